//! The arithmetic of a pass on the host, in plain `f32` loops written so that the compiler
//! vectorises them: a tiny draft's pass is a few hundred of these, each over a few hundred
//! numbers, where a libtorch call costs more to dispatch than to compute.

/// Independent partial sums in a dot product. Floating-point addition is not associative,
/// so the compiler keeps one running sum unless it is given several: 16 fill four 4-wide
/// (or two 8-wide) vector registers and hide the adds' latency.
const LANES: usize = 16;

/// `a · b` over the shorter of the two.
pub(crate) fn dot(a: &[f32], b: &[f32]) -> f32 {
    let n = a.len().min(b.len());
    let (a, b) = (&a[..n], &b[..n]);
    let mut acc = [0f32; LANES];
    let mut ca = a.chunks_exact(LANES);
    let mut cb = b.chunks_exact(LANES);
    for (x, y) in (&mut ca).zip(&mut cb) {
        for i in 0..LANES {
            acc[i] += x[i] * y[i];
        }
    }
    let mut tail = 0f32;
    for (x, y) in ca.remainder().iter().zip(cb.remainder()) {
        tail += x * y;
    }
    acc.iter().sum::<f32>() + tail
}

/// Outputs computed together in [`linear`]: their partial sums stay in registers (eight
/// 4-wide ones) while the input is walked once, so no sum is reduced across lanes.
pub(crate) const BLOCK: usize = 32;

/// A linear layer's weight laid out for [`linear`]: the checkpoint's `out × in` matrix cut
/// into blocks of [`BLOCK`] outputs, each block stored input-major (`in × BLOCK`, the last
/// block padded with zero rows), so that a pass reads the whole weight front to back.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Packed {
    pub(crate) inputs: usize,
    pub(crate) outputs: usize,
    panels: Vec<f32>,
}

impl Packed {
    /// Packs the row-major `outputs × inputs` matrix `w`.
    pub(crate) fn new(w: &[f32], outputs: usize, inputs: usize) -> Self {
        debug_assert_eq!(w.len(), outputs * inputs);
        let blocks = outputs.div_ceil(BLOCK);
        let mut panels = vec![0f32; blocks * BLOCK * inputs];
        for (o, row) in w.chunks_exact(inputs).enumerate() {
            let (block, lane) = (o / BLOCK, o % BLOCK);
            let panel = &mut panels[block * BLOCK * inputs..][..BLOCK * inputs];
            for (k, &v) in row.iter().enumerate() {
                panel[k * BLOCK + lane] = v;
            }
        }
        Self { inputs, outputs, panels }
    }
}

/// `out[t][o] = Σ_k x[t][k] · w[o][k] (+ bias[o])` for the `rows` vectors of `x`. Each step
/// over `k` is [`BLOCK`] multiply-adds of one broadcast input into sums held in registers,
/// the form that vectorises without reductions (a dot per output would end each output
/// with a horizontal sum), and each block's panel is read once per row from the
/// first-level cache.
pub(crate) fn linear(x: &[f32], rows: usize, w: &Packed, bias: Option<&[f32]>, out: &mut [f32]) {
    let (k, out_dim) = (w.inputs, w.outputs);
    debug_assert_eq!(x.len(), rows * k);
    debug_assert_eq!(out.len(), rows * out_dim);
    for (block, panel) in w.panels.chunks_exact(BLOCK * k).enumerate() {
        let first = block * BLOCK;
        let width = BLOCK.min(out_dim - first);
        for t in 0..rows {
            let mut acc = [0f32; BLOCK];
            for (&xv, wk) in x[t * k..(t + 1) * k].iter().zip(panel.chunks_exact(BLOCK)) {
                for i in 0..BLOCK {
                    acc[i] += xv * wk[i];
                }
            }
            if let Some(b) = bias {
                for (a, &bv) in acc.iter_mut().zip(&b[first..first + width]) {
                    *a += bv;
                }
            }
            out[t * out_dim + first..][..width].copy_from_slice(&acc[..width]);
        }
    }
}

/// `out = x / sqrt(mean(x²) + eps) * weight` for each row of `x` (`weight.len()` long), the
/// mean taken in f32 as transformers takes it.
pub(crate) fn rms_norm(x: &[f32], weight: &[f32], eps: f32, out: &mut [f32]) {
    let h = weight.len();
    for (row, dst) in x.chunks_exact(h).zip(out.chunks_exact_mut(h)) {
        let mean = dot(row, row) / h as f32;
        let scale = 1.0 / (mean + eps).sqrt();
        for ((d, &v), &w) in dst.iter_mut().zip(row).zip(weight) {
            *d = w * (v * scale);
        }
    }
}

/// `silu(gate) * up` in place into `gate`.
pub(crate) fn silu_mul(gate: &mut [f32], up: &[f32]) {
    for (g, &u) in gate.iter_mut().zip(up) {
        *g = *g / (1.0 + (-*g).exp()) * u;
    }
}

/// Softmax of `scores` in place.
pub(crate) fn softmax(scores: &mut [f32]) {
    let max = scores.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let mut sum = 0f32;
    for s in scores.iter_mut() {
        *s = (*s - max).exp();
        sum += *s;
    }
    let inv = 1.0 / sum;
    for s in scores.iter_mut() {
        *s *= inv;
    }
}

/// `acc += a * x`.
pub(crate) fn axpy(acc: &mut [f32], a: f32, x: &[f32]) {
    for (d, &v) in acc.iter_mut().zip(x) {
        *d += a * v;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dot_matches_a_plain_sum_over_lengths_around_the_lanes() {
        for n in [0, 1, 15, 16, 17, 33, 128, 130] {
            let a: Vec<f32> = (0..n).map(|i| (i as f32 * 0.37).sin()).collect();
            let b: Vec<f32> = (0..n).map(|i| (i as f32 * 0.11).cos()).collect();
            let plain: f64 = a.iter().zip(&b).map(|(x, y)| f64::from(*x) * f64::from(*y)).sum();
            assert!((f64::from(dot(&a, &b)) - plain).abs() < 1e-4, "n = {n}");
        }
    }

    #[test]
    fn linear_is_x_times_w_transposed_plus_bias() {
        // x: 2 × 3, w: 2 × 3 (out_dim 2).
        let x = [1.0, 2.0, 3.0, -1.0, 0.5, 0.0];
        let w = [1.0, 0.0, 1.0, 0.0, 2.0, -1.0];
        let mut out = [0f32; 4];
        linear(&x, 2, &Packed::new(&w, 2, 3), Some(&[10.0, 20.0]), &mut out);
        assert_eq!(out, [14.0, 21.0, 9.0, 21.0]);
    }

    #[test]
    fn linear_agrees_with_dots_across_whole_blocks_and_a_tail() {
        let (rows, k, out_dim) = (3, 37, 2 * BLOCK + 5);
        let x: Vec<f32> = (0..rows * k).map(|i| (i as f32 * 0.13).sin()).collect();
        let w: Vec<f32> = (0..out_dim * k).map(|i| (i as f32 * 0.07).cos()).collect();
        let bias: Vec<f32> = (0..out_dim).map(|i| i as f32).collect();
        let mut out = vec![0f32; rows * out_dim];
        linear(&x, rows, &Packed::new(&w, out_dim, k), Some(&bias), &mut out);
        for t in 0..rows {
            for o in 0..out_dim {
                let want = dot(&x[t * k..(t + 1) * k], &w[o * k..(o + 1) * k]) + bias[o];
                assert!((out[t * out_dim + o] - want).abs() < 1e-4, "row {t}, output {o}");
            }
        }
    }

    #[test]
    fn rms_norm_and_softmax_and_silu_by_their_definitions() {
        let mut out = [0f32; 2];
        rms_norm(&[3.0, 4.0], &[1.0, 2.0], 0.0, &mut out);
        let rms = (12.5f32).sqrt();
        assert!((out[0] - 3.0 / rms).abs() < 1e-6 && (out[1] - 8.0 / rms).abs() < 1e-6);
        let mut s = [0.0, (2f32).ln()];
        softmax(&mut s);
        assert!((s[0] - 1.0 / 3.0).abs() < 1e-6 && (s[1] - 2.0 / 3.0).abs() < 1e-6);
        let mut g = [0.0, 1.0];
        silu_mul(&mut g, &[5.0, 2.0]);
        assert!(g[0].abs() < 1e-7 && (g[1] - 2.0 / (1.0 + (-1f32).exp())).abs() < 1e-6);
    }
}
