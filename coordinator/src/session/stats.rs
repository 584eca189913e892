//! The speculation stats a generation sends with each message: rounds, drafted and accepted
//! tokens, times, wire bytes, batching and what proposed each candidate, summed over its
//! rounds.

use std::collections::BTreeMap;

use specd_proto::v1::{ProposalSource, ProposerTally, SpeculationStats};
use specd_sampling::{AcceptedInExpectation, Verification};

use crate::session::round_report::{BatchSum, RoundReport, WireBytes, source_name};

/// What the generation's rounds add up to, as its messages report it
/// ([`SpeculationStats`]).
#[derive(Debug, Default)]
pub struct Stats {
    pub rounds: u64,
    pub draft_tokens: u64,
    pub accepted_tokens: u64,
    accepted_per_position: Vec<u64>,
    gamma: u32,
    pub draft_ns: u64,
    pub verify_ns: u64,
    wall_ns: u64,
    wire: WireBytes,
    pub draft_fallbacks: u64,
    pub target_failovers: u64,
    acceptance_sum: f64,
    evaluated_positions: u64,
    optimistic_attempts: u64,
    optimistic_hits: u64,
    target_batches: BatchSum,
    draft_batches: BatchSum,
    optimistic_pushed: u64,
    /// Candidates proposed and accepted, by what proposed them.
    by_proposer: BTreeMap<ProposalSource, ProposerTally>,
    empty_proposals: u64,
    proposals_skipped: u64,
    /// The rule that ran ([`Self::new`]).
    verification: Verification,
    /// Σ over drafted rounds of what each rule accepts in expectation on that round's drafts.
    expected_accepted: AcceptedInExpectation,
    drafted_rounds: u64,
    /// Prompt tokens each node's prefix cache held when the generation opened its session.
    pub target_cached_tokens: usize,
    pub draft_cached_tokens: usize,
}

impl Stats {
    /// No rounds yet, of a generation verified by `verification`.
    pub fn new(verification: Verification) -> Self {
        Self { verification, ..Self::default() }
    }

    /// Adds a finished round.
    pub fn record(&mut self, report: &RoundReport) {
        self.rounds += 1;
        // A tree has no chain for the two chain rules to be compared on.
        if report.gamma > 0 && !report.tree {
            self.drafted_rounds += 1;
            self.expected_accepted.token += report.outcome.in_expectation.token;
            self.expected_accepted.block += report.outcome.in_expectation.block;
        }
        self.draft_tokens += report.gamma as u64;
        self.accepted_tokens += report.outcome.accepted as u64;
        if self.accepted_per_position.len() < report.gamma {
            self.accepted_per_position.resize(report.gamma, 0);
        }
        for slot in &mut self.accepted_per_position[..report.outcome.accepted] {
            *slot += 1;
        }
        self.gamma = report.gamma as u32;
        self.draft_ns += report.draft_ns;
        self.verify_ns += report.verify_ns;
        self.wall_ns += report.wall_ns;
        self.wire.add(&report.wire);
        self.acceptance_sum += report.outcome.expected_acceptance.iter().sum::<f64>();
        self.evaluated_positions += report.outcome.expected_acceptance.len() as u64;
        self.optimistic_attempts += u64::from(report.optimistic_attempt);
        self.optimistic_hits += u64::from(report.optimistic_hit);
        self.target_batches.add(report.target_batch);
        self.draft_batches.add(report.draft_batches);
        self.optimistic_pushed += u64::from(report.optimistic_pushed);
        for (i, &source) in report.sources.iter().enumerate() {
            let tally = self.by_proposer.entry(source).or_default();
            tally.proposed += 1;
            tally.accepted += u64::from(i < report.outcome.accepted);
        }
        self.empty_proposals += u64::from(report.empty_proposal());
        self.proposals_skipped += u64::from(report.proposal_skipped);
    }

    /// The stats as the client is sent them.
    pub fn to_wire(&self) -> SpeculationStats {
        SpeculationStats {
            rounds: self.rounds,
            draft_tokens: self.draft_tokens,
            accepted_tokens: self.accepted_tokens,
            accepted_per_position: self.accepted_per_position.clone(),
            gamma: self.gamma,
            draft_ns: self.draft_ns,
            verify_ns: self.verify_ns,
            round_wall_ns: self.wall_ns,
            wire_bytes_sent: self.wire.sent(),
            wire_bytes_received: self.wire.received(),
            draft_fallbacks: self.draft_fallbacks,
            target_failovers: self.target_failovers,
            acceptance_sum: self.acceptance_sum,
            evaluated_positions: self.evaluated_positions,
            optimistic_attempts: self.optimistic_attempts,
            optimistic_hits: self.optimistic_hits,
            target_forward_passes: self.target_batches.forward_passes,
            target_batched_sequences: self.target_batches.batched_sequences,
            draft_forward_passes: self.draft_batches.forward_passes,
            draft_batched_sequences: self.draft_batches.batched_sequences,
            wire_bytes_sent_to_draft: self.wire.to_draft,
            wire_bytes_received_from_draft: self.wire.from_draft,
            wire_bytes_sent_to_target: self.wire.to_target,
            wire_bytes_received_from_target: self.wire.from_target,
            optimistic_pushed: self.optimistic_pushed,
            by_proposer: self.by_proposer.iter().map(|(&k, v)| (source_name(k).to_owned(), *v)).collect(),
            empty_proposals: self.empty_proposals,
            proposals_skipped: self.proposals_skipped,
            verification: self.verification.to_string(),
            expected_accepted_token: self.expected_accepted.token,
            expected_accepted_block: self.expected_accepted.block,
            drafted_rounds: self.drafted_rounds,
            target_cached_tokens: self.target_cached_tokens as u32,
            draft_cached_tokens: self.draft_cached_tokens as u32,
        }
    }
}

#[cfg(test)]
mod tests {
    use specd_sampling::{BlockOutcome, EmittedFrom};

    use super::*;

    fn round(gamma: usize, accepted: usize, token: f64, block: f64) -> RoundReport {
        let outcome = BlockOutcome {
            accepted,
            tokens: vec![0; accepted + 1],
            acceptance: Vec::new(),
            expected_acceptance: Vec::new(),
            emitted_from: EmittedFrom::Bonus,
            in_expectation: AcceptedInExpectation { token, block },
        };
        RoundReport::for_tests(outcome, vec![ProposalSource::Model; gamma], [0, 0, 0])
    }

    #[test]
    fn the_stats_sum_both_rules_expectations_over_drafted_rounds_only() {
        let mut stats = Stats::new(Verification::Token);
        stats.record(&round(3, 2, 1.5, 1.75));
        stats.record(&round(0, 0, 0.0, 0.0));
        stats.record(&round(2, 0, 0.25, 0.5));
        // A tree round: no chain for the rules to be compared on.
        stats.record(&RoundReport { tree: true, ..round(6, 1, 9.0, 9.0) });
        let wire = stats.to_wire();
        assert_eq!((wire.rounds, wire.drafted_rounds), (4, 2));
        assert_eq!((wire.expected_accepted_token, wire.expected_accepted_block), (1.75, 2.25));
        assert_eq!(wire.verification, "token");
        assert_eq!(wire.accepted_tokens, 3);
    }
}
