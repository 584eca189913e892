//! The block rule on full distributions: the reference path.

use crate::dist::DenseDist;
use crate::error::{Result, SamplingError};
use crate::excess::{DensePosition, PositionView, draw_dense_excess};
use crate::rng::{Purpose, RoundKey};
use crate::rule::{BlockOutcome, EmittedFrom};
use crate::token_rule::verify_tokens;

/// One candidate with the dense q it was drawn from.
#[derive(Debug, Clone, Copy)]
pub struct DenseCandidate<'a> {
    pub token: u32,
    pub q: &'a DenseDist,
}

/// Applies the rule of [`crate::rule`] to candidates x_1..x_γ with dense q_i and the target's
/// p_1..p_{γ+1}. The acceptance uniform of position i (1-based) is `(Accept, i)`, the residual
/// draw `(Residual, i)`, the bonus `(Bonus, γ+1)`.
///
/// When rounding makes a rejection possible although the residual mass is zero (p and q
/// equal up to the last bit), the residual is undefined; the token is then drawn from p,
/// which only matters on an event of probability at most the rounding error.
pub fn verify_block_dense(candidates: &[DenseCandidate<'_>], p: &[DenseDist], key: RoundKey) -> Result<BlockOutcome> {
    verify_block_dense_with(candidates, p, key, sample_residual)
}

/// The dense loop with the draw at the first rejection left to
/// `on_reject(p_i, q_i, residual mass, u)`:
/// [`sample_residual`] makes it the exact rule, [`crate::naive`] the wrong one.
pub(crate) fn verify_block_dense_with(
    candidates: &[DenseCandidate<'_>],
    p: &[DenseDist],
    key: RoundKey,
    on_reject: impl Fn(&DenseDist, &DenseDist, f64, f64) -> u32,
) -> Result<BlockOutcome> {
    let positions = dense_positions(candidates, p)?;
    let gamma = positions.len();
    let reject = |index: usize, position: &DensePosition<'_>| {
        let u = key.stream(index, Purpose::Residual).uniform();
        Ok((on_reject(position.p, position.q, position.excess_mass(1.0), u), EmittedFrom::Residual))
    };
    verify_tokens(&positions, key, reject, || p[gamma].sample(key.stream(gamma + 1, Purpose::Bonus).uniform()))
}

/// Checks a dense block (γ + 1 target rows, one vocabulary, every candidate possible under
/// its own q) and pairs each candidate with its position's p and q.
pub(crate) fn dense_positions<'a>(
    candidates: &[DenseCandidate<'a>],
    p: &'a [DenseDist],
) -> Result<Vec<DensePosition<'a>>> {
    let gamma = candidates.len();
    if p.len() != gamma + 1 {
        return Err(SamplingError::ShapeMismatch(format!(
            "{gamma} candidates need {} target distributions, got {}",
            gamma + 1,
            p.len()
        )));
    }
    let vocab_size = p[0].vocab_size();
    for dist in p.iter().map(DenseDist::vocab_size).chain(candidates.iter().map(|c| c.q.vocab_size())) {
        if dist != vocab_size {
            return Err(SamplingError::VocabMismatch { target: vocab_size, draft: dist });
        }
    }
    candidates
        .iter()
        .zip(p)
        .enumerate()
        .map(|(i, (candidate, p_i))| {
            if candidate.q.prob(candidate.token) <= 0.0 {
                return Err(SamplingError::ImpossibleProposal { position: i + 1, token: candidate.token });
            }
            Ok(DensePosition { p: p_i, q: candidate.q, token: candidate.token })
        })
        .collect()
}

/// Draw from r ∝ max(0, p - q), whose total is `residual_mass`, with the uniform `u`; falls
/// back to p when r has no mass.
pub fn sample_residual(p: &DenseDist, q: &DenseDist, residual_mass: f64, u: f64) -> u32 {
    draw_dense_excess(p, q, 1.0, residual_mass, u)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn abc(p: [f64; 3]) -> DenseDist {
        DenseDist::new(p.to_vec()).unwrap()
    }

    #[test]
    fn refuses_impossible_proposals_and_shape_errors() {
        let p = abc([0.6, 0.3, 0.1]);
        let q = abc([0.5, 0.5, 0.0]);
        let key = RoundKey { seed: 1, round: 0 };
        let bad = [DenseCandidate { token: 2, q: &q }];
        assert_eq!(
            verify_block_dense(&bad, &[p.clone(), p.clone()], key),
            Err(SamplingError::ImpossibleProposal { position: 1, token: 2 })
        );
        let ok = [DenseCandidate { token: 0, q: &q }];
        assert!(matches!(verify_block_dense(&ok, std::slice::from_ref(&p), key), Err(SamplingError::ShapeMismatch(_))));
        let wide = DenseDist::new(vec![0.25; 4]).unwrap();
        let other = [DenseCandidate { token: 0, q: &wide }];
        assert_eq!(
            verify_block_dense(&other, &[p.clone(), p], key),
            Err(SamplingError::VocabMismatch { target: 3, draft: 4 })
        );
    }

    #[test]
    fn p_equal_q_accepts_everything() {
        let p = abc([0.6, 0.3, 0.1]);
        for seed in 0..200 {
            for token in 0..3 {
                let c = [DenseCandidate { token, q: &p }, DenseCandidate { token, q: &p }];
                let out =
                    verify_block_dense(&c, &[p.clone(), p.clone(), p.clone()], RoundKey { seed, round: 0 }).unwrap();
                assert_eq!(out.accepted, 2);
                assert_eq!(out.emitted_from, EmittedFrom::Bonus);
                assert_eq!(out.acceptance, vec![1.0, 1.0]);
            }
        }
    }

    #[test]
    fn zero_target_mass_is_always_rejected_and_never_emitted() {
        let p = abc([0.0, 1.0, 0.0]);
        let q = abc([0.5, 0.25, 0.25]);
        for seed in 0..200 {
            let c = [DenseCandidate { token: 0, q: &q }];
            let out = verify_block_dense(&c, &[p.clone(), p.clone()], RoundKey { seed, round: 7 }).unwrap();
            assert_eq!(out.accepted, 0);
            assert_eq!(out.tokens, vec![1]);
        }
    }

    #[test]
    fn residual_of_equal_distributions_falls_back_to_p() {
        let p = abc([0.6, 0.3, 0.1]);
        assert_eq!(sample_residual(&p, &p, 0.0, 0.0), 0);
        assert_eq!(sample_residual(&p, &p, 0.0, 0.95), 2);
    }
}
