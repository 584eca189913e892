//! What a finished round teaches a session's estimates: α from every drafting round, a
//! node's costs only from rounds whose pass on it was steady.

use crate::policy::average::Average;
use crate::policy::state::{AdaptiveGamma, MS, START_GAMMA};
use crate::session::round_report::RoundReport;

/// Weight of a new observation in the running averages (a horizon of about seven rounds).
const SMOOTHING: f64 = 0.15;
/// Weight of one position's Σ min(p, q) in the running α (a horizon of about 20 positions).
const ALPHA_SMOOTHING: f64 = 0.05;
/// Weight of a round in the verify pass's cost per token: lower than [`SMOOTHING`], because
/// the slope is a property of the target and its machine, small against a pass's noise, and
/// a few rounds' reading of it misled sessions into short blocks (docs/adaptive.md).
const SLOPE_SMOOTHING: f64 = 0.03;

impl AdaptiveGamma {
    /// Learns from a finished round: α from every round, a node's costs only from rounds whose
    /// pass on that node was `steady`.
    pub fn observe(&mut self, report: &RoundReport, steady: SteadyCosts) {
        self.rounds += 1;
        // Counted from the rounds that ran: a round retried after a lost node chose twice.
        // A round whose draft was asked but proposed nothing (a deterministic proposer with
        // no match) was not a choice to stop drafting: it leaves the streak as it was, and
        // only its verify pass counts (a target-only pass, below).
        if !report.empty_proposal() {
            self.plain_streak = if report.gamma == 0 { self.plain_streak + 1 } else { 0 };
        }
        let (draft, verify, wall) =
            (report.draft_ns as f64 * MS, report.verify_ns as f64 * MS, report.wall_ns as f64 * MS);
        let overhead = (wall - draft - verify).max(0.0);
        if report.empty_proposal() {
            // A target-only pass, but a round with the draft's call in it: its overhead is
            // neither side's.
            self.empty_share.add(1.0, SMOOTHING);
            if steady.target {
                self.verify_plain_ms.add(within_spikes(verify, self.verify_plain_ms), SMOOTHING);
            }
            return;
        }
        if report.gamma > 0 {
            self.empty_share.add(0.0, SMOOTHING);
        }
        if report.gamma == 0 {
            if steady.target {
                self.verify_plain_ms.add(within_spikes(verify, self.verify_plain_ms), SMOOTHING);
                self.plain_overhead_ms.add(overhead, SMOOTHING);
            }
            return;
        }
        let g = report.gamma as f64;
        let acceptances = report.policy_acceptances();
        for &a in acceptances.iter() {
            self.alpha.add(a, ALPHA_SMOOTHING);
        }
        self.own_positions += acceptances.len() as u64;
        // Per-token costs from short blocks are the least reliable: a draft call has a fixed
        // part that γ = 1 puts all on one step, and a verify pass's noise divided by γ = 1 is
        // all slope. So they count for a share that grows with γ: its square for the slope,
        // whose error shrinks as 1/γ (docs/adaptive.md has what γ = 1 probes alone cost).
        let share = (g / f64::from(START_GAMMA)).min(1.0);
        // A step is what a drawn candidate costs: a round of copies alone says nothing of it.
        let draws = report.policy_draws() as f64;
        if steady.draft && draws > 0.0 {
            let step_share = (draws / f64::from(START_GAMMA)).min(1.0);
            self.draft_step_ms.add_share(within_spikes(draft / draws, self.draft_step_ms), SMOOTHING, step_share);
        }
        if steady.target {
            if let Some(plain) = self.verify_plain_ms.get() {
                let expected = plain + self.verify_slope_ms.get().unwrap_or(0.0).max(0.0) * g;
                let verify = within_spikes(verify, Average { mean: Some(expected), ..self.verify_plain_ms });
                self.verify_slope_ms.add_share((verify - plain) / g, SLOPE_SMOOTHING, share * share);
            }
            // The draft's own time (a catch-up included) is in `draft`, not in the overhead.
            self.spec_overhead_ms.add(overhead, SMOOTHING);
        }
    }
}

/// How far above the running estimate one pass's time counts. CPU passes spike to several
/// times their median, and target-only rounds are rare while drafting, so one spike taken
/// whole would stay in that estimate for dozens of rounds (docs/adaptive.md). Clipped, a spike
/// moves an estimate a little and a lasting slow-down still moves it all the way, in about ten
/// rounds. Spikes go up only, so times below the estimate count whole, and so do the first
/// few, which an estimate that is still a plain mean needs.
const SPIKE_RATIO: f64 = 1.5;

/// `x`, at most [`SPIKE_RATIO`] × `estimate` once that rests on 1/[`SMOOTHING`] observations.
fn within_spikes(x: f64, estimate: Average) -> f64 {
    match estimate.mean {
        Some(m) if m > 0.0 && estimate.count as f64 * SMOOTHING >= 1.0 => x.min(m * SPIKE_RATIO),
        _ => x,
    }
}

/// Which nodes' times in a round are what a round at that γ costs. A node's first pass of a
/// session also fills its cache with the prompt, and a draft's first pass after target-only
/// rounds catches up on their tokens. Taken as per-token costs, those passes would price a
/// token at many times its cost, and every session started from memory would write that back
/// for the next.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SteadyCosts {
    pub target: bool,
    pub draft: bool,
}

#[cfg(test)]
impl SteadyCosts {
    /// A round whose both times are steady, as most rounds in the tests are.
    pub const BOTH: Self = Self { target: true, draft: true };
}

#[cfg(test)]
pub(crate) mod tests {
    use specd_proto::v1::ProposalSource;
    use specd_sampling::{BlockOutcome, EmittedFrom};

    use super::*;

    /// A round with these costs in ms, and `accepted` of γ accepted with Σ min(p, q) = `alpha`.
    pub(crate) fn report(
        gamma: usize,
        accepted: usize,
        alpha: f64,
        draft_ms: f64,
        verify_ms: f64,
        overhead_ms: f64,
    ) -> RoundReport {
        let evaluated = if gamma == 0 { 0 } else { (accepted + 1).min(gamma) };
        let outcome = BlockOutcome {
            accepted,
            tokens: vec![0; accepted + 1],
            acceptance: vec![1.0; evaluated],
            expected_acceptance: vec![alpha; evaluated],
            emitted_from: EmittedFrom::Bonus,
            in_expectation: Default::default(),
        };
        let ns = |ms: f64| (ms * 1e6) as u64;
        let times = [ns(draft_ms), ns(verify_ms), ns(draft_ms + verify_ms + overhead_ms)];
        RoundReport::for_tests(outcome, vec![ProposalSource::Model; gamma], times)
    }

    /// Runs `rounds` rounds of a world where a draft step costs `draft_ms`, a verify pass
    /// `verify_ms` + `slope_ms`·γ, every round `overhead_ms` more, and acceptance is `alpha`.
    pub(crate) fn run(
        policy: &mut AdaptiveGamma,
        rounds: usize,
        alpha: f64,
        draft_ms: f64,
        verify_ms: f64,
        slope_ms: f64,
    ) -> Vec<u32> {
        (0..rounds)
            .map(|_| {
                let gamma = policy.next_gamma();
                let g = gamma as usize;
                let accepted = (alpha * g as f64).round() as usize;
                let verify = verify_ms + slope_ms * f64::from(gamma);
                policy
                    .observe(&report(g, accepted, alpha, draft_ms * f64::from(gamma), verify, 0.3), SteadyCosts::BOTH);
                gamma
            })
            .collect()
    }

    #[test]
    fn rounds_with_no_proposal_count_against_drafting() {
        // A world where drafting pays when the draft proposes (α = 0.8, a cheap draft, a
        // 40 ms target pass) but the draft's call costs 30 ms of overhead.
        let world = |policy: &mut AdaptiveGamma, empty_every: usize, rounds: usize| {
            for round in 0..rounds {
                let gamma = policy.next_gamma() as usize;
                let mut report = report(gamma, (0.8 * gamma as f64) as usize, 0.8, 0.1 * gamma as f64, 40.0, 30.0);
                if gamma == 0 {
                    report.wall_ns = 40_300_000;
                } else if empty_every > 0 && round % empty_every != 0 {
                    // Asked and nothing proposed: one token at a target-only pass and the call.
                    report = RoundReport { gamma: 0, drafted: true, sources: Vec::new(), ..report };
                    report.outcome.accepted = 0;
                    report.outcome.tokens = vec![0];
                    report.outcome.expected_acceptance.clear();
                }
                policy.observe(&report, SteadyCosts::BOTH);
            }
        };
        let mut proposing = AdaptiveGamma::new(8);
        world(&mut proposing, 0, 300);
        assert!(proposing.best_gamma() > 0, "{}", proposing.summary());
        // Nine rounds in ten come back empty: each costs 70 ms for one token against 40 ms
        // target-only, and the policy stops drafting.
        let mut mostly_empty = AdaptiveGamma::new(8);
        world(&mut mostly_empty, 10, 300);
        assert!(mostly_empty.empty_share.get().unwrap() > 0.5);
        assert_eq!(mostly_empty.best_gamma(), 0, "{}", mostly_empty.summary());
    }

    #[test]
    fn a_model_and_ngram_draft_s_rejected_copies_do_not_stop_its_model() {
        // A grounded prompt at T = 0.8 on the demo pair: a `model+ngram` draft's first blocks
        // are copies of matches in the prompt, accepted at a few percent; its model's draws
        // are accepted at 0.7 and pay (a 0.4 ms step against a 2.5 ms target pass).
        // `copy_ms`: what a copy costs the draft.
        let copying_then_drawing = |copies_apart: bool, copy_ms: f64, copy_rounds: usize, rounds: usize| {
            let mut policy = AdaptiveGamma::new(6);
            for round in 0..rounds {
                let gamma = policy.next_gamma() as usize;
                let copying = round < copy_rounds;
                let (alpha, accepted) = if copying { (0.05, 0) } else { (0.7, (0.7 * gamma as f64) as usize) };
                let g = gamma as f64;
                let step = if copying { copy_ms } else { 0.4 };
                let mut round = report(gamma, accepted, alpha, step * g, 2.5 + 0.1 * g, 0.3);
                if copying {
                    round.sources = vec![ProposalSource::PromptMatch; gamma];
                }
                round.copies_apart = copies_apart;
                policy.observe(&round, SteadyCosts::BOTH);
            }
            policy
        };
        // After the copies nothing is learnt of the model, so the next round drafts to learn it.
        let apart = copying_then_drawing(true, 0.01, 40, 40);
        assert_eq!(apart.own_positions, 0, "copies taught α");
        assert!(apart.draft_step_ms.get().is_none(), "copies taught the step: {}", apart.summary());
        assert!(apart.clone().next_gamma() > 0, "{}", apart.summary());
        let apart = copying_then_drawing(true, 0.01, 40, 120);
        assert!(apart.best_gamma() > 0 && (apart.alpha() - 0.7).abs() < 0.05, "{}", apart.summary());
        let step = apart.draft_step_ms.get().unwrap();
        assert!((step - 0.4).abs() < 1e-9, "{}", apart.summary());
        // Learnt together, as before: copies that cost a step pull α below break-even, and the
        // session drafts no more but for a probe now and then (the sessions after it start
        // from there); copies that cost nothing price the model's step at next to nothing.
        let together = copying_then_drawing(false, 0.4, 40, 40);
        assert_eq!(together.best_gamma(), 0, "{}", together.summary());
        let together = copying_then_drawing(false, 0.01, 40, 40);
        assert!(together.draft_step_ms.get().unwrap() < 0.1, "{}", together.summary());
    }

    #[test]
    fn one_speculative_round_outweighs_the_prior_acceptance() {
        // The demo pair at a 5 ms RTT to the draft: a 1.7 ms draft step, an 11 ms target
        // pass (+0.3 ms a token in a verify pass), 5.5 ms of network a speculative round and
        // 0.5 ms a target-only one, α = 0.8. γ = 4 gives ~1.3×, so after the measuring
        // rounds the policy must draft. A prior α = 0.5 that one round barely moves says
        // γ = 0 (the bug this guards against).
        let mut policy = AdaptiveGamma::new(8);
        assert_eq!(policy.next_gamma(), START_GAMMA);
        policy.observe(&report(4, 3, 0.8, 4.0 * 1.7, 11.0 + 4.0 * 0.3, 5.5), SteadyCosts::BOTH);
        assert_eq!(policy.next_gamma(), 0);
        policy.observe(&report(0, 0, 0.0, 0.0, 11.0, 0.5), SteadyCosts::BOTH);
        assert!((policy.alpha() - 0.8).abs() < 0.11, "{}", policy.alpha());
        assert!(policy.next_gamma() >= 2, "{policy:?}");
    }

    #[test]
    fn a_pass_that_spiked_moves_the_costs_a_little_and_a_lasting_change_all_the_way() {
        // A 20 ms link where drafting loses a little: α = 0.7, a 3 ms draft step, a 19 ms
        // target pass plus 0.5 ms a token, 26 ms of network a speculative round.
        let round = |gamma: u32, verify: f64| {
            let g = f64::from(gamma);
            let (overhead, accepted) = if gamma == 0 { (0.6, 0) } else { (26.0, 3) };
            report(gamma as usize, accepted, 0.7, 3.0 * g, verify, overhead)
        };
        let mut policy = AdaptiveGamma::new(8);
        for gamma in [4, 0].repeat(8) {
            policy.observe(&round(gamma, 19.0 + 0.5 * f64::from(gamma)), SteadyCosts::BOTH);
        }
        assert_eq!(policy.best_gamma(), 0, "{}", policy.summary());
        // One target-only pass spikes to 42 ms: taken whole, it made the target-only estimate
        // 22.5 ms, and γ = 5 look like it paid.
        policy.observe(&round(0, 42.0), SteadyCosts::BOTH);
        let plain = policy.verify_plain_ms.get().unwrap();
        assert!(plain < 21.0, "{}", policy.summary());
        assert_eq!(policy.best_gamma(), 0, "{}", policy.summary());
        // The machine slows down for good: passes take 30 ms. A dozen rounds follow it.
        for _ in 0..12 {
            policy.observe(&round(0, 30.0), SteadyCosts::BOTH);
        }
        assert!(policy.verify_plain_ms.get().unwrap() > 28.0, "{}", policy.summary());
    }

    #[test]
    fn short_probes_barely_move_the_per_token_costs() {
        // Costs measured at γ = 4: a 2 ms draft step, a 16 ms pass + 0.5 ms a token.
        let mut policy = AdaptiveGamma::new(8);
        for gamma in [4, 0, 4, 4] {
            let g = gamma as f64;
            policy.observe(&report(gamma, gamma.min(3), 0.7, 2.0 * g, 16.0 + 0.5 * g, 8.0), SteadyCosts::BOTH);
        }
        let (slope, step) = (policy.verify_slope_ms.get().unwrap(), policy.draft_step_ms.get().unwrap());
        // Five γ = 1 probes: a draft call with its fixed 0.8 ms, and verify passes 2 ms slower
        // than usual (noise of a loaded machine).
        for _ in 0..5 {
            policy.observe(&report(1, 0, 0.7, 2.0 + 0.8, 16.0 + 0.5 + 2.0, 8.0), SteadyCosts::BOTH);
        }
        let moved = |now: Option<f64>, before: f64| now.unwrap() - before;
        assert!(moved(policy.verify_slope_ms.get(), slope) < 0.3, "{}", policy.summary());
        assert!(moved(policy.draft_step_ms.get(), step) < 0.3, "{}", policy.summary());
    }
}
