//! One forward pass of the host engine over a session's run of tokens: the Llama decoder
//! (RMS norms, RoPE, causal attention over the session's cache, SiLU MLP) in `f32` on the
//! calling thread.

use crate::host::cache::HostCache;
use crate::host::kernels::{BLOCK, axpy, linear, rms_norm, silu_mul, softmax};
use crate::host::weights::HostWeights;
use crate::rope::Frequencies;

/// The shape numbers a pass needs.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Dims {
    pub(crate) hidden: usize,
    pub(crate) intermediate: usize,
    pub(crate) heads: usize,
    pub(crate) kv_heads: usize,
    pub(crate) head_dim: usize,
    pub(crate) vocab: usize,
    pub(crate) eps: f32,
}

/// Buffers a pass writes into, kept between passes so that a step allocates nothing.
#[derive(Debug, Default)]
pub(crate) struct Scratch {
    x: Vec<f32>,
    normed: Vec<f32>,
    qkv: Vec<f32>,
    attn: Vec<f32>,
    projected: Vec<f32>,
    gate_up: Vec<f32>,
    gate: Vec<f32>,
    scores: Vec<f32>,
    cos: Vec<f32>,
    sin: Vec<f32>,
}

/// `buffer` as `len` floats, stale where it held them before: every writer of a scratch
/// buffer writes all of it, so clearing it first would be work each pass for nothing.
fn sized(buffer: &mut Vec<f32>, len: usize) -> &mut [f32] {
    buffer.resize(len, 0.0);
    buffer
}

/// What a pass computes with: the weights and the shape, RoPE and window of each layer.
#[derive(Debug)]
pub(crate) struct Net {
    pub(crate) weights: HostWeights,
    pub(crate) dims: Dims,
    pub(crate) rope: Frequencies,
    /// Each layer's sliding window, if any.
    pub(crate) windows: Vec<Option<usize>>,
}

impl Net {
    /// Appends `tokens` at positions `past..` to `cache` and returns the logits of the last
    /// `rows` of them, row-major.
    pub(crate) fn pass(
        &self,
        cache: &mut HostCache,
        past: usize,
        tokens: &[u32],
        rows: usize,
        s: &mut Scratch,
    ) -> Vec<f32> {
        let (w, d, rope, windows) = (&self.weights, self.dims, &self.rope, &self.windows);
        let n = tokens.len();
        let h = d.hidden;
        let (qd, kvd) = (d.heads * d.head_dim, d.kv_heads * d.head_dim);
        let x = sized(&mut s.x, n * h);
        for (dst, &t) in x.chunks_exact_mut(h).zip(tokens) {
            dst.copy_from_slice(&w.embed[t as usize * h..(t as usize + 1) * h]);
        }
        rotary_tables(rope, d.head_dim, past, n, &mut s.cos, &mut s.sin);
        for (l, layer) in w.layers.iter().enumerate() {
            let normed = sized(&mut s.normed, n * h);
            rms_norm(&s.x, &layer.attn_norm, d.eps, normed);
            let qkv = sized(&mut s.qkv, n * (qd + 2 * kvd));
            linear(normed, n, &layer.qkv, layer.qkv_bias.as_deref(), qkv);
            for (t, row) in qkv.chunks_exact_mut(qd + 2 * kvd).enumerate() {
                let (cos, sin) = (&s.cos[t * d.head_dim..][..d.head_dim], &s.sin[t * d.head_dim..][..d.head_dim]);
                for head in row[..qd + kvd].chunks_exact_mut(d.head_dim) {
                    rotate(head, cos, sin);
                }
                cache.write(l, past + t, &row[qd..qd + kvd], &row[qd + kvd..]);
            }
            let attn = sized(&mut s.attn, n * qd);
            attend(d, &s.qkv, cache, l, past, n, windows[l], &mut s.scores, attn);
            let projected = sized(&mut s.projected, n * h);
            linear(attn, n, &layer.o, layer.o_bias.as_deref(), projected);
            axpy(&mut s.x, 1.0, projected);
            let normed = sized(&mut s.normed, n * h);
            rms_norm(&s.x, &layer.mlp_norm, d.eps, normed);
            let i = d.intermediate;
            let gate_up = sized(&mut s.gate_up, n * 2 * i);
            linear(normed, n, &layer.gate_up, layer.gate_up_bias.as_deref(), gate_up);
            let gate = sized(&mut s.gate, n * i);
            for (g, both) in gate.chunks_exact_mut(i).zip(gate_up.chunks_exact(2 * i)) {
                g.copy_from_slice(&both[..i]);
                silu_mul(g, &both[i..]);
            }
            let projected = sized(&mut s.projected, n * h);
            linear(gate, n, &layer.down, layer.down_bias.as_deref(), projected);
            axpy(&mut s.x, 1.0, projected);
        }
        let rows = rows.clamp(1, n);
        let last = &s.x[(n - rows) * h..];
        let normed = sized(&mut s.normed, rows * h);
        rms_norm(last, &w.norm, d.eps, normed);
        let mut logits = vec![0f32; rows * d.vocab];
        linear(normed, rows, &w.lm_head, None, &mut logits);
        logits
    }
}

/// cos and sin of positions `past..past + n`, `head_dim` each (the halves repeated, as
/// transformers concatenates the frequencies), computed in `f32` as transformers does.
fn rotary_tables(rope: &Frequencies, head_dim: usize, past: usize, n: usize, cos: &mut Vec<f32>, sin: &mut Vec<f32>) {
    let half = head_dim / 2;
    cos.clear();
    sin.clear();
    let factor = rope.attention_factor as f32;
    for t in 0..n {
        let pos = (past + t) as f32 / rope.position_scale as f32;
        for _ in 0..2 {
            for &inv in &rope.inv_freq[..half] {
                let angle = pos * inv;
                cos.push(angle.cos() * factor);
                sin.push(angle.sin() * factor);
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

/// Causal attention of the run's queries (in `qkv`'s rows) over the cache of layer `l`,
/// which already holds the run's own keys and values; writes `n × heads × head_dim`.
#[allow(clippy::too_many_arguments)]
fn attend(
    d: Dims,
    qkv: &[f32],
    cache: &HostCache,
    l: usize,
    past: usize,
    n: usize,
    window: Option<usize>,
    scores: &mut Vec<f32>,
    out: &mut [f32],
) {
    let hd = d.head_dim;
    let (qd, kvd) = (d.heads * hd, d.kv_heads * hd);
    let group = d.heads / d.kv_heads;
    let scale = 1.0 / (hd as f32).sqrt();
    let values = cache.values(l);
    for t in 0..n {
        let pos = past + t;
        // A query at i sees keys j ≤ i with i - j < window.
        let first = window.map_or(0, |w| (pos + 1).saturating_sub(w));
        let q_row = &qkv[t * (qd + 2 * kvd)..][..qd];
        for head in 0..d.heads {
            let kv = head / group;
            let s = sized(scores, pos + 1 - first);
            weighted_rows(&q_row[head * hd..][..hd], cache.keys(l, kv), cache.capacity(), first, s);
            for x in s.iter_mut() {
                *x *= scale;
            }
            softmax(s);
            let o = &mut out[t * qd + head * hd..][..hd];
            weighted_rows(s, &values[first * kvd + kv * hd..], kvd, 0, o);
        }
    }
}

/// `out[i] = Σ_r weights[r] · m[r · stride + offset + i]` for `i < out.len()`: a weighted sum
/// of rows of a row-major matrix, [`BLOCK`] outputs at a time with their sums in registers.
/// Scores are this over the transposed keys (rows: dimensions; outputs: positions), and
/// attention's output over the values (rows: positions; outputs: dimensions).
fn weighted_rows(weights: &[f32], m: &[f32], stride: usize, offset: usize, out: &mut [f32]) {
    let mut start = 0;
    while start < out.len() {
        let width = BLOCK.min(out.len() - start);
        let mut acc = [0f32; BLOCK];
        if width == BLOCK {
            for (r, &w) in weights.iter().enumerate() {
                let row = &m[r * stride + offset + start..][..BLOCK];
                for i in 0..BLOCK {
                    acc[i] += w * row[i];
                }
            }
        } else {
            for (r, &w) in weights.iter().enumerate() {
                let row = &m[r * stride + offset + start..][..width];
                for (a, &x) in acc.iter_mut().zip(row) {
                    *a += w * x;
                }
            }
        }
        out[start..start + width].copy_from_slice(&acc[..width]);
        start += width;
    }
}
