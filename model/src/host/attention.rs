//! Causal attention of a pass's queries over their sessions' caches, in pieces that the
//! pool's threads share: each piece is one session's consecutive rows and one KV head.

use specd_host_kernels::{BLOCK, Kernels};

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

/// Queries attended together at most: one session's rows and the heads of one KV group,
/// which read that group's keys and values once for all of them. The kernels keep this
/// many rows of sums in registers.
const QUERIES_PER_PIECE: usize = 8;

/// A piece of attention's work: consecutive rows of one session (consecutive positions in
/// one cache), and one KV head with the query heads it serves.
#[derive(Debug, Clone, Copy)]
struct Piece {
    first_row: usize,
    rows: usize,
    kv_head: usize,
}

/// Attention of every row's queries (in `qkv`'s rows, `q` first) over layer `l` of its
/// cache, which already holds the pass's own keys and values; writes `rows × heads ×
/// head_dim` into `out`. A query at position i sees keys j ≤ i with i - j < `window`.
/// A session's rows in the pass are consecutive, at consecutive positions.
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
    let sees_from = |position: usize| window.map_or(0, |w| (position + 1).saturating_sub(w));
    let work: usize = rows.iter().map(|r| r.position + 1 - sees_from(r.position)).sum::<usize>() * qd * 2;
    let rows_per_piece = (QUERIES_PER_PIECE / group).max(1);
    let mut pieces = Vec::new();
    let mut start = 0;
    while start < rows.len() {
        let cache = rows[start].cache;
        let mut end = start + 1;
        while end < rows.len() && end - start < rows_per_piece && rows[end].cache == cache {
            end += 1;
        }
        pieces.extend((0..shape.kv_heads).map(|kv_head| Piece { first_row: start, rows: end - start, kv_head }));
        start = end;
    }
    let attended = kernels.map(pieces.len(), work >= PARALLEL_MIN_MADDS, |p| {
        let Piece { first_row, rows: n, kv_head } = pieces[p];
        let mine = &rows[first_row..first_row + n];
        let cache = caches[mine[0].cache];
        let queries: Vec<f32> = (first_row..first_row + n)
            .flat_map(|t| &qkv[t * stride + kv_head * group * hd..][..group * hd])
            .copied()
            .collect();
        let (lo, hi) = (sees_from(mine[0].position), mine[n - 1].position + 1);
        let (start, mut scores) = scores(kernels, &queries, hd, cache, l, kv_head, lo, hi);
        let width = scores.len() / (n * group);
        let reach = hi - start;
        for (q, row_scores) in scores.chunks_exact_mut(width).enumerate() {
            let position = mine[q / group].position;
            let (seen_from, seen_to) = (sees_from(position) - start, position + 1 - start);
            row_scores[..seen_from].fill(0.0);
            row_scores[seen_to..].fill(0.0);
            let seen = &mut row_scores[seen_from..seen_to];
            for s in seen.iter_mut() {
                *s *= shape.scale;
            }
            softmax(seen);
        }
        // Whole panels may have scored positions past the last query's: drop their columns.
        if width > reach {
            for q in 0..n * group {
                scores.copy_within(q * width..q * width + reach, q * reach);
            }
            scores.truncate(n * group * reach);
        }
        let mut attended = vec![0f32; n * group * hd];
        kernels.weighted_rows_many(&scores, reach, &cache.values(l, kv_head)[start * hd..], hd, 0, &mut attended);
        attended
    });
    for (piece, attended) in pieces.iter().zip(attended) {
        for (r, heads) in attended.chunks_exact(group * hd).enumerate() {
            let t = piece.first_row + r;
            out[t * qd + piece.kv_head * group * hd..][..group * hd].copy_from_slice(heads);
        }
    }
}

/// The queries' scores (unscaled) against the keys of positions `lo..hi` of one KV head,
/// `queries.len() / head_dim` rows of equal width, and the position their first column is:
/// whole panels of keys are scored whole, so the rows may start before `lo` and end after
/// `hi`.
#[allow(clippy::too_many_arguments)]
fn scores(
    kernels: &Kernels,
    queries: &[f32],
    head_dim: usize,
    cache: &HostCache,
    l: usize,
    kv_head: usize,
    lo: usize,
    hi: usize,
) -> (usize, Vec<f32>) {
    let q = queries.len() / head_dim;
    let (layout, keys) = (cache.key_layout(), cache.keys(l, kv_head));
    let paneled = layout.paneled();
    let (first_panel, end_panel) = (lo / BLOCK, hi.div_ceil(BLOCK).min(paneled / BLOCK));
    let start = if first_panel < end_panel { first_panel * BLOCK } else { lo };
    let end = hi.max(end_panel * BLOCK);
    let width = end - start;
    let mut scores = vec![0f32; q * width];
    if first_panel < end_panel {
        let mut sums = vec![[0f32; BLOCK]; (end_panel - first_panel) * q];
        let panels = &keys[first_panel * BLOCK * head_dim..end_panel * BLOCK * head_dim];
        kernels.panel_products(queries, q, head_dim, panels, &mut sums);
        for (panel, sums) in sums.chunks_exact(q).enumerate() {
            for (row, sum) in scores.chunks_exact_mut(width).zip(sums) {
                row[panel * BLOCK..][..BLOCK].copy_from_slice(sum);
            }
        }
    }
    if hi > paneled {
        let from = start.max(paneled);
        let mut tail = vec![0f32; q * (hi - from)];
        let tail_keys = &keys[paneled * head_dim..];
        kernels.weighted_rows_many(queries, head_dim, tail_keys, layout.tail(), from - paneled, &mut tail);
        for (row, tail) in scores.chunks_exact_mut(width).zip(tail.chunks_exact(hi - from)) {
            row[from - start..].copy_from_slice(tail);
        }
    }
    (start, scores)
}
