//! Causal attention of a pass's queries over their sessions' caches, in pieces that the
//! pool's threads share: each piece is one session's consecutive rows and one KV head. A
//! token tree's nodes ([`crate::TokenTree`]) sit one after another in the cache, whatever
//! their depth, and each sees the session's tokens before the tree and its own path only.

use specd_host_kernels::{BLOCK, Kernels};

use crate::host::cache::{HostCache, KvRows};

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

/// Where one query row of the pass sits: which of the pass's caches it reads, its position
/// in its sequence, and the cache slot its key and value are written to.
#[derive(Debug, Clone, Copy)]
pub(crate) struct QueryRow {
    pub(crate) cache: usize,
    /// What RoPE rotates it by and a sliding window is measured from.
    pub(crate) position: usize,
    /// Its position, except in a tree, whose nodes take the slots after the session's
    /// tokens in the order they come, while their positions follow their depths.
    pub(crate) slot: usize,
    /// `Some` for a tree's node: which of the tree's slots it sees.
    pub(crate) tree: Option<TreeQuery>,
}

/// A tree node's view: the session's tokens before the tree (the slots below `base`), and
/// the slots of its path from a root down to itself, `Queries::tree_paths[start..start +
/// len]`, ascending (a node comes after its parent).
#[derive(Debug, Clone, Copy)]
pub(crate) struct TreeQuery {
    pub(crate) base: usize,
    pub(crate) start: usize,
    pub(crate) len: usize,
}

/// A pass's query rows, and the slots its tree nodes' paths hold.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Queries<'a> {
    pub(crate) rows: &'a [QueryRow],
    pub(crate) tree_paths: &'a [usize],
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
/// head_dim` into `out`. A query at position i sees keys j ≤ i with i - j < `window`; a
/// tree node sees those of them that are before the tree or on its path. A session's rows
/// in the pass are consecutive, in consecutive slots.
#[allow(clippy::too_many_arguments)]
pub(crate) fn attend(
    kernels: &Kernels,
    shape: AttentionShape,
    qkv: &[f32],
    caches: &[&HostCache],
    queries: Queries<'_>,
    l: usize,
    window: Option<usize>,
    out: &mut [f32],
) {
    let rows = queries.rows;
    let hd = shape.head_dim;
    let (qd, kvd) = (shape.heads * hd, shape.kv_heads * hd);
    let stride = qd + 2 * kvd;
    let group = shape.heads / shape.kv_heads;
    let sees_from = |position: usize| window.map_or(0, |w| (position + 1).saturating_sub(w));
    let work: usize = rows.iter().map(|r| (r.slot + 1).saturating_sub(sees_from(r.position))).sum::<usize>() * qd * 2;
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
        let piece_queries: Vec<f32> = (first_row..first_row + n)
            .flat_map(|t| &qkv[t * stride + kv_head * group * hd..][..group * hd])
            .copied()
            .collect();
        let lo = mine.iter().map(|r| sees_from(r.position)).min().unwrap_or(0);
        let hi = mine.iter().map(|r| r.slot + 1).max().unwrap_or(0);
        // The values are read after the scores: asked for now, they come from memory while
        // the scores are computed, instead of each row stalling the weighted sum.
        match cache.values(l, kv_head).from(lo * hd) {
            KvRows::F32(values) => kernels.prefetch(&values[..(hi - lo) * hd]),
            KvRows::Bf16(values) => kernels.prefetch(&values[..(hi - lo) * hd]),
        }
        let (start, mut scores) = scores(kernels, &piece_queries, hd, cache, l, kv_head, lo, hi);
        let width = scores.len() / (n * group);
        let reach = hi - start;
        for (q, row_scores) in scores.chunks_exact_mut(width).enumerate() {
            let row = mine[q / group];
            let seen_from = sees_from(row.position) - start;
            match row.tree {
                None => {
                    let seen_to = row.position + 1 - start;
                    row_scores[..seen_from].fill(0.0);
                    row_scores[seen_to..].fill(0.0);
                    let seen = &mut row_scores[seen_from..seen_to];
                    for s in seen.iter_mut() {
                        *s *= shape.scale;
                    }
                    kernels.softmax(seen);
                }
                Some(tree) => {
                    let path = &queries.tree_paths[tree.start..][..tree.len];
                    mask_tree_row(row_scores, start, seen_from, tree.base, path, window, shape.scale);
                    kernels.softmax(row_scores);
                }
            }
        }
        // Whole panels may have scored positions past the last query's: drop their columns.
        if width > reach {
            for q in 0..n * group {
                scores.copy_within(q * width..q * width + reach, q * reach);
            }
            scores.truncate(n * group * reach);
        }
        let mut attended = vec![0f32; n * group * hd];
        match cache.values(l, kv_head).from(start * hd) {
            KvRows::F32(values) => kernels.weighted_rows_many(&scores, reach, values, hd, 0, &mut attended),
            KvRows::Bf16(values) => kernels.weighted_rows_many_bf16(&scores, reach, values, hd, 0, &mut attended),
        }
        attended
    });
    for (piece, attended) in pieces.iter().zip(attended) {
        for (r, heads) in attended.chunks_exact(group * hd).enumerate() {
            let t = piece.first_row + r;
            out[t * qd + piece.kv_head * group * hd..][..group * hd].copy_from_slice(heads);
        }
    }
}

/// Scales the scores a tree node sees and sets the others to −∞, so that a softmax over the
/// whole row gives them no weight: the columns (slots from `start`) from `seen_from` up to
/// `base` (the session's tokens before the tree, within the window), and its path's slots
/// within `window` steps of its own depth (the path's last).
fn mask_tree_row(
    row: &mut [f32],
    start: usize,
    seen_from: usize,
    base: usize,
    path: &[usize],
    window: Option<usize>,
    scale: f32,
) {
    let before_tree = base.saturating_sub(start).min(row.len());
    for (c, s) in row[..before_tree].iter_mut().enumerate() {
        *s = if c >= seen_from { *s * scale } else { f32::NEG_INFINITY };
    }
    let depth = path.len() - 1;
    let mut on_path = path.iter().enumerate().filter(|&(k, _)| window.is_none_or(|w| depth - k < w)).map(|(_, &s)| s);
    let mut next = on_path.next();
    for (c, s) in row.iter_mut().enumerate().skip(before_tree) {
        if next == Some(start + c) {
            *s *= scale;
            next = on_path.next();
        } else {
            *s = f32::NEG_INFINITY;
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
        let panels = first_panel * BLOCK * head_dim..end_panel * BLOCK * head_dim;
        match keys {
            KvRows::F32(keys) => kernels.panel_products(queries, q, head_dim, &keys[panels], &mut sums),
            KvRows::Bf16(keys) => kernels.panel_products_bf16(queries, q, head_dim, &keys[panels], &mut sums),
        }
        for (panel, sums) in sums.chunks_exact(q).enumerate() {
            for (row, sum) in scores.chunks_exact_mut(width).zip(sums) {
                row[panel * BLOCK..][..BLOCK].copy_from_slice(sum);
            }
        }
    }
    if hi > paneled {
        let from = start.max(paneled);
        let mut tail_scores = vec![0f32; q * (hi - from)];
        let (tail, offset) = (layout.tail(), from - paneled);
        match keys.from(paneled * head_dim) {
            KvRows::F32(keys) => kernels.weighted_rows_many(queries, head_dim, keys, tail, offset, &mut tail_scores),
            KvRows::Bf16(keys) => {
                kernels.weighted_rows_many_bf16(queries, head_dim, keys, tail, offset, &mut tail_scores);
            }
        }
        for (row, tail) in scores.chunks_exact_mut(width).zip(tail_scores.chunks_exact(hi - from)) {
            row[from - start..].copy_from_slice(tail);
        }
    }
    (start, scores)
}

#[cfg(test)]
mod tests {
    use specd_host_kernels::bf16_value;

    use super::*;
    use crate::host::cache::KvFormat;

    /// A bf16 cache attends as an f32 cache holding the same rounded keys and values does,
    /// on any CPU, across a panel of keys and its tail, for several queries of a KV group.
    #[test]
    fn a_bf16_cache_attends_as_an_f32_cache_of_its_rounded_values() {
        let shape = AttentionShape { heads: 4, kv_heads: 2, head_dim: 8, scale: 0.35 };
        let (kvd, qd, capacity) = (shape.kv_heads * shape.head_dim, shape.heads * shape.head_dim, BLOCK + 8);
        let wave =
            |n: usize, step: f32, phase: f32| -> Vec<f32> { (0..n).map(|i| (i as f32 * step + phase).sin()).collect() };
        let kernels = Kernels::new(1).unwrap();
        let mut f32_cache = HostCache::new(1, shape.kv_heads, shape.head_dim, capacity, KvFormat::F32).unwrap();
        let mut bf16_cache = HostCache::new(1, shape.kv_heads, shape.head_dim, capacity, KvFormat::Bf16).unwrap();
        let filled = BLOCK + 6;
        for p in 0..filled {
            let (k, v) = (wave(kvd, 0.31, p as f32), wave(kvd, 0.17, 2.0 * p as f32));
            let rounded = |x: &[f32]| -> Vec<f32> { x.iter().map(|&x| bf16_value(x)).collect() };
            f32_cache.write(0, p, &rounded(&k), &rounded(&v));
            bf16_cache.write(0, p, &k, &v);
        }
        let rows: Vec<QueryRow> =
            (filled - 3..filled).map(|p| QueryRow { cache: 0, position: p, slot: p, tree: None }).collect();
        let qkv = wave(rows.len() * (qd + 2 * kvd), 0.23, 0.5);
        let queries = Queries { rows: &rows, tree_paths: &[] };
        let attended = |cache: &HostCache| {
            let mut out = vec![f32::NAN; rows.len() * qd];
            attend(&kernels, shape, &qkv, &[cache], queries, 0, None, &mut out);
            out
        };
        let (from_f32, from_bf16) = (attended(&f32_cache), attended(&bf16_cache));
        for (i, (a, b)) in from_f32.iter().zip(&from_bf16).enumerate() {
            assert!((a - b).abs() <= 1e-5, "output {i}: {a} (f32 cache) against {b} (bf16 cache)");
        }
        // The rounding matters: the unrounded values give other outputs.
        let mut exact = HostCache::new(1, shape.kv_heads, shape.head_dim, capacity, KvFormat::F32).unwrap();
        for p in 0..filled {
            exact.write(0, p, &wave(kvd, 0.31, p as f32), &wave(kvd, 0.17, 2.0 * p as f32));
        }
        let moved = attended(&exact).iter().zip(&from_bf16).map(|(a, b)| (a - b).abs()).fold(0.0, f32::max);
        assert!(moved > 1e-4, "rounding to bf16 moved the outputs by {moved}");
    }
}
