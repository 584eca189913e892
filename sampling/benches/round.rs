//! One round of the rule at production vocabulary sizes: γ = 5, V = 32 000 and 128 256.
//!
//! `dense`: the coordinator's rule on full distributions. `sparse`: the coordinator's rule on
//! the sparse wire format with K = 64 (what runs every round). `target_pieces` and
//! `draft_truncate` are the work the sparse format moves onto the nodes, for context.
//! `effective_t0.8`: one row of logits to its distribution at T = 0.8, which each node does
//! for every position it scores (the demo's V = 4 096 too). `target_rows`: what a target
//! does after a verify pass over γ + 1 tokens, distributions of all rows and the sparse
//! pieces, on 1 and on 2 threads.

use std::hint::black_box;

use criterion::{Criterion, criterion_group, criterion_main};
use specd_sampling::{
    DenseCandidate, DenseDist, Purpose, RoundKey, SamplingParams, SparseCandidate, StreamKey, TokenHistory, Truncation,
    block_distributions, effective_distribution, score_block, verify_block_dense, verify_block_sparse,
};

const GAMMA: usize = 5;
const K: usize = 64;

/// Zipf-like logits with noise: a realistic peaked next-token distribution.
fn logits(v: usize, salt: u64, noise: f64) -> Vec<f32> {
    let mut rng = StreamKey::new(salt, 0, 0, Purpose::Plain).stream();
    let mut ranks: Vec<usize> = (0..v).collect();
    for i in (1..v).rev() {
        ranks.swap(i, (rng.next_u64() % (i as u64 + 1)) as usize);
    }
    ranks.iter().map(|&r| (-1.2 * ((r + 1) as f64).ln() + noise * rng.next_uniform()) as f32).collect()
}

fn dist(v: usize, salt: u64, noise: f64) -> DenseDist {
    effective_distribution(&logits(v, salt, noise), &SamplingParams::default(), TokenHistory::default()).unwrap()
}

fn bench_round(c: &mut Criterion) {
    for v in [32_000usize, 128_256] {
        let p: Vec<DenseDist> = (0..=GAMMA as u64).map(|i| dist(v, 100 + i, 0.5)).collect();
        // The draft sees the same ranking with more noise: acceptance around 0.8.
        let q: Vec<DenseDist> = (0..GAMMA as u64).map(|i| dist(v, 100 + i, 1.5)).collect();
        let truncation = Truncation::new(0.0, K).unwrap();
        let sparse_q: Vec<_> = q.iter().map(|q| q.truncate(truncation)).collect();
        let tokens: Vec<u32> = sparse_q.iter().enumerate().map(|(i, q)| q.sample(i as f64 / GAMMA as f64)).collect();
        let dense_candidates: Vec<_> = tokens.iter().zip(&q).map(|(&token, q)| DenseCandidate { token, q }).collect();
        let sparse_candidates: Vec<_> =
            tokens.iter().zip(&sparse_q).map(|(&token, q)| SparseCandidate { token, q }).collect();
        let supports: Vec<&[u32]> = sparse_q.iter().map(|q| q.tokens()).collect();
        let scored = score_block(&p, &supports, RoundKey { seed: 1, round: 0 }, 1).unwrap();

        let mut group = c.benchmark_group(format!("round_gamma5_v{v}"));
        let mut round = 0u32;
        group.bench_function("dense", |b| {
            b.iter(|| {
                round = round.wrapping_add(1);
                black_box(verify_block_dense(&dense_candidates, &p, RoundKey { seed: 7, round }).unwrap())
            });
        });
        group.bench_function("sparse_k64", |b| {
            b.iter(|| {
                round = round.wrapping_add(1);
                black_box(verify_block_sparse(&sparse_candidates, &scored, RoundKey { seed: 7, round }).unwrap())
            });
        });
        group.bench_function("target_pieces_k64", |b| {
            b.iter(|| black_box(score_block(&p, &supports, RoundKey { seed: 7, round: 0 }, 1).unwrap()));
        });
        group.bench_function("draft_truncate_k64", |b| b.iter(|| black_box(q[0].truncate(truncation))));
        group.finish();
    }
}

fn bench_effective(c: &mut Criterion) {
    let params = SamplingParams { temperature: 0.8, ..SamplingParams::default() };
    for v in [4_096usize, 32_000, 128_256] {
        let row = logits(v, 100, 0.5);
        c.bench_function(&format!("effective_t0.8_v{v}"), |b| {
            b.iter(|| black_box(effective_distribution(&row, &params, TokenHistory::default()).unwrap()));
        });
    }
}

fn bench_target_rows(c: &mut Criterion) {
    let params = SamplingParams { temperature: 0.8, ..SamplingParams::default() };
    for v in [32_000usize, 128_256] {
        let rows: Vec<Vec<f32>> = (0..=GAMMA as u64).map(|i| logits(v, 100 + i, 0.5)).collect();
        let rows: Vec<&[f32]> = rows.iter().map(Vec::as_slice).collect();
        let block: Vec<u32> = (0..GAMMA as u32).collect();
        let q: Vec<DenseDist> = (0..GAMMA as u64).map(|i| dist(v, 100 + i, 1.5)).collect();
        let sparse_q: Vec<_> = q.iter().map(|q| q.truncate(Truncation::new(0.0, K).unwrap())).collect();
        let supports: Vec<&[u32]> = sparse_q.iter().map(|q| q.tokens()).collect();
        let mut group = c.benchmark_group(format!("target_rows_gamma5_v{v}"));
        for threads in [1, 2] {
            group.bench_function(format!("threads_{threads}"), |b| {
                b.iter(|| {
                    let p = block_distributions(&rows, &params, &[], &[], &block, threads).unwrap();
                    black_box(score_block(&p, &supports, RoundKey { seed: 7, round: 0 }, threads).unwrap())
                });
            });
        }
        group.finish();
    }
}

criterion_group!(benches, bench_round, bench_effective, bench_target_rows);
criterion_main!(benches);
