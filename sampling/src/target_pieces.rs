//! What the target computes for the sparse wire format.
//!
//! For each block position i the target knows the full p_i but sends only what the
//! coordinator needs: p_i on the draft's support S_i, the complement mass
//! P_out = Σ_{x∉S_i} p_i(x), and one token c_i drawn from p_i restricted to the complement.
//! For position γ+1 it sends one bonus token drawn from p_{γ+1}. Outside S_i the draft's q is
//! zero, so the residual there is proportional to p_i itself, and c_i is an exact sample of
//! that part of the residual.

use crate::dense_rule::RoundKey;
use crate::dist::{DenseDist, check_token};
use crate::error::{Result, SamplingError};
use crate::kernels::{lane_sum, sample_index};
use crate::rng::Purpose;

/// The target's answer for one block position.
#[derive(Debug, Clone, PartialEq)]
pub struct ScoredPosition {
    /// p_i(x) for each x of the draft's support, in the support's order.
    pub p_on_support: Vec<f64>,
    /// Σ of p_i outside the support.
    pub complement_mass: f64,
    /// A draw from p_i restricted to the complement; `None` exactly when the mass is zero.
    pub complement_sample: Option<u32>,
}

/// The target's answer for a whole block.
#[derive(Debug, Clone, PartialEq)]
pub struct ScoredBlock {
    pub positions: Vec<ScoredPosition>,
    /// A draw from p_{γ+1}.
    pub bonus: u32,
}

/// Builds the sparse reply from the target's effective distributions p_1..p_{γ+1} and the
/// draft's supports S_1..S_γ. Draws use `(Complement, i)` and `(Bonus, γ+1)`.
pub fn score_block(p: &[DenseDist], supports: &[&[u32]], key: RoundKey) -> Result<ScoredBlock> {
    let gamma = supports.len();
    if p.len() != gamma + 1 {
        return Err(SamplingError::ShapeMismatch(format!(
            "{gamma} supports need {} target distributions, got {}",
            gamma + 1,
            p.len()
        )));
    }
    let mut positions = Vec::with_capacity(gamma);
    let mut outside = vec![true; p[0].vocab_size()];
    for (i, (p_i, support)) in p.iter().zip(supports).enumerate() {
        let position = i + 1;
        if p_i.vocab_size() != outside.len() {
            return Err(SamplingError::ShapeMismatch(format!(
                "target distributions of different sizes: {} and {}",
                outside.len(),
                p_i.vocab_size()
            )));
        }
        for &t in *support {
            check_token(t, outside.len())?;
            outside[t as usize] = false;
        }
        let p_on_support = support.iter().map(|&t| p_i.prob(t)).collect();
        let probs = p_i.probs();
        let outside_mass = |i: usize| if outside[i] { probs[i] } else { 0.0 };
        let complement_mass = lane_sum(0..probs.len(), outside_mass);
        let complement_sample = if complement_mass > 0.0 {
            let u = key.stream(position, Purpose::Complement).uniform();
            sample_index(probs.len(), outside_mass, complement_mass, u).map(|t| t as u32)
        } else {
            None
        };
        positions.push(ScoredPosition { p_on_support, complement_mass, complement_sample });
        for &t in *support {
            outside[t as usize] = true;
        }
    }
    let bonus = p[gamma].sample(key.stream(gamma + 1, Purpose::Bonus).uniform());
    Ok(ScoredBlock { positions, bonus })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pieces_add_up_and_the_complement_sample_is_outside() {
        let p = DenseDist::new(vec![0.1, 0.2, 0.3, 0.4]).unwrap();
        let key = RoundKey { seed: 3, round: 1 };
        for seed in 0..100 {
            let block = score_block(&[p.clone(), p.clone()], &[&[3, 1]], RoundKey { seed, ..key }).unwrap();
            let pos = &block.positions[0];
            assert_eq!(pos.p_on_support, vec![0.4, 0.2]);
            assert!((pos.complement_mass - 0.4).abs() < 1e-15);
            assert!(matches!(pos.complement_sample, Some(0 | 2)));
        }
        let full = score_block(&[p.clone(), p], &[&[0, 1, 2, 3]], key).unwrap();
        assert_eq!(full.positions[0].complement_mass, 0.0);
        assert_eq!(full.positions[0].complement_sample, None);
    }

    #[test]
    fn refuses_out_of_range_supports() {
        let p = DenseDist::new(vec![0.5, 0.5]).unwrap();
        assert_eq!(
            score_block(&[p.clone(), p], &[&[2]], RoundKey { seed: 0, round: 0 }),
            Err(SamplingError::TokenOutOfRange { token: 2, vocab_size: 2 })
        );
    }
}
