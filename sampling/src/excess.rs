//! One block position as the verification rules read it, on either wire format: the
//! candidate's ratio p(x)/q(x), and the scaled excess max(s·p − q, 0) with its mass and a draw
//! from it.
//!
//! Token verification needs the excess at s = 1 (the residual of docs/rule.md); block
//! verification needs it at s = P_i, the probability weight its chain has kept so far
//! ([`crate::block_rule`]). On the sparse wire q is zero outside the support S, so the excess
//! there is s·p, whose mass is s·P_out and whose draw is the target's complement sample: the
//! draw stays exact with only O(|S|) numbers.

use crate::dist::{DenseDist, SparseDist, sample_weights};
use crate::error::{Result, SamplingError};
use crate::kernels::{lane_sum, sample_index};
use crate::rng::StreamKey;
use crate::rule::EmittedFrom;
use crate::target_pieces::ScoredPosition;

/// What the rules need of one block position (q(x) > 0 is checked before one is built).
pub(crate) trait PositionView {
    /// The position's candidate x.
    fn token(&self) -> u32;
    /// p(x) / q(x) of the position's candidate x.
    fn ratio(&self) -> f64;
    /// Σ_y min(p(y), q(y)): the probability that token verification accepts here.
    fn overlap(&self) -> f64;
    /// Σ_y max(s·p(y) − q(y), 0).
    fn excess_mass(&self, s: f64) -> f64;
    /// A draw from max(s·p − q, 0) / `mass` (`mass` from [`Self::excess_mass`]) with the
    /// stream's uniforms; when rounding left no mass, a draw from p, which can only happen
    /// on an event of probability at most the rounding error.
    fn draw_excess(&self, s: f64, mass: f64, stream: StreamKey) -> Result<(u32, EmittedFrom)>;
}

/// A position with p and q in full.
#[derive(Debug, Clone, Copy)]
pub(crate) struct DensePosition<'a> {
    pub p: &'a DenseDist,
    pub q: &'a DenseDist,
    pub token: u32,
}

impl PositionView for DensePosition<'_> {
    fn token(&self) -> u32 {
        self.token
    }

    fn ratio(&self) -> f64 {
        self.p.prob(self.token) / self.q.prob(self.token)
    }

    fn overlap(&self) -> f64 {
        self.p.overlap(self.q)
    }

    fn excess_mass(&self, s: f64) -> f64 {
        let (p, q) = (self.p.probs(), self.q.probs());
        lane_sum(0..p.len(), |i| (s * p[i] - q[i]).max(0.0))
    }

    fn draw_excess(&self, s: f64, mass: f64, stream: StreamKey) -> Result<(u32, EmittedFrom)> {
        Ok((draw_dense_excess(self.p, self.q, s, mass, stream.uniform()), EmittedFrom::Residual))
    }
}

/// A draw from max(s·p − q, 0) / `mass` with the uniform `u`; from p when that has no mass.
pub(crate) fn draw_dense_excess(p: &DenseDist, q: &DenseDist, s: f64, mass: f64, u: f64) -> u32 {
    let (p_probs, q_probs) = (p.probs(), q.probs());
    let token = if mass > 0.0 {
        sample_index(p_probs.len(), |i| (s * p_probs[i] - q_probs[i]).max(0.0), mass, u).map(|t| t as u32)
    } else {
        None
    };
    token.unwrap_or_else(|| p.sample(u))
}

/// A position on the sparse wire: q on its support, and the target's pieces for it.
#[derive(Debug, Clone, Copy)]
pub(crate) struct SparsePosition<'a> {
    pub q: &'a SparseDist,
    pub scored: &'a ScoredPosition,
    /// The candidate's index in the support.
    pub index: usize,
    /// The block position (1-based), for errors.
    pub position: usize,
}

impl SparsePosition<'_> {
    fn inside(&self, s: f64) -> impl Iterator<Item = (u32, f64)> + '_ {
        self.q
            .tokens()
            .iter()
            .zip(self.q.probs())
            .zip(&self.scored.p_on_support)
            .map(move |((&t, &q), &p)| (t, (s * p - q).max(0.0)))
    }
}

impl PositionView for SparsePosition<'_> {
    fn token(&self) -> u32 {
        self.q.tokens()[self.index]
    }

    fn ratio(&self) -> f64 {
        self.scored.p_on_support[self.index] / self.q.probs()[self.index]
    }

    fn overlap(&self) -> f64 {
        self.q.probs().iter().zip(&self.scored.p_on_support).map(|(q, p)| q.min(*p)).sum()
    }

    fn excess_mass(&self, s: f64) -> f64 {
        self.inside(s).map(|(_, w)| w).sum::<f64>() + s * self.scored.complement_mass
    }

    /// With probability R_in / (R_in + s·P_out), where R_in is the mass inside the support, a
    /// token of the support in proportion to its excess; otherwise the complement sample.
    fn draw_excess(&self, s: f64, mass: f64, stream: StreamKey) -> Result<(u32, EmittedFrom)> {
        let mut stream = stream.stream();
        if mass <= 0.0 {
            let on_support = self.q.tokens().iter().copied().zip(self.scored.p_on_support.iter().copied());
            let p_mass: f64 = self.scored.p_on_support.iter().sum();
            return sample_weights(on_support, p_mass, stream.next_uniform())
                .map(|t| (t, EmittedFrom::Residual))
                .ok_or_else(|| {
                    SamplingError::InvalidTargetReply(format!("position {}: p has no mass at all", self.position))
                });
        }
        let r_in: f64 = self.inside(s).map(|(_, w)| w).sum();
        if stream.next_uniform() * mass < r_in {
            let token = sample_weights(self.inside(s), r_in, stream.next_uniform()).expect("r_in > 0 here");
            return Ok((token, EmittedFrom::Residual));
        }
        self.scored.complement_sample.map(|token| (token, EmittedFrom::Complement)).ok_or(
            SamplingError::MissingComplementSample { position: self.position, mass: self.scored.complement_mass },
        )
    }
}
