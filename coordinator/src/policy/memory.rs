//! What a coordinator's sessions learn from each other: per key (sampling settings and load
//! level), the latest costs, the population's α, the choices of the load governor and of
//! `model+ngram` copies, and `--tree auto`'s measurements.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use crate::policy::average::Average;
use crate::policy::choose::MEASURING_ROUNDS;
use crate::policy::copies::CopyChoice;
use crate::policy::governor::{LoadMode, LoadPeriods};
use crate::policy::key::PolicyKey;
use crate::policy::state::{ALPHA_PRIOR_WEIGHT, AdaptiveGamma, MS};
use crate::policy::trees::TreeTrial;

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
/// costs every session (docs/adaptive.md). The same holds before anything is learnt: under
/// load only one session in [`EXPLORE_EVERY`] of a key not learnt yet measures drafting.
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
    /// Per key, where the last `--tree auto` session left its measurements.
    trees: HashMap<PolicyKey, TreeTrial>,
}

/// One key's latest cost estimates, the acceptance of all its sessions, and how many
/// sessions started from them.
#[derive(Debug)]
struct Learnt {
    policy: AdaptiveGamma,
    /// α over every position of every session, slowly smoothed: a session's own α follows
    /// its prompt, and one poor prompt must not switch drafting off for everyone after it.
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
    /// are not independent, since the prompt sets the acceptance, so each session counts for
    /// at most [`SESSION_ALPHA_PRIOR_WEIGHT`] positions: one prompt's many poor positions must
    /// not be taken as certainty (docs/adaptive.md).
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

/// Distinct keys (sampling settings at a load level) remembered; past this the memory starts
/// again.
const REMEMBERED_SETTINGS: usize = 256;

/// Clears `map` when `key` would be one key past [`REMEMBERED_SETTINGS`]: the keys hold
/// clients' sampling settings, so nothing else bounds them.
fn make_room<V>(map: &mut HashMap<PolicyKey, V>, key: PolicyKey) {
    if !map.contains_key(&key) && map.len() >= REMEMBERED_SETTINGS {
        map.clear();
    }
}

/// While drafting does not pay, one session in this many still drafts (and probes): few enough
/// that under load the others' batches stay in step (docs/adaptive.md).
pub const EXPLORE_EVERY: u64 = 8;

/// Below this many independent positions behind the α estimate ([`Learnt::alpha_evidence`]:
/// at least 4 sessions' worth), "drafting does not pay" is not trusted and every new session
/// explores, unless drafting would not pay even with α two standard errors higher: one
/// prompt's acceptance can be far from the next one's.
pub const CONFIDENT_POSITIONS: u64 = 32;

impl PolicyMemory {
    /// The policy a new session with these settings starts with, `running` generations
    /// (this one included) running now.
    pub fn start(&self, key: PolicyKey, max: u32, running: usize) -> AdaptiveGamma {
        let mut memory = self.0.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        let Some(learnt) = memory.learnt.get_mut(&key) else {
            // A new load level starts with all its sessions at once, and all of them drafting
            // their first rounds would split each other's batches: one measures, the rest
            // decode plainly until it has.
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
            // positions decide: counted as more, the population's α would stop a good prompt
            // after its first round (docs/adaptive.md). Under load an explorer re-measures
            // the costs, and a prompt the draft knows well must not keep it drafting out of
            // step with the others.
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

    /// Where the last `--tree auto` session with these settings left its measurements of
    /// trees and chains (`policy/trees.rs`), for a new session to go on from: one session's
    /// rounds are too few to tell kinds a few percent apart. Fresh for settings not seen yet.
    pub fn tree_trial(&self, key: PolicyKey) -> TreeTrial {
        let memory = self.0.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        memory.trees.get(&key).cloned().unwrap_or_default()
    }

    /// Keeps a session's measurements of trees and chains for the sessions that start after it.
    pub fn remember_tree_trial(&self, key: PolicyKey, trial: &TreeTrial) {
        let mut memory = self.0.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        make_room(&mut memory.trees, key);
        memory.trees.insert(key, trial.clone());
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

/// How a session starts from what was learnt, and what of it a session hands back.
impl AdaptiveGamma {
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

    /// Takes `other`'s target-only costs, keeping everything else.
    fn refresh_target_only(&mut self, other: &AdaptiveGamma) {
        self.verify_plain_ms = other.verify_plain_ms;
        self.plain_overhead_ms = other.plain_overhead_ms;
    }
}

#[cfg(test)]
mod tests {
    use specd_sampling::SamplingParams;

    use super::*;
    use crate::policy::START_GAMMA;
    use crate::policy::copies::tests::run as run_copies;
    use crate::policy::governor;
    use crate::policy::observe::SteadyCosts;
    use crate::policy::observe::tests::{report, run};
    use crate::session::round_report::RoundReport;

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

    #[test]
    fn a_session_starts_from_where_the_last_one_with_its_settings_left_its_tree_trial() {
        let key = |temperature: f64| PolicyKey::of(&SamplingParams { temperature, ..SamplingParams::default() }, 1);
        let memory = PolicyMemory::default();
        let mut first = memory.tree_trial(key(0.8));
        crate::policy::trees::tests::measure(&mut first, 3, 14.0, 40);
        memory.remember_tree_trial(key(0.8), &first);
        // The next session with these settings drafts a chain after a chain (trees lost),
        // where a fresh one alternates the two kinds first…
        let mut next = memory.tree_trial(key(0.8));
        assert_eq!(next.drafted(), 40);
        crate::policy::trees::tests::measure(&mut next, 3, 14.0, 1);
        assert!(!next.wants_tree());
        // …and other settings learn for themselves.
        let fresh = memory.tree_trial(key(0.0));
        assert_eq!(fresh.drafted(), 0);
    }

    #[test]
    fn a_session_starts_from_where_the_last_one_with_its_settings_left_its_copies() {
        let key = |temperature: f64| PolicyKey::of(&SamplingParams { temperature, ..SamplingParams::default() }, 1);
        let memory = PolicyMemory::default();
        let mut first = memory.copy_choice(key(0.8));
        run_copies(&mut first, 40, 0.05, 0.7);
        memory.remember_copies(key(0.8), &first);
        // The next session with these settings asks for its model's draws from its first
        // request (the probe's wait goes on where the last one stopped)…
        let mut next = memory.copy_choice(key(0.8));
        let allowed = run_copies(&mut next, 8, 0.05, 0.7);
        assert!(allowed.iter().filter(|a| **a).count() <= 1, "{allowed:?}");
        assert!(!allowed[0], "{allowed:?}");
        // …and other settings learn for themselves.
        let mut greedy = memory.copy_choice(key(0.0));
        assert!(run_copies(&mut greedy, 8, 0.05, 0.7).iter().all(|a| *a));
    }
}
