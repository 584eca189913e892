//! The exact block rule of speculative sampling, shared pieces.
//!
//! Leviathan, Kalman and Matias, "Fast Inference from Transformers via Speculative Decoding"
//! (ICML 2023, arXiv:2211.17192) and Chen et al., "Accelerating Large Language Model
//! Decoding with Speculative Sampling" (arXiv:2302.01318).
//!
//! For a block x_1..x_γ with x_i ~ q_i, and target distributions p_1..p_{γ+1}:
//! 1. for i = 1..γ accept x_i with probability min(1, p_i(x_i) / q_i(x_i)); stop at the first
//!    rejection;
//! 2. at the first rejected position i emit one token from the residual
//!    r(x) = max(0, p_i(x) - q_i(x)) / Σ_y max(0, p_i(y) - q_i(y));
//! 3. if all γ are accepted emit a bonus token from p_{γ+1}.
//!
//! The committed tokens x_1..x_n, t are distributed exactly as n+1 tokens of target-only
//! sampling: P(emit x) = q(x)·min(1, p(x)/q(x)) + (1 - β)·r(x) = min(p, q)(x) + max(0, p - q)(x)
//! = p(x), where β = Σ min(p, q) is the acceptance probability.
//!
//! [`crate::dense_rule`] applies it on full distributions; [`crate::sparse_rule`] on the
//! sparse wire format, where q lives on a support S and the target sends p on S, the mass
//! outside S and one sample from p restricted to the outside.

/// Probability of accepting a candidate whose target probability is `p_x` and draft
/// probability `q_x > 0`.
pub fn acceptance_probability(p_x: f64, q_x: f64) -> f64 {
    if p_x >= q_x { 1.0 } else { p_x / q_x }
}

/// Where the token that ends a round came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EmittedFrom {
    /// The residual at the first rejected position, drawn from inside the draft's support.
    Residual,
    /// The residual at the first rejected position, drawn from outside the draft's support
    /// (the target's complement sample; sparse wire format only).
    Complement,
    /// The bonus token from p_{γ+1}: every candidate was accepted.
    Bonus,
    /// γ = 0: a plain draw from p.
    Plain,
}

/// The result of one round.
#[derive(Debug, Clone, PartialEq)]
pub struct BlockOutcome {
    /// How many candidates were accepted (0..=γ).
    pub accepted: usize,
    /// The committed tokens: the accepted candidates, then the emitted token.
    pub tokens: Vec<u32>,
    /// min(1, p/q) of each candidate up to the first one not committed: under token
    /// verification the accepted ones and the first rejected one, under block verification
    /// positions 1..=min(τ + 1, γ).
    pub acceptance: Vec<f64>,
    /// Σ_x min(p_i(x), q_i(x)) for the same positions: the probability that token
    /// verification accepts the position's candidate given the prefix before it, a
    /// lower-variance estimate of α than counting accepts.
    pub expected_acceptance: Vec<f64>,
    pub emitted_from: EmittedFrom,
    /// What each verification rule accepts in expectation on this round's candidates and
    /// target distributions, whichever rule ran: the two rules compared on the same drafts.
    pub in_expectation: AcceptedInExpectation,
}

/// The candidates each verification rule accepts in expectation on one drafted block, given
/// the block (the expectation is over the rule's own draws only).
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct AcceptedInExpectation {
    /// Token verification: Σ_i Π_{j≤i} min(1, p_j(x_j)/q_j(x_j)).
    pub token: f64,
    /// Block verification: E[τ] ([`crate::block_rule`]).
    pub block: f64,
}

impl BlockOutcome {
    /// The token that ends the round (residual, complement or bonus).
    pub fn emitted(&self) -> u32 {
        *self.tokens.last().expect("a round commits at least one token")
    }
}
