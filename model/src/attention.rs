//! `--attention-keys` and `--attention-kernel`: how the libtorch engine presents a session's
//! keys to attention, and which kernel it asks for.
//!
//! Why the shapes matter on a GPU: cuDNN's attention (which libtorch tries first on recent
//! GPUs) builds an execution plan per distinct shape and keeps it in an unbounded cache.
//! Attending over exactly `past + n` keys presents a new key length on nearly every decode
//! and verify step, so nearly every step may pay a plan build on the host. Keys rounded up
//! to a bucket (the tail masked out) present one shape per bucket instead. A CPU builds
//! no plans, so there the exact length, with no mask for a single query, is fastest.

use std::fmt;
use std::str::FromStr;

use crate::device::DeviceSpec;
use crate::error::{ModelError, Result};

/// Key bucket that `auto` uses on CUDA: few enough shapes that their plans are built once in
/// a whole context, small enough that the masked tail costs little next to the matmuls.
pub const CUDA_KEY_BUCKET: usize = 256;

/// How many keys each attention call sees.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum KeyLengths {
    /// [`KeyLengths::Bucketed`] by [`CUDA_KEY_BUCKET`] on CUDA, [`KeyLengths::Exact`] on a CPU.
    #[default]
    Auto,
    /// Exactly the session's length after the run (`past + n`).
    Exact,
    /// The length rounded up to a multiple of this many tokens (at most the session's
    /// reserved capacity), the keys past the length masked out.
    Bucketed(usize),
}

impl KeyLengths {
    /// The bucket in tokens on `device`, or `None` for exact lengths.
    pub fn bucket(self, device: DeviceSpec) -> Option<usize> {
        match self {
            Self::Auto => matches!(device, DeviceSpec::Cuda(_)).then_some(CUDA_KEY_BUCKET),
            Self::Exact => None,
            Self::Bucketed(tokens) => Some(tokens),
        }
    }
}

impl FromStr for KeyLengths {
    type Err = ModelError;

    fn from_str(s: &str) -> Result<Self> {
        match s {
            "auto" => Ok(Self::Auto),
            "exact" => Ok(Self::Exact),
            _ => match s.parse::<usize>() {
                Ok(tokens) if tokens > 0 => Ok(Self::Bucketed(tokens)),
                _ => Err(ModelError::InvalidInput(format!(
                    "unknown attention key lengths {s:?} (expected auto, exact or a bucket of at least 1 token)"
                ))),
            },
        }
    }
}

impl fmt::Display for KeyLengths {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Auto => f.write_str("auto"),
            Self::Exact => f.write_str("exact"),
            Self::Bucketed(tokens) => write!(f, "{tokens}"),
        }
    }
}

/// Which attention kernel is asked for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum AttentionKernel {
    /// [`AttentionKernel::Sdpa`] until a GPU run shows the other faster.
    #[default]
    Auto,
    /// libtorch's `scaled_dot_product_attention`, which picks a kernel per call (cuDNN,
    /// flash, memory-efficient or the math fallback on CUDA; flash on a CPU).
    Sdpa,
    /// libtorch's memory-efficient CUDA kernel, called directly: it never builds cuDNN plans
    /// and takes a mask. CUDA only.
    Efficient,
}

impl AttentionKernel {
    /// The kernel on `device`; [`AttentionKernel::Efficient`] is refused on a CPU, which has
    /// no such kernel.
    pub fn resolve(self, device: DeviceSpec) -> Result<Self> {
        match (self, device) {
            (Self::Auto, _) => Ok(Self::Sdpa),
            (Self::Efficient, DeviceSpec::Cpu) => Err(ModelError::InvalidInput(
                "--attention-kernel efficient needs a CUDA device: libtorch has no memory-efficient attention kernel for the CPU"
                    .into(),
            )),
            (kernel, _) => Ok(kernel),
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Self::Auto => "auto",
            Self::Sdpa => "sdpa",
            Self::Efficient => "efficient",
        }
    }
}

impl FromStr for AttentionKernel {
    type Err = ModelError;

    fn from_str(s: &str) -> Result<Self> {
        match s {
            "auto" => Ok(Self::Auto),
            "sdpa" => Ok(Self::Sdpa),
            "efficient" => Ok(Self::Efficient),
            _ => Err(ModelError::InvalidInput(format!(
                "unknown attention kernel {s:?} (expected auto, sdpa or efficient)"
            ))),
        }
    }
}

impl fmt::Display for AttentionKernel {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// How the libtorch engine attends (the host engine always attends over exact lengths).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct AttentionOptions {
    pub keys: KeyLengths,
    pub kernel: AttentionKernel,
    /// Repeat each KV head for its query heads before attention instead of asking the
    /// kernel for grouped-query attention. The engine does so by itself where libtorch
    /// would otherwise fall to its math kernel (see `libtorch::attention_plan`); this forces
    /// it, for tests.
    pub expand_kv_heads: bool,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn key_lengths_parse_and_resolve_by_device() {
        assert_eq!("auto".parse::<KeyLengths>().unwrap(), KeyLengths::Auto);
        assert_eq!("exact".parse::<KeyLengths>().unwrap(), KeyLengths::Exact);
        assert_eq!("64".parse::<KeyLengths>().unwrap(), KeyLengths::Bucketed(64));
        for bad in ["0", "-3", "bucket", ""] {
            assert!(bad.parse::<KeyLengths>().is_err(), "{bad:?}");
        }
        for k in [KeyLengths::Auto, KeyLengths::Exact, KeyLengths::Bucketed(17)] {
            assert_eq!(k.to_string().parse::<KeyLengths>().unwrap(), k);
        }
        assert_eq!(KeyLengths::Auto.bucket(DeviceSpec::Cpu), None);
        assert_eq!(KeyLengths::Auto.bucket(DeviceSpec::Cuda(1)), Some(CUDA_KEY_BUCKET));
        assert_eq!(KeyLengths::Exact.bucket(DeviceSpec::Cuda(0)), None);
        assert_eq!(KeyLengths::Bucketed(8).bucket(DeviceSpec::Cpu), Some(8));
    }

    #[test]
    fn the_efficient_kernel_is_refused_on_a_cpu() {
        assert_eq!(AttentionKernel::Auto.resolve(DeviceSpec::Cpu).unwrap(), AttentionKernel::Sdpa);
        assert_eq!(AttentionKernel::Auto.resolve(DeviceSpec::Cuda(0)).unwrap(), AttentionKernel::Sdpa);
        assert_eq!(AttentionKernel::Efficient.resolve(DeviceSpec::Cuda(0)).unwrap(), AttentionKernel::Efficient);
        let err = AttentionKernel::Efficient.resolve(DeviceSpec::Cpu).unwrap_err().to_string();
        assert!(err.contains("CUDA"), "{err}");
        for k in [AttentionKernel::Auto, AttentionKernel::Sdpa, AttentionKernel::Efficient] {
            assert_eq!(k.to_string().parse::<AttentionKernel>().unwrap(), k);
        }
        assert!("cudnn".parse::<AttentionKernel>().is_err());
    }
}
