//! The block rule on the sparse wire format: what the coordinator runs every round.

use crate::dist::SparseDist;
use crate::error::{Result, SamplingError};
use crate::excess::{PositionView, SparsePosition};
use crate::rng::Purpose;
use crate::rng::RoundKey;
use crate::rule::{BlockOutcome, EmittedFrom};
use crate::target_pieces::{ScoredBlock, ScoredPosition};
use crate::token_rule::verify_tokens;

/// One candidate with the sparse q (support S and q on S) it was drawn from.
#[derive(Debug, Clone, Copy)]
pub struct SparseCandidate<'a> {
    pub token: u32,
    pub q: &'a SparseDist,
}

/// Applies the rule of [`crate::rule`] with q on supports and the target's [`ScoredBlock`].
///
/// At the first rejection the residual is a mixture: inside S it has mass
/// R_in = Σ_S max(0, p - q), outside S mass P_out (there q = 0). With probability
/// R_in / (R_in + P_out) a token is drawn from S in proportion to max(0, p - q), otherwise
/// the target's complement sample is emitted. Both branches are exact draws from r.
/// Draws: `(Accept, i)` for acceptance; `(Residual, i)` for the branch and the draw in S.
pub fn verify_block_sparse(
    candidates: &[SparseCandidate<'_>],
    scored: &ScoredBlock,
    key: RoundKey,
) -> Result<BlockOutcome> {
    verify_block_sparse_with(candidates, scored, key, sample_sparse_residual)
}

/// What a rule emits at the first rejection, at block `position`, from the draft's q, the
/// target's pieces and the round's key: the token and which branch drew it.
pub(crate) type SparseResidual = fn(usize, &SparseDist, &ScoredPosition, RoundKey) -> Result<(u32, EmittedFrom)>;

/// [`verify_block_sparse`] with `residual` at the first rejection (the naive rule swaps it).
pub(crate) fn verify_block_sparse_with(
    candidates: &[SparseCandidate<'_>],
    scored: &ScoredBlock,
    key: RoundKey,
    residual: SparseResidual,
) -> Result<BlockOutcome> {
    let positions = sparse_positions(candidates, scored)?;
    let reject = |index: usize, position: &SparsePosition<'_>| residual(index, position.q, position.scored, key);
    verify_tokens(&positions, key, reject, || scored.bonus)
}

/// Checks a sparse block (one scored position per candidate, each reply consistent with its
/// support, every candidate in its own support) and pairs each candidate with its pieces.
pub(crate) fn sparse_positions<'a>(
    candidates: &[SparseCandidate<'a>],
    scored: &'a ScoredBlock,
) -> Result<Vec<SparsePosition<'a>>> {
    let gamma = candidates.len();
    if scored.positions.len() != gamma {
        return Err(SamplingError::ShapeMismatch(format!(
            "{gamma} candidates but the target scored {} positions",
            scored.positions.len()
        )));
    }
    for (i, (c, s)) in candidates.iter().zip(&scored.positions).enumerate() {
        validate_position(i + 1, c.q, s)?;
    }
    candidates
        .iter()
        .zip(&scored.positions)
        .enumerate()
        .map(|(i, (candidate, scored_i))| {
            let position = i + 1;
            let index = candidate
                .q
                .tokens()
                .iter()
                .position(|&t| t == candidate.token)
                .ok_or(SamplingError::ImpossibleProposal { position, token: candidate.token })?;
            Ok(SparsePosition { q: candidate.q, scored: scored_i, index, position })
        })
        .collect()
}

/// The exact residual at the first rejection: the excess max(p − q, 0) at scale 1.
fn sample_sparse_residual(
    position: usize,
    q: &SparseDist,
    scored: &ScoredPosition,
    key: RoundKey,
) -> Result<(u32, EmittedFrom)> {
    // The index is not read by the excess; the candidate was checked to be in the support.
    let at = SparsePosition { q, scored, index: 0, position };
    at.draw_excess(1.0, at.excess_mass(1.0), key.stream(position, Purpose::Residual))
}

pub(crate) fn validate_position(position: usize, q: &SparseDist, scored: &ScoredPosition) -> Result<()> {
    let bad = |what: String| Err(SamplingError::InvalidTargetReply(format!("position {position}: {what}")));
    if scored.p_on_support.len() != q.len() {
        return bad(format!("{} probabilities for a support of {}", scored.p_on_support.len(), q.len()));
    }
    if let Some(p) = scored.p_on_support.iter().find(|p| !(0.0..=1.0 + 1e-9).contains(*p)) {
        return bad(format!("probability {p} outside [0, 1]"));
    }
    let m = scored.complement_mass;
    if !(0.0..=1.0 + 1e-9).contains(&m) {
        return bad(format!("complement mass {m} outside [0, 1]"));
    }
    let total = m + scored.p_on_support.iter().sum::<f64>();
    if (total - 1.0).abs() > 1e-6 {
        return bad(format!("p on the support plus the complement mass is {total}, not 1"));
    }
    match scored.complement_sample {
        None if m > 0.0 => Err(SamplingError::MissingComplementSample { position, mass: m }),
        Some(c) if q.tokens().contains(&c) => bad(format!("complement sample {c} is inside the support")),
        Some(c) if c as usize >= q.vocab_size() => {
            Err(SamplingError::TokenOutOfRange { token: c, vocab_size: q.vocab_size() })
        }
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn q_ab() -> SparseDist {
        SparseDist::new(3, vec![0, 1], vec![0.5, 0.5]).unwrap()
    }

    fn scored(p_on_support: Vec<f64>, complement_mass: f64, complement_sample: Option<u32>) -> ScoredBlock {
        ScoredBlock { positions: vec![ScoredPosition { p_on_support, complement_mass, complement_sample }], bonus: 2 }
    }

    #[test]
    fn refuses_broken_target_replies() {
        let q = q_ab();
        let c = [SparseCandidate { token: 0, q: &q }];
        let key = RoundKey { seed: 0, round: 0 };
        let cases = [
            scored(vec![0.5], 0.5, Some(2)),
            scored(vec![0.5, 0.2], 0.1, Some(2)),
            scored(vec![0.5, 0.2], 0.3, None),
            scored(vec![0.5, 0.2], 0.3, Some(1)),
            scored(vec![0.5, 0.2], 0.3, Some(9)),
            scored(vec![f64::NAN, 0.2], 0.3, Some(2)),
        ];
        for case in &cases {
            assert!(verify_block_sparse(&c, case, key).is_err(), "{case:?}");
        }
        let off_support = [SparseCandidate { token: 2, q: &q }];
        assert_eq!(
            verify_block_sparse(&off_support, &scored(vec![0.5, 0.2], 0.3, Some(2)), key),
            Err(SamplingError::ImpossibleProposal { position: 1, token: 2 })
        );
    }

    #[test]
    fn a_deterministic_candidate_is_accepted_with_p_and_otherwise_replaced_from_p_without_it() {
        // q = one-hot(1): a support of size one with q = 1. p = (0.2, 0.3, 0.5).
        let q = SparseDist::new(3, vec![1], vec![1.0]).unwrap();
        let c = [SparseCandidate { token: 1, q: &q }];
        let (mut accepted, mut replaced) = (0u32, [0u32; 3]);
        let n = 20_000u64;
        for seed in 0..n {
            // The complement sample: what the target draws from p outside S, here 0 or 2.
            let complement = if seed % 7 < 2 { 0 } else { 2 };
            let block = scored(vec![0.3], 0.7, Some(complement));
            let out = verify_block_sparse(&c, &block, RoundKey { seed, round: 0 }).unwrap();
            assert_eq!(out.acceptance, vec![0.3]);
            assert!((out.expected_acceptance[0] - 0.3).abs() < 1e-12);
            if out.accepted == 1 {
                accepted += 1;
            } else {
                // The residual max(0, p - q) is 0 on S: always the complement sample.
                assert_eq!((out.tokens[0], out.emitted_from), (complement, EmittedFrom::Complement));
                replaced[out.tokens[0] as usize] += 1;
            }
        }
        // Acceptance 0.3: 6 000 of 20 000, σ ≈ 65; 6σ bounds.
        assert!((accepted as f64 - 0.3 * n as f64).abs() < 6.0 * 65.0, "{accepted}");
        // Both complement draws were emitted on rejections, in proportion to how often each
        // was given (2 in 7 seeds give 0).
        let rejected = replaced[0] + replaced[2];
        assert!((replaced[0] as f64 - rejected as f64 * 2.0 / 7.0).abs() < 6.0 * 38.0, "{replaced:?}");
    }

    #[test]
    fn all_mass_outside_the_support_always_emits_the_complement_sample() {
        let q = q_ab();
        for seed in 0..100 {
            let c = [SparseCandidate { token: 1, q: &q }];
            let out =
                verify_block_sparse(&c, &scored(vec![0.0, 0.0], 1.0, Some(2)), RoundKey { seed, round: 0 }).unwrap();
            assert_eq!(out.tokens, vec![2]);
            assert_eq!(out.emitted_from, EmittedFrom::Complement);
        }
    }
}
