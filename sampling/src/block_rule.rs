//! Block verification: the block judged as a whole (Sun, Mendlovic, Leviathan, Aharoni,
//! Beirami, Ro and Suresh, "Block Verification Accelerates Speculative Decoding", ICLR 2025,
//! arXiv:2403.10444).
//!
//! For candidates x_1..x_γ with x_i ~ q_i and the target's p_1..p_{γ+1}:
//! - P_0 = 1 and P_i = min(1, P_{i−1}·p_i(x_i)/q_i(x_i)): the weight the chain keeps;
//! - r_i = Σ_y max(P_i·p_{i+1}(y) − q_{i+1}(y), 0) for i < γ;
//! - h_i = r_i / (r_i + 1 − P_i) for i < γ, and h_γ = P_γ;
//! - every position draws η_i; τ is the last i with η_i < h_i (0 when none passes);
//! - the round commits x_1..x_τ and one token from max(P_τ·p_{τ+1} − q_{τ+1}, 0), normalised,
//!   or from p_{γ+1} when τ = γ.
//!
//! The committed tokens have the target's law, and in expectation no fewer are accepted than
//! under token verification (the paper's Theorems 1 and 2; docs/rule.md has the sketch).
//! Where token verification stops at the first rejection, this rule may still accept a
//! longer prefix whose later candidates make up for it.
//!
//! Draws: `(Accept, i)` for η_i, `(Residual, τ + 1)` for the token after τ < γ, and the
//! target's `(Bonus, γ + 1)` draw after τ = γ. Every η is keyed by its round, so a round that
//! learns η_i > h_i for a position never hands that η to a later round (docs/randomness.md).

use crate::block_weights::{BlockWeights, token_expected_accepted};
use crate::dense_rule::{DenseCandidate, dense_positions};
use crate::dist::DenseDist;
use crate::error::Result;
use crate::excess::PositionView;
use crate::rng::{DrawKeys, Purpose};
use crate::rule::{AcceptedInExpectation, BlockOutcome, EmittedFrom};
use crate::sparse_rule::{SparseCandidate, sparse_positions};
use crate::target_pieces::ScoredBlock;

/// Block verification on full distributions: `candidates` x_1..x_γ with their q, the target's
/// p_1..p_{γ+1}.
pub fn verify_whole_block_dense(
    candidates: &[DenseCandidate<'_>],
    p: &[DenseDist],
    key: impl DrawKeys,
) -> Result<BlockOutcome> {
    let positions = dense_positions(candidates, p)?;
    let gamma = positions.len();
    verify_whole_block(&positions, key, || p[gamma].sample(key.stream(gamma + 1, Purpose::Bonus).uniform()))
}

/// Block verification on the sparse wire format: q on supports, the target's
/// [`ScoredBlock`]. The token after τ < γ comes from the support in proportion to
/// max(P_τ·p − q, 0) or, with probability P_τ·P_out over the total, is the target's
/// complement sample: outside the support the excess is P_τ·p itself.
pub fn verify_whole_block_sparse(
    candidates: &[SparseCandidate<'_>],
    scored: &ScoredBlock,
    key: impl DrawKeys,
) -> Result<BlockOutcome> {
    let positions = sparse_positions(candidates, scored)?;
    verify_whole_block(&positions, key, || scored.bonus)
}

fn verify_whole_block<V: PositionView>(
    positions: &[V],
    key: impl DrawKeys,
    bonus: impl FnOnce() -> u32,
) -> Result<BlockOutcome> {
    let gamma = positions.len();
    let weights = BlockWeights::of(positions);
    let stop = (1..=gamma).rev().find(|&i| key.stream(i, Purpose::Accept).uniform() < weights.pass[i - 1]).unwrap_or(0);
    let mut tokens: Vec<u32> = positions.iter().take(stop).map(PositionView::token).collect();
    let emitted_from = if stop == gamma {
        tokens.push(bonus());
        EmittedFrom::Bonus
    } else {
        let weight = weights.kept[stop];
        let at = &positions[stop];
        let (token, from) = at.draw_excess(weight, weights.excess[stop], key.stream(stop + 1, Purpose::Residual))?;
        tokens.push(token);
        from
    };
    let evaluated = &positions[..(stop + 1).min(gamma)];
    Ok(BlockOutcome {
        accepted: stop,
        tokens,
        acceptance: evaluated.iter().map(|p| p.ratio().min(1.0)).collect(),
        expected_acceptance: evaluated.iter().map(PositionView::overlap).collect(),
        emitted_from,
        in_expectation: AcceptedInExpectation {
            token: token_expected_accepted(positions),
            block: weights.expected_accepted(),
        },
    })
}
