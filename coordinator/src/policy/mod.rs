//! Adaptive draft length (docs/adaptive.md): per session, pick the γ in 0..=max that maximises
//! expected tokens per millisecond, from what the session's own rounds measured, starting
//! from what earlier sessions learnt.
//!
//! The model of a round, every term measured:
//! - α: the per-position acceptance, from Σ min(p, q) of every evaluated position (exact from
//!   the target's p on the draft's support; lower variance than counting accepts);
//! - a draft step: draft time ÷ γ;
//! - a verify pass: `verify(γ) = verify(0) + slope·γ`, because on CPU scoring γ+1 tokens costs
//!   more than scoring one (BENCHMARKS.md: 1.9× for 6 tokens in f32);
//! - the rest of a round (network, hand-offs, the rule): measured separately for speculative
//!   rounds (two calls) and target-only rounds (one call).
//!
//! Expected tokens of a round are (1 - α^(γ+1)) / (1 - α), so speed(γ) = that ÷
//! (γ·draft + verify(γ) + overhead) and speed(0) = 1 ÷ (verify(0) + overhead(0)). The two cost
//! cases of docs/rule.md: with α = 0.5, a target pass of 100 ms and draft steps of 20 ms,
//! γ = 1 gives 1.25× and the policy drafts; with draft steps of 60 ms every γ is slower than
//! target-only (γ = 1: 0.94×, the "0.875×" family of cases) and the policy picks γ = 0, which
//! is plain target decoding.
//!
//! A session starts from what the coordinator's earlier sessions with the same sampling
//! settings and about the same number of concurrent generations learnt ([`PolicyMemory`]):
//! their latest costs, and the α of all their positions (its own α starts there, counted as
//! [`SESSION_ALPHA_PRIOR_WEIGHT`] positions, and then follows its prompt). A short request
//! must not spend its few rounds re-learning that drafting does not pay (a 20 ms link to the
//! draft, a draft that knows nothing of the target, a target whose passes are shared by many
//! sessions). The first session of its kind, and a session that explores, starts with one
//! speculative and one target-only round, so both sides are measured (the first round's
//! passes also fill the caches and teach only α: a first session drafts once more to measure
//! the draft, an explorer keeps the learnt draft costs); the α of an explorer
//! that runs alone starts from the population's counted as only 2 positions, so its own
//! soon decide. That drafting does not pay is trusted only once the α behind
//! it is several sessions' worth: one prompt's positions are not independent. Either way a
//! session re-measures the side it is not using now and then: a target-only round every
//! [`PLAIN_PROBE_EVERY`] rounds while drafting, a round at the best drafting γ while not, as
//! often as costs at most [`DRAFT_PROBE_BUDGET`] of the session's rate (after
//! [`DRAFT_PROBE_MIN`] to [`DRAFT_PROBE_MAX`] target-only rounds: near break-even often, since a probe
//! there loses little and a session whose α dipped must get back, rarely across a slow link,
//! where a probe costs several target passes). The law
//! stays exact whatever γ is chosen: each round's rule is exact for its γ, and γ depends only
//! on earlier rounds.

pub(crate) mod average;
pub mod copies;
pub mod governor;
pub mod key;
mod remeasure;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use specd_sampling::cost::expected_tokens_per_round;

use crate::policy::average::Average;
use crate::policy::copies::CopyChoice;
use crate::policy::governor::{LoadMode, LoadPeriods};
use crate::policy::key::PolicyKey;
use crate::policy::remeasure::within_budget;
use crate::session::round_report::RoundReport;

/// γ of the first round, before anything is measured.
pub const START_GAMMA: u32 = 4;
/// Rounds a session that starts from nothing (or explores) measures with: γ = START_GAMMA,
/// then 0.
pub const MEASURING_ROUNDS: u64 = 2;
/// While drafting, one target-only round this often refreshes its costs.
pub const PLAIN_PROBE_EVERY: u64 = 64;
/// While not drafting, a drafting round checks whether drafting pays again, as often as its
/// expected loss against target-only rounds stays under this share of the session's tokens.
/// (One γ = 1 probe in 16 to 128 rounds whatever it cost left sessions whose α had dipped
/// below break-even at a 5 ms RTT target-only for the rest of their 48 tokens, and at 20 ms
/// spent 4% of the rate on probes that could not pay.)
pub const DRAFT_PROBE_BUDGET: f64 = 0.01;
/// Bounds on the target-only rounds between two probes.
pub const DRAFT_PROBE_MIN: u64 = 8;
pub const DRAFT_PROBE_MAX: u64 = 128;
/// Relative difference in expected speed below which two γ are a tie (the smaller wins).
const NEAR_TIE: f64 = 1e-9;
/// Weight of a new observation in the running averages.
const SMOOTHING: f64 = 0.15;
/// Weight of one position's Σ min(p, q) in the running α.
const ALPHA_SMOOTHING: f64 = 0.05;
/// Weight of a round in the verify pass's cost per token. The slope is a property of the
/// target and its machine, small against the pass's noise (here 0.5 ms a token against
/// ±2 ms, spikes aside): learnt at [`SMOOTHING`], sessions at a 0 ms RTT read anything from
/// -0.4 to 4.4 ms a token from their few rounds, and those that read high drafted γ = 2–3
/// where γ = 5 was faster (26 rounds for 48 tokens against 19).
const SLOPE_SMOOTHING: f64 = 0.03;

/// How many observations the prior α = 0.5 counts for: a round that evaluates 3 or more
/// positions outweighs it.
const ALPHA_PRIOR_WEIGHT: u64 = 2;

/// One session's adaptive γ.
#[derive(Debug, Clone)]
pub struct AdaptiveGamma {
    max: u32,
    alpha: Average,
    draft_step_ms: Average,
    verify_plain_ms: Average,
    verify_slope_ms: Average,
    spec_overhead_ms: Average,
    plain_overhead_ms: Average,
    rounds: u64,
    last_choice: u32,
    /// Target-only rounds since the last drafting one.
    plain_streak: u64,
    /// Positions this session's own rounds evaluated (its α's prior excluded).
    own_positions: u64,
    /// Share of drafting rounds whose draft proposed nothing (a deterministic proposer
    /// without a match): they commit one token in a target-only pass plus the draft's call.
    empty_share: Average,
}

const MS: f64 = 1e-6;

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

    /// A session's start from what an earlier one learnt: the same estimates, its own
    /// maximum, past the measuring rounds of a first session.
    fn warm_copy(&self, max: u32) -> Self {
        Self {
            max,
            rounds: self.rounds.max(MEASURING_ROUNDS),
            last_choice: self.last_choice.min(max),
            plain_streak: 0,
            ..self.clone()
        }
    }

    /// A session's start that measures drafting again from its first round (γ =
    /// START_GAMMA, then a target-only round), with the estimates learnt so far.
    fn exploring_copy(&self, max: u32) -> Self {
        Self { max, rounds: 0, last_choice: 0, plain_streak: 0, ..self.clone() }
    }

    /// Whether drafting would pay were α two standard errors higher than estimated from
    /// `positions` independent positions: while the estimate is uncertain, whether exploring
    /// is worth its cost. (One was too few: the first session's prompt drafted badly, its
    /// costs were measured on its few rounds, and a 5 ms link where γ = 6 gives 1.26× was
    /// left undrafted until the eighth session.)
    fn could_pay(&self, positions: u64) -> bool {
        let (alpha, n) = (self.alpha(), positions.max(1) as f64);
        let optimistic = alpha + 2.0 * (alpha * (1.0 - alpha) / n).sqrt();
        let Some(plain) = self.speed(0) else { return true };
        (1..=self.max).any(|g| self.speed_at(g, optimistic).is_some_and(|s| s > plain))
    }

    /// Takes `other`'s target-only costs, keeping everything else.
    fn refresh_target_only(&mut self, other: &AdaptiveGamma) {
        self.verify_plain_ms = other.verify_plain_ms;
        self.plain_overhead_ms = other.plain_overhead_ms;
    }

    /// Whether both sides (target-only and speculative rounds) have been measured.
    fn measured(&self) -> bool {
        self.speed(0).is_some() && self.speed(1).is_some()
    }

    /// The largest γ this session may use (0: it never drafts).
    pub fn max(&self) -> u32 {
        self.max
    }

    /// The estimated per-position acceptance α.
    pub fn alpha(&self) -> f64 {
        self.alpha.get().unwrap_or(0.5)
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
    fn draft_probe_every(&self) -> u64 {
        let (Some(plain), Some((gamma, drafting))) = (self.speed(0), self.best_drafting()) else {
            return DRAFT_PROBE_MIN;
        };
        let Some(probe_ms) = self.round_ms(gamma) else { return DRAFT_PROBE_MIN };
        let lost_tokens = probe_ms * (plain - drafting).max(0.0);
        within_budget(lost_tokens, DRAFT_PROBE_BUDGET, DRAFT_PROBE_MIN, DRAFT_PROBE_MAX)
    }

    /// The drafting γ (≥ 1) with the highest expected speed, and that speed; near-ties go to
    /// the smaller γ.
    fn best_drafting(&self) -> Option<(u32, f64)> {
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
        // part that γ = 1 puts all on one step, and a verify pass's noise of ±2 ms divided by
        // γ = 1 is a slope of ±2 ms a token. Sessions that had stopped drafting measured only
        // such γ = 1 probes, priced drafting at 1.5–2 ms a token for the verify and 2.8 ms a
        // draft step (1.0 ms and 2.0 ms at γ ≥ 4), and stayed stopped where γ = 3 paid 1.15×
        // (5 ms RTT, α 0.6). So they count for a share that grows with γ: its square for the
        // slope, whose error shrinks as 1/γ.
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

/// How far above the running estimate one pass's time counts: times on this 2-core machine
/// have spikes of 2–4× the median (a 5 ms RTT run: target-only passes of median 18.4 ms and
/// up to 45 ms, γ = 3 passes of median 19.6 ms and up to 78 ms). Target-only rounds are rare
/// while drafting, so one spike taken whole stayed in that estimate for dozens of rounds: at
/// 20 ms RTT it read 42 ms against 19, and drafting looked like it paid for every session
/// started from it. Clipped, a spike moves an estimate a little and a lasting slow-down still
/// moves it all the way, in about ten rounds. Spikes go up only, so times below the estimate
/// count whole, and so do the first few, which an estimate that is still a plain mean needs.
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
/// rounds catches up on their tokens: taken as per-token costs, the demo's 60-token prompts
/// priced a verified token at several ms, and every session started from memory wrote that
/// back for the next.
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

/// What finished rounds taught, shared by a coordinator's sessions: per key (the session
/// picks it: sampling settings, on which acceptance depends, and the load, on which the
/// costs do), the latest cost estimates of any session that may draft, the target-only costs
/// of any session, and the α over all positions of all sessions.
/// Which γ a round uses never depends on that round's own draws, so the law stays exact.
///
/// When what was learnt says drafting does not pay, only one new session in
/// [`EXPLORE_EVERY`] drafts at all (from its first round, so the memory stays current); the
/// others get a maximum of 0, so they open no draft session and pay nothing for a draft they
/// would not use. Until the α estimate rests on [`CONFIDENT_POSITIONS`] positions every new
/// session explores, but only while it runs alone: under load a session that drafts while the
/// others do not arrives at the target out of step with them and splits their batches, which
/// costs every session (8 clients on the demo pair: 0.89× target-only with every new session
/// exploring, 1.00× with one in 8). The same holds before anything is learnt: under load only
/// one session in [`EXPLORE_EVERY`] of a key not learnt yet measures drafting.
#[derive(Debug, Clone, Default)]
pub struct PolicyMemory(Arc<Mutex<Memory>>);

#[derive(Debug, Default)]
struct Memory {
    learnt: HashMap<PolicyKey, Learnt>,
    /// Sessions started per key with nothing learnt for it yet.
    unlearnt_starts: HashMap<PolicyKey, u64>,
    /// Per key of a load above one: whether its sessions draft ([`crate::policy::governor`]).
    loaded: HashMap<PolicyKey, LoadPeriods>,
    /// Per key, where the last `model+ngram` session left its choice of copies.
    copies: HashMap<PolicyKey, CopyChoice>,
}

/// One key's latest cost estimates, the acceptance of all its sessions, and how many
/// sessions started from them.
#[derive(Debug)]
struct Learnt {
    policy: AdaptiveGamma,
    /// α over every position of every session, slowly smoothed: a session's own α follows
    /// its prompt (the demo pair's greedy α is 0.24 on one prompt, 0.78 over eight) and one
    /// poor prompt must not switch drafting off for everyone after it.
    population_alpha: Average,
    /// Sessions whose positions are in `population_alpha`.
    alpha_sessions: u64,
    starts: u64,
}

impl Learnt {
    /// The learnt costs with the population's α: what new sessions decide from.
    fn shared(&self) -> AdaptiveGamma {
        AdaptiveGamma { alpha: self.population_alpha, ..self.policy.clone() }
    }

    /// How many independent positions the population α is worth. Positions of one prompt
    /// are not independent: the prompt sets the acceptance (greedy on the demo pair, 0.24
    /// on one prompt and 0.78 over eight), so each session counts for at most
    /// [`SESSION_ALPHA_PRIOR_WEIGHT`] positions. At a 5 ms RTT, a first prompt's 40 poor
    /// positions were taken as certainty, and drafting (γ = 6: 1.26–1.34×) stayed off for
    /// 7 sessions in 8 (1.16×).
    fn alpha_evidence(&self) -> u64 {
        let positions = self.population_alpha.count.saturating_sub(ALPHA_PRIOR_WEIGHT);
        positions.min(self.alpha_sessions * SESSION_ALPHA_PRIOR_WEIGHT)
    }
}

/// Weight of one position in the population α (a horizon of about 500 positions).
const POPULATION_ALPHA_SMOOTHING: f64 = 0.002;

/// How many positions the population α counts for in a new session's own α (with the
/// prior's [`ALPHA_PRIOR_WEIGHT`]): after about 10 of its own positions, a session's α is
/// half its prompt's.
pub const SESSION_ALPHA_PRIOR_WEIGHT: u64 = 8;

/// Distinct sampling settings remembered; past this the memory starts again.
const REMEMBERED_SETTINGS: usize = 256;

/// Clears `map` when `key` would be one key past [`REMEMBERED_SETTINGS`]: the keys hold
/// clients' sampling settings, so nothing else bounds them.
fn make_room<V>(map: &mut HashMap<PolicyKey, V>, key: PolicyKey) {
    if !map.contains_key(&key) && map.len() >= REMEMBERED_SETTINGS {
        map.clear();
    }
}

/// While drafting does not pay, one session in this many still drafts (and probes).
pub const EXPLORE_EVERY: u64 = 8;

/// Below this many independent positions behind the α estimate ([`Learnt::alpha_evidence`]:
/// at least 4 sessions' worth), "drafting does not pay" is not trusted and every new session
/// explores, unless drafting would not pay even with α two standard errors higher: one
/// prompt's acceptance can be far from the next one's (greedy on the demo pair: 0.24 on one
/// prompt, 0.78 over eight).
pub const CONFIDENT_POSITIONS: u64 = 32;

impl PolicyMemory {
    /// The policy a new session with these settings starts with, `running` generations
    /// (this one included) running now.
    pub fn start(&self, key: PolicyKey, max: u32, running: usize) -> AdaptiveGamma {
        let mut memory = self.0.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        let Some(learnt) = memory.learnt.get_mut(&key) else {
            // A new load level starts with all its sessions at once (8 clients: the whole
            // first pass of the demo pair drafted its first rounds, at 0.86× target-only).
            // One measures; the rest decode plainly until it has.
            make_room(&mut memory.unlearnt_starts, key);
            let starts = memory.unlearnt_starts.entry(key).or_default();
            *starts += 1;
            let explores = running <= 1 || *starts % EXPLORE_EVERY == 1;
            return AdaptiveGamma::new(if explores { max } else { 0 });
        };
        learnt.starts += 1;
        // Decided with this session's maximum: the latest session may have had none.
        let shared = AdaptiveGamma { max, ..learnt.shared() };
        let evidence = learnt.alpha_evidence();
        let (start, prior_positions) = if shared.best_gamma() > 0 {
            (shared.warm_copy(max), SESSION_ALPHA_PRIOR_WEIGHT)
        } else if (running <= 1 && evidence < CONFIDENT_POSITIONS && shared.could_pay(evidence))
            || learnt.starts.is_multiple_of(EXPLORE_EVERY)
        {
            // A lone explorer goes against what the population's α says, so its own
            // positions decide: with the population's α counted as 8 positions, a prompt at
            // α = 0.78 after one at 0.25 stood at 0.40 after its first round, stopped
            // drafting, and left the population's α where it was. Under load an explorer
            // re-measures the costs, and a prompt the draft knows well must not keep it
            // drafting out of step with the others.
            (shared.exploring_copy(max), if running <= 1 { 0 } else { SESSION_ALPHA_PRIOR_WEIGHT })
        } else {
            (shared.warm_copy(0), SESSION_ALPHA_PRIOR_WEIGHT)
        };
        let alpha = Average { count: start.alpha.count.min(ALPHA_PRIOR_WEIGHT + prior_positions), ..start.alpha };
        AdaptiveGamma { alpha, own_positions: 0, ..start }
    }

    /// Where the last session with these settings left its choice of copies (`model+ngram`
    /// drafts; `policy/copies.rs`), for a new session to start from; a fresh choice for
    /// settings not seen yet.
    pub fn copy_choice(&self, key: PolicyKey) -> CopyChoice {
        let memory = self.0.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        memory.copies.get(&key).cloned().unwrap_or_default()
    }

    /// Keeps a session's choice of copies for the sessions that start after it.
    pub fn remember_copies(&self, key: PolicyKey, choice: &CopyChoice) {
        let mut memory = self.0.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        make_room(&mut memory.copies, key);
        memory.copies.insert(key, choice.clone());
    }

    /// What the sessions of a load level above one do now.
    pub fn load_mode(&self, key: PolicyKey) -> LoadMode {
        let memory = self.0.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        memory.loaded.get(&key).map_or(LoadMode::Plain, LoadPeriods::mode)
    }

    /// Adds a finished round of a session at a load level above one, run in `mode`, to that
    /// level's period.
    pub fn record_loaded_round(&self, key: PolicyKey, mode: LoadMode, tokens: usize, wall_ns: u64) {
        let mut memory = self.0.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        make_room(&mut memory.loaded, key);
        let loaded = memory.loaded.entry(key).or_default();
        let before = loaded.mode();
        loaded.record(mode, tokens, wall_ns as f64 * MS);
        if loaded.mode() != before {
            tracing::info!(level = %key, state = %loaded.summary(), "load level changes mode");
        }
    }

    /// Keeps a session's cost estimates for the sessions that start after it, and adds the
    /// Σ min(p, q) of the positions its last round evaluated to the population's α.
    pub fn remember(&self, key: PolicyKey, policy: &AdaptiveGamma, positions: &[f64]) {
        let mut memory = self.0.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        if let Some(learnt) = memory.learnt.get_mut(&key) {
            for &a in positions {
                learnt.population_alpha.add(a, POPULATION_ALPHA_SMOOTHING);
            }
            // Its first round with positions: one more session behind the population's α.
            if !positions.is_empty() && policy.own_positions == positions.len() as u64 {
                learnt.alpha_sessions += 1;
            }
            if policy.max == 0 {
                // A session that may not draft measures only target-only rounds; its draft
                // costs are a stale copy and would overwrite what an explorer just learnt.
                learnt.policy.refresh_target_only(policy);
            } else if policy.measured() {
                learnt.policy = policy.clone();
            }
            return;
        }
        if !policy.measured() {
            return;
        }
        make_room(&mut memory.learnt, key);
        memory.unlearnt_starts.remove(&key);
        // The first session of its kind: its own α so far is all there is.
        let alpha_sessions = u64::from(policy.own_positions > 0);
        let learnt = Learnt { policy: policy.clone(), population_alpha: policy.alpha, alpha_sessions, starts: 0 };
        memory.learnt.insert(key, learnt);
    }
}

#[cfg(test)]
mod tests {
    use specd_sampling::{BlockOutcome, EmittedFrom, SamplingParams};

    use super::*;

    /// Greedy sampling, one session running: the key most tests learn under.
    fn greedy() -> PolicyKey {
        PolicyKey::of(&SamplingParams::greedy(), 1)
    }

    /// Sampling at T = 1, one session running: other settings than [`greedy`].
    fn t1() -> PolicyKey {
        PolicyKey::of(&SamplingParams::default(), 1)
    }

    /// Greedy sampling at load level `running`.
    fn greedy_at(running: usize) -> PolicyKey {
        PolicyKey::of(&SamplingParams::greedy(), running)
    }

    /// A round with these costs in ms, and `accepted` of γ accepted with Σ min(p, q) = `alpha`.
    fn report(
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
        };
        let ns = |ms: f64| (ms * 1e6) as u64;
        let times = [ns(draft_ms), ns(verify_ms), ns(draft_ms + verify_ms + overhead_ms)];
        RoundReport::for_tests(outcome, vec!["model"; gamma], times)
    }

    /// Runs `rounds` rounds of a world where a draft step costs `draft_ms`, a verify pass
    /// `verify_ms` + `slope_ms`·γ, every round `overhead_ms` more, and acceptance is `alpha`.
    fn run(
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

    /// Plays `rounds` rounds of `session` against `memory`, as a coordinator's session does:
    /// `world` answers each γ with a round's report.
    fn play(
        memory: &PolicyMemory,
        key: PolicyKey,
        session: &mut AdaptiveGamma,
        rounds: usize,
        world: impl Fn(u32) -> RoundReport,
    ) {
        for _ in 0..rounds {
            let round = world(session.next_gamma());
            session.observe(&round, SteadyCosts::BOTH);
            memory.remember(key, session, &round.outcome.expected_acceptance);
        }
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
                    round.sources = vec!["prompt_match"; gamma];
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
    fn passes_that_fill_a_cache_teach_acceptance_but_no_costs() {
        // The same world as above, but the first round's passes also filled both caches with
        // a 60-token prompt: +30 ms at the target, +12 ms at the draft. Taken as costs, they
        // price a verified token at 7.5 ms and a draft step at 4.7 ms, and γ = 0 wins.
        let mut policy = AdaptiveGamma::new(8);
        assert_eq!(policy.next_gamma(), START_GAMMA);
        let filling = SteadyCosts { target: false, draft: false };
        policy.observe(&report(4, 3, 0.8, 4.0 * 1.7 + 12.0, 11.0 + 4.0 * 0.3 + 30.0, 5.5), filling);
        assert!((policy.alpha() - 0.8).abs() < 0.11, "α is learnt: {}", policy.alpha());
        assert_eq!(policy.next_gamma(), 0);
        // The target-only round measures that side; the drafting side is measured next.
        policy.observe(&report(0, 0, 0.0, 0.0, 11.0, 0.5), SteadyCosts::BOTH);
        assert_eq!(policy.next_gamma(), START_GAMMA, "{policy:?}");
        // A draft that caught up on target-only rounds' tokens: its time is not a step's.
        let catching_up = SteadyCosts { target: true, draft: false };
        policy.observe(&report(4, 3, 0.8, 4.0 * 1.7 + 12.0, 11.0 + 4.0 * 0.3, 5.5), catching_up);
        assert_eq!(policy.next_gamma(), START_GAMMA, "the draft step is still unmeasured: {policy:?}");
        policy.observe(&report(4, 3, 0.8, 4.0 * 1.7, 11.0 + 4.0 * 0.3, 5.5), SteadyCosts::BOTH);
        assert!((policy.verify_slope_ms.get().unwrap() - 0.3).abs() < 1e-6, "{policy:?}");
        assert!((policy.draft_step_ms.get().unwrap() - 1.7).abs() < 1e-6, "{policy:?}");
        assert!(policy.next_gamma() >= 2, "{policy:?}");
        // A session started from these estimates: its first round fills both caches, and its
        // costs stay where they were.
        let memory = PolicyMemory::default();
        memory.remember(greedy(), &policy, &[]);
        let mut warm = memory.start(greedy(), 8, 1);
        let gamma = warm.next_gamma();
        assert!(gamma >= 2, "{warm:?}");
        let g = f64::from(gamma);
        warm.observe(&report(gamma as usize, 1, 0.8, 1.7 * g + 12.0, 11.0 + 0.3 * g + 30.0, 5.5), filling);
        for (after, before) in [
            (warm.verify_plain_ms, policy.verify_plain_ms),
            (warm.verify_slope_ms, policy.verify_slope_ms),
            (warm.draft_step_ms, policy.draft_step_ms),
        ] {
            assert_eq!(after.get(), before.get(), "{warm:?}");
        }
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
    fn one_prompt_s_poor_acceptance_does_not_stop_the_next_sessions_drafting() {
        // A first session whose prompt drafts badly: few positions say drafting does not pay.
        // α = 0.3 with these costs loses a little (γ = 1: 0.93×); α = 0.5 would win.
        let memory = PolicyMemory::default();
        let mut first = memory.start(greedy(), 8, 1);
        run(&mut first, 20, 0.3, 20.0, 50.0, 0.0);
        memory.remember(greedy(), &first, &[]);
        assert_eq!(first.best_gamma(), 0);
        assert!(first.own_positions < CONFIDENT_POSITIONS);
        assert!(first.could_pay(first.own_positions));
        // Every next session still drafts from its first round until the evidence suffices.
        for _ in 0..EXPLORE_EVERY {
            let mut next = memory.start(greedy(), 8, 1);
            assert_eq!((next.max(), next.next_gamma()), (8, START_GAMMA));
        }
        // Under load only one in EXPLORE_EVERY does: the others' batches stay in step.
        let explorers = (0..EXPLORE_EVERY).filter(|_| memory.start(greedy(), 8, 8).max() > 0).count();
        assert_eq!(explorers, 1);
        // Not so where drafting would lose even with a higher α: a draft step dearer than
        // a target pass loses at any α.
        let mut hopeless = memory.start(t1(), 8, 1);
        run(&mut hopeless, 20, 0.5, 120.0, 100.0, 0.0);
        memory.remember(t1(), &hopeless, &[]);
        assert!(hopeless.own_positions < CONFIDENT_POSITIONS && !hopeless.could_pay(hopeless.own_positions));
        let explorers = (0..EXPLORE_EVERY).filter(|_| memory.start(t1(), 8, 1).max() > 0).count();
        assert_eq!(explorers, 1);
    }

    #[test]
    fn many_positions_of_one_poor_prompt_do_not_stop_the_next_sessions_exploring() {
        // The demo pair across a 5 ms link: a 1.7 ms draft step, an 11 ms target pass
        // (+0.3 ms a token), 5.5 ms of network a speculative round, 0.5 ms a target-only one.
        // At the usual α = 0.78, γ = 4 gives 1.5×; the first prompt's α = 0.25 loses.
        let link_5ms = |alpha: f64| {
            move |gamma: u32| {
                let g = f64::from(gamma);
                let overhead = if gamma == 0 { 0.5 } else { 5.5 };
                report(gamma as usize, (alpha * g).round() as usize, alpha, 1.7 * g, 11.0 + 0.3 * g, overhead)
            }
        };
        let memory = PolicyMemory::default();
        let mut first = memory.start(greedy(), 8, 1);
        play(&memory, greedy(), &mut first, 2, link_5ms(0.25));
        while first.own_positions < 2 * CONFIDENT_POSITIONS {
            play(&memory, greedy(), &mut first, 16, link_5ms(0.25));
        }
        assert_eq!(first.best_gamma(), 0, "{}", first.summary());
        // Its positions are many, but they are one prompt's: the next session explores, its
        // own α decides whether it goes on drafting, and the sessions after it draft too.
        let mut second = memory.start(greedy(), 8, 1);
        assert_eq!((second.max(), second.next_gamma()), (8, START_GAMMA), "{}", second.summary());
        play(&memory, greedy(), &mut second, 40, link_5ms(0.78));
        assert!(second.best_gamma() >= 3, "{}", second.summary());
        let mut third = memory.start(greedy(), 8, 1);
        assert!(third.next_gamma() >= 3, "{}", third.summary());
        // Under load an explorer measures costs, and its α starts from the population's.
        let memory = PolicyMemory::default();
        let mut first = memory.start(greedy_at(8), 8, 1);
        play(&memory, greedy_at(8), &mut first, 20, link_5ms(0.25));
        let weights: Vec<u64> = (0..EXPLORE_EVERY)
            .map(|_| memory.start(greedy_at(8), 8, 8))
            .filter(|p| p.max() > 0)
            .map(|p| p.alpha.count)
            .collect();
        assert_eq!(weights.len(), 1);
        assert!(weights[0] > ALPHA_PRIOR_WEIGHT, "{weights:?}");
        let alone = memory.start(greedy_at(8), 8, 1);
        assert_eq!((alone.max(), alone.alpha.count), (8, ALPHA_PRIOR_WEIGHT));
    }

    #[test]
    fn under_load_one_session_of_a_new_kind_measures_drafting_and_the_rest_decode_plainly() {
        let memory = PolicyMemory::default();
        // Eight clients start at once at a load nothing was learnt at.
        let mut wave: Vec<AdaptiveGamma> = (0..8).map(|_| memory.start(greedy_at(8), 8, 8)).collect();
        let explorers: Vec<usize> = (0..8).filter(|&i| wave[i].max() > 0).collect();
        assert_eq!(explorers.len(), 1);
        let mut explorer = wave.remove(explorers[0]);
        assert_eq!(explorer.next_gamma(), START_GAMMA);
        // A session that runs alone measures whatever the others do.
        assert_eq!(memory.start(greedy_at(8), 8, 1).next_gamma(), START_GAMMA);
        // Once the explorer has measured, new sessions start from what it learnt: drafting
        // pays here, so they draft.
        play(&memory, greedy_at(8), &mut explorer, 20, |gamma| {
            let g = f64::from(gamma);
            report(gamma as usize, (0.8 * g).round() as usize, 0.8, g, 30.0, 0.3)
        });
        let next: Vec<AdaptiveGamma> = (0..8).map(|_| memory.start(greedy_at(8), 8, 8)).collect();
        assert!(next.iter().all(|p| p.max() == 8 && p.best_gamma() > 0), "{}", next[0].summary());
    }

    #[test]
    fn several_sessions_evidence_that_drafting_does_not_pay_is_trusted() {
        // α = 0.45 loses across a 5 ms link (γ = 2: 0.93×); 0.45 + 2 standard errors of 32
        // positions (0.63) would win, so only the amount of evidence stops the exploring.
        let link_5ms = |gamma: u32| {
            let g = f64::from(gamma);
            let overhead = if gamma == 0 { 0.5 } else { 5.5 };
            report(gamma as usize, (0.45 * g).round() as usize, 0.45, 1.7 * g, 11.0 + 0.3 * g, overhead)
        };
        let memory = PolicyMemory::default();
        let evidence = || memory.0.lock().unwrap().learnt.get(&greedy()).map_or(0, Learnt::alpha_evidence);
        while evidence() < CONFIDENT_POSITIONS {
            let mut session = memory.start(greedy(), 8, 1);
            play(&memory, greedy(), &mut session, 100, link_5ms);
        }
        let shared = memory.0.lock().unwrap().learnt[&greedy()].shared();
        assert!(shared.best_gamma() == 0 && shared.could_pay(CONFIDENT_POSITIONS), "{}", shared.summary());
        let explorers = (0..EXPLORE_EVERY).filter(|_| memory.start(greedy(), 8, 1).max() > 0).count();
        assert_eq!(explorers, 1);
    }

    #[test]
    fn load_levels_keep_their_own_periods() {
        let memory = PolicyMemory::default();
        assert_eq!(memory.load_mode(greedy_at(8)), LoadMode::Plain);
        for _ in 0..governor::PERIOD_ROUNDS {
            memory.record_loaded_round(greedy_at(8), LoadMode::Plain, 1, 20_000_000);
        }
        assert_eq!(memory.load_mode(greedy_at(8)), LoadMode::Adaptive);
        assert_eq!(memory.load_mode(greedy_at(4)), LoadMode::Plain);
        // Past REMEMBERED_SETTINGS levels the memory starts again.
        for i in 0..REMEMBERED_SETTINGS {
            memory.record_loaded_round(
                PolicyKey::of(&SamplingParams { temperature: i as f64, ..SamplingParams::default() }, 2),
                LoadMode::Plain,
                1,
                20_000_000,
            );
        }
        assert!(memory.0.lock().unwrap().loaded.len() <= REMEMBERED_SETTINGS);
        assert_eq!(memory.load_mode(greedy_at(8)), LoadMode::Plain);
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
    fn one_poor_prompt_does_not_switch_drafting_off_for_the_sessions_after_it() {
        let memory = PolicyMemory::default();
        // Sessions at α = 0.8 in a world where that pays (draft 8 ms, pass 40 ms)…
        for _ in 0..4 {
            let mut session = memory.start(greedy(), 8, 1);
            play(&memory, greedy(), &mut session, 40, |gamma| {
                let accepted = (0.8 * f64::from(gamma)).round() as usize;
                report(gamma as usize, accepted, 0.8, 8.0 * f64::from(gamma), 40.0, 0.3)
            });
        }
        assert!(memory.start(greedy(), 8, 1).best_gamma() > 0);
        // …then one whose prompt the draft gets wrong (α = 0.1): it stops drafting itself…
        let mut poor = memory.start(greedy(), 8, 1);
        play(&memory, greedy(), &mut poor, 60, |gamma| {
            report(gamma as usize, 0, 0.1, 8.0 * f64::from(gamma), 40.0, 0.3)
        });
        assert_eq!(poor.best_gamma(), 0, "{}", poor.summary());
        // …but the next session still starts drafting.
        let mut next = memory.start(greedy(), 8, 1);
        assert_eq!(next.max(), 8);
        assert!(next.next_gamma() > 0, "{}", next.summary());
    }

    #[test]
    fn sessions_that_may_not_draft_do_not_overwrite_what_an_explorer_learnt() {
        let memory = PolicyMemory::default();
        // Drafting does not pay (α = 0.05), confidently.
        let mut first = memory.start(greedy(), 8, 1);
        while first.own_positions < CONFIDENT_POSITIONS {
            run(&mut first, 64, 0.05, 20.0, 50.0, 0.0);
        }
        memory.remember(greedy(), &first, &[]);
        let mut starts: Vec<AdaptiveGamma> = (0..EXPLORE_EVERY).map(|_| memory.start(greedy(), 8, 1)).collect();
        let explorer = starts.iter().position(|p| p.max() == 8).expect("one explores");
        let mut explorer = starts.remove(explorer);
        // The draft has become cheap and good: the explorer learns it.
        play(&memory, greedy(), &mut explorer, 100, |gamma| {
            let accepted = (0.9 * f64::from(gamma)).round() as usize;
            report(gamma as usize, accepted, 0.9, f64::from(gamma), 50.0, 0.0)
        });
        assert!(explorer.best_gamma() > 0, "{}", explorer.summary());
        // A session without a draft finishes afterwards and remembers its target-only rounds.
        let mut plain = starts.pop().expect("a session that may not draft");
        assert_eq!(plain.max(), 0);
        run(&mut plain, 10, 0.0, 0.0, 50.0, 0.0);
        memory.remember(greedy(), &plain, &[]);
        let mut next = memory.start(greedy(), 8, 1);
        assert!(next.next_gamma() > 0, "the explorer's estimates were kept");
    }

    #[test]
    fn max_zero_never_drafts() {
        let mut policy = AdaptiveGamma::new(0);
        assert!(run(&mut policy, 20, 0.9, 1.0, 50.0, 0.0).iter().all(|g| *g == 0));
    }

    #[test]
    fn a_new_session_starts_from_what_earlier_sessions_learnt() {
        let memory = PolicyMemory::default();
        // A first session of its kind measures both sides: γ = START_GAMMA, then 0.
        let mut first = memory.start(greedy(), 8, 1);
        let chosen = run(&mut first, 2, 0.05, 20.0, 50.0, 0.0);
        assert_eq!(chosen, [START_GAMMA, 0]);
        // γ = 1 probes (the best drafting γ here), one position each: enough of them to trust
        // the estimate.
        for _ in 0..100 {
            if first.own_positions >= CONFIDENT_POSITIONS {
                break;
            }
            run(&mut first, 64, 0.05, 20.0, 50.0, 0.0);
        }
        memory.remember(greedy(), &first, &[]);
        assert!(first.own_positions >= CONFIDENT_POSITIONS);
        assert_eq!(first.best_gamma(), 0);
        // The next ones with the same settings do not draft at all, but one in EXPLORE_EVERY
        // starts from the same estimates and measures drafting again from its first round…
        let starts: Vec<AdaptiveGamma> = (0..2 * EXPLORE_EVERY).map(|_| memory.start(greedy(), 8, 1)).collect();
        let exploring: Vec<_> = starts.into_iter().filter(|p| p.max() == 8).collect();
        assert_eq!(exploring.len(), 2);
        for mut explorer in exploring {
            assert_eq!(explorer.next_gamma(), START_GAMMA);
        }
        let mut next = memory.start(greedy(), 8, 1);
        assert_eq!(next.max(), 0);
        assert_eq!(next.next_gamma(), 0);
        // …and others still start by measuring.
        assert_eq!(memory.start(t1(), 8, 1).next_gamma(), START_GAMMA);
        // A session that has measured nothing yet leaves the memory as it was.
        memory.remember(greedy(), &AdaptiveGamma::new(8), &[]);
        assert_eq!(memory.start(greedy(), 8, 1).next_gamma(), 0);
        // The memory keeps its own maximum per session.
        let mut capped = memory.start(greedy(), 0, 1);
        assert!(run(&mut capped, 20, 0.9, 1.0, 50.0, 0.0).iter().all(|g| *g == 0));
    }
}
