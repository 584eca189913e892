//! The pass's steps built on `eˣ`: attention's softmax and the MLP's gated activations
//! (SiLU, and GELU's tanh approximation). A verify pass of a few tokens computes tens of
//! thousands of exponentials; the standard library's `exp` is a call per value that the
//! compiler cannot vectorise, so here `eˣ` is a polynomial written as plain arithmetic,
//! which [`crate::kernels`] compiles per instruction set like the other loops.
//!
//! The polynomial is Cephes' `expf` (S. L. Moshier): `x = n ln 2 + r` with `|r| ≤ ln 2 / 2`,
//! `eʳ` by a degree-7 polynomial, `2ⁿ` put in the exponent's bits. Its error is within
//! two units in the last place of `f32` over the whole range (the tests check it against
//! the standard library's), far inside the 1e-4 that the host engine's parity with
//! transformers allows.

use crate::loops::madd;

/// Above this `eˣ` overflows `f32`.
const HIGH: f32 = 88.722_83;
/// Below this `eˣ` is under the smallest normal `f32`: it is taken as 0 (the standard
/// library's `exp` goes on through the subnormals, up to 1.2e-38 away).
const LOW: f32 = -87.336_54;
/// `ln 2` split in two, the first part exact in few bits, so that `x - n ln 2` loses
/// nothing for the `n` that arise.
const LN2_HIGH: f32 = 0.693_359_4;
const LN2_LOW: f32 = -2.121_944_4e-4;
/// Adding and subtracting `1.5 · 2²³` rounds an `f32` below 2²² to the nearest integer.
const ROUNDER: f32 = 12_582_912.0;
/// Cephes' coefficients of `(eʳ - 1 - r) / r²`, highest degree first.
const COEFFICIENTS: [f32; 6] = [1.987_569_1e-4, 1.398_199_9e-3, 8.333_452e-3, 4.166_579_6e-2, 1.666_666_5e-1, 0.5];

/// `eˣ`: within two ulps of the exact value, 0 below [`LOW`], `∞` above [`HIGH`], NaN for
/// NaN. Every branch is a select, so a loop over it vectorises.
#[inline(always)]
pub(crate) fn exp<const FUSED: bool>(x: f32) -> f32 {
    // A NaN stays NaN through what follows, whose integer steps then read meaningless but
    // harmless bits: the last select returns the NaN itself.
    let clamped = x.clamp(LOW, HIGH);
    let rounded = clamped * std::f32::consts::LOG2_E + ROUNDER;
    let n = rounded - ROUNDER;
    let r = madd::<FUSED>(n, -LN2_LOW, madd::<FUSED>(n, -LN2_HIGH, clamped));
    let mut p = COEFFICIENTS[0];
    for &c in &COEFFICIENTS[1..] {
        p = madd::<FUSED>(p, r, c);
    }
    let er = madd::<FUSED>(p, r * r, r) + 1.0;
    // n lies in -126..=128 here, and `rounded`'s low bits hold it: read that way, not by
    // `n as i32`, whose saturating conversion the compiler does one value at a time. 2ⁿ
    // goes into an f32's exponent bits in two halves, so that 2¹²⁸ (x just under HIGH) is
    // never formed.
    // For a NaN `n` is meaningless, so the arithmetic on it wraps rather than overflows.
    let n = rounded.to_bits().wrapping_sub(ROUNDER.to_bits()) as i32;
    let half = n >> 1;
    let scale_a = f32::from_bits((half.wrapping_add(127) as u32) << 23);
    let scale_b = f32::from_bits((n.wrapping_sub(half).wrapping_add(127) as u32) << 23);
    let y = er * scale_a * scale_b;
    if x.is_nan() {
        x
    } else if x < LOW {
        0.0
    } else if x > HIGH {
        f32::INFINITY
    } else {
        y
    }
}

/// Softmax of `scores` in place. The maximum and the sum are kept in independent lanes, so
/// that they vectorise too: the sum's order differs from a left-to-right one by rounding
/// alone.
#[inline(always)]
pub(crate) fn softmax<const FUSED: bool>(scores: &mut [f32]) {
    const LANES: usize = 16;
    let mut maxima = [f32::NEG_INFINITY; LANES];
    let mut chunks = scores.chunks_exact(LANES);
    for c in &mut chunks {
        for i in 0..LANES {
            maxima[i] = maxima[i].max(c[i]);
        }
    }
    let max = chunks.remainder().iter().chain(&maxima).copied().fold(f32::NEG_INFINITY, f32::max);
    let mut sums = [0f32; LANES];
    let mut chunks = scores.chunks_exact_mut(LANES);
    for c in &mut chunks {
        for i in 0..LANES {
            c[i] = exp::<FUSED>(c[i] - max);
            sums[i] += c[i];
        }
    }
    let mut sum = 0f32;
    for s in chunks.into_remainder() {
        *s = exp::<FUSED>(*s - max);
        sum += *s;
    }
    let inverse = 1.0 / (sums.iter().sum::<f32>() + sum);
    for s in scores.iter_mut() {
        *s *= inverse;
    }
}

/// `silu(gate) · up` into `gate`: `g / (1 + e⁻ᵍ) · u`.
#[inline(always)]
pub(crate) fn silu_times<const FUSED: bool>(gate: &mut [f32], up: &[f32]) {
    for (g, &u) in gate.iter_mut().zip(up) {
        *g = *g / (1.0 + exp::<FUSED>(-*g)) * u;
    }
}

/// `gelu_tanh(gate) · up` into `gate`, torch's tanh approximation
/// `0.5 x (1 + tanh(√(2/π) (x + 0.044715 x³)))`, computed as `x / (1 + e^(-2z))` with `z` the
/// tanh's argument: the same function, since `(1 + tanh z) / 2 = 1 / (1 + e^(-2z))`.
#[inline(always)]
pub(crate) fn gelu_tanh_times<const FUSED: bool>(gate: &mut [f32], up: &[f32]) {
    // √(2/π).
    const K: f32 = 0.797_884_6;
    for (g, &u) in gate.iter_mut().zip(up) {
        let x = *g;
        let z = K * madd::<FUSED>(0.044_715 * x * x, x, x);
        *g = x / (1.0 + exp::<FUSED>(-2.0 * z)) * u;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// How many representable `f32` values lie between `a` and `b` (both finite, same sign).
    fn ulps(a: f32, b: f32) -> u32 {
        a.to_bits().abs_diff(b.to_bits())
    }

    #[test]
    fn exp_is_within_two_ulps_of_the_standard_librarys_over_its_range() {
        let mut worst = (0u32, 0f32);
        let steps = 400_000;
        for i in 0..=steps {
            let x = LOW + (HIGH - LOW) * i as f32 / steps as f32;
            for fused in [true, false] {
                let got = if fused { exp::<true>(x) } else { exp::<false>(x) };
                let want = x.exp();
                // Only normal results: below LOW the polynomial's answer is 0 on purpose.
                if want >= f32::MIN_POSITIVE && want.is_finite() {
                    let d = ulps(got, want);
                    if d > worst.0 {
                        worst = (d, x);
                    }
                }
            }
        }
        assert!(worst.0 <= 2, "{} ulps at x = {}", worst.0, worst.1);
    }

    #[test]
    fn exp_of_the_edges_and_of_nan() {
        assert_eq!(exp::<true>(0.0), 1.0);
        assert_eq!(exp::<true>(f32::NEG_INFINITY), 0.0);
        assert_eq!(exp::<true>(-1000.0), 0.0);
        assert_eq!(exp::<true>(f32::INFINITY), f32::INFINITY);
        assert_eq!(exp::<true>(89.0), f32::INFINITY);
        assert!(exp::<true>(f32::NAN).is_nan());
        let top = exp::<true>(HIGH);
        assert!(top.is_finite() && ulps(top, HIGH.exp()) <= 2, "{top} against {}", HIGH.exp());
    }

    #[test]
    fn softmax_and_the_activations_match_their_definitions() {
        let scores: Vec<f32> = (0..37).map(|i| (i as f32 * 0.7).sin() * 9.0).collect();
        let mut got = scores.clone();
        softmax::<true>(&mut got);
        let max = scores.iter().copied().fold(f32::NEG_INFINITY, f32::max);
        let total: f64 = scores.iter().map(|&s| f64::from(s - max).exp()).sum();
        for (g, &s) in got.iter().zip(&scores) {
            let want = f64::from(s - max).exp() / total;
            assert!((f64::from(*g) - want).abs() <= 1e-6 * want.max(1e-3), "{g} against {want}");
        }
        // Masked scores (−∞) get no weight.
        let mut masked = [0.0, f32::NEG_INFINITY, 2f32.ln()];
        softmax::<false>(&mut masked);
        assert!(masked[1] == 0.0 && (masked[0] - 1.0 / 3.0).abs() < 1e-6 && (masked[2] - 2.0 / 3.0).abs() < 1e-6);

        let gate: Vec<f32> = (0..50).map(|i| (i as f32 - 25.0) * 0.41).collect();
        let up: Vec<f32> = (0..50).map(|i| (i as f32 * 0.3).cos()).collect();
        let mut silu = gate.clone();
        silu_times::<true>(&mut silu, &up);
        let mut gelu = gate.clone();
        gelu_tanh_times::<true>(&mut gelu, &up);
        for i in 0..gate.len() {
            let (x, u) = (f64::from(gate[i]), f64::from(up[i]));
            let want_silu = x / (1.0 + (-x).exp()) * u;
            let k = (2.0 / std::f64::consts::PI).sqrt();
            let want_gelu = 0.5 * x * (1.0 + (k * (x + 0.044_715 * x * x * x)).tanh()) * u;
            assert!((f64::from(silu[i]) - want_silu).abs() <= 1e-5, "silu at {x}: {} against {want_silu}", silu[i]);
            assert!((f64::from(gelu[i]) - want_gelu).abs() <= 1e-5, "gelu at {x}: {} against {want_gelu}", gelu[i]);
        }
    }
}
