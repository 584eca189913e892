//! Whether a `model+ngram` draft's copies pay in this session. A copy (the token after an
//! n-gram match, q = one-hot) costs no draft step and is accepted with the target's p of that
//! one token; a draw from the model costs a step and is accepted with Σ min(p, q). On greedy
//! output that repeats itself copies win. Sampled at T = 0.8 from the demo target, copies were
//! accepted far less often than the model's draws, and mixing them in made `model+ngram`
//! 0.93× the model alone on the grounded prompts (BENCHMARKS.md). So the coordinator measures
//! both kinds in the session's rounds and, once copies are worse by more than they save, asks
//! the draft for its model's candidates only (`ProposeRequest.model_only`).
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
//! them again, to measure them.

use crate::policy::average::Average;
use crate::session::round_report::{MODEL_DRAW, RoundReport};

/// Evaluated positions of each kind before the two are compared.
const MIN_EVALUATED: u64 = 8;
/// Weight of one evaluated position in the running acceptances.
const WEIGHT: f64 = 0.1;
/// While copies are off, every this many requests one allows them.
pub const PROBE_EVERY: u64 = 8;

/// One session's measurements of its copies and its model's draws.
#[derive(Debug, Clone, Default)]
pub struct CopyChoice {
    copy: Average,
    model: Average,
    /// d/R: a model draw's share of the draft time over the rest of its round.
    step_share: Average,
    /// Requests since the last one that allowed copies.
    without: u64,
}

impl CopyChoice {
    /// Whether the next Propose allows copies; called once per Propose.
    pub fn allow_copies(&mut self) -> bool {
        let allow = self.copies_pay() || self.without + 1 >= PROBE_EVERY;
        self.without = if allow { 0 } else { self.without + 1 };
        allow
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
        for (&acceptance, &source) in evaluated {
            let tally = if source == MODEL_DRAW { &mut self.model } else { &mut self.copy };
            tally.add(acceptance, WEIGHT);
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
mod tests {
    use super::*;
    use specd_sampling::{BlockOutcome, EmittedFrom};

    /// A round whose evaluated positions (all of its block) had these sources and Σ min(p, q).
    fn round(evaluated: &[(&'static str, f64)], draft_ns: u64, wall_ns: u64) -> RoundReport {
        let outcome = BlockOutcome {
            accepted: 0,
            tokens: vec![0],
            acceptance: vec![1.0; evaluated.len()],
            expected_acceptance: evaluated.iter().map(|(_, a)| *a).collect(),
            emitted_from: EmittedFrom::Residual,
        };
        RoundReport::for_tests(outcome, evaluated.iter().map(|(s, _)| *s).collect(), [draft_ns, 0, wall_ns])
    }

    /// Requests, each followed by a round with these positions; what each request allowed.
    fn run(choice: &mut CopyChoice, rounds: usize, copy: f64, model: f64) -> Vec<bool> {
        (0..rounds)
            .map(|_| {
                let allowed = choice.allow_copies();
                let positions: &[(&'static str, f64)] = if allowed {
                    &[("output_match", copy), ("model", model)]
                } else {
                    &[("model", model), ("model", model)]
                };
                choice.observe(&round(positions, 800_000, 3_800_000), false);
                allowed
            })
            .collect()
    }

    #[test]
    fn copies_accepted_far_less_than_model_draws_stop_and_are_probed() {
        let mut choice = CopyChoice::default();
        let allowed = run(&mut choice, 64, 0.15, 0.7);
        assert!(allowed[..8].iter().all(|a| *a), "too few measured yet: {allowed:?}");
        let later = &allowed[16..];
        assert_eq!(later.iter().filter(|a| **a).count(), later.len() / PROBE_EVERY as usize, "{allowed:?}");
    }

    #[test]
    fn copies_that_start_paying_come_back() {
        // Prompt matches first (rarely accepted), then output that repeats itself.
        let mut choice = CopyChoice::default();
        let early = run(&mut choice, 24, 0.1, 0.6);
        assert!(!early[16..].iter().all(|a| *a), "bad copies never stopped: {early:?}");
        let late = run(&mut choice, 64, 0.95, 0.6);
        assert!(late[48..].iter().all(|a| *a), "good copies stayed off: {late:?}");
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
            blind.observe(&round(&[("output_match", 0.5), ("model", 0.6)], 800_000, 3_800_000), true);
            blind.observe(&round(&[("model", 0.6), ("model", 0.6)], 800_000, 3_800_000), true);
        }
        assert!(!blind.copies_pay());
    }

    #[test]
    fn drafts_of_one_kind_never_stop_copying() {
        let mut model_only = CopyChoice::default();
        let mut copies_only = CopyChoice::default();
        for _ in 0..20 {
            assert!(model_only.allow_copies() && copies_only.allow_copies());
            model_only.observe(&round(&[("model", 0.9)], 500_000, 3_500_000), false);
            copies_only.observe(&round(&[("suffix", 0.05)], 1_000, 3_000_000), false);
        }
    }
}
