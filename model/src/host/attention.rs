//! Causal attention of a pass's queries over their sessions' caches, each query row and
//! head an independent piece of work that the pool's threads share.

use specd_host_kernels::Kernels;

use crate::host::cache::HostCache;
use crate::host::elementwise::softmax;

/// The shape of attention in one layer.
#[derive(Debug, Clone, Copy)]
pub(crate) struct AttentionShape {
    pub(crate) heads: usize,
    pub(crate) kv_heads: usize,
    pub(crate) head_dim: usize,
    /// Scores are multiplied by this (`head_dim^-1/2`, or Gemma's
    /// `query_pre_attn_scalar^-1/2`).
    pub(crate) scale: f32,
}

/// Where one query row of the pass sits: which of the pass's caches it reads, and its
/// position there.
#[derive(Debug, Clone, Copy)]
pub(crate) struct QueryRow {
    pub(crate) cache: usize,
    pub(crate) position: usize,
}

/// Multiply-adds below which attention runs on the calling thread.
const PARALLEL_MIN_MADDS: usize = 16 * 1024;

/// Attention of every row's queries (in `qkv`'s rows, `q` first) over layer `l` of its
/// cache, which already holds the pass's own keys and values; writes `rows × heads ×
/// head_dim` into `out`. A query at position i sees keys j ≤ i with i - j < `window`.
#[allow(clippy::too_many_arguments)]
pub(crate) fn attend(
    kernels: &Kernels,
    shape: AttentionShape,
    qkv: &[f32],
    caches: &[&HostCache],
    rows: &[QueryRow],
    l: usize,
    window: Option<usize>,
    out: &mut [f32],
) {
    let hd = shape.head_dim;
    let (qd, kvd) = (shape.heads * hd, shape.kv_heads * hd);
    let stride = qd + 2 * kvd;
    let group = shape.heads / shape.kv_heads;
    let work: usize = rows.iter().map(|r| (r.position + 1).min(window.unwrap_or(usize::MAX))).sum::<usize>() * qd * 2;
    kernels.for_each_chunk(out, hd, work >= PARALLEL_MIN_MADDS, |piece, o| {
        let (t, head) = (piece / shape.heads, piece % shape.heads);
        let QueryRow { cache, position } = rows[t];
        let cache = caches[cache];
        let kv = head / group;
        let first = window.map_or(0, |w| (position + 1).saturating_sub(w));
        let mut scores = vec![0f32; position + 1 - first];
        let q = &qkv[t * stride + head * hd..][..hd];
        kernels.weighted_rows(q, cache.keys(l, kv), cache.capacity(), first, &mut scores);
        for s in &mut scores {
            *s *= shape.scale;
        }
        softmax(&mut scores);
        kernels.weighted_rows(&scores, &cache.values(l)[first * kvd + kv * hd..], kvd, 0, o);
    });
}
