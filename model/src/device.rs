//! `--device cpu|cuda:N` and `--dtype auto|f32|f16|bf16|f64`.

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
    /// Chosen at load ([`DType::resolve`]): the checkpoint's own dtype on a GPU; on a CPU,
    /// bf16 where it has bf16 matrix units and f32 elsewhere. Until resolved it acts as f32.
    Auto,
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
    /// The dtype a model loads in: `self` unless it is [`DType::Auto`]. On a GPU that is
    /// `checkpoint` (what `config.json` says the weights are; f32 when it says nothing). On
    /// a CPU it is the fastest that keeps parity with transformers: libtorch's bf16
    /// matmuls are slower than f32 ones unless the CPU has bf16 matrix units
    /// ([`crate::cpu_features::has_bf16_matrix_units`]), so f32 without them and bf16 with.
    pub fn resolve(self, device: DeviceSpec, checkpoint: Option<DType>) -> DType {
        match (self, device) {
            (Self::Auto, DeviceSpec::Cuda(_)) => checkpoint.filter(|d| *d != Self::Auto).unwrap_or(Self::F32),
            (Self::Auto, DeviceSpec::Cpu) => {
                if crate::cpu_features::has_bf16_matrix_units() {
                    Self::Bf16
                } else {
                    Self::F32
                }
            }
            (concrete, _) => concrete,
        }
    }

    /// The libtorch kind.
    pub fn kind(self) -> tch::Kind {
        match self {
            Self::Auto | Self::F32 => tch::Kind::Float,
            Self::F16 => tch::Kind::Half,
            Self::Bf16 => tch::Kind::BFloat16,
            Self::F64 => tch::Kind::Double,
        }
    }

    /// Bytes per element.
    pub fn size_in_bytes(self) -> u64 {
        match self {
            Self::Auto | Self::F32 => 4,
            Self::F16 | Self::Bf16 => 2,
            Self::F64 => 8,
        }
    }
}

impl FromStr for DType {
    type Err = ModelError;

    fn from_str(s: &str) -> Result<Self> {
        match s {
            "auto" => Ok(Self::Auto),
            "f32" | "float32" => Ok(Self::F32),
            "f16" | "float16" => Ok(Self::F16),
            "bf16" | "bfloat16" => Ok(Self::Bf16),
            "f64" | "float64" => Ok(Self::F64),
            _ => Err(ModelError::Device(format!("unknown dtype {s:?} (expected auto, f32, f16, bf16 or f64)"))),
        }
    }
}

impl fmt::Display for DType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Auto => "auto",
            Self::F32 => "f32",
            Self::F16 => "f16",
            Self::Bf16 => "bf16",
            Self::F64 => "f64",
        })
    }
}
