//! The cost model of speculative decoding: when does drafting pay, and with which γ.
//!
//! With per-token acceptance α, a round of draft length γ commits on average
//! (1 - α^(γ+1)) / (1 - α) tokens (Leviathan et al. 2023, eq. 1). A round costs γ draft
//! steps, one verify pass of the target and, when the draft sits elsewhere, one network
//! round trip to it; target-only decoding (γ = 0) costs one target pass per token. The best
//! γ maximises tokens per millisecond and is 0 when the draft does not pay.

use crate::error::{Result, SamplingError};

/// Largest draft length anything in specd accepts.
pub const MAX_GAMMA: u32 = 32;

/// Measured (or assumed) costs and acceptance.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct CostModel {
    /// Per-token acceptance probability, in [0, 1).
    pub alpha: f64,
    /// One verify pass of the target (≈ one decode step: the block is scored in one forward).
    pub target_ms: f64,
    /// One draft step.
    pub draft_ms: f64,
    /// Round trip between the coordinator and the draft node, paid once per speculative round.
    pub rtt_ms: f64,
}

impl CostModel {
    pub fn new(alpha: f64, target_ms: f64, draft_ms: f64, rtt_ms: f64) -> Result<Self> {
        let invalid = |name, value, expected| Err(SamplingError::InvalidParameter { name, value, expected });
        if !(0.0..1.0).contains(&alpha) {
            return invalid("alpha", alpha, "must be in [0, 1)");
        }
        if !(target_ms.is_finite() && target_ms > 0.0) {
            return invalid("target_ms", target_ms, "must be a positive number of milliseconds");
        }
        if !(draft_ms.is_finite() && draft_ms >= 0.0) {
            return invalid("draft_ms", draft_ms, "must be a non-negative number of milliseconds");
        }
        if !(rtt_ms.is_finite() && rtt_ms >= 0.0) {
            return invalid("rtt_ms", rtt_ms, "must be a non-negative number of milliseconds");
        }
        Ok(Self { alpha, target_ms, draft_ms, rtt_ms })
    }

    /// Expected committed tokens per round: (1 - α^(γ+1)) / (1 - α).
    pub fn tokens_per_round(&self, gamma: u32) -> f64 {
        expected_tokens_per_round(self.alpha, gamma)
    }

    /// Milliseconds per round: γ·draft + rtt + target; just the target pass when γ = 0.
    pub fn round_ms(&self, gamma: u32) -> f64 {
        if gamma == 0 { self.target_ms } else { f64::from(gamma) * self.draft_ms + self.rtt_ms + self.target_ms }
    }

    pub fn ms_per_token(&self, gamma: u32) -> f64 {
        self.round_ms(gamma) / self.tokens_per_round(gamma)
    }

    /// Speedup over target-only decoding (γ = 0).
    pub fn speedup(&self, gamma: u32) -> f64 {
        self.ms_per_token(0) / self.ms_per_token(gamma)
    }

    /// docs/benchmarking.md's analytic bound (1-α^(γ+1)) / ((1-α)(γc+1)), c = draft / target; equal to
    /// [`Self::speedup`] when the round trip is zero.
    pub fn analytic_bound(&self, gamma: u32) -> f64 {
        let c = self.draft_ms / self.target_ms;
        self.tokens_per_round(gamma) / (f64::from(gamma) * c + 1.0)
    }

    /// The γ in 0..=max_gamma with the highest speedup, and that speedup. Near-ties (relative
    /// 1e-9) go to the smaller γ: less draft work for the same speed.
    pub fn best_gamma(&self, max_gamma: u32) -> (u32, f64) {
        let mut best = (0, 1.0);
        for gamma in 1..=max_gamma.min(MAX_GAMMA) {
            let s = self.speedup(gamma);
            if s > best.1 * (1.0 + 1e-9) {
                best = (gamma, s);
            }
        }
        best
    }
}

/// (1 - α^(γ+1)) / (1 - α), with its limit γ + 1 at α = 1.
pub fn expected_tokens_per_round(alpha: f64, gamma: u32) -> f64 {
    if alpha >= 1.0 {
        return f64::from(gamma) + 1.0;
    }
    (1.0 - alpha.powi(gamma as i32 + 1)) / (1.0 - alpha)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn validation() {
        assert!(CostModel::new(1.0, 100.0, 20.0, 0.0).is_err());
        assert!(CostModel::new(-0.1, 100.0, 20.0, 0.0).is_err());
        assert!(CostModel::new(0.5, 0.0, 20.0, 0.0).is_err());
        assert!(CostModel::new(0.5, 100.0, f64::NAN, 0.0).is_err());
        assert!(CostModel::new(0.5, 100.0, 20.0, -1.0).is_err());
        assert!(CostModel::new(0.0, 100.0, 0.0, 0.0).is_ok());
    }

    #[test]
    fn gamma_zero_is_target_only() {
        let m = CostModel::new(0.9, 100.0, 1.0, 0.0).unwrap();
        assert_eq!(m.tokens_per_round(0), 1.0);
        assert_eq!(m.ms_per_token(0), 100.0);
        assert_eq!(m.speedup(0), 1.0);
    }

    #[test]
    fn round_trip_time_costs_speed() {
        let m = CostModel::new(0.8, 50.0, 2.0, 0.0).unwrap();
        let slow = CostModel { rtt_ms: 20.0, ..m };
        assert!(slow.speedup(4) < m.speedup(4));
        assert!((m.speedup(4) - m.analytic_bound(4)).abs() < 1e-12);
        let hopeless = CostModel { rtt_ms: 1000.0, ..m };
        assert_eq!(hopeless.best_gamma(MAX_GAMMA), (0, 1.0));
    }
}
