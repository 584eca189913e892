//! One libtorch pass over several sessions' runs of tokens (a ragged batch): the runs are
//! concatenated for the embedding, the projections and the MLP, each run attends to its own
//! session's cache, and the head runs on each run's last rows only.

use tch::{Device, Kind, Tensor};

use crate::attention::AttentionKernel;
use crate::error::{ModelError, Result};
use crate::kv_cache::KvCache;
use crate::libtorch::attention_plan::AttentionPlan;
use crate::libtorch::dims::Dims;
use crate::libtorch::segments::{PositionTables, Segment};
use crate::libtorch::weights::Weights;
use crate::rope::RopeTables;
use crate::sessions::SessionTable;
use crate::token_tree::TokenTree;

/// What a pass computes with: the weights, the shape, and what the later families add.
#[derive(Debug)]
pub(crate) struct Net {
    pub(crate) weights: Weights,
    pub(crate) dims: Dims,
    /// √hidden in the run's dtype (Gemma), by which embeddings are multiplied.
    pub(crate) embed_scale: Option<Tensor>,
    pub(crate) rope: RopeTables,
    /// The windowed layers' RoPE where it differs (Gemma 3).
    pub(crate) local_rope: Option<RopeTables>,
    /// The window of the layers that have one.
    pub(crate) sliding_window: Option<usize>,
    /// Logits become `c * tanh(logits / c)`.
    pub(crate) final_logit_softcapping: Option<f64>,
    pub(crate) attention: AttentionPlan,
    pub(crate) device: Device,
    pub(crate) kind: Kind,
}

impl Net {
    /// One forward pass over `segments`, each appending to its session's cache in `caches`.
    /// Returns `[Σ rows, vocab]` float32 logits on the model's device, the runs' rows in order.
    pub(crate) fn pass(&mut self, segments: &[Segment<'_>], caches: &mut SessionTable<KvCache>) -> Result<Tensor> {
        let ids: Vec<i64> = segments.iter().flat_map(|s| s.tokens.iter().map(|&t| i64::from(t))).collect();
        let ids = Tensor::from_slice(&ids).f_to_device(self.device)?;
        let mut x = self.weights.embed.f_index_select(0, &ids)?.f_unsqueeze(0)?;
        if let Some(scale) = &self.embed_scale {
            x = x.f_mul(scale)?;
        }
        // Global layers, then (where some layers are windowed) the windowed layers: the
        // rotary tables of every segment's positions and each segment's mask.
        let masks = MaskShape {
            kind: self.kind,
            device: self.device,
            padded: self.attention.kernel == AttentionKernel::Efficient,
        };
        let layers = &self.weights.layers;
        let global = if layers.iter().any(|l| !l.windowed) {
            Some(position_tables(segments, &mut self.rope, None, masks)?)
        } else {
            None
        };
        let local = if layers.iter().any(|l| l.windowed) {
            let rope = self.local_rope.as_mut().unwrap_or(&mut self.rope);
            Some(position_tables(segments, rope, self.sliding_window, masks)?)
        } else {
            None
        };
        let w = &self.weights;
        for (li, l) in w.layers.iter().enumerate() {
            // Each kind's tables exist where a layer of that kind does.
            let tables =
                if l.windowed { local.as_ref().or(global.as_ref()) } else { global.as_ref().or(local.as_ref()) };
            let tables = tables.ok_or_else(|| ModelError::InvalidInput("a model without layers".into()))?;
            x = l.forward(&x, li, &self.dims, &self.attention, tables, segments, caches)?;
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
}

/// The rotary tables of `rope` for every segment's positions, concatenated, and each
/// segment's mask with `window`.
fn position_tables(
    segments: &[Segment<'_>],
    rope: &mut RopeTables,
    window: Option<usize>,
    masks: MaskShape,
) -> Result<PositionTables> {
    let mut cos = Vec::with_capacity(segments.len());
    let mut sin = Vec::with_capacity(segments.len());
    let mut segment_masks = Vec::with_capacity(segments.len());
    for s in segments {
        match s.tree {
            None => {
                let (c, n) = rope.cos_sin(s.past, s.tokens.len())?;
                cos.push(c);
                sin.push(n);
                segment_masks.push(attention_mask(s.past, s.tokens.len(), s.keys, window, masks)?);
            }
            Some(tree) => {
                // Each node at the position of its depth: the tables of the deepest level,
                // gathered by depth.
                let depths: Vec<i64> = (0..tree.len()).map(|i| tree.depth(i) as i64).collect();
                let levels = depths.iter().max().map_or(1, |d| *d as usize + 1);
                let (c, n) = rope.cos_sin(s.past, levels)?;
                let index = Tensor::from_slice(&depths).f_to_device(c.device())?;
                cos.push(c.f_index_select(0, &index)?);
                sin.push(n.f_index_select(0, &index)?);
                segment_masks.push(Some(tree_mask(s.past, tree, s.keys, window, masks)?));
            }
        }
    }
    // Rotary embeddings are per position, so they apply to the concatenated runs at once.
    let (cos, sin) = if segments.len() == 1 {
        (cos.remove(0), sin.remove(0))
    } else {
        (Tensor::f_cat(&cos, 0)?, Tensor::f_cat(&sin, 0)?)
    };
    Ok(PositionTables { cos: cos.f_unsqueeze(1)?, sin: sin.f_unsqueeze(1)?, masks: segment_masks })
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

/// Where and how a pass's masks are made.
#[derive(Debug, Clone, Copy)]
struct MaskShape {
    kind: Kind,
    device: Device,
    /// Rows padded to a multiple of [`MASK_ALIGNMENT`] and viewed back to their width, as
    /// the memory-efficient kernel requires of a mask (the dispatcher pads for it; called
    /// directly, the caller must).
    padded: bool,
}

const MASK_ALIGNMENT: usize = 16;

/// Additive `[n, keys]` mask in the pass's dtype (0 where a query may attend, -inf
/// elsewhere) for queries at `past..past + n`, or `None` when every key is visible (a
/// single query over exactly its keys, with no active sliding window). It is written on the
/// host and copied once: built with tensor operations it would take eight launches a run.
fn attention_mask(
    past: usize,
    n: usize,
    keys: usize,
    window: Option<usize>,
    shape: MaskShape,
) -> Result<Option<Tensor>> {
    let window_active = window.is_some_and(|w| past + n > w);
    if n == 1 && !window_active && keys == past + n {
        return Ok(None);
    }
    let width = if shape.padded { keys.next_multiple_of(MASK_ALIGNMENT) } else { keys };
    let mut mask = vec![f32::NEG_INFINITY; n * width];
    for (i, row) in mask.chunks_exact_mut(width).enumerate() {
        let query = past + i;
        let first = window.map_or(0, |w| (query + 1).saturating_sub(w));
        row[first..=query].fill(0.0);
    }
    mask_tensor(&mask, n, keys, width, shape)
}

/// The additive `[n, keys]` mask of a tree's nodes at cache slots `past..past + n`: node
/// `i`, at position `past + depth(i)`, sees the cache before `past` and its own ancestors
/// (itself included), each within the sliding window of its position where there is one.
fn tree_mask(past: usize, tree: &TokenTree, keys: usize, window: Option<usize>, shape: MaskShape) -> Result<Tensor> {
    let n = tree.len();
    let width = if shape.padded { keys.next_multiple_of(MASK_ALIGNMENT) } else { keys };
    let mut mask = vec![f32::NEG_INFINITY; n * width];
    for (i, row) in mask.chunks_exact_mut(width).enumerate() {
        let query = past + tree.depth(i);
        let first = window.map_or(0, |w| (query + 1).saturating_sub(w));
        row[first.min(past)..past].fill(0.0);
        for node in tree.path_to(i) {
            if past + tree.depth(node) >= first {
                row[past + node] = 0.0;
            }
        }
    }
    mask_tensor(&mask, n, keys, width, shape)?.ok_or_else(|| ModelError::InvalidInput("an empty token tree".into()))
}

/// A host mask of `n` rows of `width` as a `[n, keys]` tensor in the pass's dtype and place.
fn mask_tensor(mask: &[f32], n: usize, keys: usize, width: usize, shape: MaskShape) -> Result<Option<Tensor>> {
    let mask =
        Tensor::from_slice(mask).f_view([n as i64, width as i64])?.f_to_kind(shape.kind)?.f_to_device(shape.device)?;
    Ok(Some(if width == keys { mask } else { mask.f_narrow(1, 0, keys as i64)? }))
}
