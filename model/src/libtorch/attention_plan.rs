//! What the libtorch engine's attention does, decided once at load: the key bucket, the
//! kernel, and whether KV heads are repeated for their query heads.
//!
//! libtorch's `scaled_dot_product_attention` picks a kernel per call. On CUDA with torch
//! 2.11, a masked call with grouped-query attention can find no fused kernel that takes
//! both (flash refuses a mask; the memory-efficient kernel learned GQA later) and falls to
//! the math kernel, which upcasts to float32 and repeats K/V anyway. Asking libtorch which
//! kernel it would pick for the model's own shapes ([`SdpBackend`], from `_fused_sdp_choice`)
//! tells the engine when to repeat the heads itself, so that such a call stays fused.

use std::fmt;

use tch::{Device, Kind, Tensor};

use crate::attention::{AttentionKernel, AttentionOptions};
use crate::device::DeviceSpec;
use crate::error::Result;
use crate::libtorch::dims::Dims;

/// The kernel libtorch's dispatcher picks (`at::native::SDPBackend`'s numbering).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum SdpBackend {
    Math,
    Flash,
    Efficient,
    Cudnn,
    Other(i64),
}

impl SdpBackend {
    fn from_choice(choice: i64) -> Self {
        match choice {
            0 => Self::Math,
            1 => Self::Flash,
            2 => Self::Efficient,
            3 => Self::Cudnn,
            other => Self::Other(other),
        }
    }
}

impl fmt::Display for SdpBackend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Math => f.write_str("math"),
            Self::Flash => f.write_str("flash"),
            Self::Efficient => f.write_str("memory-efficient"),
            Self::Cudnn => f.write_str("cudnn"),
            Self::Other(n) => write!(f, "backend {n}"),
        }
    }
}

/// How every attention call of a model runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct AttentionPlan {
    /// Keys rounded up to a multiple of this many positions; `None`: exact lengths.
    pub(crate) bucket: Option<usize>,
    /// [`AttentionKernel::Sdpa`] or [`AttentionKernel::Efficient`].
    pub(crate) kernel: AttentionKernel,
    /// Repeat each KV head for its query heads before attention.
    pub(crate) expand_kv_heads: bool,
    /// What libtorch picks for a masked block of queries (a verify pass) as the plan calls it;
    /// `None` with the efficient kernel, which is called directly.
    pub(crate) masked_backend: Option<SdpBackend>,
}

impl AttentionPlan {
    /// The plan for a model of `dims` in `kind` on `device` (`spec`), probing libtorch's
    /// choice where it matters.
    pub(crate) fn choose(
        options: &AttentionOptions,
        dims: &Dims,
        spec: DeviceSpec,
        kind: Kind,
        device: Device,
    ) -> Result<Self> {
        let bucket = options.keys.bucket(spec);
        let kernel = options.kernel.resolve(spec)?;
        let grouped = dims.heads != dims.kv_heads;
        if kernel == AttentionKernel::Efficient {
            // The memory-efficient kernel of torch 2.11 takes no GQA flag.
            return Ok(Self { bucket, kernel, expand_kv_heads: grouped, masked_backend: None });
        }
        let mut expand = grouped && options.expand_kv_heads;
        let mut backend = masked_choice(dims, expand, kind, device)?;
        if grouped && !expand && backend == SdpBackend::Math {
            expand = true;
            backend = masked_choice(dims, expand, kind, device)?;
        }
        Ok(Self { bucket, kernel, expand_kv_heads: expand, masked_backend: Some(backend) })
    }

    /// The number of keys a run's queries see when the session holds `len` positions
    /// after the run and reserved `capacity`.
    pub(crate) fn keys(&self, len: usize, capacity: usize) -> usize {
        match self.bucket {
            Some(bucket) => len.next_multiple_of(bucket).min(capacity).max(len),
            None => len,
        }
    }
}

impl fmt::Display for AttentionPlan {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.bucket {
            Some(bucket) => write!(f, "keys in buckets of {bucket}")?,
            None => f.write_str("exact key lengths")?,
        }
        write!(f, ", kernel {}", self.kernel)?;
        if let Some(backend) = self.masked_backend {
            write!(f, " ({backend} for a masked block)")?;
        }
        if self.expand_kv_heads {
            f.write_str(", KV heads repeated for their query heads")?;
        }
        Ok(())
    }
}

/// The kernel libtorch picks for a masked block of 2 queries over 8 keys of this model's
/// heads, in its dtype on its device, with the KV heads repeated or not.
fn masked_choice(dims: &Dims, expand: bool, kind: Kind, device: Device) -> Result<SdpBackend> {
    let (queries, keys) = (2, 8);
    let kv_heads = if expand { dims.heads } else { dims.kv_heads };
    let q = Tensor::f_zeros([1, dims.heads, queries, dims.head_dim], (kind, device))?;
    let k = Tensor::f_zeros([1, kv_heads, keys, dims.head_dim], (kind, device))?;
    let mask = Tensor::f_zeros([queries, keys], (kind, device))?;
    let grouped = kv_heads != dims.heads;
    let choice = Tensor::f_internal_fused_sdp_choice(&q, &k, &k, Some(&mask), 0.0, false, dims.scale, grouped)?;
    Ok(SdpBackend::from_choice(choice))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::attention::KeyLengths;
    use crate::config::Activation;

    fn dims(heads: i64, kv_heads: i64) -> Dims {
        Dims { heads, kv_heads, head_dim: 16, intermediate: 32, scale: None, activation: Activation::Silu }
    }

    #[test]
    fn a_cpu_keeps_grouped_heads_fused_and_exact_lengths() {
        let plan =
            AttentionPlan::choose(&AttentionOptions::default(), &dims(4, 2), DeviceSpec::Cpu, Kind::Float, Device::Cpu)
                .unwrap();
        assert_eq!(plan.bucket, None);
        assert_eq!(plan.kernel, AttentionKernel::Sdpa);
        assert!(!plan.expand_kv_heads, "{plan}");
        assert_ne!(plan.masked_backend, Some(SdpBackend::Math), "{plan}");
        assert_eq!(plan.keys(37, 64), 37);
    }

    #[test]
    fn forced_expansion_and_buckets() {
        let options = AttentionOptions { keys: KeyLengths::Bucketed(16), expand_kv_heads: true, ..Default::default() };
        let plan = AttentionPlan::choose(&options, &dims(4, 2), DeviceSpec::Cpu, Kind::Float, Device::Cpu).unwrap();
        assert!(plan.expand_kv_heads);
        // A model without grouped heads has nothing to repeat.
        let plain = AttentionPlan::choose(&options, &dims(4, 4), DeviceSpec::Cpu, Kind::Float, Device::Cpu).unwrap();
        assert!(!plain.expand_kv_heads);
        // Rounded up to the bucket, never past the reservation, never below the length.
        assert_eq!(plan.keys(1, 64), 16);
        assert_eq!(plan.keys(16, 64), 16);
        assert_eq!(plan.keys(17, 64), 32);
        assert_eq!(plan.keys(60, 62), 62);
        assert_eq!(plan.keys(62, 62), 62);
    }
}
