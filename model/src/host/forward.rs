//! One forward pass of the host engine over one or more sessions' runs of tokens: the
//! Llama-family decoder (norms, q/k norms, RoPE, causal attention over each session's
//! cache, gated MLP, Gemma's extra norms, scaling and soft-capping) in f32. The runs share
//! every linear layer, so a batch reads the weights once; each run attends to its own cache.

use specd_host_kernels::{Kernels, LinearScratch};

use crate::config::Activation;
use crate::host::attention::{AttentionShape, Queries, QueryRow, TreeQuery, attend};
use crate::host::cache::HostCache;
use crate::host::elementwise::{gated, soft_cap};
use crate::host::weights::HostWeights;
use crate::rope::Frequencies;
use crate::token_tree::TokenTree;

/// Activations below which the MLP's gate runs on the calling thread.
const PARALLEL_MIN_ACTIVATIONS: usize = 64 * 1024;

/// The shape numbers a pass needs.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Dims {
    pub(crate) hidden: usize,
    pub(crate) intermediate: usize,
    pub(crate) vocab: usize,
    pub(crate) eps: f32,
    pub(crate) attention: AttentionShape,
}

/// What a pass computes with.
#[derive(Debug)]
pub(crate) struct Net {
    pub(crate) weights: HostWeights,
    pub(crate) dims: Dims,
    pub(crate) rope: Frequencies,
    /// The windowed layers' RoPE where it differs from the others' (Gemma 3).
    pub(crate) local_rope: Option<Frequencies>,
    /// Each layer's sliding window, if any.
    pub(crate) windows: Vec<Option<usize>>,
    /// Embeddings are multiplied by this (Gemma's √hidden).
    pub(crate) embed_scale: Option<f32>,
    pub(crate) activation: Activation,
    /// Final logits become `cap · tanh(logits / cap)` (Gemma).
    pub(crate) logit_cap: Option<f32>,
}

/// One session's part of a pass: `tokens` appended to `cache` at positions `past..`, and
/// the logits of the last `rows` of them returned. With a `tree`, `tokens` are its nodes,
/// written to the slots `past..` but each at the position its depth gives it, seeing its
/// own path only.
#[derive(Debug)]
pub(crate) struct Run<'a> {
    pub(crate) cache: &'a mut HostCache,
    pub(crate) past: usize,
    pub(crate) tokens: &'a [u32],
    pub(crate) rows: usize,
    pub(crate) tree: Option<&'a TokenTree>,
}

/// cos and sin of each query row's position, `head_dim` each.
#[derive(Debug, Default)]
struct RotaryTables {
    cos: Vec<f32>,
    sin: Vec<f32>,
}

/// Buffers a pass writes into, kept between passes so that a step allocates little.
#[derive(Debug, Default)]
pub(crate) struct Scratch {
    x: Vec<f32>,
    normed: Vec<f32>,
    qkv: Vec<f32>,
    attn: Vec<f32>,
    projected: Vec<f32>,
    gate_up: Vec<f32>,
    gate: Vec<f32>,
    last: Vec<f32>,
    global: RotaryTables,
    local: RotaryTables,
    rows: Vec<QueryRow>,
    tree_paths: Vec<usize>,
    linear: LinearScratch,
}

/// `buffer` as `len` floats, stale where it held them before: every writer of a scratch
/// buffer writes all of it, so clearing it first would be work each pass for nothing.
fn sized(buffer: &mut Vec<f32>, len: usize) -> &mut [f32] {
    buffer.resize(len, 0.0);
    buffer
}

impl Net {
    /// Runs every run's tokens through the model, appending their keys and values to their
    /// caches, and returns each run's logits (its last `rows`, row-major), in order.
    pub(crate) fn pass(&self, k: &Kernels, runs: &mut [Run<'_>], s: &mut Scratch) -> Vec<Vec<f32>> {
        let (w, d) = (&self.weights, self.dims);
        let a = d.attention;
        let (h, hd) = (d.hidden, a.head_dim);
        let (qd, kvd) = (a.heads * hd, a.kv_heads * hd);
        let n: usize = runs.iter().map(|r| r.tokens.len()).sum();
        s.rows.clear();
        s.tree_paths.clear();
        for (cache, r) in runs.iter().enumerate() {
            let Some(tree) = r.tree else {
                let at = |t| QueryRow { cache, position: r.past + t, slot: r.past + t, tree: None };
                s.rows.extend((0..r.tokens.len()).map(at));
                continue;
            };
            for node in 0..tree.len() {
                // The path's slots from the node up, then turned root first: no list a node.
                let start = s.tree_paths.len();
                s.tree_paths.extend(tree.ancestors(node).map(|n| r.past + n));
                s.tree_paths[start..].reverse();
                let query = TreeQuery { base: r.past, start, len: s.tree_paths.len() - start };
                let (position, slot) = (r.past + tree.depth(node), r.past + node);
                s.rows.push(QueryRow { cache, position, slot, tree: Some(query) });
            }
        }
        let x = sized(&mut s.x, n * h);
        for (dst, &t) in x.chunks_exact_mut(h).zip(runs.iter().flat_map(|r| r.tokens)) {
            w.embed.row_into(t as usize, dst);
            if let Some(scale) = self.embed_scale {
                dst.iter_mut().for_each(|v| *v *= scale);
            }
        }
        rotary_tables(&self.rope, hd, &s.rows, &mut s.global);
        if let Some(local) = &self.local_rope {
            rotary_tables(local, hd, &s.rows, &mut s.local);
        }
        for (l, layer) in w.layers.iter().enumerate() {
            let tables = match (&self.local_rope, self.windows[l]) {
                (Some(_), Some(_)) => &s.local,
                _ => &s.global,
            };
            let normed = sized(&mut s.normed, n * h);
            layer.attn_norm.apply(&s.x, d.eps, normed);
            let qkv = sized(&mut s.qkv, n * (qd + 2 * kvd));
            k.linear(normed, n, &layer.qkv, layer.qkv_bias.as_deref(), qkv, &mut s.linear);
            for ((t, row), at) in qkv.chunks_exact_mut(qd + 2 * kvd).enumerate().zip(&s.rows) {
                let (q, rest) = row.split_at_mut(qd);
                let (keys, values) = rest.split_at_mut(kvd);
                if let Some((qn, kn)) = &layer.qk_norm {
                    qn.apply_in_place(q, d.eps);
                    kn.apply_in_place(keys, d.eps);
                }
                let (cos, sin) = (&tables.cos[t * hd..][..hd], &tables.sin[t * hd..][..hd]);
                for head in q.chunks_exact_mut(hd).chain(keys.chunks_exact_mut(hd)) {
                    rotate(head, cos, sin);
                }
                runs[at.cache].cache.write(l, at.slot, keys, values);
            }
            let caches: Vec<&HostCache> = runs.iter().map(|r| &*r.cache).collect();
            let attn = sized(&mut s.attn, n * qd);
            let queries = Queries { rows: &s.rows, tree_paths: &s.tree_paths };
            attend(k, a, &s.qkv, &caches, queries, l, self.windows[l], attn);
            let projected = sized(&mut s.projected, n * h);
            k.linear(attn, n, &layer.o, layer.o_bias.as_deref(), projected, &mut s.linear);
            if let Some(norm) = &layer.post_attn_norm {
                norm.apply_in_place(projected, d.eps);
            }
            add(&mut s.x, projected);
            let normed = sized(&mut s.normed, n * h);
            layer.mlp_norm.apply(&s.x, d.eps, normed);
            let i = d.intermediate;
            let gate_up = sized(&mut s.gate_up, n * 2 * i);
            k.linear(normed, n, &layer.gate_up, layer.gate_up_bias.as_deref(), gate_up, &mut s.linear);
            let gate = sized(&mut s.gate, n * i);
            // An exponential or a tanh per value: a prompt's worth is worth splitting.
            let gate_up: &[f32] = gate_up;
            k.for_each_chunk(gate, i, n * i >= PARALLEL_MIN_ACTIVATIONS, |t, g| {
                let both = &gate_up[t * 2 * i..][..2 * i];
                g.copy_from_slice(&both[..i]);
                gated(k, self.activation, g, &both[i..]);
            });
            let projected = sized(&mut s.projected, n * h);
            k.linear(gate, n, &layer.down, layer.down_bias.as_deref(), projected, &mut s.linear);
            if let Some(norm) = &layer.post_mlp_norm {
                norm.apply_in_place(projected, d.eps);
            }
            add(&mut s.x, projected);
        }
        // Each run's last rows, gathered so that the head reads its weights once.
        s.last.clear();
        let mut start = 0;
        let mut counts = Vec::with_capacity(runs.len());
        for r in runs.iter() {
            let len = r.tokens.len();
            let rows = r.rows.clamp(1, len.max(1)).min(len);
            s.last.extend_from_slice(&s.x[(start + len - rows) * h..(start + len) * h]);
            counts.push(rows);
            start += len;
        }
        let total: usize = counts.iter().sum();
        w.norm.apply_in_place(&mut s.last, d.eps);
        let mut logits = vec![0f32; total * d.vocab];
        k.linear(&s.last, total, &w.lm_head, None, &mut logits, &mut s.linear);
        if let Some(cap) = self.logit_cap {
            soft_cap(&mut logits, cap);
        }
        let mut rest = logits.as_slice();
        counts
            .into_iter()
            .map(|rows| {
                let (mine, others) = rest.split_at(rows * d.vocab);
                rest = others;
                mine.to_vec()
            })
            .collect()
    }
}

/// `x += y`.
fn add(x: &mut [f32], y: &[f32]) {
    for (a, &b) in x.iter_mut().zip(y) {
        *a += b;
    }
}

/// cos and sin of each row's position, `head_dim` each (the halves repeated, as
/// transformers concatenates the frequencies), computed in `f32` as transformers does.
fn rotary_tables(rope: &Frequencies, head_dim: usize, rows: &[QueryRow], tables: &mut RotaryTables) {
    let half = head_dim / 2;
    tables.cos.clear();
    tables.sin.clear();
    let factor = rope.attention_factor as f32;
    for row in rows {
        let pos = row.position as f32 / rope.position_scale as f32;
        for _ in 0..2 {
            for &inv in &rope.inv_freq[..half] {
                let angle = pos * inv;
                tables.cos.push(angle.cos() * factor);
                tables.sin.push(angle.sin() * factor);
            }
        }
    }
}

/// `x * cos + rotate_half(x) * sin` for one head of one position.
fn rotate(x: &mut [f32], cos: &[f32], sin: &[f32]) {
    let half = x.len() / 2;
    for i in 0..half {
        let (a, b) = (x[i], x[i + half]);
        x[i] = a * cos[i] + -b * sin[i];
        x[i + half] = b * cos[i + half] + a * sin[i + half];
    }
}
