//! One libtorch pass over several sessions' runs of tokens (a ragged batch): the runs are
//! concatenated for the embedding, the projections and the MLP, each run attends to its own
//! session's cache, and the head runs on each run's last rows only.

use tch::{Device, Kind, Tensor};

use crate::error::{ModelError, Result};
use crate::kv_cache::KvCache;
use crate::libtorch::layer::Dims;
use crate::libtorch::segments::{PositionTables, Segment};
use crate::libtorch::weights::Weights;
use crate::rope::Rope;
use crate::sessions::SessionTable;

/// What a pass computes with: the weights, the shape, and what the later families add.
#[derive(Debug)]
pub(crate) struct Net {
    pub(crate) weights: Weights,
    pub(crate) dims: Dims,
    /// √hidden in the run's dtype (Gemma), by which embeddings are multiplied.
    pub(crate) embed_scale: Option<Tensor>,
    pub(crate) rope: Rope,
    /// The windowed layers' RoPE where it differs (Gemma 3).
    pub(crate) local_rope: Option<Rope>,
    /// The window of the layers that have one.
    pub(crate) sliding_window: Option<usize>,
    /// Logits become `c * tanh(logits / c)`.
    pub(crate) final_logit_softcapping: Option<f64>,
    pub(crate) device: Device,
    pub(crate) kind: Kind,
}

impl Net {
    /// One forward pass over `segments`, each appending to its session's cache in `caches`.
    /// Returns `[Σ rows, vocab]` float32 logits on the model's device, the runs' rows in order.
    pub(crate) fn pass(&self, segments: &[Segment<'_>], caches: &mut SessionTable<KvCache>) -> Result<Tensor> {
        let w = &self.weights;
        let ids: Vec<i64> = segments.iter().flat_map(|s| s.tokens.iter().map(|&t| i64::from(t))).collect();
        let ids = Tensor::from_slice(&ids).f_to_device(self.device)?;
        let mut x = w.embed.f_index_select(0, &ids)?.f_unsqueeze(0)?;
        if let Some(scale) = &self.embed_scale {
            x = x.f_mul(scale)?;
        }
        // Global layers, then (where some layers are windowed) the windowed layers: the
        // rotary tables of every segment's positions and each segment's mask.
        let global = if w.layers.iter().any(|l| !l.windowed) {
            Some(self.position_tables(segments, &self.rope, None)?)
        } else {
            None
        };
        let local = if w.layers.iter().any(|l| l.windowed) {
            Some(self.position_tables(segments, self.local_rope.as_ref().unwrap_or(&self.rope), self.sliding_window)?)
        } else {
            None
        };
        for (li, l) in w.layers.iter().enumerate() {
            // Each kind's tables exist where a layer of that kind does.
            let tables =
                if l.windowed { local.as_ref().or(global.as_ref()) } else { global.as_ref().or(local.as_ref()) };
            let tables = tables.ok_or_else(|| ModelError::InvalidInput("a model without layers".into()))?;
            x = l.forward(&x, li, &self.dims, tables, segments, caches)?;
        }
        let x = last_rows(&x, segments)?;
        let x = w.norm.apply(&x)?;
        let logits = x.f_linear(&w.lm_head, None::<&Tensor>)?;
        let logits = match self.final_logit_softcapping {
            Some(cap) => logits.f_div_scalar(cap)?.f_tanh()?.f_mul_scalar(cap)?,
            None => logits,
        };
        Ok(logits.f_squeeze_dim(0)?.f_to_kind(Kind::Float)?)
    }

    /// The rotary tables of `rope` for every segment's positions, concatenated, and each
    /// segment's mask with `window`.
    fn position_tables(&self, segments: &[Segment<'_>], rope: &Rope, window: Option<usize>) -> Result<PositionTables> {
        let mut cos = Vec::with_capacity(segments.len());
        let mut sin = Vec::with_capacity(segments.len());
        let mut masks = Vec::with_capacity(segments.len());
        for s in segments {
            let (c, n) = rope.cos_sin(s.past, s.tokens.len(), self.kind)?;
            cos.push(c);
            sin.push(n);
            masks.push(attention_mask(s.past, s.tokens.len(), window, self.kind, self.device)?);
        }
        // Rotary embeddings are per position, so they apply to the concatenated runs at once.
        let (cos, sin) = if segments.len() == 1 {
            (cos.remove(0), sin.remove(0))
        } else {
            (Tensor::f_cat(&cos, 0)?, Tensor::f_cat(&sin, 0)?)
        };
        Ok(PositionTables { cos, sin, masks })
    }
}

/// The hidden states `[1, Σ n, hidden]` of each segment's last `rows` positions, in order:
/// the rows the head runs on.
fn last_rows(x: &Tensor, segments: &[Segment<'_>]) -> Result<Tensor> {
    if segments.iter().all(|s| s.rows == s.tokens.len()) {
        return Ok(x.shallow_clone());
    }
    let mut parts = Vec::with_capacity(segments.len());
    let mut end = 0i64;
    for s in segments {
        end += s.tokens.len() as i64;
        parts.push(x.f_narrow(1, end - s.rows as i64, s.rows as i64)?);
    }
    Ok(if let [one] = parts.as_slice() { one.shallow_clone() } else { Tensor::f_cat(&parts, 1)? })
}

/// Additive `[n, past + n]` mask in `kind` (0 where a query may attend, -inf elsewhere) for
/// queries at `past..past + n`, or `None` when every key is visible (a single query with no
/// active sliding window). Attention would turn a boolean mask into this one in every
/// layer; built once per pass, it saves about 0.5–1% of a 4-token verify pass on the demo
/// target (BENCHMARKS.md).
fn attention_mask(past: usize, n: usize, window: Option<usize>, kind: Kind, device: Device) -> Result<Option<Tensor>> {
    let total = past + n;
    let window_active = window.is_some_and(|w| total > w);
    if n == 1 && !window_active {
        return Ok(None);
    }
    let q = Tensor::f_arange_start(past as i64, total as i64, (Kind::Int64, device))?.f_unsqueeze(1)?;
    let k = Tensor::f_arange(total as i64, (Kind::Int64, device))?.f_unsqueeze(0)?;
    let mut mask = k.f_le_tensor(&q)?;
    if let Some(w) = window {
        let recent = q.f_sub(&k)?.f_lt(w as i64)?;
        mask = mask.f_logical_and(&recent)?;
    }
    let open = Tensor::f_zeros([n as i64, total as i64], (kind, device))?;
    Ok(Some(open.f_masked_fill(&mask.f_logical_not()?, f64::NEG_INFINITY)?))
}
