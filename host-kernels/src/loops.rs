//! The loops, written once as plain safe Rust over fixed-width arrays so that the compiler
//! vectorises them, and instantiated per instruction set by the dispatching functions in
//! [`crate::kernels`]. `FUSED` selects `mul_add`, which is one instruction where the set
//! has FMA and a libm call where it does not.

use crate::isa::prefetch;
use crate::packed::{BLOCK, LINE};

#[inline(always)]
pub(crate) fn madd<const FUSED: bool>(a: f32, b: f32, c: f32) -> f32 {
    if FUSED { a.mul_add(b, c) } else { a * b + c }
}

/// A weight as stored in a panel, widened to `f32` for the arithmetic.
pub(crate) trait Weight: Copy + Send + Sync {
    fn widen(self) -> f32;
}

impl Weight for f32 {
    #[inline(always)]
    fn widen(self) -> f32 {
        self
    }
}

/// bf16 is the upper half of an f32: widening is a shift, exact, and vectorises as one.
impl Weight for u16 {
    #[inline(always)]
    fn widen(self) -> f32 {
        crate::from_bf16(self)
    }
}

/// `out[t][i] = Σ_k x[t][k] · panel[k][i]` for the rows `t` of `x` (each `k` long) and the
/// [`BLOCK`] outputs `i` of one panel, the first of `panels`. Rows go in tiles of `TILE`,
/// and the rest in one tile of its exact size (7, left by a tile of 8, goes as 4 and 3), so
/// the panel is read (and widened) once per tile. A tile sums `WIDTH` outputs at a time, so
/// that its sums stay in registers meanwhile (a tile whose sums spill stores and reloads them
/// at every multiply-add): AVX-512 holds a tile of 8 rows at the panel's full width in 16 of
/// its 32 registers, AVX2 a tile of 6 rows at half the width in 12 of its 16 (bf16 panels,
/// and f32's for a prompt's rows: [`crate::kernels`] says why).
#[inline(always)]
pub(crate) fn panel_rows<W: Weight, const FUSED: bool, const TILE: usize, const WIDTH: usize>(
    x: &[f32],
    k: usize,
    panels: &[W],
    out: &mut [[f32; BLOCK]],
) {
    let rows = out.len();
    let mut t = 0;
    while rows - t >= TILE {
        tile_at::<W, FUSED, TILE, 1, WIDTH>(x, t, k, panels, &mut out[t..t + TILE]);
        t += TILE;
    }
    // Fewer rows than a tile are fewer independent sums: each multiply-add would wait for
    // the one before it into the same register (4 cycles where 2 could issue each cycle),
    // so the inputs are split across `S` sets of sums, added at the end. Where the tiles
    // sum half a panel's width at a time (AVX2's bf16), up to three rows still go at the
    // full width, in 8-12 registers: each sweep of a panel then uses whole cache lines of
    // it, which a decode pass streams from memory.
    let halves = WIDTH < BLOCK;
    let rest = &mut out[t..];
    match (rest.len(), halves) {
        (0, _) => {}
        (1, false) => tile_at::<W, FUSED, 1, 4, BLOCK>(x, t, k, panels, rest),
        (1, true) => tile_at::<W, FUSED, 1, 2, BLOCK>(x, t, k, panels, rest),
        (2, false) => tile_at::<W, FUSED, 2, 2, BLOCK>(x, t, k, panels, rest),
        (2, true) => tile_at::<W, FUSED, 2, 1, BLOCK>(x, t, k, panels, rest),
        (3, false) => tile_at::<W, FUSED, 3, 2, BLOCK>(x, t, k, panels, rest),
        (3, true) => tile_at::<W, FUSED, 3, 1, BLOCK>(x, t, k, panels, rest),
        (4, _) => tile_at::<W, FUSED, 4, 1, WIDTH>(x, t, k, panels, rest),
        (5, _) => tile_at::<W, FUSED, 5, 1, WIDTH>(x, t, k, panels, rest),
        (6, _) => tile_at::<W, FUSED, 6, 1, WIDTH>(x, t, k, panels, rest),
        // Only a `TILE` of 8 leaves 7. (No call back into `panel_rows`: a recursive
        // function cannot be inlined into the kernel compiled for the CPU's features, and
        // out of line it would run with the baseline's, `mul_add` a libm call.)
        _ => {
            tile_at::<W, FUSED, 4, 1, WIDTH>(x, t, k, panels, &mut rest[..4]);
            tile_at::<W, FUSED, 3, 2, WIDTH>(x, t + 4, k, panels, &mut rest[4..]);
        }
    }
}

/// The tile of rows from `first` on: the panel's first tile, which prefetches, when `first`
/// is 0.
#[inline(always)]
fn tile_at<W: Weight, const FUSED: bool, const N: usize, const S: usize, const WIDTH: usize>(
    x: &[f32],
    first: usize,
    k: usize,
    panels: &[W],
    out: &mut [[f32; BLOCK]],
) {
    if first == 0 {
        tile::<W, FUSED, true, N, S, WIDTH>(x, first, k, panels, out);
    } else {
        tile::<W, FUSED, false, N, S, WIDTH>(x, first, k, panels, out);
    }
}

/// How many of a panel's rows ahead of the one being read the first sweep asks the CPU to
/// fetch. A decode pass reads each weight once, so every panel comes from memory, and with
/// the hardware prefetcher alone the sweeps wait on it; far enough ahead to cover that wait,
/// near enough that the rows are still cached when the sweep reaches them (BENCHMARKS.md has
/// the distances measured).
const DISTANCE: usize = 16;

/// Prefetches row `row` of `panels` (a panel's rows are [`BLOCK`] weights, one or two cache
/// lines), counting on past the current panel into the next one of the same piece of work,
/// which follows it in memory; past the piece's slice no hint is given.
#[inline(always)]
fn fetch_row<W: Weight>(panels: &[W], row: usize) {
    const { assert!(size_of::<W>() > 0 && size_of::<W>() <= LINE, "a weight fits a cache line") };
    let per_line = LINE / size_of::<W>();
    let mut at = row * BLOCK;
    while at < (row + 1) * BLOCK {
        prefetch(panels, at);
        at += per_line;
    }
}

/// `N` rows of one panel (the first [`BLOCK`]` · k` weights of `panels`, followed by the
/// next panels of the piece), `WIDTH` of its outputs at a time, the inputs taken `S` at a
/// time into `S` sets of sums. With `FETCH` (the panel's first tile, which is the one that
/// reads it from memory), its first sweep prefetches [`DISTANCE`] rows ahead; later tiles
/// and sweeps find the panel in L2 or L3 where it fits.
#[inline(always)]
fn tile<W: Weight, const FUSED: bool, const FETCH: bool, const N: usize, const S: usize, const WIDTH: usize>(
    x: &[f32],
    first: usize,
    k: usize,
    panels: &[W],
    out: &mut [[f32; BLOCK]],
) {
    let xs: [&[f32]; N] = std::array::from_fn(|r| &x[(first + r) * k..][..k]);
    let panel = &panels[..k * BLOCK];
    for part in 0..BLOCK / WIDTH {
        let at = part * WIDTH;
        let mut acc = [[[0f32; WIDTH]; N]; S];
        let mut groups = panel.chunks_exact(BLOCK * S);
        let mut kk = 0;
        for group in &mut groups {
            for s in 0..S {
                if FETCH && part == 0 {
                    fetch_row(panels, kk + s + DISTANCE);
                }
                let wk = &group[s * BLOCK + at..][..WIDTH];
                let mut w = [0f32; WIDTH];
                for i in 0..WIDTH {
                    w[i] = wk[i].widen();
                }
                for r in 0..N {
                    let xv = xs[r][kk + s];
                    for i in 0..WIDTH {
                        acc[s][r][i] = madd::<FUSED>(xv, w[i], acc[s][r][i]);
                    }
                }
            }
            kk += S;
        }
        for wk in groups.remainder().chunks_exact(BLOCK) {
            if FETCH && part == 0 {
                fetch_row(panels, kk + DISTANCE);
            }
            let wk = &wk[at..][..WIDTH];
            let mut w = [0f32; WIDTH];
            for i in 0..WIDTH {
                w[i] = wk[i].widen();
            }
            for r in 0..N {
                let xv = xs[r][kk];
                for i in 0..WIDTH {
                    acc[0][r][i] = madd::<FUSED>(xv, w[i], acc[0][r][i]);
                }
            }
            kk += 1;
        }
        for r in 0..N {
            for i in 0..WIDTH {
                let mut sum = acc[0][r][i];
                for set in &acc[1..] {
                    sum += set[r][i];
                }
                out[r][at + i] = sum;
            }
        }
    }
}

/// Independent partial sums in [`dot`]: addition is not associative, so the compiler keeps
/// one running sum unless it is given several.
const LANES: usize = 16;

/// `a · b` over the shorter of the two.
#[inline(always)]
pub(crate) fn dot<const FUSED: bool>(a: &[f32], b: &[f32]) -> f32 {
    let n = a.len().min(b.len());
    let (a, b) = (&a[..n], &b[..n]);
    let mut acc = [0f32; LANES];
    let mut ca = a.chunks_exact(LANES);
    let mut cb = b.chunks_exact(LANES);
    for (x, y) in (&mut ca).zip(&mut cb) {
        for i in 0..LANES {
            acc[i] = madd::<FUSED>(x[i], y[i], acc[i]);
        }
    }
    let mut tail = 0f32;
    for (x, y) in ca.remainder().iter().zip(cb.remainder()) {
        tail = madd::<FUSED>(*x, *y, tail);
    }
    acc.iter().sum::<f32>() + tail
}

/// `out[i] = Σ_r weights[r] · m[r · stride + offset + i]` for `i < out.len()`: a weighted sum
/// of rows of a row-major matrix, [`BLOCK`] outputs at a time with their sums in registers.
/// Attention's scores are this over the transposed keys (rows: dimensions; outputs:
/// positions), and its output over the values (rows: positions; outputs: dimensions).
#[inline(always)]
pub(crate) fn weighted_rows<W: Weight, const FUSED: bool>(
    weights: &[f32],
    m: &[W],
    stride: usize,
    offset: usize,
    out: &mut [f32],
) {
    let mut start = 0;
    while start < out.len() {
        let width = BLOCK.min(out.len() - start);
        if width == BLOCK {
            // As in `tile`: one set of sums would make each multiply-add wait for the one
            // before it (a chain as long as the context, for attention), so rows go four at
            // a time into four sets, each a local of its own so that it stays in registers.
            let row =
                |r: usize| -> &[W; BLOCK] { m[r * stride + offset + start..][..BLOCK].try_into().expect("a block") };
            let (mut a0, mut a1, mut a2, mut a3) = ([0f32; BLOCK], [0f32; BLOCK], [0f32; BLOCK], [0f32; BLOCK]);
            let mut groups = weights.chunks_exact(4);
            let mut r = 0;
            for g in &mut groups {
                block_madd::<W, FUSED>(&mut a0, g[0], row(r));
                block_madd::<W, FUSED>(&mut a1, g[1], row(r + 1));
                block_madd::<W, FUSED>(&mut a2, g[2], row(r + 2));
                block_madd::<W, FUSED>(&mut a3, g[3], row(r + 3));
                r += 4;
            }
            for &w in groups.remainder() {
                block_madd::<W, FUSED>(&mut a0, w, row(r));
                r += 1;
            }
            for i in 0..BLOCK {
                out[start + i] = (a0[i] + a1[i]) + (a2[i] + a3[i]);
            }
        } else {
            let mut acc = [0f32; BLOCK];
            for (r, &w) in weights.iter().enumerate() {
                part_madd::<W, FUSED>(&mut acc, w, &m[r * stride + offset + start..][..width]);
            }
            out[start..start + width].copy_from_slice(&acc[..width]);
        }
        start += width;
    }
}

/// `out[t][i] = Σ_r w[t][r] · m[r · stride + offset + i]` for the rows `t` of `w` (each
/// `reach` long; `out`'s rows `width` long): [`weighted_rows`] for several weight rows at
/// once, `TILE` at a time, so that each row of `m` is read once per tile, not once per
/// weight row. Attention's queries of one session share its keys and values this way.
#[inline(always)]
pub(crate) fn weighted_rows_many<W: Weight, const FUSED: bool, const TILE: usize>(
    w: &[f32],
    reach: usize,
    m: &[W],
    stride: usize,
    offset: usize,
    out: &mut [f32],
) {
    let n = w.len() / reach.max(1);
    if n == 0 {
        return;
    }
    let width = out.len() / n;
    let mut t = 0;
    while t < n {
        let rows = (n - t).min(TILE);
        let (w, out) = (&w[t * reach..(t + rows) * reach], &mut out[t * width..(t + rows) * width]);
        match rows {
            1 => weighted_rows::<W, FUSED>(w, m, stride, offset, out),
            2 => many_tile::<W, FUSED, 2>(w, reach, m, stride, offset, out),
            3 => many_tile::<W, FUSED, 3>(w, reach, m, stride, offset, out),
            4 => many_tile::<W, FUSED, 4>(w, reach, m, stride, offset, out),
            5 => many_tile::<W, FUSED, 5>(w, reach, m, stride, offset, out),
            6 => many_tile::<W, FUSED, 6>(w, reach, m, stride, offset, out),
            7 => many_tile::<W, FUSED, 7>(w, reach, m, stride, offset, out),
            _ => many_tile::<W, FUSED, 8>(w, reach, m, stride, offset, out),
        }
        t += rows;
    }
}

/// `N` weight rows of [`weighted_rows_many`], their sums in registers.
#[inline(always)]
fn many_tile<W: Weight, const FUSED: bool, const N: usize>(
    w: &[f32],
    reach: usize,
    m: &[W],
    stride: usize,
    offset: usize,
    out: &mut [f32],
) {
    let width = out.len() / N;
    let ws: [&[f32]; N] = std::array::from_fn(|t| &w[t * reach..][..reach]);
    let mut start = 0;
    while start < width {
        let bw = BLOCK.min(width - start);
        let mut acc = [[0f32; BLOCK]; N];
        if bw == BLOCK {
            for r in 0..reach {
                let row: &[W; BLOCK] = m[r * stride + offset + start..][..BLOCK].try_into().expect("a block");
                // The row is widened once, before the products: written as one call per weight
                // row, the compiler widened it again for each and stored sums to the stack at
                // every step. Up to 5 weight rows (a verify block's queries) their weights are
                // also gathered first, which took a third off the time at 5 rows; at 8 the
                // compiler turned that gather into code 17× slower, so larger tiles read each
                // weight where it is used (`attention_loops` bench).
                let mut wide = [0f32; BLOCK];
                for i in 0..BLOCK {
                    wide[i] = row[i].widen();
                }
                if N <= 5 {
                    let mut weights = [0f32; N];
                    for t in 0..N {
                        weights[t] = ws[t][r];
                    }
                    for t in 0..N {
                        for i in 0..BLOCK {
                            acc[t][i] = madd::<FUSED>(weights[t], wide[i], acc[t][i]);
                        }
                    }
                } else {
                    for t in 0..N {
                        let w = ws[t][r];
                        for i in 0..BLOCK {
                            acc[t][i] = madd::<FUSED>(w, wide[i], acc[t][i]);
                        }
                    }
                }
            }
        } else {
            for r in 0..reach {
                let row = &m[r * stride + offset + start..][..bw];
                for t in 0..N {
                    part_madd::<W, FUSED>(&mut acc[t], ws[t][r], row);
                }
            }
        }
        for t in 0..N {
            out[t * width + start..][..bw].copy_from_slice(&acc[t][..bw]);
        }
        start += bw;
    }
}

/// `acc[i] += w · row[i]` for the `row.len()` (under [`BLOCK`]) sums of a block's last part.
#[inline(always)]
fn part_madd<W: Weight, const FUSED: bool>(acc: &mut [f32; BLOCK], w: f32, row: &[W]) {
    for (a, &x) in acc.iter_mut().zip(row) {
        *a = madd::<FUSED>(w, x.widen(), *a);
    }
}

#[inline(always)]
fn block_madd<W: Weight, const FUSED: bool>(acc: &mut [f32; BLOCK], w: f32, row: &[W; BLOCK]) {
    for i in 0..BLOCK {
        acc[i] = madd::<FUSED>(w, row[i].widen(), acc[i]);
    }
}

/// `acc += a · x`.
#[inline(always)]
pub(crate) fn axpy<const FUSED: bool>(acc: &mut [f32], a: f32, x: &[f32]) {
    for (d, &v) in acc.iter_mut().zip(x) {
        *d = madd::<FUSED>(a, v, *d);
    }
}
