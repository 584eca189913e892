//! Attention's loops at the demo target's shape (head dim 64) over a session of 133
//! positions, for 1 to 8 query rows (a decode step, a verify block of γ = 4, a prompt's
//! tile): the scores against a head's key panels and the weighted sum of its values, bf16
//! cache, one thread, the CPU's widest instruction set.
//!
//! `cargo bench -p specd-host-kernels --bench attention_loops`

use std::hint::black_box;
use std::time::Instant;

use specd_host_kernels::{BLOCK, Kernels, to_bf16};

fn main() {
    const HEAD_DIM: usize = 64;
    const POSITIONS: usize = 133;
    let kernels = Kernels::new(1).expect("kernels");
    let wave = |n: usize, step: f32| (0..n).map(|i| (i as f32 * step).sin()).collect::<Vec<f32>>();
    let panels = POSITIONS.div_ceil(BLOCK);
    let keys: Vec<u16> = wave(panels * BLOCK * HEAD_DIM, 0.37).into_iter().map(to_bf16).collect();
    let values: Vec<u16> = wave(POSITIONS * HEAD_DIM, 0.29).into_iter().map(to_bf16).collect();
    println!("{}, one thread, {POSITIONS} positions, head dim {HEAD_DIM}", kernels.isa().name());
    for rows in [1usize, 3, 5, 6, 7, 8] {
        let queries = wave(rows * HEAD_DIM, 0.11);
        let weights = wave(rows * POSITIONS, 0.07);
        let mut sums = vec![[0f32; BLOCK]; panels * rows];
        let mut out = vec![0f32; rows * HEAD_DIM];
        let reps = 20_000;
        let time = |f: &mut dyn FnMut()| {
            let mut best = f64::MAX;
            for _ in 0..5 {
                let start = Instant::now();
                for _ in 0..reps {
                    f();
                }
                best = best.min(start.elapsed().as_secs_f64() / reps as f64);
            }
            best
        };
        let scores = time(&mut || {
            kernels.panel_products_bf16(black_box(&queries), rows, HEAD_DIM, &keys, &mut sums);
            black_box(&sums);
        });
        let weighted = time(&mut || {
            kernels.weighted_rows_many_bf16(black_box(&weights), POSITIONS, &values, HEAD_DIM, 0, &mut out);
            black_box(&out);
        });
        println!("{rows} row(s): scores {:6.2} µs, values {:6.2} µs", scores * 1e6, weighted * 1e6);
    }
}
