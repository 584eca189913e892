//! `--device cpu|cuda:N` and `--dtype f32|f16|bf16|f64`.

use std::fmt;
use std::str::FromStr;

use crate::error::{ModelError, Result};

/// Where the weights and caches live.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum DeviceSpec {
    /// The host CPU.
    #[default]
    Cpu,
    /// CUDA device `N` (`cuda` alone means `cuda:0`).
    Cuda(usize),
}

impl DeviceSpec {
    /// The libtorch device, or an error when CUDA is asked for but absent.
    pub fn to_device(self) -> Result<tch::Device> {
        match self {
            Self::Cpu => Ok(tch::Device::Cpu),
            Self::Cuda(n) => {
                let count = tch::Cuda::device_count();
                if count <= 0 {
                    return Err(ModelError::Device(format!(
                        "cuda:{n} requested but libtorch sees no CUDA device (is libtorch_cuda linked and a driver present?)"
                    )));
                }
                if n as i64 >= count {
                    return Err(ModelError::Device(format!(
                        "cuda:{n} requested but only {count} CUDA device(s) exist"
                    )));
                }
                Ok(tch::Device::Cuda(n))
            }
        }
    }
}

impl FromStr for DeviceSpec {
    type Err = ModelError;

    fn from_str(s: &str) -> Result<Self> {
        match s {
            "cpu" => Ok(Self::Cpu),
            "cuda" => Ok(Self::Cuda(0)),
            _ => s
                .strip_prefix("cuda:")
                .and_then(|n| n.parse().ok())
                .map(Self::Cuda)
                .ok_or_else(|| ModelError::Device(format!("unknown device {s:?} (expected cpu or cuda:N)"))),
        }
    }
}

impl fmt::Display for DeviceSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Cpu => write!(f, "cpu"),
            Self::Cuda(n) => write!(f, "cuda:{n}"),
        }
    }
}

/// The dtype weights and caches are kept in; logits always come back as `f32`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum DType {
    /// 32-bit float (the reference for parity tests).
    #[default]
    F32,
    /// IEEE half precision.
    F16,
    /// bfloat16.
    Bf16,
    /// 64-bit float: slow, but a block scored in one forward and the same tokens scored one
    /// at a time agree to ~1e-15, so greedy speculative and greedy target-only decoding give
    /// identical tokens (the greedy identity tests use it).
    F64,
}

impl DType {
    /// The libtorch kind.
    pub fn kind(self) -> tch::Kind {
        match self {
            Self::F32 => tch::Kind::Float,
            Self::F16 => tch::Kind::Half,
            Self::Bf16 => tch::Kind::BFloat16,
            Self::F64 => tch::Kind::Double,
        }
    }

    /// Bytes per element.
    pub fn size_in_bytes(self) -> u64 {
        match self {
            Self::F32 => 4,
            Self::F16 | Self::Bf16 => 2,
            Self::F64 => 8,
        }
    }
}

impl FromStr for DType {
    type Err = ModelError;

    fn from_str(s: &str) -> Result<Self> {
        match s {
            "f32" | "float32" => Ok(Self::F32),
            "f16" | "float16" => Ok(Self::F16),
            "bf16" | "bfloat16" => Ok(Self::Bf16),
            "f64" | "float64" => Ok(Self::F64),
            _ => Err(ModelError::Device(format!("unknown dtype {s:?} (expected f32, f16, bf16 or f64)"))),
        }
    }
}

impl fmt::Display for DType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::F32 => "f32",
            Self::F16 => "f16",
            Self::Bf16 => "bf16",
            Self::F64 => "f64",
        })
    }
}
