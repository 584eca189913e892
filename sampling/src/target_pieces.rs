//! What the target computes for the sparse wire format.
//!
//! For each block position i the target knows the full p_i but sends only what the
//! coordinator needs: p_i on the draft's support S_i, the complement mass
//! P_out = Σ_{x∉S_i} p_i(x), and one token c_i drawn from p_i restricted to the complement.
//! For position γ+1 it sends one bonus token drawn from p_{γ+1}. Outside S_i the draft's q is
//! zero, so the residual there is proportional to p_i itself, and c_i is an exact sample of
//! that part of the residual.

use crate::dist::{DenseDist, check_token};
use crate::error::{Result, SamplingError};
use crate::kernels::{lane_sum, sample_index};
use crate::rng::Purpose;
use crate::rng::RoundKey;
use crate::rows::map_positions;

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

/// The target's pieces for one node of a drafted tree ([`crate::tree_rule`]).
#[derive(Debug, Clone, PartialEq)]
pub enum ScoredNode {
    /// A node with children: p on their draft support, the mass outside and a sample of it.
    Inner(ScoredPosition),
    /// A node without children: a draw from p after it.
    Leaf { bonus: u32 },
}

/// The sparse reply for a tree: `p[u]` after every node u (the root is 0), `supports[u]` the
/// draft support node u's children were drawn from (`None` at a leaf). Draws use
/// `(Complement, u + 1)` and `(Bonus, u + 1)`.
pub fn score_tree(p: &[DenseDist], supports: &[Option<&[u32]>], key: RoundKey) -> Result<Vec<ScoredNode>> {
    if p.len() != supports.len() || p.is_empty() {
        return Err(SamplingError::ShapeMismatch(format!(
            "{} tree nodes with {} target distributions",
            supports.len(),
            p.len()
        )));
    }
    let mut outside = vec![true; p[0].vocab_size()];
    p.iter()
        .zip(supports)
        .enumerate()
        .map(|(u, (p_u, support))| match support {
            Some(support) => {
                let u_draw = key.stream(u + 1, Purpose::Complement).uniform();
                score_position(p_u, support, &mut outside, u_draw).map(ScoredNode::Inner)
            }
            None => Ok(ScoredNode::Leaf { bonus: p_u.sample(key.stream(u + 1, Purpose::Bonus).uniform()) }),
        })
        .collect()
}

/// Builds the sparse reply from the target's effective distributions p_1..p_{γ+1} and the
/// draft's supports S_1..S_γ. Draws use `(Complement, i)` and `(Bonus, γ+1)`. Large blocks
/// are scored on at most `threads` threads (module `rows`), with the same numbers.
pub fn score_block(p: &[DenseDist], supports: &[&[u32]], key: RoundKey, threads: usize) -> Result<ScoredBlock> {
    let gamma = supports.len();
    if p.len() != gamma + 1 {
        return Err(SamplingError::ShapeMismatch(format!(
            "{gamma} supports need {} target distributions, got {}",
            gamma + 1,
            p.len()
        )));
    }
    let vocab_size = p[0].vocab_size();
    let positions = map_positions(
        gamma,
        vocab_size,
        threads,
        // Each thread marks one support at a time in its own mask, and clears it after.
        || vec![true; vocab_size],
        |outside, i| score_position(&p[i], supports[i], outside, key.stream(i + 1, Purpose::Complement).uniform()),
    );
    let positions = positions.into_iter().collect::<Result<Vec<_>>>()?;
    let bonus = p[gamma].sample(key.stream(gamma + 1, Purpose::Bonus).uniform());
    Ok(ScoredBlock { positions, bonus })
}

/// One position's pieces; `outside` (one entry per token of p_1) is all `true` before and after.
fn score_position(p_i: &DenseDist, support: &[u32], outside: &mut [bool], u: f64) -> Result<ScoredPosition> {
    if p_i.vocab_size() != outside.len() {
        return Err(SamplingError::ShapeMismatch(format!(
            "target distributions of different sizes: {} and {}",
            outside.len(),
            p_i.vocab_size()
        )));
    }
    for &t in support {
        check_token(t, outside.len())?;
    }
    for &t in support {
        outside[t as usize] = false;
    }
    let p_on_support = support.iter().map(|&t| p_i.prob(t)).collect();
    let probs = p_i.probs();
    let outside_mass = |i: usize| if outside[i] { probs[i] } else { 0.0 };
    let complement_mass = lane_sum(0..probs.len(), outside_mass);
    let complement_sample = if complement_mass > 0.0 {
        sample_index(probs.len(), outside_mass, complement_mass, u).map(|t| t as u32)
    } else {
        None
    };
    for &t in support {
        outside[t as usize] = true;
    }
    Ok(ScoredPosition { p_on_support, complement_mass, complement_sample })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pieces_add_up_and_the_complement_sample_is_outside() {
        let p = DenseDist::new(vec![0.1, 0.2, 0.3, 0.4]).unwrap();
        let key = RoundKey { seed: 3, round: 1 };
        for seed in 0..100 {
            let block = score_block(&[p.clone(), p.clone()], &[&[3, 1]], RoundKey { seed, ..key }, 1).unwrap();
            let pos = &block.positions[0];
            assert_eq!(pos.p_on_support, vec![0.4, 0.2]);
            assert!((pos.complement_mass - 0.4).abs() < 1e-15);
            assert!(matches!(pos.complement_sample, Some(0 | 2)));
        }
        let full = score_block(&[p.clone(), p], &[&[0, 1, 2, 3]], key, 1).unwrap();
        assert_eq!(full.positions[0].complement_mass, 0.0);
        assert_eq!(full.positions[0].complement_sample, None);
    }

    #[test]
    fn a_block_scored_on_threads_has_the_same_pieces_and_each_its_own_support() {
        // Large enough to spread (6 rows of 70 000): the same pieces on 1 and on 3 threads,
        // and each position's complement leaves out its own support only.
        let vocab = 70_000usize;
        let p: Vec<DenseDist> = (0..6)
            .map(|r| {
                DenseDist::from_weights((0..vocab).map(|i| 1.0 + ((i * 31 + r * 7) % 97) as f64).collect()).unwrap()
            })
            .collect();
        let supports: Vec<Vec<u32>> = (0..5u32).map(|r| (0..40).map(|k| r * 1000 + k * 3).collect()).collect();
        let supports: Vec<&[u32]> = supports.iter().map(Vec::as_slice).collect();
        let key = RoundKey { seed: 11, round: 4 };
        let one = score_block(&p, &supports, key, 1).unwrap();
        assert_eq!(one, score_block(&p, &supports, key, 3).unwrap());
        for (i, position) in one.positions.iter().enumerate() {
            let inside: f64 = supports[i].iter().map(|&t| p[i].prob(t)).sum();
            assert!((position.complement_mass - (1.0 - inside)).abs() < 1e-12, "position {i}");
            let sample = position.complement_sample.unwrap();
            assert!(!supports[i].contains(&sample), "position {i} drew {sample} from its support");
        }
    }

    #[test]
    fn refuses_out_of_range_supports() {
        let p = DenseDist::new(vec![0.5, 0.5]).unwrap();
        assert_eq!(
            score_block(&[p.clone(), p], &[&[2]], RoundKey { seed: 0, round: 0 }, 1),
            Err(SamplingError::TokenOutOfRange { token: 2, vocab_size: 2 })
        );
    }
}
