//! Loops over the whole vocabulary (V up to 128k+), written so that they run fast.
//!
//! f64 addition is not reassociated by the compiler, so a plain running sum over V waits on
//! every add. Eight independent accumulators let the adds overlap and vectorise. Sampling
//! skips whole blocks by their sum and walks only the block where the draw lands.
//!
//! The loops a row's distribution runs are `#[inline(always)]`: a function compiled for a
//! wider instruction set ([`crate::effective_distribution`]'s copies) widens only the code
//! inlined into it, and a call would run the baseline's.

const LANES: usize = 8;
const BLOCK: usize = 512;

/// Σ weight(i) for i in `range`.
#[inline(always)]
pub(crate) fn lane_sum(range: std::ops::Range<usize>, weight: impl Fn(usize) -> f64) -> f64 {
    let mut acc = [0.0f64; LANES];
    let mut i = range.start;
    while i + LANES <= range.end {
        for (j, a) in acc.iter_mut().enumerate() {
            *a += weight(i + j);
        }
        i += LANES;
    }
    let mut tail = 0.0;
    while i < range.end {
        tail += weight(i);
        i += 1;
    }
    acc.iter().sum::<f64>() + tail
}

/// The largest of `values` (-inf when empty), NaN-free values assumed. A running maximum
/// waits on every comparison, as a running sum waits on every add; eight lanes let them
/// overlap and vectorise.
#[inline(always)]
pub(crate) fn lane_max<S: Copy + Into<f64>>(values: &[S]) -> f64 {
    let mut acc = [f64::NEG_INFINITY; LANES];
    let chunks = values.chunks_exact(LANES);
    let tail = chunks.remainder().iter().fold(f64::NEG_INFINITY, |m, &v| m.max(v.into()));
    for chunk in chunks {
        for (a, &v) in acc.iter_mut().zip(chunk) {
            let v = v.into();
            *a = if v > *a { v } else { *a };
        }
    }
    acc.iter().fold(tail, |m, &a| m.max(a))
}

/// (Σ min(p, q), Σ max(0, p - q)) in one pass: the acceptance probability β of a position
/// and the residual mass, which are read together at a rejection.
#[inline]
pub(crate) fn overlap_and_excess(p: &[f64], q: &[f64]) -> (f64, f64) {
    let n = p.len().min(q.len());
    let (p, q) = (&p[..n], &q[..n]);
    let mut overlap = [0.0f64; LANES];
    let mut excess = [0.0f64; LANES];
    let (p_chunks, q_chunks) = (p.chunks_exact(LANES), q.chunks_exact(LANES));
    let (p_tail, q_tail) = (p_chunks.remainder(), q_chunks.remainder());
    for (cp, cq) in p_chunks.zip(q_chunks) {
        for j in 0..LANES {
            let (x, y) = (cp[j], cq[j]);
            let m = if x < y { x } else { y };
            overlap[j] += m;
            excess[j] += x - m;
        }
    }
    let mut tail = (0.0, 0.0);
    for (&x, &y) in p_tail.iter().zip(q_tail) {
        tail.0 += x.min(y);
        tail.1 += (x - y).max(0.0);
    }
    (overlap.iter().sum::<f64>() + tail.0, excess.iter().sum::<f64>() + tail.1)
}

/// Inverse-CDF draw of an index in 0..n with probability weight(i) / total, `u` in [0, 1).
/// Never returns an index of zero weight; when rounding leaves the threshold past the end,
/// the last index of positive weight is returned. `None` when every weight is zero.
pub(crate) fn sample_index(n: usize, weight: impl Fn(usize) -> f64, total: f64, u: f64) -> Option<usize> {
    let threshold = u * total;
    let mut running = 0.0;
    let mut last_positive = None;
    let mut start = 0;
    while start < n {
        let end = (start + BLOCK).min(n);
        let block_sum = lane_sum(start..end, &weight);
        if running + block_sum <= threshold && end < n {
            if block_sum > 0.0 {
                last_positive = Some(start);
            }
            running += block_sum;
            start = end;
            continue;
        }
        for i in start..end {
            let w = weight(i);
            if w <= 0.0 {
                continue;
            }
            running += w;
            last_positive = Some(i);
            if threshold < running {
                return last_positive;
            }
        }
        start = end;
    }
    // `last_positive` may point at the start of a skipped block (a positive weight exists
    // there); find the exact last positive index.
    last_positive.map(|from| (from..n).rev().find(|&i| weight(i) > 0.0).unwrap_or(from))
}

/// e^x for x ≤ 0 (or -inf), within 1 ulp of libm's `exp` (a test checks 2 million points),
/// 0 below -708 (where libm's results are below 3.4e-308), NaN for NaN. Inlined, with no
/// branch and no call, so that a row's values vectorise: a call to libm's `exp` for each
/// was most of the time a row of logits took to become a distribution (BENCHMARKS.md).
#[inline(always)]
pub(crate) fn exp_nonpositive(x: f64) -> f64 {
    // x = k·ln 2 + r with |r| ≤ ln 2 / 2, ln 2 split so that k·LN2_HI is exact (fdlibm's).
    const LN2_HI: f64 = 6.931_471_803_691_238e-1;
    const LN2_LO: f64 = 1.908_214_929_270_587_7e-10;
    const INV_LN2: f64 = std::f64::consts::LOG2_E;
    // Adding 1.5·2^52 rounds to an integer, which is then the low bits of the sum.
    const ROUND: f64 = 6_755_399_441_055_744.0;
    const SMALLEST: f64 = -708.0;
    let clamped = if x < SMALLEST { SMALLEST } else { x };
    let shifted = clamped * INV_LN2 + ROUND;
    let k = shifted - ROUND;
    let r = (clamped - k * LN2_HI) - k * LN2_LO;
    // Taylor to r^13: the first term left out is under 5e-18 at |r| = ln 2 / 2. The terms
    // from r^2 on are summed in Estrin's order (pairs, then pairs of pairs with r^2, r^4, r^8)
    // rather than Horner's: each value then waits on a chain of about 10 dependent operations
    // instead of 26, so a row's values overlap in the CPU. The terms 1 and r are added last,
    // Horner's way, because summed in Estrin's order their rounding reaches 2 ulp.
    const C: [f64; 12] = [
        0.5,
        1.0 / 6.0,
        1.0 / 24.0,
        1.0 / 120.0,
        1.0 / 720.0,
        1.0 / 5_040.0,
        1.0 / 40_320.0,
        1.0 / 362_880.0,
        1.0 / 3_628_800.0,
        1.0 / 39_916_800.0,
        1.0 / 479_001_600.0,
        1.0 / 6_227_020_800.0,
    ];
    let r2 = r * r;
    let r4 = r2 * r2;
    let r8 = r4 * r4;
    let pair = |i: usize| C[i] + C[i + 1] * r;
    // Σ r^(n-2) / n! for n = 2..=13.
    let beyond_linear = pair(0) + r2 * pair(2) + r4 * (pair(4) + r2 * pair(6)) + r8 * (pair(8) + r2 * pair(10));
    let p = 1.0 + (r + r2 * beyond_linear);
    // 2^k from its exponent bits: k is in -1021..=0 here, so 2^k is a normal number.
    let k_bits = (shifted.to_bits() as i64).wrapping_sub(ROUND.to_bits() as i64);
    let scale = f64::from_bits(((k_bits + 1023) as u64) << 52);
    let e = p * scale;
    if x < SMALLEST { 0.0 } else { e }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exp_of_nonpositive_numbers_is_libms_within_one_ulp() {
        // A dense grid over [-708, 0], the numbers near 0 where r is tiny, and the ends.
        let grid = (0..=2_000_000).map(|i| -708.0 * f64::from(i) / 2_000_000.0);
        let near_zero = (1..200).map(|i| -(0.5f64.powi(i)));
        let mut worst = 0u64;
        for x in grid.chain(near_zero).chain([-0.0, -1e-300, -0.346_573_590_279_972_6, -0.346_573_590_279_973]) {
            let (got, want) = (exp_nonpositive(x), x.exp());
            // Apart in representable numbers: both are positive, so their bits order them.
            let ulps = (got.to_bits() as i64 - want.to_bits() as i64).unsigned_abs();
            worst = worst.max(ulps);
            assert!(ulps <= 1, "e^{x}: {got} against libm's {want} ({ulps} ulp)");
        }
        assert!(worst > 0, "not a single difference from libm: the test would not see one");
        assert_eq!(exp_nonpositive(0.0), 1.0);
        assert_eq!(exp_nonpositive(-0.0), 1.0);
        for x in [-708.01, -709.0, -745.2, -1e300, f64::NEG_INFINITY] {
            assert_eq!(exp_nonpositive(x), 0.0, "e^{x}");
        }
        assert!(exp_nonpositive(f64::NAN).is_nan());
    }

    #[test]
    fn lane_max_matches_a_plain_maximum() {
        for n in [0, 1, 7, 8, 9, 1037] {
            let v: Vec<f32> = (0..n).map(|i| ((i * 37) % 101) as f32 - 50.0 - (i as f32) * 1e-3).collect();
            let plain = v.iter().fold(f64::NEG_INFINITY, |m, &x| m.max(f64::from(x)));
            assert_eq!(lane_max(&v), plain, "{n} values");
        }
        assert_eq!(lane_max(&[f64::NEG_INFINITY; 12]), f64::NEG_INFINITY);
    }

    #[test]
    fn lane_sum_matches_plain_sum() {
        let w: Vec<f64> = (0..1037).map(|i| (i % 13) as f64 * 0.25).collect();
        let plain: f64 = w.iter().sum();
        assert!((lane_sum(0..w.len(), |i| w[i]) - plain).abs() < 1e-9);
        assert_eq!(lane_sum(3..3, |i| w[i]), 0.0);
    }

    #[test]
    fn overlap_and_excess_match_plain_sums() {
        let a: Vec<f64> = (0..1001).map(|i| (i % 5) as f64).collect();
        let b: Vec<f64> = (0..1001).map(|i| (i % 3) as f64).collect();
        let overlap: f64 = a.iter().zip(&b).map(|(x, y)| x.min(*y)).sum();
        let excess: f64 = a.iter().zip(&b).map(|(x, y)| (x - y).max(0.0)).sum();
        assert_eq!(overlap_and_excess(&a, &b), (overlap, excess));
    }

    #[test]
    fn sampling_matches_a_plain_walk_across_blocks() {
        let n = 3 * BLOCK + 17;
        let w: Vec<f64> = (0..n).map(|i| if i % 7 == 0 { 0.0 } else { ((i * 31) % 11) as f64 }).collect();
        let total: f64 = w.iter().sum();
        for k in 0..2000 {
            let u = k as f64 / 2000.0;
            let mut running = 0.0;
            let expected = (0..n).find(|&i| {
                running += w[i];
                w[i] > 0.0 && u * total < running
            });
            let got = sample_index(n, |i| w[i], total, u);
            let got_w = got.map(|i| w[i]);
            assert!(got_w.is_some_and(|x| x > 0.0));
            // Block sums may round differently from a running sum only at exact boundaries.
            let e = expected.unwrap();
            assert!(got.unwrap().abs_diff(e) <= 1, "u = {u}: {got:?} vs {e}");
        }
        assert_eq!(sample_index(n, |_| 0.0, 1.0, 0.5), None);
        let last = (0..n).rev().find(|&i| w[i] > 0.0);
        assert_eq!(sample_index(n, |i| w[i], total * 2.0, 0.99), last, "threshold past the end");
    }
}
