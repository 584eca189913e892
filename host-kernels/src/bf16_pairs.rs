//! Linear layers over [`WeightFormat::Bf16Pairs`](crate::WeightFormat::Bf16Pairs) panels:
//! the inputs rounded to bf16 pairs once per layer ([`round_pairs`]), then multiplied by
//! `vdpbf16ps` where the CPU has it, or by the same products widened to `f32` elsewhere
//! ([`panels`]).
//!
//! A prompt's pass is bound by its products: one bf16 instruction computes 32 of them (two
//! per lane) where an `f32` multiply-add computes 16. This module allows
//! `unsafe` for what the intrinsics need beyond the feature check `crate::isa` makes: loading
//! and storing vectors from slices whose lengths were checked, and viewing a vector's bits
//! as bf16 pairs.

use crate::isa::{Isa, Level, dispatched, prefetch};
use crate::loops::Weight;
use crate::packed::{BLOCK, LINE, to_bf16};

/// `x` (`rows × k`) rounded to bf16, two inputs to a `u32` (input `2j` in the low half,
/// `2j + 1` in the high, zero past the last), into `out` (`rows × ⌈k / 2⌉`).
///
/// A verify pass rounds a few thousand inputs a layer on the calling thread while the
/// pool's helpers wait, so the rounding is compiled per instruction set, to vectorise.
pub(crate) fn round_pairs(isa: Isa, x: &[f32], rows: usize, k: usize, out: &mut Vec<u32>) {
    out.resize(rows * k.div_ceil(2), 0);
    round_rows(isa, x, rows, k, out);
}

dispatched! {
    fn round_rows(x: &[f32], rows: usize, k: usize, out: &mut [u32]) {
        avx512 => round_rows_of(x, rows, k, out),
        avx2 => round_rows_of(x, rows, k, out),
        baseline => round_rows_of(x, rows, k, out),
    }
}

#[inline(always)]
fn round_rows_of(x: &[f32], rows: usize, k: usize, out: &mut [u32]) {
    let pairs = k.div_ceil(2);
    for (row, dst) in x.chunks_exact(k).take(rows).zip(out.chunks_exact_mut(pairs)) {
        let mut values = row.chunks_exact(2);
        for (d, p) in dst.iter_mut().zip(&mut values) {
            *d = u32::from(to_bf16(p[0])) | (u32::from(to_bf16(p[1])) << 16);
        }
        if let [last] = values.remainder() {
            dst[pairs - 1] = u32::from(to_bf16(*last));
        }
    }
}

/// `sums[p · rows + t][i] = Σ_j x[t][j] · panels[p][j][i]` for each pair panel `p` and each
/// of the `rows` rows of `x` (pairs from [`round_pairs`], `pairs` a row).
pub(crate) fn panels(isa: Isa, x: &[u32], pairs: usize, rows: usize, panels: &[u16], sums: &mut [[f32; BLOCK]]) {
    match isa.0 {
        #[cfg(target_arch = "x86_64")]
        Level::Avx512Bf16 => {
            // SAFETY: an `Isa` at this level exists only after `is_x86_feature_detected!`
            // reported AVX-512 F, BW, VL and BF16 (`Isa::available`).
            #[allow(unsafe_code)]
            unsafe {
                products::each_panel(x, pairs, rows, panels, sums);
            }
        }
        _ => widened(isa, x, pairs, rows, panels, sums),
    }
}

dispatched! {
    fn widened(x: &[u32], pairs: usize, rows: usize, panels: &[u16], sums: &mut [[f32; BLOCK]]) {
        avx512 => widened_panels(x, pairs, rows, panels, sums),
        avx2 => widened_panels(x, pairs, rows, panels, sums),
        baseline => widened_panels(x, pairs, rows, panels, sums),
    }
}

/// The products of [`panels`] one row at a time, each pair widened to `f32`: exact products
/// (eight bits of significand times eight), each added in the order Intel's manual gives
/// for `vdpbf16ps`, the high input's first. For CPUs without bf16 instructions, and in the
/// tests as the instruction's reference.
#[inline(always)]
fn widened_panels(x: &[u32], pairs: usize, rows: usize, panels: &[u16], sums: &mut [[f32; BLOCK]]) {
    for (p, out) in sums.chunks_exact_mut(rows).enumerate() {
        let panel = &panels[p * BLOCK * 2 * pairs..][..BLOCK * 2 * pairs];
        for (t, sum) in out.iter_mut().enumerate() {
            let mut acc = [0f32; BLOCK];
            for (&xp, w) in x[t * pairs..][..pairs].iter().zip(panel.chunks_exact(BLOCK * 2)) {
                let (x0, x1) = ((xp as u16).widen(), ((xp >> 16) as u16).widen());
                for i in 0..BLOCK {
                    acc[i] += x1 * w[2 * i + 1].widen();
                    acc[i] += x0 * w[2 * i].widen();
                }
            }
            *sum = acc;
        }
    }
}

#[cfg(target_arch = "x86_64")]
mod products {
    use std::arch::x86_64::{
        __m512, __m512bh, __m512i, _mm512_add_ps, _mm512_dpbf16_ps, _mm512_loadu_si512, _mm512_set1_epi32,
        _mm512_setzero_ps, _mm512_storeu_ps,
    };

    use super::{BLOCK, LINE, prefetch};

    /// A pair row of a panel: [`BLOCK`] outputs × two inputs, two vectors.
    const PAIR_ROW: usize = BLOCK * 2;

    /// How many pair rows ahead of the one being read a panel's first tile asks the CPU to
    /// fetch: the same bytes ahead as the widening loops' distance (`crate::loops`).
    const DISTANCE: usize = 8;

    /// Rows a tile multiplies by each pair row it loads: two sums a row, 16 of the 32
    /// registers, with the two weight vectors and a broadcast input beside them. At 64 rows a
    /// pass runs near one instruction a cycle already, so larger tiles have little to gain
    /// (BENCHMARKS.md).
    const TILE: usize = 8;

    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512bf16")]
    pub(super) fn each_panel(x: &[u32], pairs: usize, rows: usize, panels: &[u16], sums: &mut [[f32; BLOCK]]) {
        for (p, out) in sums.chunks_exact_mut(rows).enumerate() {
            let panels = &panels[p * PAIR_ROW * pairs..];
            let mut t = 0;
            while rows - t >= TILE {
                tile_at::<TILE, 1>(x, t, pairs, panels, &mut out[t..t + TILE]);
                t += TILE;
            }
            // Fewer rows than a tile have fewer independent sums: each instruction would wait
            // for the one before it into the same register, so the pairs are split across
            // sets of sums, added at the end (as `crate::loops` does).
            let rest = &mut out[t..];
            match rest.len() {
                0 => {}
                1 => tile_at::<1, 4>(x, t, pairs, panels, rest),
                2 => tile_at::<2, 2>(x, t, pairs, panels, rest),
                3 => tile_at::<3, 2>(x, t, pairs, panels, rest),
                4 => tile_at::<4, 1>(x, t, pairs, panels, rest),
                5 => tile_at::<5, 1>(x, t, pairs, panels, rest),
                6 => tile_at::<6, 1>(x, t, pairs, panels, rest),
                _ => tile_at::<7, 1>(x, t, pairs, panels, rest),
            }
        }
    }

    /// The tile of rows from `first` on: the panel's first tile, which prefetches, when
    /// `first` is 0.
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512bf16")]
    fn tile_at<const N: usize, const S: usize>(
        x: &[u32],
        first: usize,
        pairs: usize,
        panels: &[u16],
        out: &mut [[f32; BLOCK]],
    ) {
        if first == 0 {
            tile::<N, S, true>(x, first, pairs, panels, out);
        } else {
            tile::<N, S, false>(x, first, pairs, panels, out);
        }
    }

    /// `N` rows of one panel (the first `pairs` pair rows of `panels`, followed by the next
    /// panels of the piece), the pairs taken `S` at a time into `S` sets of sums.
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512bf16")]
    fn tile<const N: usize, const S: usize, const FETCH: bool>(
        x: &[u32],
        first: usize,
        pairs: usize,
        panels: &[u16],
        out: &mut [[f32; BLOCK]],
    ) {
        let xs: [&[u32]; N] = std::array::from_fn(|r| &x[(first + r) * pairs..][..pairs]);
        let panel = &panels[..pairs * PAIR_ROW];
        let mut acc = [[[_mm512_setzero_ps(); 2]; N]; S];
        let mut groups = panel.chunks_exact(PAIR_ROW * S);
        let mut j = 0;
        for group in &mut groups {
            for s in 0..S {
                if FETCH {
                    fetch(panels, j + s + DISTANCE);
                }
                let row = &group[s * PAIR_ROW..][..PAIR_ROW];
                let (low, high) = (load(&row[..BLOCK]), load(&row[BLOCK..]));
                for r in 0..N {
                    let xv = broadcast(xs[r][j + s]);
                    acc[s][r][0] = _mm512_dpbf16_ps(acc[s][r][0], xv, low);
                    acc[s][r][1] = _mm512_dpbf16_ps(acc[s][r][1], xv, high);
                }
            }
            j += S;
        }
        for row in groups.remainder().chunks_exact(PAIR_ROW) {
            if FETCH {
                fetch(panels, j + DISTANCE);
            }
            let (low, high) = (load(&row[..BLOCK]), load(&row[BLOCK..]));
            for r in 0..N {
                let xv = broadcast(xs[r][j]);
                acc[0][r][0] = _mm512_dpbf16_ps(acc[0][r][0], xv, low);
                acc[0][r][1] = _mm512_dpbf16_ps(acc[0][r][1], xv, high);
            }
            j += 1;
        }
        for r in 0..N {
            for half in 0..2 {
                let mut sum = acc[0][r][half];
                for set in &acc[1..] {
                    sum = _mm512_add_ps(sum, set[r][half]);
                }
                store(&mut out[r][half * 16..][..16], sum);
            }
        }
    }

    /// Prefetches pair row `row` of `panels` (two cache lines).
    #[inline(always)]
    fn fetch(panels: &[u16], row: usize) {
        prefetch(panels, row * PAIR_ROW);
        prefetch(panels, row * PAIR_ROW + LINE / 2);
    }

    /// The 32 bf16 values of `w` (16 lanes of two).
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512bf16")]
    fn load(w: &[u16]) -> __m512bh {
        let w: &[u16; BLOCK] = w.try_into().expect("a vector of bf16 values");
        // SAFETY: reads the 64 bytes of `w`; any bits are a vector of bf16 values.
        #[allow(unsafe_code)]
        unsafe {
            std::mem::transmute::<__m512i, __m512bh>(_mm512_loadu_si512(w.as_ptr().cast()))
        }
    }

    /// A pair of bf16 inputs in every lane.
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512bf16")]
    fn broadcast(pair: u32) -> __m512bh {
        // SAFETY: a 512-bit integer vector and a vector of bf16 values are the same 64
        // bytes, any bits valid in either.
        #[allow(unsafe_code)]
        unsafe {
            std::mem::transmute::<__m512i, __m512bh>(_mm512_set1_epi32(pair as i32))
        }
    }

    /// Writes the 16 sums of `v` to `out`.
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512bf16")]
    fn store(out: &mut [f32], v: __m512) {
        let out: &mut [f32; 16] = out.try_into().expect("16 sums");
        // SAFETY: writes the 64 bytes of `out`.
        #[allow(unsafe_code)]
        unsafe {
            _mm512_storeu_ps(out.as_mut_ptr(), v);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Each instruction set's rounding gives `to_bf16`'s bits, pairs packed low input first,
    /// an odd row's last pair holding one input: over ties (both ways), NaN, infinities,
    /// zeros of both signs, subnormals and values that round up into the next exponent.
    #[test]
    fn round_pairs_gives_to_bf16s_bits_on_every_instruction_set() {
        let mut x = vec![
            1.0f32,
            f32::from_bits(0x3f80_8000),
            f32::from_bits(0x3f81_8000),
            f32::from_bits(0x3f7f_ffff),
            f32::NAN,
            -f32::NAN,
            f32::INFINITY,
            f32::NEG_INFINITY,
            0.0,
            -0.0,
            f32::from_bits(1),
            f32::MAX,
            -1.5e-3,
        ];
        x.extend((0..40).map(|i| (i as f32 * 0.77).sin() * 10f32.powi(i % 7 - 3)));
        let k = 13;
        let rows = x.len() / k;
        let x = &x[..rows * k];
        let want: Vec<u32> = x
            .chunks_exact(k)
            .flat_map(|row| {
                row.chunks(2).map(|p| u32::from(to_bf16(p[0])) | p.get(1).map_or(0, |&v| u32::from(to_bf16(v)) << 16))
            })
            .collect();
        for isa in Isa::available() {
            let mut got = vec![7u32; 3];
            round_pairs(isa, x, rows, k, &mut got);
            assert_eq!(got, want, "{}", isa.name());
        }
    }
}
