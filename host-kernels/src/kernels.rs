//! [`Kernels`]: the operations a host pass calls, run with the CPU's widest instruction set
//! and, for the linear layers, split by panels across a pool of threads.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock, PoisonError};

use crate::bf16_pairs;
use crate::error::KernelError;
use crate::exponentials;
use crate::isa::{Isa, dispatched, prefetch};
use crate::loops;
use crate::packed::{BLOCK, LINE, PackedMatrix, Panels};
use crate::pool::HotPool;

/// Work below which a linear layer runs on the calling thread: handing it to the pool costs
/// a few microseconds, as much as this many multiply-adds.
const PARALLEL_MIN_MADDS: usize = 32 * 1024;

/// Pieces per thread a linear layer is cut into, so that a thread slowed by something else
/// on its core leaves its last pieces to the others.
const PIECES_PER_THREAD: usize = 3;

/// An instruction set and a pool of threads ([`HotPool`]): the calling thread takes a share
/// of each parallel step, and the pool's helpers stay awake from one step to the next.
///
/// Pools are shared by every `Kernels` of one thread count in the process, where two pools
/// would each spin on the cores the other's pass needs: a step of a second host model that
/// finds the pool busy with the first's runs on its own thread alone.
#[derive(Debug, Clone)]
pub struct Kernels {
    isa: Isa,
    threads: usize,
    pool: Option<Arc<HotPool>>,
}

/// The process's pools, by thread count.
fn shared_pool(threads: usize) -> Result<Arc<HotPool>, KernelError> {
    static POOLS: OnceLock<Mutex<HashMap<usize, Arc<HotPool>>>> = OnceLock::new();
    let mut pools = POOLS.get_or_init(Mutex::default).lock().unwrap_or_else(PoisonError::into_inner);
    if let Some(pool) = pools.get(&threads) {
        return Ok(Arc::clone(pool));
    }
    let pool = Arc::new(HotPool::new(threads)?);
    pools.insert(threads, Arc::clone(&pool));
    Ok(pool)
}

/// A linear layer's partial sums (panel-major) and, for bf16 pair panels, its inputs
/// rounded to bf16 pairs: kept between calls so that a pass allocates nothing.
#[derive(Debug, Default)]
pub struct LinearScratch {
    sums: Vec<[f32; BLOCK]>,
    pairs: Vec<u32>,
}

impl Kernels {
    /// The CPU's widest instruction set and `threads` threads (at least one: the caller's).
    pub fn new(threads: usize) -> Result<Self, KernelError> {
        Self::with_isa(Isa::detect(), threads)
    }

    /// `isa` (one of [`Isa::available`]) and `threads` threads.
    pub fn with_isa(isa: Isa, threads: usize) -> Result<Self, KernelError> {
        let threads = threads.max(1);
        let pool = if threads > 1 { Some(shared_pool(threads)?) } else { None };
        Ok(Self { isa, threads, pool })
    }

    pub fn isa(&self) -> Isa {
        self.isa
    }

    pub fn threads(&self) -> usize {
        self.threads
    }

    /// Runs `op`, a pass whose steps these kernels split: the pool's helpers stay awake
    /// from one step to the next until it returns, and sleep soon after.
    pub fn pass<R>(&self, op: impl FnOnce() -> R) -> R {
        match &self.pool {
            Some(pool) => pool.pass(op),
            None => op(),
        }
    }

    /// `f(index, piece)` for each piece, across the pool when `parallel` (and there is one),
    /// else in order on the calling thread.
    ///
    /// Only the parallel path gathers the pieces: a layer run on the calling thread, as most
    /// of a draft's are, allocates nothing.
    fn each_piece<'a, T: Send + 'a>(
        &self,
        pieces: impl ExactSizeIterator<Item = &'a mut [T]>,
        parallel: bool,
        f: impl Fn(usize, &mut [T]) + Sync,
    ) {
        match &self.pool {
            Some(pool) if parallel && pieces.len() > 1 => {
                // Each piece is taken by exactly one task; the lock only hands it over.
                let pieces: Vec<Mutex<&mut [T]>> = pieces.map(Mutex::new).collect();
                pool.run(pieces.len(), &|i| {
                    let mut piece = pieces[i].lock().unwrap_or_else(PoisonError::into_inner);
                    f(i, &mut piece);
                });
            }
            _ => pieces.enumerate().for_each(|(i, piece)| f(i, piece)),
        }
    }

    /// `out[t][o] = Σ_k x[t][k] · w[o][k] (+ bias[o])` for the `rows` vectors of `x`.
    ///
    /// # Panics
    /// If `x`, `out` or `bias` do not have the lengths `rows` and `w` give them.
    pub fn linear(
        &self,
        x: &[f32],
        rows: usize,
        w: &PackedMatrix,
        bias: Option<&[f32]>,
        out: &mut [f32],
        scratch: &mut LinearScratch,
    ) {
        let (k, outputs, blocks) = (w.inputs, w.outputs, w.blocks());
        assert_eq!(x.len(), rows * k, "{rows} inputs of {k}");
        assert_eq!(out.len(), rows * outputs, "{rows} outputs of {outputs}");
        if let Some(b) = bias {
            assert_eq!(b.len(), outputs, "a bias of {outputs}");
        }
        if rows == 0 {
            return;
        }
        if k == 0 {
            // No inputs: every output is its bias.
            for row in out.chunks_exact_mut(outputs.max(1)) {
                match bias {
                    Some(b) => row.copy_from_slice(b),
                    None => row.fill(0.0),
                }
            }
            return;
        }
        let LinearScratch { sums, pairs } = scratch;
        sums.resize(blocks * rows, [0.0; BLOCK]);
        if let Panels::Bf16Pairs(_) = w.panels {
            bf16_pairs::round_pairs(self.isa, x, rows, k, pairs);
        }
        let (isa, pairs, panel_len) = (self.isa, &*pairs, w.panel_len());
        let run = |first_block: usize, sums: &mut [[f32; BLOCK]]| {
            let count = sums.len() / rows;
            let at = first_block * panel_len..(first_block + count) * panel_len;
            match &w.panels {
                Panels::F32(p) => panels_f32(isa, x, k, rows, &p.as_slice()[at], sums),
                Panels::Bf16(p) => panels_bf16(isa, x, k, rows, &p.as_slice()[at], sums),
                Panels::Bf16Pairs(p) => bf16_pairs::panels(isa, pairs, k.div_ceil(2), rows, &p.as_slice()[at], sums),
            }
        };
        let parallel = self.pool.is_some() && rows * k * outputs >= PARALLEL_MIN_MADDS;
        let per = if parallel { blocks.div_ceil(self.threads * PIECES_PER_THREAD).max(1) } else { blocks };
        self.each_piece(sums.chunks_mut(per * rows), parallel, |piece, s| run(piece * per, s));
        for (block, sums) in sums.chunks_exact(rows).enumerate() {
            let first = block * BLOCK;
            let width = BLOCK.min(outputs - first);
            for (t, sum) in sums.iter().enumerate() {
                let dst = &mut out[t * outputs + first..][..width];
                dst.copy_from_slice(&sum[..width]);
                if let Some(b) = bias {
                    for (d, &bv) in dst.iter_mut().zip(&b[first..first + width]) {
                        *d += bv;
                    }
                }
            }
        }
    }

    /// Calls `f(index, piece)` for each `chunk`-long piece of `data` (the last may be
    /// shorter): across the pool's threads when `parallel` and there is a pool, else in order
    /// on the calling thread. For work whose pieces are independent, as attention's heads are.
    pub fn for_each_chunk<T: Send>(
        &self,
        data: &mut [T],
        chunk: usize,
        parallel: bool,
        f: impl Fn(usize, &mut [T]) + Sync + Send,
    ) {
        self.each_piece(data.chunks_mut(chunk.max(1)), parallel, f);
    }

    /// `f(i)` for `i < n`, in order, on the pool's threads when `parallel` (and the pool has
    /// more than one).
    pub fn map<R: Send>(&self, n: usize, parallel: bool, f: impl Fn(usize) -> R + Sync) -> Vec<R> {
        match &self.pool {
            Some(pool) if parallel && n > 1 => {
                let results: Vec<Mutex<Option<R>>> = (0..n).map(|_| Mutex::new(None)).collect();
                pool.run(n, &|i| {
                    let result = f(i);
                    *results[i].lock().unwrap_or_else(PoisonError::into_inner) = Some(result);
                });
                results
                    .into_iter()
                    .map(|r| r.into_inner().unwrap_or_else(PoisonError::into_inner).expect("every task ran"))
                    .collect()
            }
            _ => (0..n).map(f).collect(),
        }
    }

    /// `a · b` over the shorter of the two.
    pub fn dot(&self, a: &[f32], b: &[f32]) -> f32 {
        dot(self.isa, a, b)
    }

    /// `out[i] = Σ_r weights[r] · m[r · stride + offset + i]` for `i < out.len()`.
    ///
    /// # Panics
    /// If `m` is too short for `weights.len()` rows of that stride.
    pub fn weighted_rows(&self, weights: &[f32], m: &[f32], stride: usize, offset: usize, out: &mut [f32]) {
        weighted_rows(self.isa, weights, m, stride, offset, out);
    }

    /// `sums[p · rows + t][i] = Σ_j x[t][j] · panels[p][j][i]` for each panel `p` of
    /// `panels` (`k × BLOCK` floats each, input-major, as a [`PackedMatrix`] keeps them) and
    /// each of the `rows` vectors of `x` (`k` long), on the calling thread: the loop of
    /// [`Self::linear`], over panels laid out by the caller (attention's keys).
    ///
    /// # Panics
    /// If `x` or `sums` do not have the lengths `rows`, `k` and the panels give them.
    pub fn panel_products(&self, x: &[f32], rows: usize, k: usize, panels: &[f32], sums: &mut [[f32; BLOCK]]) {
        assert_eq!(x.len(), rows * k, "{rows} inputs of {k}");
        assert_eq!(sums.len() * BLOCK * k, panels.len() * rows, "a sum per panel and row");
        if rows > 0 && k > 0 {
            panels_f32(self.isa, x, k, rows, panels, sums);
        }
    }

    /// [`Self::panel_products`] over panels of bf16 values (`to_bf16`'s bits), widened to
    /// f32 as they are read: attention's keys in a bf16 cache.
    ///
    /// # Panics
    /// As [`Self::panel_products`].
    pub fn panel_products_bf16(&self, x: &[f32], rows: usize, k: usize, panels: &[u16], sums: &mut [[f32; BLOCK]]) {
        assert_eq!(x.len(), rows * k, "{rows} inputs of {k}");
        assert_eq!(sums.len() * BLOCK * k, panels.len() * rows, "a sum per panel and row");
        if rows > 0 && k > 0 {
            panels_bf16(self.isa, x, k, rows, panels, sums);
        }
    }

    /// `out[t][i] = Σ_r weights[t][r] · m[r · stride + offset + i]` for each row `t` of
    /// `weights` (rows `reach` long; `out` holds as many rows, of equal width): the rows of
    /// `m` are read once for several weight rows.
    ///
    /// # Panics
    /// If `m` is too short for `reach` rows of that stride.
    pub fn weighted_rows_many(
        &self,
        weights: &[f32],
        reach: usize,
        m: &[f32],
        stride: usize,
        offset: usize,
        out: &mut [f32],
    ) {
        weighted_rows_many(self.isa, weights, reach, m, stride, offset, out);
    }

    /// [`Self::weighted_rows_many`] over a matrix of bf16 values (`to_bf16`'s bits), widened
    /// to f32 as they are read: attention's values, and a tail of its keys, in a bf16 cache.
    ///
    /// # Panics
    /// As [`Self::weighted_rows_many`].
    pub fn weighted_rows_many_bf16(
        &self,
        weights: &[f32],
        reach: usize,
        m: &[u16],
        stride: usize,
        offset: usize,
        out: &mut [f32],
    ) {
        weighted_rows_many_bf16(self.isa, weights, reach, m, stride, offset, out);
    }

    /// `acc += a · x`.
    pub fn axpy(&self, acc: &mut [f32], a: f32, x: &[f32]) {
        axpy(self.isa, acc, a, x);
    }

    /// Asks the CPU to start bringing every cache line of `data` into its caches: for data
    /// that a step will read soon, after other work, such as attention's values while its
    /// scores are computed.
    pub fn prefetch<T>(&self, data: &[T]) {
        let per_line = (LINE / size_of::<T>().max(1)).max(1);
        for at in (0..data.len()).step_by(per_line) {
            prefetch(data, at);
        }
    }

    /// Softmax of `scores` in place; scores of −∞ get weight 0.
    pub fn softmax(&self, scores: &mut [f32]) {
        softmax(self.isa, scores);
    }

    /// `silu(gate[i]) · up[i]` into `gate[i]`, over the shorter of the two.
    pub fn silu_times(&self, gate: &mut [f32], up: &[f32]) {
        silu_times(self.isa, gate, up);
    }

    /// `gelu_tanh(gate[i]) · up[i]` into `gate[i]` (torch's tanh approximation of GELU), over
    /// the shorter of the two.
    pub fn gelu_tanh_times(&self, gate: &mut [f32], up: &[f32]) {
        gelu_tanh_times(self.isa, gate, up);
    }
}

/// Rows from which f32 panels on AVX2 go in half-width tiles of 6 (`panels_f32`).
const HALF_WIDTH_F32_ROWS: usize = 16;

// Inlined into each dispatched arm below, so that it is compiled with the arm's features:
// out of line it would be compiled for the baseline, `mul_add` a libm call.
#[inline(always)]
fn each_panel<W: loops::Weight, const FUSED: bool, const TILE: usize, const WIDTH: usize>(
    x: &[f32],
    k: usize,
    rows: usize,
    panels: &[W],
    sums: &mut [[f32; BLOCK]],
) {
    for (p, out) in sums.chunks_exact_mut(rows).enumerate() {
        loops::panel_rows::<W, FUSED, TILE, WIDTH>(x, k, &panels[p * BLOCK * k..], out);
    }
}

dispatched! {
    fn panels_f32(x: &[f32], k: usize, rows: usize, panels: &[f32], sums: &mut [[f32; BLOCK]]) {
        avx512 => each_panel::<f32, true, 8, 32>(x, k, rows, panels, sums),
        // An f32 panel's row is two cache lines: swept in halves (as bf16 is below), each
        // half read every other line from memory, and a decode pass took 10-20 % longer
        // than at the full width, where the sums spill to the stack. A prompt's many rows
        // reuse each panel from the cache across their tiles, and there the halves took
        // 20 % less time (64 rows).
        avx2 => {
            if rows >= HALF_WIDTH_F32_ROWS {
                each_panel::<f32, true, 6, 16>(x, k, rows, panels, sums);
            } else {
                each_panel::<f32, true, 4, 32>(x, k, rows, panels, sums);
            }
        },
        baseline => each_panel::<f32, false, 4, 32>(x, k, rows, panels, sums),
    }
}

dispatched! {
    fn panels_bf16(x: &[f32], k: usize, rows: usize, panels: &[u16], sums: &mut [[f32; BLOCK]]) {
        avx512 => each_panel::<u16, true, 8, 32>(x, k, rows, panels, sums),
        // A bf16 panel's row is one cache line, which the first half's sweep brings in whole.
        avx2 => each_panel::<u16, true, 6, 16>(x, k, rows, panels, sums),
        baseline => each_panel::<u16, false, 4, 32>(x, k, rows, panels, sums),
    }
}

dispatched! {
    fn dot(a: &[f32], b: &[f32]) -> f32 {
        avx512 => loops::dot::<true>(a, b),
        avx2 => loops::dot::<true>(a, b),
        baseline => loops::dot::<false>(a, b),
    }
}

dispatched! {
    fn weighted_rows(weights: &[f32], m: &[f32], stride: usize, offset: usize, out: &mut [f32]) {
        avx512 => loops::weighted_rows::<f32, true>(weights, m, stride, offset, out),
        avx2 => loops::weighted_rows::<f32, true>(weights, m, stride, offset, out),
        baseline => loops::weighted_rows::<f32, false>(weights, m, stride, offset, out),
    }
}

dispatched! {
    fn weighted_rows_many(weights: &[f32], reach: usize, m: &[f32], stride: usize, offset: usize, out: &mut [f32]) {
        avx512 => loops::weighted_rows_many::<f32, true, 8>(weights, reach, m, stride, offset, out),
        avx2 => loops::weighted_rows_many::<f32, true, 4>(weights, reach, m, stride, offset, out),
        baseline => loops::weighted_rows_many::<f32, false, 4>(weights, reach, m, stride, offset, out),
    }
}

dispatched! {
    fn weighted_rows_many_bf16(weights: &[f32], reach: usize, m: &[u16], stride: usize, offset: usize, out: &mut [f32]) {
        avx512 => loops::weighted_rows_many::<u16, true, 8>(weights, reach, m, stride, offset, out),
        avx2 => loops::weighted_rows_many::<u16, true, 4>(weights, reach, m, stride, offset, out),
        baseline => loops::weighted_rows_many::<u16, false, 4>(weights, reach, m, stride, offset, out),
    }
}

dispatched! {
    fn softmax(scores: &mut [f32]) {
        avx512 => exponentials::softmax::<true>(scores),
        avx2 => exponentials::softmax::<true>(scores),
        baseline => exponentials::softmax::<false>(scores),
    }
}

dispatched! {
    fn silu_times(gate: &mut [f32], up: &[f32]) {
        avx512 => exponentials::silu_times::<true>(gate, up),
        avx2 => exponentials::silu_times::<true>(gate, up),
        baseline => exponentials::silu_times::<false>(gate, up),
    }
}

dispatched! {
    fn gelu_tanh_times(gate: &mut [f32], up: &[f32]) {
        avx512 => exponentials::gelu_tanh_times::<true>(gate, up),
        avx2 => exponentials::gelu_tanh_times::<true>(gate, up),
        baseline => exponentials::gelu_tanh_times::<false>(gate, up),
    }
}

dispatched! {
    fn axpy(acc: &mut [f32], a: f32, x: &[f32]) {
        avx512 => loops::axpy::<true>(acc, a, x),
        avx2 => loops::axpy::<true>(acc, a, x),
        baseline => loops::axpy::<false>(acc, a, x),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::packed::WeightFormat;

    fn wave(n: usize, step: f32) -> Vec<f32> {
        (0..n).map(|i| (i as f32 * step).sin()).collect()
    }

    /// `x · wᵀ + bias` in f64, row by row.
    fn reference(x: &[f32], rows: usize, w: &[f32], outputs: usize, bias: &[f32]) -> Vec<f64> {
        let k = x.len() / rows;
        let mut out = Vec::new();
        for t in 0..rows {
            for o in 0..outputs {
                let s: f64 = (0..k).map(|j| f64::from(x[t * k + j]) * f64::from(w[o * k + j])).sum();
                out.push(s + f64::from(bias[o]));
            }
        }
        out
    }

    #[test]
    fn linear_matches_a_plain_product_for_every_set_format_tile_and_thread_count() {
        // Rows 1..=13 cover every tile (4, 6 and 8) and remainder, and two whole tiles; 17
        // and 20 the half-width tiles of a prompt's f32 rows on AVX2; 2 blocks and a tail of
        // outputs; 37 inputs are no multiple of anything.
        let (k, outputs) = (37, 2 * BLOCK + 5);
        let w = wave(outputs * k, 0.07);
        let bias = wave(outputs, 0.5);
        for isa in Isa::available() {
            for threads in [1, 2, 3] {
                let kernels = Kernels::with_isa(isa, threads).unwrap();
                for format in [WeightFormat::F32, WeightFormat::Bf16, WeightFormat::Bf16Pairs] {
                    let packed = PackedMatrix::new(&w, outputs, k, format);
                    // bf16 weights are compared with their own rounded values, and pair
                    // panels' products with the rounded inputs too.
                    let wr: Vec<f32> =
                        if format.is_bf16() { w.iter().copied().map(crate::bf16_value).collect() } else { w.clone() };
                    let mut scratch = LinearScratch::default();
                    for rows in (1..=13).chain([17, 20]) {
                        let x = wave(rows * k, 0.13);
                        let mut out = vec![f32::NAN; rows * outputs];
                        kernels.linear(&x, rows, &packed, Some(&bias), &mut out, &mut scratch);
                        let xr: Vec<f32> = if format == WeightFormat::Bf16Pairs {
                            x.iter().copied().map(crate::bf16_value).collect()
                        } else {
                            x
                        };
                        let want = reference(&xr, rows, &wr, outputs, &bias);
                        for (i, (&got, &want)) in out.iter().zip(&want).enumerate() {
                            assert!(
                                (f64::from(got) - want).abs() < 1e-4,
                                "{} × {threads} threads, {format:?}, {rows} rows, value {i}: {got} ≠ {want}",
                                isa.name()
                            );
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn a_layer_without_inputs_gives_its_bias() {
        let packed = PackedMatrix::new(&[], 3, 0, WeightFormat::F32);
        let mut out = [f32::NAN; 6];
        Kernels::new(2).unwrap().linear(
            &[],
            2,
            &packed,
            Some(&[1.0, 2.0, 3.0]),
            &mut out,
            &mut LinearScratch::default(),
        );
        assert_eq!(out, [1.0, 2.0, 3.0, 1.0, 2.0, 3.0]);
    }

    #[test]
    fn a_layer_large_enough_to_split_gives_the_same_values_on_one_thread_and_on_three() {
        let (rows, k, outputs) = (3, 384, 40 * BLOCK);
        assert!(rows * k * outputs >= PARALLEL_MIN_MADDS);
        let packed = PackedMatrix::new(&wave(outputs * k, 0.011), outputs, k, WeightFormat::Bf16);
        let x = wave(rows * k, 0.3);
        let run = |threads| {
            let mut out = vec![0f32; rows * outputs];
            Kernels::new(threads).unwrap().linear(&x, rows, &packed, None, &mut out, &mut LinearScratch::default());
            out
        };
        // Each output is summed by one thread in one order, so the split changes nothing.
        assert_eq!(run(1), run(3));
    }

    #[test]
    fn pair_panels_give_what_their_widened_products_give_on_every_set() {
        // The bf16 instruction (where the CPU has it) against the widened loop every other
        // set runs: the same exact products, summed in another order, so within f32
        // rounding of the sums; and both far from the sums of the unrounded inputs, which
        // shows the inputs are rounded (a kernel that skipped it would fail the first check).
        let (k, outputs, rows) = (301, 3 * BLOCK, 19);
        let w = wave(outputs * k, 0.031);
        let packed = PackedMatrix::new(&w, outputs, k, WeightFormat::Bf16Pairs);
        let x = wave(rows * k, 0.29);
        let run = |isa| {
            let mut out = vec![f32::NAN; rows * outputs];
            Kernels::with_isa(isa, 1).unwrap().linear(&x, rows, &packed, None, &mut out, &mut LinearScratch::default());
            out
        };
        let baseline = run(Isa::baseline());
        let unrounded = {
            let wr: Vec<f32> = w.iter().copied().map(crate::bf16_value).collect();
            reference(&x, rows, &wr, outputs, &vec![0.0; outputs])
        };
        let far = baseline.iter().zip(&unrounded).map(|(&a, &b)| (f64::from(a) - b).abs()).fold(0.0, f64::max);
        assert!(far > 1e-3, "rounding the inputs moves some sum by more than 1e-3 (it moved {far})");
        for isa in Isa::available() {
            for (i, (&got, &want)) in run(isa).iter().zip(&baseline).enumerate() {
                assert!((got - want).abs() <= 1e-5 * want.abs().max(1.0), "{}: value {i}: {got} ≠ {want}", isa.name());
            }
        }
    }

    #[test]
    fn the_vector_loops_match_their_definitions_on_every_set() {
        for isa in Isa::available() {
            let k = Kernels::with_isa(isa, 1).unwrap();
            for n in [0, 1, 15, 16, 17, 130] {
                let (a, b) = (wave(n, 0.37), wave(n, 0.11));
                let plain: f64 = a.iter().zip(&b).map(|(x, y)| f64::from(*x) * f64::from(*y)).sum();
                assert!((f64::from(k.dot(&a, &b)) - plain).abs() < 1e-4, "{}: n = {n}", isa.name());
            }
            // Rows of an 11 × 80 matrix at offset 2 (two groups of four sums and three
            // more), 70 outputs (two whole blocks and a tail), for 1 to 10 weight rows at
            // once (across the tiles of 4 and 8).
            let m = wave(11 * 80, 0.2);
            for n in 1..=10 {
                let weights = wave(n * 11, 0.7);
                let mut out = vec![0f32; n * 70];
                k.weighted_rows_many(&weights, 11, &m, 80, 2, &mut out);
                if n == 1 {
                    let mut one = vec![0f32; 70];
                    k.weighted_rows(&weights, &m, 80, 2, &mut one);
                    assert_eq!(one, out, "{}", isa.name());
                }
                for (t, row) in out.chunks_exact(70).enumerate() {
                    for (i, &o) in row.iter().enumerate() {
                        let want: f32 = (0..11).map(|r| weights[t * 11 + r] * m[r * 80 + 2 + i]).sum();
                        assert!((o - want).abs() < 1e-5, "{}: {n} rows, row {t}, output {i}", isa.name());
                    }
                }
            }
            // Panels laid out by the caller: 3 panels of k = 7 inputs, 5 rows.
            let (k_in, rows) = (7, 5);
            let (x, panels) = (wave(rows * k_in, 0.3), wave(3 * k_in * BLOCK, 0.05));
            let mut sums = vec![[0f32; BLOCK]; 3 * rows];
            k.panel_products(&x, rows, k_in, &panels, &mut sums);
            for (p, t) in (0..3).flat_map(|p| (0..rows).map(move |t| (p, t))) {
                for i in 0..BLOCK {
                    let want: f32 = (0..k_in).map(|j| x[t * k_in + j] * panels[p * k_in * BLOCK + j * BLOCK + i]).sum();
                    assert!((sums[p * rows + t][i] - want).abs() < 1e-5, "{}: panel {p}, row {t}", isa.name());
                }
            }
            // The same over bf16 storage: the widened values' products. Rounding is
            // visible (the bf16 matrix differs from the f32 one), so a loop that read the
            // wrong half of each value, or skipped widening, would fail.
            let (m16, panels16): (Vec<u16>, Vec<u16>) =
                (m.iter().map(|&v| crate::to_bf16(v)).collect(), panels.iter().map(|&v| crate::to_bf16(v)).collect());
            let widen = |v: &[u16]| -> Vec<f32> { v.iter().copied().map(crate::from_bf16).collect() };
            let (m_wide, panels_wide) = (widen(&m16), widen(&panels16));
            assert!(m_wide.iter().zip(&m).any(|(a, b)| a != b), "bf16 rounds the matrix");
            for n in [1, 3, 9] {
                let weights = wave(n * 11, 0.7);
                let (mut from_bf16, mut from_f32) = (vec![0f32; n * 70], vec![0f32; n * 70]);
                k.weighted_rows_many_bf16(&weights, 11, &m16, 80, 2, &mut from_bf16);
                k.weighted_rows_many(&weights, 11, &m_wide, 80, 2, &mut from_f32);
                assert_eq!(from_bf16, from_f32, "{}: {n} rows over bf16", isa.name());
            }
            let mut sums16 = vec![[0f32; BLOCK]; 3 * rows];
            k.panel_products_bf16(&x, rows, k_in, &panels16, &mut sums16);
            for (p, t) in (0..3).flat_map(|p| (0..rows).map(move |t| (p, t))) {
                for i in 0..BLOCK {
                    let want: f32 =
                        (0..k_in).map(|j| x[t * k_in + j] * panels_wide[p * k_in * BLOCK + j * BLOCK + i]).sum();
                    assert!((sums16[p * rows + t][i] - want).abs() < 1e-5, "{}: bf16 panel {p}, row {t}", isa.name());
                }
            }
            for parallel in [false, true] {
                let squares = Kernels::with_isa(isa, 2).unwrap().map(9, parallel, |i| i * i);
                assert_eq!(squares, (0..9).map(|i| i * i).collect::<Vec<_>>());
            }
            let mut pieces = vec![0usize; 10];
            for parallel in [false, true] {
                Kernels::with_isa(isa, 2).unwrap().for_each_chunk(&mut pieces, 3, parallel, |i, p| p.fill(i + 1));
                assert_eq!(pieces, [1, 1, 1, 2, 2, 2, 3, 3, 3, 4]);
            }
            let mut acc = vec![1.0f32; 5];
            k.axpy(&mut acc, 2.0, &[1.0, 2.0, 3.0, 4.0, 5.0]);
            assert_eq!(acc, [3.0, 5.0, 7.0, 9.0, 11.0]);
        }
    }

    /// Each set's softmax and gated activations against the standard library's exponential in
    /// f64, over lengths that leave a remainder after the vector lanes, with masked scores.
    #[test]
    fn the_exponential_steps_match_their_definitions_on_every_set() {
        for isa in Isa::available() {
            let k = Kernels::with_isa(isa, 1).unwrap();
            for n in [1, 16, 37, 133] {
                let mut scores: Vec<f32> = wave(n, 0.61).iter().map(|v| v * 12.0).collect();
                if n > 2 {
                    scores[1] = f32::NEG_INFINITY;
                }
                let want: Vec<f64> = {
                    let max = scores.iter().copied().fold(f32::NEG_INFINITY, f32::max);
                    let e: Vec<f64> = scores.iter().map(|&s| f64::from(s - max).exp()).collect();
                    let total: f64 = e.iter().sum();
                    e.iter().map(|v| v / total).collect()
                };
                k.softmax(&mut scores);
                for (i, (&got, want)) in scores.iter().zip(&want).enumerate() {
                    assert!((f64::from(got) - want).abs() <= 1e-6 * want.max(1e-2), "{}: n = {n}, {i}", isa.name());
                }
                let gate: Vec<f32> = wave(n, 0.43).iter().map(|v| v * 9.0).collect();
                let up = wave(n, 0.19);
                let (mut silu, mut gelu) = (gate.clone(), gate.clone());
                k.silu_times(&mut silu, &up);
                k.gelu_tanh_times(&mut gelu, &up);
                let c = (2.0 / std::f64::consts::PI).sqrt();
                for i in 0..n {
                    let (x, u) = (f64::from(gate[i]), f64::from(up[i]));
                    let want_silu = x / (1.0 + (-x).exp()) * u;
                    let want_gelu = 0.5 * x * (1.0 + (c * (x + 0.044_715 * x * x * x)).tanh()) * u;
                    assert!((f64::from(silu[i]) - want_silu).abs() <= 2e-6 * (1.0 + want_silu.abs()), "{}", isa.name());
                    assert!((f64::from(gelu[i]) - want_gelu).abs() <= 2e-6 * (1.0 + want_gelu.abs()), "{}", isa.name());
                }
            }
        }
    }
}
