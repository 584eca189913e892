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
            kept.push((kept[i] * position.ratio()).min(1.0));
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
                // 0/0 happens only with P_i = 1 and p_{i+1} = q_{i+1}: then every later P is
                // 1 and every later h is 1, so passing here cannot leave an empty residual.
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
