//! The node's own time per round of the deterministic proposers at 4 096 tokens of context
//! (the goal of issue #27: ≤ 50 µs a round for ngram).
//!
//! `ngram/*`: one γ = 8 lookup over a sequence of 4 096 tokens, on text-like tokens (a
//! vocabulary of 32 000 with a Zipf-like law, where most positions share nothing with the
//! end) and on a repetitive one (a vocabulary of 16, where almost every position does and
//! the match search does the most work). `suffix/*`: one γ = 8 proposal over the same
//! sequences with an index holding 64 earlier sessions of 1 024 tokens.

use std::hint::black_box;

use criterion::{Criterion, criterion_group, criterion_main};
use specd_draft_node::proposer::ngram::lookup;
use specd_draft_node::proposer::{MatchSpan, SuffixIndex};

const CONTEXT: usize = 4096;
const GAMMA: usize = 8;

/// `n` tokens over `vocab` with a Zipf-like law (a small LCG: the bench needs no exact law).
fn tokens(n: usize, vocab: u64, salt: u64) -> Vec<u32> {
    let mut state = salt.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..n)
        .map(|_| {
            state = state.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1_442_695_040_888_963_407);
            let u = ((state >> 11) as f64 / (1u64 << 53) as f64).max(1e-12);
            // Inverse of a 1/r law's CDF, roughly: rank ~ vocab^u.
            ((vocab as f64).powf(u) as u64 - 1).min(vocab - 1) as u32
        })
        .collect()
}

fn bench(c: &mut Criterion) {
    let span = MatchSpan::default();
    for (name, vocab) in [("text", 32_000), ("repetitive", 16)] {
        let sequence = tokens(CONTEXT, vocab, 1);
        c.bench_function(&format!("ngram/{name}_4096"), |b| {
            b.iter(|| lookup(black_box(&sequence), 512, span, GAMMA));
        });
        let mut index = SuffixIndex::new(span.max, 1 << 18);
        for s in 0..64 {
            index.insert(s, &tokens(1024, vocab, 100 + s));
        }
        c.bench_function(&format!("suffix/{name}_4096"), |b| {
            b.iter(|| index.propose(u64::MAX, black_box(&sequence), span, GAMMA));
        });
    }
}

criterion_group!(benches, bench);
criterion_main!(benches);
