//! The γ of each round: the one with the most expected tokens per millisecond under the
//! session's estimates, with probes of the side it is not using.

use std::time::Duration;

use specd_sampling::cost::expected_tokens_per_round;

use crate::policy::average::Average;
use crate::policy::remeasure::within_budget;
use crate::policy::state::{AdaptiveGamma, START_GAMMA};

/// Rounds a session that starts from nothing (or explores) measures with: γ = START_GAMMA,
/// then 0, one of each side.
pub const MEASURING_ROUNDS: u64 = 2;
/// While drafting, one target-only round this often refreshes its costs: rarely enough that
/// the refresh costs at most a round in 64.
pub const PLAIN_PROBE_EVERY: u64 = 64;
/// While not drafting, a drafting round checks whether drafting pays again, as often as its
/// expected loss against target-only rounds stays under this share of the session's tokens:
/// often near break-even, where a probe loses little and a session whose α dipped must find
/// its way back, rarely across a slow link, where a probe costs several target passes
/// (docs/adaptive.md has the measurements).
pub const DRAFT_PROBE_BUDGET: f64 = 0.01;
/// The fewest target-only rounds between two probes, however little a probe loses.
pub const DRAFT_PROBE_MIN: u64 = 8;
/// The most target-only rounds between two probes, however much a probe loses: a session
/// must still notice a draft that has become good.
pub const DRAFT_PROBE_MAX: u64 = 128;
/// Relative difference in expected speed below which two γ are a tie (the smaller wins).
const NEAR_TIE: f64 = 1e-9;

impl AdaptiveGamma {
    /// Whether drafting would pay were α two standard errors higher than estimated from
    /// `positions` independent positions: while the estimate is uncertain, whether exploring
    /// is worth its cost. One standard error left a link where drafting paid undrafted for
    /// several sessions after a first prompt that drafted badly (docs/adaptive.md).
    pub(super) fn could_pay(&self, positions: u64) -> bool {
        let (alpha, n) = (self.alpha(), positions.max(1) as f64);
        let optimistic = alpha + 2.0 * (alpha * (1.0 - alpha) / n).sqrt();
        let Some(plain) = self.speed(0) else { return true };
        (1..=self.max).any(|g| self.speed_at(g, optimistic).is_some_and(|s| s > plain))
    }

    /// Whether both sides (target-only and speculative rounds) have been measured.
    pub(super) fn measured(&self) -> bool {
        self.speed(0).is_some() && self.speed(1).is_some()
    }

    /// γ for the next round.
    pub fn next_gamma(&mut self) -> u32 {
        let start = START_GAMMA.min(self.max);
        let gamma = match self.rounds {
            _ if self.max == 0 => 0,
            0 => start,
            1 => 0,
            // Round 0's passes also filled the caches and taught only α: a side still
            // unmeasured (a session with nothing learnt yet) is measured now.
            _ if self.speed(0).is_none() => 0,
            _ if self.speed(start).is_none() => start,
            n => {
                let best = self.best_gamma();
                if best > 0 && n % PLAIN_PROBE_EVERY == 0 {
                    0
                } else if best == 0 && self.plain_streak >= self.draft_probe_every() {
                    self.best_drafting().map_or(1, |(gamma, _)| gamma)
                } else {
                    best
                }
            }
        };
        self.last_choice = gamma;
        gamma
    }

    /// Target-only rounds between probes while not drafting: as many as keeps a probe's
    /// expected loss (the tokens target-only rounds would have committed in its time, less
    /// its own) under [`DRAFT_PROBE_BUDGET`] of theirs.
    pub(super) fn draft_probe_every(&self) -> u64 {
        let (Some(plain), Some((gamma, drafting))) = (self.speed(0), self.best_drafting()) else {
            return DRAFT_PROBE_MIN;
        };
        let Some(probe_ms) = self.round_ms(gamma) else { return DRAFT_PROBE_MIN };
        let lost_tokens = probe_ms * (plain - drafting).max(0.0);
        within_budget(lost_tokens, DRAFT_PROBE_BUDGET, DRAFT_PROBE_MIN, DRAFT_PROBE_MAX)
    }

    /// The drafting γ (≥ 1) with the highest expected speed, and that speed; near-ties go to
    /// the smaller γ.
    pub(super) fn best_drafting(&self) -> Option<(u32, f64)> {
        (1..=self.max).filter_map(|g| self.speed(g).map(|s| (g, s))).fold(None, |best: Option<(u32, f64)>, (g, s)| {
            match best {
                Some((_, b)) if s <= b * (1.0 + NEAR_TIE) => best,
                _ => Some((g, s)),
            }
        })
    }

    /// Expected tokens per millisecond at `gamma`; `None` while a cost is unmeasured.
    pub fn speed(&self, gamma: u32) -> Option<f64> {
        self.speed_at(gamma, self.alpha())
    }

    /// [`Self::speed`] had the acceptance been `alpha`.
    fn speed_at(&self, gamma: u32, alpha: f64) -> Option<f64> {
        if gamma == 0 {
            return Some(1.0 / self.round_ms(0)?);
        }
        let (tokens, drafting_ms) = (expected_tokens_per_round(alpha.clamp(0.0, 0.999), gamma), self.round_ms(gamma)?);
        // A proposer whose block length varies (n-gram, suffix): a share of the rounds asked
        // for γ propose nothing and commit one token at a target-only pass's cost plus the
        // speculative round's overhead (the draft's call); shorter blocks than γ are in the
        // per-token costs, which are measured on the candidates actually sent.
        let empty = self.empty_share.get().unwrap_or(0.0);
        if empty == 0.0 {
            return Some(tokens / drafting_ms);
        }
        let empty_ms = (self.verify_plain_ms.get()? + self.spec_overhead_ms.get()?).max(1e-6);
        Some(((1.0 - empty) * tokens + empty) / ((1.0 - empty) * drafting_ms + empty * empty_ms))
    }

    /// Expected time of a round at `gamma`; `None` while a cost is unmeasured.
    fn round_ms(&self, gamma: u32) -> Option<f64> {
        let verify_plain = self.verify_plain_ms.get()?;
        if gamma == 0 {
            return Some((verify_plain + self.plain_overhead_ms.get()?).max(1e-6));
        }
        let g = f64::from(gamma);
        let verify = verify_plain + self.verify_slope_ms.get().unwrap_or(0.0).max(0.0) * g;
        Some((g * self.draft_step_ms.get()? + verify + self.spec_overhead_ms.get()?).max(1e-6))
    }

    /// How long a session should wait for its draft session to open before its first round,
    /// rather than start target-only and draft once it is open; `None`: until it is open
    /// (nothing measured yet to weigh it by). Not waiting, the round in flight when the draft
    /// opens commits one token in a target pass t; waiting d for the draft, the time t - d
    /// left goes to drafting at s times the speed. So waiting pays while d < t·(1 − 1/s),
    /// which is a token's time target-only less its time drafting, and never where drafting
    /// does not pay.
    pub fn draft_open_grace(&self) -> Option<Duration> {
        let plain = self.speed(0)?;
        let (_, drafting) = self.best_drafting()?;
        let grace_ms = (1.0 / plain - 1.0 / drafting).max(0.0);
        Some(Duration::from_secs_f64(grace_ms / 1e3))
    }

    /// The γ with the highest expected speed; near-ties go to the smaller γ.
    pub fn best_gamma(&self) -> u32 {
        let Some(plain) = self.speed(0) else { return self.last_choice };
        match self.best_drafting() {
            Some((gamma, drafting)) if drafting > plain * (1.0 + NEAR_TIE) => gamma,
            _ => 0,
        }
    }

    /// The estimates and the γ they pick, for logs: `α 0.780, draft step 1.70 ms, verify
    /// 11.00 + 0.30·γ ms, overhead 5.50 (speculative) / 0.40 (target-only) ms, best γ 4`.
    pub fn summary(&self) -> String {
        let ms = |a: Average| a.get().map_or_else(|| "?".to_owned(), |x| format!("{x:.2}"));
        format!(
            "α {:.3}, draft step {} ms, verify {} + {}·γ ms, overhead {} (speculative) / {} (target-only) ms, best γ {}",
            self.alpha(),
            ms(self.draft_step_ms),
            ms(self.verify_plain_ms),
            ms(self.verify_slope_ms),
            ms(self.spec_overhead_ms),
            ms(self.plain_overhead_ms),
            self.best_gamma()
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::observe::SteadyCosts;
    use crate::policy::observe::tests::{report, run};

    #[test]
    fn a_cheap_good_draft_is_used_with_the_gamma_the_cost_model_prefers() {
        let mut policy = AdaptiveGamma::new(12);
        let chosen = run(&mut policy, 200, 0.8, 2.0, 40.0, 0.5);
        // The same world's best γ by brute force over the model of the module docs.
        let speed = |g: u32| {
            let round = f64::from(g) * 2.0 + 40.0 + 0.5 * f64::from(g) + 0.3;
            expected_tokens_per_round(0.8, g) / round
        };
        let best = (1..=12).max_by(|a, b| speed(*a).total_cmp(&speed(*b))).unwrap();
        assert_eq!(policy.best_gamma(), best);
        let settled = &chosen[100..];
        let at_best = settled.iter().filter(|g| **g == best).count();
        assert!(at_best >= settled.len() * 9 / 10, "{chosen:?}");
        assert!((policy.alpha() - 0.8).abs() < 0.01);
    }

    #[test]
    fn a_draft_that_does_not_pay_is_turned_off_and_probed_now_and_then() {
        // docs/rule.md's losing case: α = 0.5, target pass 100 ms, draft step 60 ms.
        let mut policy = AdaptiveGamma::new(8);
        let chosen = run(&mut policy, 200, 0.5, 60.0, 100.0, 0.0);
        assert_eq!(policy.best_gamma(), 0);
        let settled = &chosen[50..];
        let drafting = settled.iter().filter(|g| **g > 0).count();
        assert!(drafting <= settled.len() / policy.draft_probe_every() as usize + 1, "{chosen:?}");
        assert!(drafting >= 1, "still probes: {chosen:?}");
        assert!(settled.iter().all(|g| *g <= 1), "probes use the best drafting γ, here 1: {chosen:?}");
    }

    #[test]
    fn the_winning_case_of_the_design_drafts() {
        // α = 0.5, target pass 100 ms, draft step 20 ms: γ = 1 and γ = 2 both give 1.25×.
        let mut policy = AdaptiveGamma::new(8);
        run(&mut policy, 100, 0.5, 20.0, 100.0, 0.0);
        let best = policy.best_gamma();
        assert!((1..=2).contains(&best), "{best}");
        let speedup = policy.speed(best).unwrap() / policy.speed(0).unwrap();
        assert!((speedup - 1.25).abs() < 0.02, "{speedup}");
    }

    #[test]
    fn a_session_waits_for_its_draft_only_as_long_as_drafting_wins_it_back() {
        let mut winning = AdaptiveGamma::new(8);
        assert_eq!(winning.draft_open_grace(), None, "nothing measured: it waits");
        // The design's winning case: a pass of 100 ms (100.3 with the round's overhead) and
        // 1.25× from drafting: waiting pays up to 100.3·(1 − 1/1.25) ≈ 20 ms.
        run(&mut winning, 100, 0.5, 20.0, 100.0, 0.0);
        let speedup = winning.speed(winning.best_gamma()).unwrap() / winning.speed(0).unwrap();
        let expected_ms = 100.3 * (1.0 - 1.0 / speedup);
        let grace_ms = winning.draft_open_grace().unwrap().as_secs_f64() * 1e3;
        assert!((grace_ms - expected_ms).abs() < 0.1 && (19.0..21.0).contains(&grace_ms), "{grace_ms} ms");
        // The losing case: drafting does not pay, so nothing is worth waiting for.
        let mut losing = AdaptiveGamma::new(8);
        run(&mut losing, 200, 0.5, 60.0, 100.0, 0.0);
        assert_eq!(losing.draft_open_grace(), Some(Duration::ZERO));
    }

    #[test]
    fn drafting_resumes_when_the_draft_starts_agreeing() {
        let mut policy = AdaptiveGamma::new(8);
        run(&mut policy, 100, 0.05, 5.0, 50.0, 0.0);
        assert_eq!(policy.best_gamma(), 0);
        let chosen = run(&mut policy, 400, 0.9, 5.0, 50.0, 0.0);
        assert!(policy.best_gamma() >= 4, "{chosen:?}");
    }

    #[test]
    fn probes_are_rarer_the_more_drafting_loses() {
        // A session that measured a draft across a link of `link_ms`: a 2 ms draft step, a
        // 14 ms target pass, α = 0.8.
        let measured = |link_ms: f64| {
            let mut policy = AdaptiveGamma::new(8);
            for gamma in [4, 0, 1, 0] {
                let overhead = if gamma == 0 { 0.3 } else { link_ms };
                policy
                    .observe(&report(gamma, gamma.min(3), 0.8, 2.0 * gamma as f64, 14.0, overhead), SteadyCosts::BOTH);
            }
            policy
        };
        // Across 53 ms drafting runs at ~0.57× target-only (α ≈ 0.71 after these rounds): a
        // probe loses 2.5 tokens, so they are as far apart as allowed.
        let far = measured(53.0);
        assert_eq!(far.best_gamma(), 0);
        assert_eq!(far.draft_probe_every(), DRAFT_PROBE_MAX, "{}", far.summary());
        // Near break-even (a 20 ms link, γ = 5 at 0.98×) a probe loses 0.06 tokens: as often
        // as allowed, and at the best drafting γ, so a session whose α had dipped finds out
        // within a few probes (one position each would take dozens).
        let mut near = measured(20.0);
        assert_eq!(near.best_gamma(), 0, "{}", near.summary());
        assert_eq!(near.draft_probe_every(), DRAFT_PROBE_MIN, "{}", near.summary());
        // The streak is counted from rounds that ran: choosing alone does not advance it.
        near.plain_streak = 0;
        assert_eq!((near.next_gamma(), near.next_gamma()), (0, 0));
        let (probe, drafting) = near.best_drafting().unwrap();
        let chosen: Vec<u32> = (0..=DRAFT_PROBE_MIN)
            .map(|_| {
                let gamma = near.next_gamma();
                let g = gamma as usize;
                let overhead = if gamma == 0 { 0.3 } else { 20.0 };
                near.observe(&report(g, g.min(3), 0.8, 2.0 * g as f64, 14.0, overhead), SteadyCosts::BOTH);
                gamma
            })
            .collect();
        assert_eq!(chosen[..DRAFT_PROBE_MIN as usize], [0; DRAFT_PROBE_MIN as usize]);
        assert!(probe >= 4, "{}", near.summary());
        assert_eq!(chosen[DRAFT_PROBE_MIN as usize], probe, "{}", near.summary());
        // Each probe's expected loss is within the budget of the rounds between probes.
        let plain = near.speed(0).unwrap();
        let probe_ms = expected_tokens_per_round(near.alpha(), probe) / drafting;
        assert!(probe_ms * (plain - drafting) <= DRAFT_PROBE_BUDGET * DRAFT_PROBE_MIN as f64);
    }

    #[test]
    fn max_zero_never_drafts() {
        let mut policy = AdaptiveGamma::new(0);
        assert!(run(&mut policy, 20, 0.9, 1.0, 50.0, 0.0).iter().all(|g| *g == 0));
    }
}
