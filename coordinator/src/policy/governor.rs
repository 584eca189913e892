//! Under load, whether the sessions' own draft lengths beat plain decoding for all of them.
//!
//! Alone, a session can compare its drafting rounds with its target-only rounds: the machine
//! does the same thing in both. Under load it cannot: its target-only rounds share passes with
//! other sessions' long blocks, its drafting rounds with their one-token rounds, and a session
//! that drafts while the others do not splits their batches, which its own times do not show
//! (docs/adaptive.md has what that cost the demo pair).
//!
//! So per load level (sampling settings and running generations, as the policy memory keys
//! them) the coordinator alternates periods of [`PERIOD_ROUNDS`] rounds: in a `Plain` period
//! every adaptive session of the level decodes target-only (requests with a fixed γ are not
//! governed), in an `Adaptive` one each follows its own policy. A period's result is tokens
//! per session-second (committed tokens ÷ the summed wall time of the rounds that committed
//! them), which is the aggregate rate ÷ the sessions running.
//! After one period of each, the better mode runs, and now and then a period re-measures the
//! other: as often as spends at most [`REMEASURE_BUDGET`] of the level's rate on it, and at
//! least one period in [`OTHER_MODE_EVERY_MAX`]. A level starts `Plain`: under load the safe
//! default is to not draft.
//! The law is untouched: a round's γ still depends only on what happened before it.

use crate::policy::average::Average;
use crate::policy::remeasure::within_budget;

/// Rounds (of all the level's sessions) in one period.
pub const PERIOD_ROUNDS: u64 = 64;
/// The share of a level's rate that re-measuring the mode that measured worse may cost: a
/// mode at 0.75× the other runs after 25 periods of it. It is below the 1–2% by which a plain
/// configuration's rate varies, so that re-measuring costs less than noise (docs/adaptive.md).
pub const REMEASURE_BUDGET: f64 = 0.01;
/// The fewest periods between re-measurings: a mode within 8% of the other is re-measured one
/// period in 8.
pub const OTHER_MODE_EVERY_MIN: u64 = 8;
/// The most periods between re-measurings: a mode that loses badly is still re-measured one
/// period in 64, in case the machine changed.
pub const OTHER_MODE_EVERY_MAX: u64 = 64;
/// Weight of a period's rate once a mode has a few (the first ones are averaged plainly).
const RATE_SMOOTHING: f64 = 0.25;

/// Periods of the better mode between two of the other, which runs at `ratio` of its rate.
fn remeasure_every(ratio: f64) -> u64 {
    within_budget(1.0 - ratio, REMEASURE_BUDGET, OTHER_MODE_EVERY_MIN, OTHER_MODE_EVERY_MAX)
}

/// What the sessions of a load level do in the current period.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LoadMode {
    /// Every session decodes target-only.
    Plain,
    /// Each session picks its own γ.
    Adaptive,
}

/// One load level's periods.
#[derive(Debug, Clone)]
pub struct LoadPeriods {
    mode: LoadMode,
    rounds: u64,
    tokens: u64,
    session_ms: f64,
    /// Periods the better mode has run since the other last did.
    since_other: u64,
    /// The current period re-measures the mode that measured worse.
    remeasuring: bool,
    plain: Average,
    adaptive: Average,
}

impl Default for LoadPeriods {
    fn default() -> Self {
        Self {
            mode: LoadMode::Plain,
            rounds: 0,
            tokens: 0,
            session_ms: 0.0,
            since_other: 0,
            remeasuring: false,
            plain: Average::default(),
            adaptive: Average::default(),
        }
    }
}

impl LoadPeriods {
    /// What the level's sessions do now.
    pub fn mode(&self) -> LoadMode {
        self.mode
    }

    /// Adds a finished round that ran in `mode`: `tokens` committed in `wall_ms`. Rounds
    /// that started before the current period (in flight at its change) are left out.
    pub fn record(&mut self, mode: LoadMode, tokens: usize, wall_ms: f64) {
        if mode != self.mode || !(wall_ms.is_finite() && wall_ms > 0.0) {
            return;
        }
        self.rounds += 1;
        self.tokens += tokens as u64;
        self.session_ms += wall_ms;
        if self.rounds >= PERIOD_ROUNDS {
            self.end_period();
        }
    }

    fn end_period(&mut self) {
        let rate = self.tokens as f64 / self.session_ms;
        match self.mode {
            LoadMode::Plain => self.plain.add(rate, RATE_SMOOTHING),
            LoadMode::Adaptive => self.adaptive.add(rate, RATE_SMOOTHING),
        }
        (self.rounds, self.tokens, self.session_ms) = (0, 0, 0.0);
        self.mode = match (self.plain.get(), self.adaptive.get()) {
            (None, _) => LoadMode::Plain,
            (_, None) => LoadMode::Adaptive,
            (Some(plain), Some(adaptive)) => {
                let (best, other, ratio) = if adaptive > plain {
                    (LoadMode::Adaptive, LoadMode::Plain, plain / adaptive)
                } else {
                    (LoadMode::Plain, LoadMode::Adaptive, adaptive / plain)
                };
                // A re-measured mode that now measures better was measured later than the
                // other's estimate, and the machine drifts: the other is measured again at once
                // before the level switches for long.
                let flipped = self.remeasuring && self.mode == best;
                self.since_other = if self.mode == best && !flipped { self.since_other + 1 } else { 0 };
                self.remeasuring = flipped || self.since_other >= remeasure_every(ratio);
                if self.remeasuring {
                    self.since_other = 0;
                    other
                } else {
                    best
                }
            }
        };
    }

    /// Tokens per session-second measured in each mode, for logs.
    pub fn summary(&self) -> String {
        let rate = |r: Average| r.get().map_or_else(|| "?".to_owned(), |x| format!("{:.1}", x * 1e3));
        format!(
            "{:?} now; tokens per session-second: plain {}, adaptive {}",
            self.mode,
            rate(self.plain),
            rate(self.adaptive)
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Runs `periods` periods of a world where plain rounds commit 1 token in 20 ms and
    /// adaptive ones `tokens` in `ms`; returns the mode of each period.
    fn run(level: &mut LoadPeriods, periods: u64, (tokens, ms): (usize, f64)) -> Vec<LoadMode> {
        (0..periods)
            .map(|_| {
                let mode = level.mode();
                for _ in 0..PERIOD_ROUNDS {
                    match level.mode() {
                        LoadMode::Plain => level.record(LoadMode::Plain, 1, 20.0),
                        LoadMode::Adaptive => level.record(LoadMode::Adaptive, tokens, ms),
                    }
                }
                mode
            })
            .collect()
    }

    #[test]
    fn a_level_measures_plain_then_adaptive_then_runs_the_better_one() {
        // Drafting loses 10% in aggregate (3 tokens in 66 ms: it splits the batches).
        let mut losing = LoadPeriods::default();
        let modes = run(&mut losing, 40, (3, 66.0));
        assert_eq!(&modes[..2], [LoadMode::Plain, LoadMode::Adaptive]);
        let adaptive = modes[2..].iter().filter(|m| **m == LoadMode::Adaptive).count();
        assert!(adaptive <= 38 / remeasure_every(60.0 / 66.0) as usize + 1, "{modes:?}");
        assert!(adaptive >= 1, "the other mode is re-measured: {modes:?}");
        // Drafting wins 10% (3 tokens in 54 ms).
        let mut winning = LoadPeriods::default();
        let modes = run(&mut winning, 40, (3, 54.0));
        let plain = modes[2..].iter().filter(|m| **m == LoadMode::Plain).count();
        assert!(plain <= 38 / remeasure_every(54.0 / 60.0) as usize + 1, "{modes:?}");
        assert!(winning.summary().ends_with("plain 50.0, adaptive 55.6"), "{}", winning.summary());
    }

    #[test]
    fn a_level_follows_when_drafting_starts_paying() {
        let mut level = LoadPeriods::default();
        run(&mut level, 17, (3, 66.0));
        assert_eq!(level.mode(), LoadMode::Plain);
        // The re-measuring periods see the change, and the level switches within a few.
        let modes = run(&mut level, 40, (3, 40.0));
        assert!(modes[24..].iter().filter(|m| **m == LoadMode::Adaptive).count() >= 14, "{modes:?}");
    }

    #[test]
    fn the_worse_mode_is_re_measured_the_more_rarely_the_more_it_loses() {
        // Re-measuring costs (1 - ratio) of a period's rate after every N of the better mode: at
        // most 1%.
        for (tokens, ms, every) in [(1, 21.0, 8), (3, 80.0, 25), (1, 200.0, 64)] {
            let mut level = LoadPeriods::default();
            let modes = run(&mut level, 2 + 4 * (every + 1), (tokens, ms));
            let adaptive = modes[2..].iter().filter(|m| **m == LoadMode::Adaptive).count() as u64;
            assert_eq!(adaptive, 4, "one in {every}: {modes:?}");
            let ratio = tokens as f64 / ms * 20.0;
            assert!((1.0 - ratio) / every as f64 <= REMEASURE_BUDGET * 1.02 || every == OTHER_MODE_EVERY_MAX);
        }
    }

    #[test]
    fn a_re_measured_mode_that_now_wins_runs_its_periods() {
        let mut level = LoadPeriods::default();
        // Drafting loses 25%: it is re-measured after 25 periods of plain, and not before.
        let modes = run(&mut level, 2 + 25, (3, 80.0));
        let adaptive: Vec<usize> =
            modes.iter().enumerate().filter(|(_, m)| **m == LoadMode::Adaptive).map(|(i, _)| i).collect();
        assert_eq!(adaptive, [1], "{modes:?}");
        assert_eq!(level.mode(), LoadMode::Adaptive, "the next period re-measures");
        // That period finds drafting winning (3 tokens in 45 ms: 1.33×, enough to lift its
        // average past plain's). Plain is measured again at once, loses again, and the level
        // drafts from then on, re-measuring plain after 8 periods or more.
        let modes = run(&mut level, 10, (3, 45.0));
        use LoadMode::{Adaptive as A, Plain as P};
        assert_eq!(modes, [A, P, A, A, A, A, A, A, A, A], "{}", level.summary());
    }

    #[test]
    fn rounds_without_time_are_ignored() {
        let mut level = LoadPeriods::default();
        for _ in 0..2 * PERIOD_ROUNDS {
            level.record(LoadMode::Plain, 5, 0.0);
            level.record(LoadMode::Plain, 5, f64::NAN);
        }
        assert_eq!((level.mode(), level.plain.get()), (LoadMode::Plain, None));
    }

    #[test]
    fn rounds_of_the_previous_period_are_left_out() {
        let mut level = LoadPeriods::default();
        for _ in 0..PERIOD_ROUNDS {
            level.record(LoadMode::Plain, 1, 20.0);
        }
        assert_eq!(level.mode(), LoadMode::Adaptive);
        // A plain round still in flight when the period changed, 50× faster than any other.
        level.record(LoadMode::Plain, 50, 20.0);
        for _ in 0..PERIOD_ROUNDS {
            level.record(LoadMode::Adaptive, 1, 25.0);
        }
        assert!(level.summary().ends_with("plain 50.0, adaptive 40.0"), "{}", level.summary());
        assert_eq!(level.mode(), LoadMode::Plain);
    }
}
