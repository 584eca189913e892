//! The shape of the libtorch engine's layers, as every layer and the attention plan read it.

use crate::config::Activation;

/// The shape numbers and switches every layer computes with.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Dims {
    pub(crate) heads: i64,
    pub(crate) kv_heads: i64,
    pub(crate) head_dim: i64,
    pub(crate) intermediate: i64,
    /// Attention scores' scale where it is not `head_dim^-1/2` (`query_pre_attn_scalar`).
    pub(crate) scale: Option<f64>,
    pub(crate) activation: Activation,
}
