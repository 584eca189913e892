//! `--device cpu|cuda:N` and `--dtype f32|f16|bf16`.

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
}

impl DType {
    /// The libtorch kind.
    pub fn kind(self) -> tch::Kind {
        match self {
            Self::F32 => tch::Kind::Float,
            Self::F16 => tch::Kind::Half,
            Self::Bf16 => tch::Kind::BFloat16,
        }
    }

    /// Bytes per element.
    pub fn size_in_bytes(self) -> u64 {
        match self {
            Self::F32 => 4,
            Self::F16 | Self::Bf16 => 2,
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
            _ => Err(ModelError::Device(format!("unknown dtype {s:?} (expected f32, f16 or bf16)"))),
        }
    }
}

impl fmt::Display for DType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::F32 => "f32",
            Self::F16 => "f16",
            Self::Bf16 => "bf16",
        })
    }
}
