//! The host pass's element-wise steps: norms, activations, soft-capping. Norms and
//! soft-capping cost a few microseconds a pass against the linear layers' hundreds, so they
//! stay plain loops on the calling thread; the activations and attention's softmax, an
//! exponential per value, are `specd_host_kernels`' vectorised loops, as the linear layers
//! and attention's products are.

use specd_host_kernels::Kernels;

use crate::config::Activation;

/// An RMS norm's weight, with Gemma's `1 +` already added (both then compute
/// `weight * x / sqrt(mean(x²) + eps)` in f32, as transformers does for an f32 model).
#[derive(Debug)]
pub(crate) struct Norm {
    pub(crate) weight: Vec<f32>,
}

impl Norm {
    pub(crate) fn new(mut weight: Vec<f32>, plus_one: bool) -> Self {
        if plus_one {
            for w in &mut weight {
                *w += 1.0;
            }
        }
        Self { weight }
    }

    /// Normalises each row of `x` (the weight's length) into `out`.
    pub(crate) fn apply(&self, x: &[f32], eps: f32, out: &mut [f32]) {
        let h = self.weight.len();
        for (row, dst) in x.chunks_exact(h).zip(out.chunks_exact_mut(h)) {
            let scale = inverse_rms(row, eps);
            for ((d, &v), &w) in dst.iter_mut().zip(row).zip(&self.weight) {
                *d = w * (v * scale);
            }
        }
    }

    /// Normalises each row of `x` in place.
    pub(crate) fn apply_in_place(&self, x: &mut [f32], eps: f32) {
        let h = self.weight.len();
        for row in x.chunks_exact_mut(h) {
            let scale = inverse_rms(row, eps);
            for (v, &w) in row.iter_mut().zip(&self.weight) {
                *v = w * (*v * scale);
            }
        }
    }
}

/// `1 / sqrt(mean(x²) + eps)`, the squares summed in independent lanes (in f32, as
/// transformers sums them).
fn inverse_rms(x: &[f32], eps: f32) -> f32 {
    let mut lanes = [0f32; 8];
    let mut chunks = x.chunks_exact(8);
    for c in &mut chunks {
        for i in 0..8 {
            lanes[i] += c[i] * c[i];
        }
    }
    let tail: f32 = chunks.remainder().iter().map(|v| v * v).sum();
    let mean = (lanes.iter().sum::<f32>() + tail) / x.len() as f32;
    1.0 / (mean + eps).sqrt()
}

/// `act(gate) * up` in place into `gate`, with the kernels' vectorised exponential.
pub(crate) fn gated(kernels: &Kernels, activation: Activation, gate: &mut [f32], up: &[f32]) {
    match activation {
        Activation::Silu => kernels.silu_times(gate, up),
        Activation::GeluTanh => kernels.gelu_tanh_times(gate, up),
        // The host engine refuses a model with exact GELU (`host::unsupported`): Rust's
        // standard library has no `erf`.
        Activation::Gelu => unreachable!("exact GELU is refused at load"),
    }
}

/// `cap · tanh(x / cap)` in place (Gemma's final logits).
pub(crate) fn soft_cap(x: &mut [f32], cap: f32) {
    for v in x {
        *v = (*v / cap).tanh() * cap;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn norms_activations_and_soft_capping_by_their_definitions() {
        let mut out = [0f32; 2];
        Norm::new(vec![1.0, 2.0], false).apply(&[3.0, 4.0], 0.0, &mut out);
        let rms = (12.5f32).sqrt();
        assert!((out[0] - 3.0 / rms).abs() < 1e-6 && (out[1] - 8.0 / rms).abs() < 1e-6);
        // Gemma's weight is 1 + w.
        let mut x = [3.0f32, 4.0];
        Norm::new(vec![0.0, 1.0], true).apply_in_place(&mut x, 0.0);
        assert!((x[0] - 3.0 / rms).abs() < 1e-6 && (x[1] - 8.0 / rms).abs() < 1e-6);
        for isa in specd_host_kernels::Isa::available() {
            let kernels = Kernels::with_isa(isa, 1).unwrap();
            let mut g = [0.0, 1.0];
            gated(&kernels, Activation::Silu, &mut g, &[5.0, 2.0]);
            assert!(g[0].abs() < 1e-7 && (g[1] - 2.0 / (1.0 + (-1f32).exp())).abs() < 1e-6);
            // gelu_tanh(1) = 0.841192 (torch).
            let mut g = [1.0f32];
            gated(&kernels, Activation::GeluTanh, &mut g, &[1.0]);
            assert!((g[0] - 0.841_192).abs() < 1e-5, "{}", g[0]);
        }
        let mut l = [0.0f32, 100.0];
        soft_cap(&mut l, 30.0);
        assert!(l[0] == 0.0 && (l[1] - 30.0 * (100f32 / 30.0).tanh()).abs() < 1e-5);
    }
}
