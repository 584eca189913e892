//! Whether a `model+ngram` draft's copies pay in this session. A copy (the token after an
//! n-gram match, q = one-hot) costs no draft step and is accepted with the target's p of that
//! one token; a draw from the model costs a step and is accepted with Σ min(p, q). On greedy
//! output that repeats itself copies win; sampled, they can be accepted so much less often
//! than the model's draws that they cost more than they save (docs/adaptive.md). So the
//! coordinator measures both kinds in the session's rounds and, once copies are worse by more
//! than they save, asks the draft for its model's candidates only (`ProposeRequest.model_only`).
//!
//! The comparison: in a chain of candidates each accepted with probability a, a round yields
//! about 1/(1 − a) tokens. With R the cost of a round besides drafting (the verify pass and the
//! hand-offs) and d a model draw (its step, and catching up on the copies before it), a token
//! costs (1 − a_copy)·R from copies and (1 − a_model)·R + d from model draws: copies pay
//! while a_copy ≥ a_model − d/R.
//!
//! The choice depends only on rounds already committed, so each round's rule stays exact.
//! Acceptance is a running average, so what the output does now counts: a session's first
//! copies come from matches in the prompt, and greedy output that later repeats itself makes
//! copies pay where they did not. While copies are off, one request in [`PROBE_EVERY`] allows
//! them again, to measure them; each probe that finds them still worse doubles the wait
//! before the next, up to [`MAX_PROBE_EVERY`], since a probe's rejected copy costs a round.
//!
//! A session starts from where the last session with its sampling settings left the choice
//! ([`crate::policy::PolicyMemory::copy_choice`]): learnt afresh in every session, the
//! copies' first blocks and probes cost more than the copies could save (docs/adaptive.md).

use specd_proto::v1::ProposalSource;

use crate::policy::average::Average;
use crate::session::round_report::RoundReport;

/// Evaluated positions of each kind before the two are compared.
const MIN_EVALUATED: u64 = 8;
/// Weight of one evaluated position in the running acceptances.
const WEIGHT: f64 = 0.1;
/// While copies are off, every this many requests one allows them, at first.
pub const PROBE_EVERY: u64 = 8;
/// The longest wait between probes, after probes that found copies still worse.
pub const MAX_PROBE_EVERY: u64 = 64;

/// One session's measurements of its copies and its model's draws.
#[derive(Debug, Clone, Default)]
pub struct CopyChoice {
    copy: Average,
    model: Average,
    /// d/R: a model draw's share of the draft time over the rest of its round.
    step_share: Average,
    /// Requests since the last one that allowed copies.
    without: u64,
    /// Requests between probes now ([`PROBE_EVERY`] until a probe finds copies still worse;
    /// 0 read as [`PROBE_EVERY`]).
    probe_every: u64,
    /// Copies were allowed to measure them, and no round with a copy has answered yet.
    probing: bool,
}

impl CopyChoice {
    /// Whether the next Propose allows copies; called once per Propose.
    pub fn allow_copies(&mut self) -> bool {
        if self.copies_pay() {
            self.probe_every = PROBE_EVERY;
            self.probing = false;
            self.without = 0;
            return true;
        }
        let probe = self.probing || self.without + 1 >= self.probe_every.max(PROBE_EVERY);
        self.probing = probe;
        self.without = if probe { 0 } else { self.without + 1 };
        probe
    }

    /// Whether copies were measured to pay, or not measured enough to tell.
    fn copies_pay(&self) -> bool {
        let (Some(copy), Some(model)) = (self.copy.get(), self.model.get()) else { return true };
        if self.copy.count < MIN_EVALUATED || self.model.count < MIN_EVALUATED {
            return true;
        }
        copy >= model - self.step_share.get().unwrap_or(0.0)
    }

    /// Learns from a drafted round; `first_model_pass`: its draft time also ran the prompt
    /// through the model (`draft_link::first_model_pass`), so it says nothing of a step's cost.
    pub fn observe(&mut self, report: &RoundReport, first_model_pass: bool) {
        let evaluated = report.outcome.expected_acceptance.iter().zip(&report.sources);
        let (mut copied, mut copies_sum) = (0u32, 0.0);
        for (&acceptance, &source) in evaluated {
            if source == ProposalSource::Model {
                self.model.add(acceptance, WEIGHT);
            } else if self.probing {
                (copied, copies_sum) = (copied + 1, copies_sum + acceptance);
            } else {
                self.copy.add(acceptance, WEIGHT);
            }
        }
        // A probe answers once a round had a copy (a round without a match copies nothing).
        // Its copies stand for the copies now, whatever those of rounds ago did: the output
        // may have started repeating itself, and a running average would need several probes
        // (each after a longer wait) to follow it.
        if copied > 0 {
            self.probing = false;
            self.copy = Average::prior(copies_sum / f64::from(copied), MIN_EVALUATED);
            if !self.copies_pay() {
                self.probe_every = (self.probe_every.max(PROBE_EVERY) * 2).min(MAX_PROBE_EVERY);
            }
        }
        // Copies cost the draft next to nothing; catching its model up on them is part of
        // what its draws cost in a mixed block.
        let draws = report.model_draws();
        let rest_ns = report.wall_ns.saturating_sub(report.draft_ns);
        if draws > 0 && !first_model_pass && rest_ns > 0 {
            let step = report.draft_ns as f64 / draws as f64;
            self.step_share.add(step / rest_ns as f64, WEIGHT);
        }
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use specd_proto::v1::ProposalSource::{Model, OutputMatch, Suffix};
    use specd_sampling::{BlockOutcome, EmittedFrom};

    /// A round whose evaluated positions (all of its block) had these sources and Σ min(p, q).
    fn round(evaluated: &[(ProposalSource, f64)], draft_ns: u64, wall_ns: u64) -> RoundReport {
        let outcome = BlockOutcome {
            accepted: 0,
            tokens: vec![0],
            acceptance: vec![1.0; evaluated.len()],
            expected_acceptance: evaluated.iter().map(|(_, a)| *a).collect(),
            emitted_from: EmittedFrom::Residual,
            in_expectation: Default::default(),
        };
        RoundReport::for_tests(outcome, evaluated.iter().map(|(s, _)| *s).collect(), [draft_ns, 0, wall_ns])
    }

    /// Requests, each followed by a round of `copies` copies and a model draw where copies
    /// were allowed, of model draws alone elsewhere; what each request allowed.
    fn run_blocks(choice: &mut CopyChoice, rounds: usize, copies: usize, copy: f64, model: f64) -> Vec<bool> {
        (0..rounds)
            .map(|_| {
                let allowed = choice.allow_copies();
                let first = if allowed { (OutputMatch, copy) } else { (Model, model) };
                let mut positions = vec![first; copies];
                positions.push((Model, model));
                choice.observe(&round(&positions, 800_000, 3_800_000), false);
                allowed
            })
            .collect()
    }

    /// [`run_blocks`] with one copy a block.
    pub(crate) fn run(choice: &mut CopyChoice, rounds: usize, copy: f64, model: f64) -> Vec<bool> {
        run_blocks(choice, rounds, 1, copy, model)
    }

    #[test]
    fn copies_accepted_far_less_than_model_draws_stop_and_are_probed_less_and_less_often() {
        let mut choice = CopyChoice::default();
        let allowed = run(&mut choice, 200, 0.15, 0.7);
        assert!(allowed[..8].iter().all(|a| *a), "too few measured yet: {allowed:?}");
        let probes: Vec<usize> = (9..allowed.len()).filter(|&i| allowed[i]).collect();
        let gaps: Vec<usize> = probes.windows(2).map(|w| w[1] - w[0]).collect();
        // Each probe that finds copies worse doubles the wait, up to the longest.
        assert_eq!(gaps, [16, 32, 64, 64], "probes at {probes:?}");
    }

    #[test]
    fn copies_that_start_paying_come_back() {
        // Prompt matches first (rarely accepted), then output that repeats itself: a probe's
        // block is then several copies long.
        let mut choice = CopyChoice::default();
        let early = run(&mut choice, 40, 0.1, 0.6);
        assert!(!early[16..].iter().all(|a| *a), "bad copies never stopped: {early:?}");
        assert!(choice.probe_every > PROBE_EVERY, "a probe found them worse: the wait grew");
        let late = run_blocks(&mut choice, 64, 4, 0.95, 0.6);
        assert!(late[40..].iter().all(|a| *a), "good copies stayed off: {late:?}");
        assert_eq!(choice.probe_every, PROBE_EVERY, "paying copies start the probes' wait again");
    }

    #[test]
    fn copies_a_little_worse_than_model_draws_pay_for_the_steps_they_save() {
        // d/R is 0.8 ms / 3 ms ≈ 0.27 in mixed rounds, 0.4 / 3 ≈ 0.13 in the model's own: copies
        // at 0.5 against draws at 0.6 save more than they lose.
        let mut choice = CopyChoice::default();
        assert!(run(&mut choice, 40, 0.5, 0.6).iter().all(|a| *a));
        // Without the saving counted (every model round a first pass), the same rates stop copies.
        let mut blind = CopyChoice::default();
        for _ in 0..20 {
            blind.observe(&round(&[(OutputMatch, 0.5), (Model, 0.6)], 800_000, 3_800_000), true);
            blind.observe(&round(&[(Model, 0.6), (Model, 0.6)], 800_000, 3_800_000), true);
        }
        assert!(!blind.copies_pay());
    }

    #[test]
    fn drafts_of_one_kind_never_stop_copying() {
        let mut model_only = CopyChoice::default();
        let mut copies_only = CopyChoice::default();
        for _ in 0..20 {
            assert!(model_only.allow_copies() && copies_only.allow_copies());
            model_only.observe(&round(&[(Model, 0.9)], 500_000, 3_500_000), false);
            copies_only.observe(&round(&[(Suffix, 0.05)], 1_000, 3_000_000), false);
        }
    }
}
