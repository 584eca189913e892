//! One session's adaptive γ: the estimates its own rounds measured (`observe.rs` updates
//! them, `choose.rs` picks each round's γ from them, `memory.rs` hands them on to the
//! sessions after it).

use crate::policy::average::Average;

/// γ of the first round, before anything is measured: a block long enough that its per-token
/// costs count whole in the estimates (`observe.rs`).
pub const START_GAMMA: u32 = 4;

/// How many observations the prior α = 0.5 counts for: a round that evaluates 3 or more
/// positions outweighs it.
pub(super) const ALPHA_PRIOR_WEIGHT: u64 = 2;

/// Nanoseconds to milliseconds.
pub(super) const MS: f64 = 1e-6;

/// One session's adaptive γ.
#[derive(Debug, Clone)]
pub struct AdaptiveGamma {
    pub(super) max: u32,
    pub(super) alpha: Average,
    pub(super) draft_step_ms: Average,
    pub(super) verify_plain_ms: Average,
    pub(super) verify_slope_ms: Average,
    pub(super) spec_overhead_ms: Average,
    pub(super) plain_overhead_ms: Average,
    pub(super) rounds: u64,
    pub(super) last_choice: u32,
    /// Target-only rounds since the last drafting one.
    pub(super) plain_streak: u64,
    /// Positions this session's own rounds evaluated (its α's prior excluded).
    pub(super) own_positions: u64,
    /// Share of drafting rounds whose draft proposed nothing (a deterministic proposer
    /// without a match): they commit one token in a target-only pass plus the draft's call.
    pub(super) empty_share: Average,
}

impl AdaptiveGamma {
    /// γ is chosen in 0..=max.
    pub fn new(max: u32) -> Self {
        Self {
            max,
            alpha: Average::prior(0.5, ALPHA_PRIOR_WEIGHT),
            draft_step_ms: Average::default(),
            verify_plain_ms: Average::default(),
            verify_slope_ms: Average::default(),
            spec_overhead_ms: Average::default(),
            plain_overhead_ms: Average::default(),
            rounds: 0,
            last_choice: 0,
            plain_streak: 0,
            own_positions: 0,
            empty_share: Average::default(),
        }
    }

    /// The largest γ this session may use (0: it never drafts).
    pub fn max(&self) -> u32 {
        self.max
    }

    /// The estimated per-position acceptance α.
    pub fn alpha(&self) -> f64 {
        self.alpha.get().unwrap_or(0.5)
    }
}
