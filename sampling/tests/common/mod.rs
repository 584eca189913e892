//! Test harness: prefix-dependent table models and a miniature round loop that drives the
//! real draft sampling, target pieces and rule exactly as the services will.

#![allow(dead_code)]

use specd_sampling::law::{PrefixModel, WireFormat};
use specd_sampling::naive::naive_verify_block_dense;
use specd_sampling::{
    BlockOutcome, DenseCandidate, DenseDist, DrawKeys, Purpose, RoundKey, SparseCandidate, StreamKey, score_block,
    verify_block_dense, verify_block_sparse, verify_whole_block_dense, verify_whole_block_sparse,
};

/// Which rule the round loop applies.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Rule {
    /// Token verification.
    Exact,
    /// Resample from p on rejection: the deliberately wrong rule the tests must catch.
    Naive,
    /// Block verification.
    Block,
    /// Block verification with its draws keyed by the position in the generated sequence and
    /// not by the round: a round that rejected at position k learnt that the η of positions
    /// after k failed, and the next round reuses those η. Wrong (vLLM's keying,
    /// docs/randomness.md); the tests must catch it.
    BlockKeyedBySequencePosition,
    /// Block verification with its draws keyed by the block position alone: every round of a
    /// generation reuses the same η and residual draws. Wrong; the tests must catch it.
    BlockKeyedByBlockPosition,
}

/// Draws keyed by (seed, position in the generated sequence), the same in every round.
#[derive(Debug, Clone, Copy)]
pub struct SequencePositionKeys {
    pub seed: u64,
    /// Tokens committed before this round.
    pub committed: usize,
}

impl DrawKeys for SequencePositionKeys {
    fn stream(self, position: usize, purpose: Purpose) -> StreamKey {
        StreamKey::new(self.seed, 0, (self.committed + position) as u32, purpose)
    }
}

/// Fixed p and q for every prefix.
pub struct FixedModel {
    pub p: DenseDist,
    pub q: DenseDist,
}

impl PrefixModel for FixedModel {
    fn target(&self, _: &[u32]) -> DenseDist {
        self.p.clone()
    }
    fn draft(&self, _: &[u32]) -> DenseDist {
        self.q.clone()
    }
}

/// Distributions that depend on the whole prefix, derived from a seed by hashing, in a mix
/// of shapes: dense with zeros, one-hot, q = p, q disjoint from p, uniform.
pub struct HashedModel {
    pub seed: u64,
    pub vocab_size: usize,
}

impl HashedModel {
    fn draws(&self, prefix: &[u32], salt: u32) -> specd_sampling::rng::CounterRng {
        let mut h: u64 = 0xcbf2_9ce4_8422_2325 ^ self.seed;
        for &t in prefix {
            h = (h ^ u64::from(t) ^ 0x100).wrapping_mul(0x0100_0000_01b3);
        }
        StreamKey::new(h, prefix.len() as u32, salt, Purpose::Plain).stream()
    }

    fn random_dist(&self, prefix: &[u32], salt: u32) -> DenseDist {
        let mut rng = self.draws(prefix, salt);
        let v = self.vocab_size;
        let mut w: Vec<f64> = (0..v).map(|_| if rng.next_uniform() < 0.3 { 0.0 } else { rng.next_uniform() }).collect();
        if w.iter().all(|&x| x == 0.0) {
            w[(rng.next_u32() as usize) % v] = 1.0;
        }
        DenseDist::from_weights(w).unwrap()
    }
}

impl PrefixModel for HashedModel {
    fn target(&self, prefix: &[u32]) -> DenseDist {
        let mut rng = self.draws(prefix, 7);
        if rng.next_uniform() < 0.15 {
            return DenseDist::one_hot(self.vocab_size, rng.next_u32() % self.vocab_size as u32).unwrap();
        }
        self.random_dist(prefix, 1)
    }

    fn draft(&self, prefix: &[u32]) -> DenseDist {
        let mut rng = self.draws(prefix, 9);
        let v = self.vocab_size;
        match rng.next_u32() % 5 {
            0 => DenseDist::one_hot(v, rng.next_u32() % v as u32).unwrap(),
            1 => self.target(prefix),
            2 => {
                let p = self.target(prefix);
                let outside: Vec<f64> = p.probs().iter().map(|&x| if x == 0.0 { 1.0 } else { 0.0 }).collect();
                if outside.iter().any(|&x| x > 0.0) {
                    DenseDist::from_weights(outside).unwrap()
                } else {
                    DenseDist::new(vec![1.0 / v as f64; v]).unwrap()
                }
            }
            3 => DenseDist::new(vec![1.0 / v as f64; v]).unwrap(),
            _ => self.random_dist(prefix, 2),
        }
    }
}

/// Generates `length` tokens after `prompt` with speculative rounds of draft length `gamma`,
/// exactly as the three roles will: the draft samples each candidate from its (truncated) q,
/// the target computes p for every block position, the coordinator applies the rule.
pub fn generate(
    model: &dyn PrefixModel,
    prompt: &[u32],
    gamma: usize,
    length: usize,
    wire: WireFormat,
    seed: u64,
    rule: Rule,
) -> Vec<u32> {
    let mut context = prompt.to_vec();
    let mut round = 0u32;
    while context.len() - prompt.len() < length {
        let outcome =
            run_round(model, &context, context.len() - prompt.len(), gamma, wire, RoundKey { seed, round }, rule);
        context.extend(&outcome.tokens);
        round += 1;
    }
    context[prompt.len()..prompt.len() + length].to_vec()
}

/// One round after `context`, of which `committed` tokens were generated before it.
pub fn run_round(
    model: &dyn PrefixModel,
    context: &[u32],
    committed: usize,
    gamma: usize,
    wire: WireFormat,
    key: RoundKey,
    rule: Rule,
) -> BlockOutcome {
    let RoundKey { seed, round } = key;
    let mut block = Vec::with_capacity(gamma);
    let mut dense_q = Vec::with_capacity(gamma);
    let mut sparse_q = Vec::with_capacity(gamma);
    for i in 1..=gamma {
        let mut prefix = context.to_vec();
        prefix.extend(&block);
        let q = model.draft(&prefix);
        let u = StreamKey::new(seed, round, i as u32, Purpose::Draft).uniform();
        let token = match wire {
            WireFormat::Dense => q.sample(u),
            WireFormat::Sparse(t) => {
                let sparse = q.truncate(t);
                let x = sparse.sample(u);
                sparse_q.push(sparse);
                x
            }
        };
        dense_q.push(q);
        block.push(token);
    }
    let p: Vec<DenseDist> = (0..=gamma)
        .map(|i| {
            let mut prefix = context.to_vec();
            prefix.extend(&block[..i]);
            model.target(&prefix)
        })
        .collect();
    let wrong_keys = SequencePositionKeys { seed, committed };
    match wire {
        WireFormat::Dense => {
            let candidates: Vec<_> =
                block.iter().zip(&dense_q).map(|(&token, q)| DenseCandidate { token, q }).collect();
            match rule {
                Rule::Exact => verify_block_dense(&candidates, &p, key),
                Rule::Naive => naive_verify_block_dense(&candidates, &p, key),
                Rule::Block => verify_whole_block_dense(&candidates, &p, key),
                Rule::BlockKeyedBySequencePosition => verify_whole_block_dense(&candidates, &p, wrong_keys),
                Rule::BlockKeyedByBlockPosition => {
                    verify_whole_block_dense(&candidates, &p, RoundKey { seed, round: 0 })
                }
            }
        }
        WireFormat::Sparse(_) => {
            let supports: Vec<&[u32]> = sparse_q.iter().map(|q| q.tokens()).collect();
            let scored = score_block(&p, &supports, key, 1).unwrap();
            let candidates: Vec<_> =
                block.iter().zip(&sparse_q).map(|(&token, q)| SparseCandidate { token, q }).collect();
            match rule {
                Rule::Exact => verify_block_sparse(&candidates, &scored, key),
                Rule::Naive => panic!("the naive rule is only kept in dense form"),
                Rule::Block => verify_whole_block_sparse(&candidates, &scored, key),
                Rule::BlockKeyedBySequencePosition => verify_whole_block_sparse(&candidates, &scored, wrong_keys),
                Rule::BlockKeyedByBlockPosition => {
                    verify_whole_block_sparse(&candidates, &scored, RoundKey { seed, round: 0 })
                }
            }
        }
    }
    .unwrap()
}

/// Index of a sequence over a vocabulary of size v, as a base-v number.
pub fn cell_index(seq: &[u32], v: usize) -> usize {
    seq.iter().fold(0, |acc, &t| acc * v + t as usize)
}

/// The mean of `value(seed)` over seeds 0..n and its standard error.
pub fn mean_and_error(n: u64, value: impl Fn(u64) -> f64) -> (f64, f64) {
    let (mut sum, mut squares) = (0.0, 0.0);
    for seed in 0..n {
        let x = value(seed);
        sum += x;
        squares += x * x;
    }
    let mean = sum / n as f64;
    (mean, ((squares / n as f64 - mean * mean).max(0.0) / n as f64).sqrt())
}
