//! What the single-client measurement adds up: each mode's totals over whole requests and
//! after their first rounds, each pass's rates, and how often greedy outputs agree.

use std::time::Duration;

use serde_json::json;

use super::sample::Sample;

/// How often greedy speculative output equals target-only output on the same prompt. Exact
/// in law does not mean identical in bits: a verify pass scores several tokens at once, and
/// its floating-point sums may round differently from one-token passes, which can flip an
/// argmax between two near-tied tokens (more often in bf16 than in f32).
#[derive(Debug, Default)]
pub(super) struct GreedyAgreement {
    pairs: u64,
    identical: u64,
    /// Tokens before the first difference, summed over pairs.
    common_prefix: u64,
    compared: u64,
}

impl GreedyAgreement {
    pub(super) fn add(&mut self, target_only: &[u32], speculative: &[u32]) {
        let prefix = target_only.iter().zip(speculative).take_while(|(a, b)| a == b).count();
        self.pairs += 1;
        self.identical += u64::from(target_only == speculative);
        self.common_prefix += prefix as u64;
        self.compared += target_only.len().max(speculative.len()) as u64;
    }

    pub(super) fn report(&self) -> serde_json::Value {
        json!({
            "pairs": self.pairs,
            "identical_fraction": self.identical as f64 / self.pairs.max(1) as f64,
            "common_prefix_fraction": self.common_prefix as f64 / self.compared.max(1) as f64,
        })
    }
}

/// The sums of one mode over a pass (or all passes).
#[derive(Debug, Default, Clone)]
pub(super) struct Totals {
    pub(super) tokens: u64,
    pub(super) wall: Duration,
    pub(super) rounds: u64,
    pub(super) draft_tokens: u64,
    pub(super) draft_ns: u64,
    pub(super) verify_ns: u64,
    /// The rounds' wall time as the coordinator saw it.
    pub(super) round_wall_ns: u64,
    pub(super) acceptance_sum: f64,
    pub(super) evaluated: u64,
    pub(super) wire_bytes: u64,
    /// Sent to the draft, received from it, sent to the target, received from it.
    pub(super) wire_bytes_by_role: [u64; 4],
    pub(super) optimistic_attempts: u64,
    pub(super) optimistic_hits: u64,
    pub(super) optimistic_pushed: u64,
    /// Candidates proposed and accepted, by proposer (prompt and output matches apart).
    pub(super) by_proposer: std::collections::BTreeMap<String, (u64, u64)>,
    pub(super) empty_proposals: u64,
    /// Rounds that verified candidates, and Σ over them of what each rule accepts in
    /// expectation on their drafts.
    pub(super) drafted_rounds: u64,
    pub(super) expected_accepted_token: f64,
    pub(super) expected_accepted_block: f64,
    /// The rule the coordinator ran, as its stats name it.
    pub(super) verification: String,
}

impl Totals {
    pub(super) fn add(&mut self, s: &Sample) {
        self.tokens += s.tokens;
        self.wall += s.wall;
        self.rounds += s.stats.rounds;
        self.draft_tokens += s.stats.draft_tokens;
        self.draft_ns += s.stats.draft_ns;
        self.verify_ns += s.stats.verify_ns;
        self.round_wall_ns += s.stats.round_wall_ns;
        self.acceptance_sum += s.stats.acceptance_sum;
        self.evaluated += s.stats.evaluated_positions;
        self.wire_bytes += s.stats.wire_bytes_sent + s.stats.wire_bytes_received;
        let st = &s.stats;
        let by_role = [
            st.wire_bytes_sent_to_draft,
            st.wire_bytes_received_from_draft,
            st.wire_bytes_sent_to_target,
            st.wire_bytes_received_from_target,
        ];
        for (total, x) in self.wire_bytes_by_role.iter_mut().zip(by_role) {
            *total += x;
        }
        self.optimistic_attempts += s.stats.optimistic_attempts;
        self.optimistic_hits += s.stats.optimistic_hits;
        self.optimistic_pushed += s.stats.optimistic_pushed;
        for (proposer, tally) in &s.stats.by_proposer {
            let sum = self.by_proposer.entry(proposer.clone()).or_default();
            (sum.0, sum.1) = (sum.0 + tally.proposed, sum.1 + tally.accepted);
        }
        self.empty_proposals += s.stats.empty_proposals;
        self.drafted_rounds += s.stats.drafted_rounds;
        self.expected_accepted_token += s.stats.expected_accepted_token;
        self.expected_accepted_block += s.stats.expected_accepted_block;
        if !s.stats.verification.is_empty() {
            self.verification.clone_from(&s.stats.verification);
        }
    }

    /// Tokens per drafted round: what the rule that ran committed, and what each rule commits
    /// in expectation on the same drafts (accepted candidates plus the one token every round
    /// ends with).
    pub(super) fn tokens_per_round(&self) -> serde_json::Value {
        let per_drafted = |x: f64| if self.drafted_rounds == 0 { 0.0 } else { 1.0 + x / self.drafted_rounds as f64 };
        let (token, block) = (per_drafted(self.expected_accepted_token), per_drafted(self.expected_accepted_block));
        json!({
            "measured": self.per_round(self.tokens as f64),
            "verification": self.verification,
            "drafted_rounds": self.drafted_rounds,
            "expected_token": token,
            "expected_block": block,
            "block_over_token": if token > 0.0 { block / token } else { 0.0 },
        })
    }

    pub(super) fn tokens_per_s(&self) -> f64 {
        self.tokens as f64 / self.wall.as_secs_f64().max(1e-9)
    }

    pub(super) fn per_round(&self, x: f64) -> f64 {
        if self.rounds == 0 { 0.0 } else { x / self.rounds as f64 }
    }
}

/// One mode's totals over whole requests, and over their rounds after the first
/// ([`Sample::after_first_round`]): the decoding the per-round costs and the bound are about.
#[derive(Debug, Default)]
pub(super) struct ModeTotals {
    pub(super) whole: Totals,
    pub(super) decode: Totals,
    first_round_wall: Duration,
    requests: u64,
}

impl ModeTotals {
    pub(super) fn add(&mut self, s: &Sample) {
        self.whole.add(s);
        self.decode.add(&s.after_first_round());
        self.first_round_wall += s.first_round.as_ref().map_or(s.wall, |f| f.wall);
        self.requests += 1;
    }

    pub(super) fn first_round_ms(&self) -> f64 {
        self.first_round_wall.as_secs_f64() * 1e3 / self.requests.max(1) as f64
    }
}

/// One pass's tokens/s of both modes, over whole requests and after their first rounds.
#[derive(Debug, Clone, Copy)]
pub(super) struct PassRates {
    pub(super) target_only_tokens_per_s: f64,
    pub(super) speculative_tokens_per_s: f64,
    pub(super) decode_target_only_tokens_per_s: f64,
    pub(super) decode_speculative_tokens_per_s: f64,
}

impl PassRates {
    pub(super) fn new(target_only: &ModeTotals, speculative: &ModeTotals) -> Self {
        Self {
            target_only_tokens_per_s: target_only.whole.tokens_per_s(),
            speculative_tokens_per_s: speculative.whole.tokens_per_s(),
            decode_target_only_tokens_per_s: target_only.decode.tokens_per_s(),
            decode_speculative_tokens_per_s: speculative.decode.tokens_per_s(),
        }
    }

    pub(super) fn speedup(&self) -> f64 {
        self.speculative_tokens_per_s / self.target_only_tokens_per_s
    }

    pub(super) fn decode_speedup(&self) -> f64 {
        self.decode_speculative_tokens_per_s / self.decode_target_only_tokens_per_s
    }
}

/// What a single-client measurement found: both modes' totals over all passes, each pass's
/// rates, and the agreement of greedy outputs.
#[derive(Debug, Default)]
pub(super) struct Measurement {
    pub(super) target_only: ModeTotals,
    pub(super) speculative: ModeTotals,
    pub(super) passes: Vec<PassRates>,
    pub(super) agreement: GreedyAgreement,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn greedy_agreement_counts_identical_outputs_and_the_prefix_before_a_difference() {
        let mut agreement = GreedyAgreement::default();
        agreement.add(&[1, 2, 3, 4], &[1, 2, 3, 4]);
        agreement.add(&[1, 2, 3, 4], &[1, 9, 3, 4]);
        let report = agreement.report();
        assert_eq!(report["pairs"], 2);
        assert_eq!(report["identical_fraction"], 0.5);
        assert_eq!(report["common_prefix_fraction"], 5.0 / 8.0);
    }
}
