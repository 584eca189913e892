//! The demo target's linear layers (hidden 384, intermediate 1 024, vocabulary 4 096, six
//! layers), one pass's worth, for each instruction set, weight format and thread count, at
//! 1, 2, 3, 5 and 64 rows: the figures behind the host engine's choices.
//!
//! `cargo bench -p specd-host-kernels --bench linear [-- FILTER]`: with a filter, only the
//! lines whose weight format and instruction set (`Bf16 avx2+fma`) contain it are measured.

use std::time::Instant;

use specd_host_kernels::{Isa, Kernels, LinearScratch, PackedMatrix, WeightFormat};

fn main() {
    let shapes = [(1152usize, 384usize), (384, 384), (2048, 384), (384, 1024)];
    let wave = |n: usize, step: f32| (0..n).map(|i| (i as f32 * step).sin() * 0.1).collect::<Vec<f32>>();
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
    // cargo passes `--bench` to a harness-less bench; the first other argument is a filter.
    let filter = std::env::args().skip(1).find(|a| !a.starts_with("--")).unwrap_or_default();
    for format in [WeightFormat::F32, WeightFormat::Bf16, WeightFormat::Bf16Pairs] {
        let mut layers: Vec<PackedMatrix> = Vec::new();
        for _ in 0..6 {
            for &(o, i) in &shapes {
                layers.push(PackedMatrix::new(&wave(o * i, 0.013), o, i, format));
            }
        }
        layers.push(PackedMatrix::new(&wave(4096 * 384, 0.017), 4096, 384, format));
        let bytes: usize = layers.iter().map(PackedMatrix::bytes).sum();
        let x = wave(64 * 1024, 0.3);
        let mut out = vec![0f32; 64 * 4096];
        for isa in Isa::available().into_iter().filter(|isa| format!("{format:?} {}", isa.name()).contains(&filter)) {
            for t in (1..=threads).filter(|t| *t == 1 || *t == threads) {
                let kernels = Kernels::with_isa(isa, t).expect("threads");
                let mut scratch = LinearScratch::default();
                for rows in [1usize, 2, 3, 5, 64] {
                    let reps = if rows == 64 { 10 } else { 200 };
                    let mut pass = || {
                        kernels.pass(|| {
                            for l in &layers {
                                let (k, o) = (l.inputs(), l.outputs());
                                kernels.linear(&x[..rows * k], rows, l, None, &mut out[..rows * o], &mut scratch);
                            }
                        });
                    };
                    pass();
                    let mut best = f64::MAX;
                    for _ in 0..5 {
                        let start = Instant::now();
                        for _ in 0..reps {
                            pass();
                        }
                        best = best.min(start.elapsed().as_secs_f64() / reps as f64);
                    }
                    println!(
                        "{format:?} {:>9} {t} thread(s) {rows:>2} rows: {:7.1} µs a pass, {:6.0} rows/s, {:5.1} GB/s of weights",
                        isa.name(),
                        best * 1e6,
                        rows as f64 / best,
                        bytes as f64 / best / 1e9
                    );
                }
            }
        }
    }
}
