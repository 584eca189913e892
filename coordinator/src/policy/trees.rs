//! `--tree auto`: whether a session's rounds draft trees or chains, measured by the session
//! (docs/adaptive.md#trees). A tree of depth γ with two alternatives at the first position
//! ([`auto_shape`]) yields more tokens a round than the chain of γ, for more target positions
//! and more draft passes; which pays depends on the hardware (on a GPU a pass over a few more
//! positions costs next to nothing, on a CPU each costs nearly a token's pass) and on the
//! link. So the session measures both kinds' tokens per millisecond of a whole round and
//! drafts the better; the other kind is measured again every [`REMEASURE_EVERY`] drafted
//! rounds, so a change of load or of text is seen.
//!
//! Exact whatever it chooses: each round's rule is exact for its tree or chain, and the
//! choice depends only on earlier rounds.

use specd_sampling::TreeShape;

use crate::policy::average::Average;
use crate::session::round_report::RoundReport;

/// Rounds of each kind measured before the session chooses.
pub const MEASURED_ROUNDS: u64 = 4;

/// While one kind is chosen, one drafted round in this many measures the other.
pub const REMEASURE_EVERY: u64 = 16;

/// Weight of each new round in the running tokens per millisecond.
const WEIGHT: f64 = 0.2;

/// The tree `auto` tries at depth γ: two alternatives for the next token, each continued by
/// one candidate per depth. `None` where it would be a chain (γ = 0).
pub fn auto_shape(gamma: u32) -> Option<TreeShape> {
    let mut widths = vec![1; gamma as usize];
    *widths.first_mut()? = 2;
    TreeShape::new(widths).ok()
}

/// What one kind of round committed and cost, as running averages: their ratio is the
/// kind's tokens per millisecond. A ratio of averages, not an average of each round's ratio,
/// which a round of one token in a long pass swings far more than the throughput it measures.
#[derive(Debug, Clone, Copy, Default)]
struct Throughput {
    tokens: Average,
    ms: Average,
}

impl Throughput {
    fn add(&mut self, tokens: f64, ms: f64) {
        self.tokens.add(tokens, WEIGHT);
        self.ms.add(ms, WEIGHT);
    }

    fn rounds(&self) -> u64 {
        self.ms.count
    }

    fn per_ms(&self) -> Option<f64> {
        Some(self.tokens.get()? / self.ms.get()?)
    }
}

/// One session's measurements of chains and trees.
#[derive(Debug, Clone, Default)]
pub struct TreeTrial {
    chain: Throughput,
    tree: Throughput,
    drafted: u64,
}

impl TreeTrial {
    /// Whether the next drafted round drafts a tree: alternately until both kinds have
    /// [`MEASURED_ROUNDS`], then the kind with more tokens per millisecond, with one round in
    /// [`REMEASURE_EVERY`] of the other.
    pub fn wants_tree(&self) -> bool {
        if self.tree.rounds() < MEASURED_ROUNDS || self.chain.rounds() < MEASURED_ROUNDS {
            return self.tree.rounds() < self.chain.rounds();
        }
        let tree_pays = self.tree.per_ms() > self.chain.per_ms();
        let remeasure = self.drafted % REMEASURE_EVERY == REMEASURE_EVERY - 1;
        tree_pays != remeasure
    }

    /// Learns from a drafted round: its tokens and its wall time, under its kind.
    pub fn observe(&mut self, report: &RoundReport) {
        if report.gamma == 0 || report.wall_ns == 0 {
            return;
        }
        self.drafted += 1;
        let kind = if report.tree { &mut self.tree } else { &mut self.chain };
        kind.add(report.outcome.tokens.len() as f64, report.wall_ns as f64 / 1e6);
    }
}

#[cfg(test)]
mod tests {
    use specd_proto::v1::ProposalSource;
    use specd_sampling::{BlockOutcome, EmittedFrom};

    use super::*;

    fn round(tree: bool, tokens: usize, wall_ms: f64) -> RoundReport {
        let outcome = BlockOutcome {
            accepted: tokens - 1,
            tokens: vec![0; tokens],
            acceptance: Vec::new(),
            expected_acceptance: Vec::new(),
            emitted_from: EmittedFrom::Bonus,
            in_expectation: Default::default(),
        };
        let report = RoundReport::for_tests(outcome, vec![ProposalSource::Model; 4], [0, 0, (wall_ms * 1e6) as u64]);
        RoundReport { tree, ..report }
    }

    /// Runs `rounds` rounds in a world where a chain round commits 3 tokens in 10 ms and a
    /// tree round `tree_tokens` in `tree_ms`; returns the share of tree rounds after the first
    /// measuring ones.
    fn tree_share(tree_tokens: usize, tree_ms: f64, rounds: usize) -> f64 {
        let mut trial = TreeTrial::default();
        let mut trees = 0;
        for i in 0..rounds {
            let tree = trial.wants_tree();
            trees += usize::from(tree && i >= 2 * MEASURED_ROUNDS as usize);
            trial.observe(&if tree { round(true, tree_tokens, tree_ms) } else { round(false, 3, 10.0) });
        }
        trees as f64 / (rounds - 2 * MEASURED_ROUNDS as usize) as f64
    }

    #[test]
    fn the_session_drafts_the_kind_that_yields_more_tokens_per_ms() {
        // A GPU-like world: a tree's extra positions cost 5 %, and it commits 4 tokens.
        assert!(tree_share(4, 10.5, 200) > 0.9, "trees pay and should be drafted");
        // A CPU-like world: a tree round costs 40 % more for 10 % more tokens.
        let share = tree_share(3, 14.0, 200);
        assert!(share > 0.0 && share < 0.1, "only re-measuring rounds draft trees: {share}");
    }

    #[test]
    fn target_only_rounds_teach_nothing_and_the_auto_shape_branches_at_the_first_position() {
        let mut trial = TreeTrial::default();
        trial.observe(&RoundReport { gamma: 0, ..round(false, 1, 5.0) });
        assert_eq!(trial.drafted, 0);
        assert_eq!(auto_shape(3).unwrap().widths, [2, 1, 1]);
        assert!(auto_shape(0).is_none());
    }
}
