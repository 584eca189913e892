//! The wrong rule, kept as a counterexample: on rejection, resample from p instead of the
//! residual. Its output law is β-weighted towards q's accepted mass and is *not* p
//! (docs/rule.md: (0.59, 0.295, 0.115) instead of (0.6, 0.3, 0.1)). It exists so that the
//! statistical tests can prove they would catch it, and so `specd rule` can show it.
//!
//! On the sparse wire the same mistake reads p as what to draw from at a rejection, without
//! taking q off: with a deterministic candidate (q = one-hot(x)) it emits x again with
//! probability p(x), which the law audits of the n-gram and suffix proposers must catch.

use crate::dense_rule::{DenseCandidate, verify_block_dense_with};
use crate::dist::{DenseDist, SparseDist, sample_weights};
use crate::error::{Result, SamplingError};
use crate::rng::Purpose;
use crate::rng::RoundKey;
use crate::rule::{BlockOutcome, EmittedFrom};
use crate::sparse_rule::{SparseCandidate, verify_block_sparse_with};
use crate::target_pieces::{ScoredBlock, ScoredPosition};
use crate::tree_rule::{ChildDraws, DraftTree, OnReject, TreeOutcome, verify_tree_dense_with};

/// The block loop of [`crate::dense_rule::verify_block_dense`] with "resample from p" at the
/// first rejection. Do not use for generation.
pub fn naive_verify_block_dense(
    candidates: &[DenseCandidate<'_>],
    p: &[DenseDist],
    key: RoundKey,
) -> Result<BlockOutcome> {
    verify_block_dense_with(candidates, p, key, |p_i, _q_i, _residual_mass, u| p_i.sample(u))
}

/// The block loop of [`crate::sparse_rule::verify_block_sparse`] with "resample from p" at
/// the first rejection: a token of S in proportion to p with probability p(S), otherwise the
/// complement sample. Do not use for generation.
pub fn naive_verify_block_sparse(
    candidates: &[SparseCandidate<'_>],
    scored: &ScoredBlock,
    key: RoundKey,
) -> Result<BlockOutcome> {
    verify_block_sparse_with(candidates, scored, key, resample_from_p)
}

fn resample_from_p(
    position: usize,
    q: &SparseDist,
    scored: &ScoredPosition,
    key: RoundKey,
) -> Result<(u32, EmittedFrom)> {
    let mut stream = key.stream(position, Purpose::Residual).stream();
    let inside: f64 = scored.p_on_support.iter().sum();
    if stream.next_uniform() * (inside + scored.complement_mass) < inside {
        let weights = q.tokens().iter().copied().zip(scored.p_on_support.iter().copied());
        let token = sample_weights(weights, inside, stream.next_uniform()).expect("p(S) > 0 here");
        return Ok((token, EmittedFrom::Residual));
    }
    let token = scored
        .complement_sample
        .ok_or(SamplingError::MissingComplementSample { position, mass: scored.complement_mass })?;
    Ok((token, EmittedFrom::Complement))
}

/// Tree verification that tries each next child against p itself, without taking the
/// rejected children's mass off, and draws from p when every child is rejected: wrong, since
/// a token both proposed and rejected keeps its full chance. Do not use for generation.
pub fn naive_verify_tree_dense(
    tree: &DraftTree,
    q: &[Option<DenseDist>],
    p: &[DenseDist],
    draws: ChildDraws,
    key: RoundKey,
) -> Result<TreeOutcome> {
    verify_tree_dense_with(tree, q, p, draws, key, OnReject::KeepTarget)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_naive_sparse_rule_emits_a_rejected_deterministic_candidate_again() {
        // q = one-hot(1), p(1) = 0.3: the exact rule never emits 1 after rejecting it; the
        // naive one does, with probability 0.3 of the rejections.
        let q = SparseDist::new(3, vec![1], vec![1.0]).unwrap();
        let c = [SparseCandidate { token: 1, q: &q }];
        let block = ScoredBlock {
            positions: vec![ScoredPosition {
                p_on_support: vec![0.3],
                complement_mass: 0.7,
                complement_sample: Some(2),
            }],
            bonus: 0,
        };
        let (mut rejected, mut again) = (0u32, 0u32);
        for seed in 0..10_000 {
            let out = naive_verify_block_sparse(&c, &block, RoundKey { seed, round: 0 }).unwrap();
            if out.accepted == 0 {
                rejected += 1;
                again += u32::from(out.tokens[0] == 1);
            }
        }
        // About 7 000 rejections, 2 100 of them emitting 1 again (σ ≈ 38).
        assert!((f64::from(again) - 0.3 * f64::from(rejected)).abs() < 250.0, "{again} of {rejected}");
    }
}
