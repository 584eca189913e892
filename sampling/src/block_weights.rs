//! Block verification's weights for one drafted block (the quantities of
//! [`crate::block_rule`]), and what each verification rule accepts in expectation given the
//! block, for reports that compare the rules on the same drafts.

use crate::excess::PositionView;
use crate::rule::AcceptedInExpectation;

/// Block verification's quantities for one drafted block.
#[derive(Debug, Clone, PartialEq)]
pub struct BlockWeights {
    /// P_0..P_γ: P_0 = 1, P_i = min(1, P_{i−1}·p_i(x_i)/q_i(x_i)).
    pub kept: Vec<f64>,
    /// r_0..r_{γ−1}: r_i = Σ_y max(P_i·p_{i+1}(y) − q_{i+1}(y), 0).
    pub excess: Vec<f64>,
    /// h_1..h_γ (h_i at index i − 1): the probability that the block passes at i.
    pub pass: Vec<f64>,
}

impl BlockWeights {
    /// The weights of a block whose positions are `positions`.
    pub(crate) fn of(positions: &[impl PositionView]) -> Self {
        let gamma = positions.len();
        let mut kept = Vec::with_capacity(gamma + 1);
        kept.push(1.0);
        for (i, position) in positions.iter().enumerate() {
            // Once the chain has lost all its weight it stays lost: 0·∞ (a later candidate with
            // a subnormal q) is NaN, and NaN.min(1.0) would revive it.
            let weight = if kept[i] > 0.0 { (kept[i] * position.ratio()).min(1.0) } else { 0.0 };
            kept.push(weight);
        }
        // Once P is 0 it stays 0, and max(0·p − q, 0) = 0: no pass over the vocabulary.
        let excess: Vec<f64> = positions
            .iter()
            .zip(&kept)
            .map(|(position, &weight)| if weight > 0.0 { position.excess_mass(weight) } else { 0.0 })
            .collect();
        let pass = (1..=gamma)
            .map(|i| {
                if i == gamma {
                    return kept[gamma];
                }
                let (r, weight) = (excess[i], kept[i]);
                let denominator = r + (1.0 - weight);
                // 0/0 happens only with P_i = 1 and p_{i+1} = q_{i+1}: then P_{i+1} = 1 and
                // h_{i+1} = 1, so passing here never leaves the round at an empty residual.
                if denominator > 0.0 { r / denominator } else { 1.0 }
            })
            .collect();
        Self { kept, excess, pass }
    }

    /// P(τ = i) for i = 0..=γ: h_i·Π_{j>i}(1 − h_j), with h_0 = 1.
    pub fn stop_law(&self) -> Vec<f64> {
        let gamma = self.pass.len();
        let mut law = vec![0.0; gamma + 1];
        let mut none_after = 1.0;
        for i in (0..=gamma).rev() {
            let h = if i == 0 { 1.0 } else { self.pass[i - 1] };
            law[i] = h * none_after;
            none_after *= 1.0 - h;
        }
        law
    }

    /// E[τ]: the candidates block verification accepts in expectation, given the block.
    pub fn expected_accepted(&self) -> f64 {
        self.stop_law().iter().enumerate().map(|(i, w)| i as f64 * w).sum()
    }
}

/// E[accepted] of token verification given the block: Σ_i Π_{j≤i} min(1, p_j(x_j)/q_j(x_j)).
pub(crate) fn token_expected_accepted(positions: &[impl PositionView]) -> f64 {
    let mut all_so_far = 1.0;
    let mut sum = 0.0;
    for position in positions {
        all_so_far *= position.ratio().min(1.0);
        sum += all_so_far;
    }
    sum
}

/// What each rule accepts in expectation on these positions.
pub(crate) fn in_expectation(positions: &[impl PositionView]) -> AcceptedInExpectation {
    AcceptedInExpectation {
        token: token_expected_accepted(positions),
        block: BlockWeights::of(positions).expected_accepted(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dist::DenseDist;
    use crate::excess::DensePosition;

    #[test]
    fn a_chain_that_lost_its_weight_is_not_revived_by_a_later_infinite_ratio() {
        // x_1 has p = 0; x_2 has a subnormal q, so p/q overflows to ∞ and 0·∞ is NaN.
        let p1 = DenseDist::new(vec![0.0, 1.0]).unwrap();
        let q1 = DenseDist::new(vec![0.5, 0.5]).unwrap();
        let p2 = DenseDist::new(vec![0.5, 0.5]).unwrap();
        let q2 = DenseDist::from_weights(vec![1e-320, 1.0]).unwrap();
        let positions = [DensePosition { p: &p1, q: &q1, token: 0 }, DensePosition { p: &p2, q: &q2, token: 0 }];
        let weights = BlockWeights::of(&positions);
        assert_eq!(weights.kept, vec![1.0, 0.0, 0.0]);
        assert_eq!(weights.pass[1], 0.0, "a block through a token of p = 0 must never pass");
        assert_eq!(weights.stop_law()[0], 1.0);
    }

    #[test]
    fn the_stop_law_sums_to_one() {
        let p = DenseDist::new(vec![0.6, 0.3, 0.1]).unwrap();
        let q = DenseDist::new(vec![0.5, 0.25, 0.25]).unwrap();
        for tokens in [[0, 1, 2], [2, 2, 2], [1, 0, 0]] {
            let positions: Vec<_> = tokens.iter().map(|&token| DensePosition { p: &p, q: &q, token }).collect();
            let law = BlockWeights::of(&positions).stop_law();
            assert!((law.iter().sum::<f64>() - 1.0).abs() < 1e-12, "{tokens:?}: {law:?}");
        }
    }
}
