//! One decoder layer of the libtorch engine: its weights and norms, and what it computes:
//! each run's attention over its session's cache, then the MLP.

use tch::{Kind, Tensor};

use crate::attention::AttentionKernel;
use crate::config::Activation;
use crate::error::Result;
use crate::kv_cache::KvCache;
use crate::libtorch::attention_plan::AttentionPlan;
use crate::libtorch::dims::Dims;
use crate::libtorch::segments::{PositionTables, Segment};
use crate::rope::apply_rope;
use crate::sessions::SessionTable;

/// One decoder layer. q/k/v and gate/up are fused at load time (one matmul each instead of
/// three and two), which matters most for small runs of tokens.
#[derive(Debug)]
pub(crate) struct Layer {
    pub(crate) attn_norm: Norm,
    /// Per-head RMS norms of q and k (Qwen3, Gemma 3).
    pub(crate) qk_norm: Option<(Norm, Norm)>,
    /// Gemma's norm of the attention output, before the residual add.
    pub(crate) post_attn_norm: Option<Norm>,
    /// Gemma's norm of the MLP output, before the residual add.
    pub(crate) post_mlp_norm: Option<Norm>,
    /// Whether the sliding window applies (Gemma 3's local layers; every layer of a
    /// windowed Mistral).
    pub(crate) windowed: bool,
    /// `[q_dim + 2 * kv_dim, hidden]`: q, k, v stacked.
    pub(crate) qkv: Tensor,
    pub(crate) qkv_bias: Option<Tensor>,
    pub(crate) o: Tensor,
    pub(crate) o_bias: Option<Tensor>,
    pub(crate) mlp_norm: Norm,
    /// `[2 * intermediate, hidden]`: gate, up stacked.
    pub(crate) gate_up: Tensor,
    pub(crate) gate_up_bias: Option<Tensor>,
    pub(crate) down: Tensor,
    pub(crate) down_bias: Option<Tensor>,
}

impl Layer {
    /// The hidden states `x` (`[1, Σ n, hidden]`, the runs of `segments` concatenated) after
    /// this layer, the `index`-th: each run's keys and values are written to its session's
    /// cache, and its queries attend to that cache.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn forward(
        &self,
        x: &Tensor,
        index: usize,
        d: &Dims,
        plan: &AttentionPlan,
        tables: &PositionTables,
        segments: &[Segment<'_>],
        caches: &mut SessionTable<KvCache>,
    ) -> Result<Tensor> {
        let x = x.f_add(&self.attention(x, index, d, plan, tables, segments, caches)?)?;
        let mlp = self.mlp(&x, d)?;
        Ok(x.f_add(&mlp)?)
    }

    /// What attention adds to the residual stream. q, k and v are kept position-major
    /// (`[1, Σ n, heads, head_dim]`), the cache's layout, so a run's keys and values are
    /// written to it as one block; q is viewed head-major for the kernel.
    #[allow(clippy::too_many_arguments)]
    fn attention(
        &self,
        x: &Tensor,
        index: usize,
        d: &Dims,
        plan: &AttentionPlan,
        tables: &PositionTables,
        segments: &[Segment<'_>],
        caches: &mut SessionTable<KvCache>,
    ) -> Result<Tensor> {
        let (heads, kv_heads, hd) = (d.heads, d.kv_heads, d.head_dim);
        let total: i64 = segments.iter().map(|s| s.tokens.len() as i64).sum();
        let hs = self.attn_norm.apply(x)?;
        let qkv = hs.f_linear(&self.qkv, self.qkv_bias.as_ref())?;
        let q = qkv.f_narrow(-1, 0, heads * hd)?.f_view([1, total, heads, hd])?;
        let k = qkv.f_narrow(-1, heads * hd, kv_heads * hd)?.f_reshape([1, total, kv_heads, hd])?;
        let (q, k) = match &self.qk_norm {
            Some((qn, kn)) => (qn.apply(&q)?, kn.apply(&k)?),
            None => (q, k),
        };
        let v = qkv.f_narrow(-1, (heads + kv_heads) * hd, kv_heads * hd)?.f_reshape([1, total, kv_heads, hd])?;
        let q = apply_rope(&q, &tables.cos, &tables.sin)?.f_transpose(1, 2)?;
        let k = apply_rope(&k, &tables.cos, &tables.sin)?;
        let grouped = heads != kv_heads;
        let mut outputs = Vec::with_capacity(segments.len());
        let mut start = 0i64;
        for (s, mask) in segments.iter().zip(&tables.masks) {
            let n = s.tokens.len() as i64;
            let cache = &mut caches.get_mut(s.session)?.state;
            let (k_all, v_all) =
                cache.append(index, s.past, &k.f_narrow(1, start, n)?, &v.f_narrow(1, start, n)?, s.keys)?;
            let (k_all, v_all) = if grouped && plan.expand_kv_heads {
                (repeat_kv_heads(&k_all, heads)?, repeat_kv_heads(&v_all, heads)?)
            } else {
                (k_all, v_all)
            };
            let q = q.f_narrow(2, start, n)?;
            let attn = match plan.kernel {
                AttentionKernel::Efficient => {
                    // The kernel takes no broadcast: the mask is given for every head.
                    let mask = mask.as_ref().map(|m| m.f_expand([1, heads, n, s.keys as i64], false)).transpose()?;
                    Tensor::f_internal_scaled_dot_product_efficient_attention(
                        &q, &k_all, &v_all, mask, false, 0.0, false, d.scale,
                    )?
                    .0
                }
                _ => Tensor::f_scaled_dot_product_attention(
                    &q,
                    &k_all,
                    &v_all,
                    mask.as_ref(),
                    0.0,
                    false,
                    d.scale,
                    grouped && !plan.expand_kv_heads,
                )?,
            };
            outputs.push(attn.f_transpose(1, 2)?.f_reshape([1, n, heads * hd])?);
            start += n;
        }
        let attn = if outputs.len() == 1 { outputs.remove(0) } else { Tensor::f_cat(&outputs, 1)? };
        let attn = attn.f_linear(&self.o, self.o_bias.as_ref())?;
        match &self.post_attn_norm {
            Some(norm) => norm.apply(&attn),
            None => Ok(attn),
        }
    }

    /// What the MLP adds to the residual stream.
    fn mlp(&self, x: &Tensor, d: &Dims) -> Result<Tensor> {
        let hs = self.mlp_norm.apply(x)?;
        let gate_up = hs.f_linear(&self.gate_up, self.gate_up_bias.as_ref())?;
        let inter = d.intermediate;
        let gate = gate_up.f_narrow(-1, 0, inter)?;
        let gate = match d.activation {
            Activation::Silu => gate.f_silu()?,
            Activation::GeluTanh => gate.f_gelu("tanh")?,
            Activation::Gelu => gate.f_gelu("none")?,
        };
        let up = gate_up.f_narrow(-1, inter, inter)?;
        let mlp = gate.f_mul(&up)?.f_linear(&self.down, self.down_bias.as_ref())?;
        match &self.post_mlp_norm {
            Some(norm) => norm.apply(&mlp),
            None => Ok(mlp),
        }
    }
}

/// `[1, kv_heads, L, head_dim]` with each KV head repeated for its group of query heads,
/// `[1, heads, L, head_dim]`, as grouped-query attention pairs them (query head h reads KV
/// head h / (heads / kv_heads)).
fn repeat_kv_heads(x: &Tensor, heads: i64) -> Result<Tensor> {
    let size = x.size();
    let (kv_heads, len, hd) = (size[1], size[2], size[3]);
    Ok(x.f_unsqueeze(2)?.f_expand([1, kv_heads, heads / kv_heads, len, hd], false)?.f_reshape([1, heads, len, hd])?)
}

/// An RMS norm with its weight: Llama's `w * normed` in the input's dtype, or Gemma's
/// `(1 + w) * normed` in float32 (the weight kept as `1 + w` in float32).
#[derive(Debug)]
pub(crate) struct Norm {
    weight: Tensor,
    plus_one: bool,
    eps: f64,
}

impl Norm {
    pub(crate) fn new(weight: Tensor, plus_one: bool, eps: f64) -> Result<Self> {
        let weight = if plus_one { weight.f_to_kind(Kind::Float)?.f_add_scalar(1.0)? } else { weight };
        Ok(Self { weight, plus_one, eps })
    }

    /// Normalises the last dimension of `x`; the result has `x`'s dtype.
    pub(crate) fn apply(&self, x: &Tensor) -> Result<Tensor> {
        if !self.plus_one {
            return rms_norm(x, &self.weight, self.eps);
        }
        // Gemma multiplies by its weight in float32, before the cast back.
        let xf = x.f_to_kind(Kind::Float)?;
        Ok(normalised(&xf, Some(&self.weight), self.eps)?.f_to_kind(x.kind())?)
    }
}

/// `weight * (x / sqrt(mean(x²) + eps))`, the mean taken in float32 and the weight applied
/// after the cast back, as transformers does. On a GPU libtorch's own `rms_norm` normalises
/// (one fused kernel instead of five launches); on a CPU its composite form measured slower
/// than the five operations (BENCHMARKS.md), so they stay. The weight is multiplied apart
/// because `rms_norm` would apply it before the cast, which rounds differently in bf16.
pub fn rms_norm(x: &Tensor, weight: &Tensor, eps: f64) -> Result<Tensor> {
    let kind = x.kind();
    let xf = x.f_to_kind(Kind::Float)?;
    Ok(weight.f_mul(&normalised(&xf, None, eps)?.f_to_kind(kind)?)?)
}

/// `x / sqrt(mean(x²) + eps)` over the last dimension of a float32 `x`, times `weight` where
/// given (in float32).
fn normalised(xf: &Tensor, weight: Option<&Tensor>, eps: f64) -> Result<Tensor> {
    if xf.device().is_cuda() {
        let last = [*xf.size().last().unwrap_or(&0)];
        return Ok(xf.f_rms_norm(last.as_slice(), weight, eps)?);
    }
    let var = xf.f_square()?.f_mean_dim(-1, true, Kind::Float)?;
    let normed = xf.f_mul(&var.f_add_scalar(eps)?.f_rsqrt()?)?;
    Ok(match weight {
        Some(w) => normed.f_mul(w)?,
        None => normed,
    })
}
