//! What a session decides before each round: its γ, whether the governor runs the load
//! level's sessions plainly, and whether the round is its adaptive policy's to learn from.

use crate::policy::governor::LoadMode;
use crate::policy::key::PolicyKey;
use crate::policy::{AdaptiveGamma, SteadyCosts};
use crate::request::GammaChoice;

/// The plan of one round, made before it runs.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RoundPlan {
    /// How many candidates to ask the draft for (0: target-only).
    pub gamma: u32,
    /// The policy key of the load level the session runs at now.
    pub level: PolicyKey,
    /// The mode the governor set for that level, where it decides (`None`: the session runs
    /// alone, or its γ is fixed).
    pub load_mode: Option<LoadMode>,
    /// The round would have drafted, but the draft's session is still being opened: it runs
    /// target-only.
    pub awaiting_draft: bool,
    /// The draft is sure to propose nothing (an n-gram draft and no match), so it is not
    /// asked: the round runs target-only, an empty proposal without the round trip.
    pub nothing_to_propose: bool,
    /// Which nodes' times in this round are a round's cost.
    pub steady: SteadyCosts,
}

impl RoundPlan {
    /// The governor runs the load level's sessions target-only.
    pub fn governed_plain(&self) -> bool {
        self.load_mode == Some(LoadMode::Plain)
    }

    /// Whether the session's adaptive policy learns from this round. A round the governor
    /// makes plain is not the policy's: the policy neither advances (an explorer keeps its
    /// measuring rounds for a period that drafts) nor learns from it; nor is a round that
    /// waited for the draft's session to open, nor one whose γ the draft could not fill.
    pub fn policy_owns(&self) -> bool {
        !self.governed_plain() && !self.awaiting_draft && !self.nothing_to_propose
    }

    /// The load level and mode whose period this round counts in, once it ran with a target
    /// pass that did not fill the cache (`refilled` false). A round that filled the cache
    /// costs the prompt's pass, whichever mode the level is in: counted, it would make the
    /// mode measured first (the period the sessions start in) look slower than it is. Rounds
    /// that waited for a draft session to open count: that wait is what drafting costs a
    /// period's sessions.
    pub fn loaded_round(&self, refilled: bool) -> Option<(PolicyKey, LoadMode)> {
        self.load_mode.filter(|_| !refilled).map(|mode| (self.level, mode))
    }
}

/// The γ the session wants for its next round: none where the governor runs the level plainly
/// (the policy is not asked, so it does not advance), the adaptive `policy`'s choice, or the
/// fixed γ.
pub fn wanted_gamma(policy: Option<&mut AdaptiveGamma>, choice: GammaChoice, governed_plain: bool) -> u32 {
    match (policy, choice) {
        _ if governed_plain => 0,
        (Some(policy), _) => policy.next_gamma(),
        (None, gamma) => gamma.max(),
    }
}

/// The round's γ: a round commits up to γ + 1 tokens, so it never drafts past the `remaining`
/// tokens still wanted.
pub fn round_gamma(wanted: u32, remaining: usize) -> u32 {
    wanted.min(remaining.saturating_sub(1) as u32)
}

#[cfg(test)]
mod tests {
    use super::*;
    use specd_sampling::SamplingParams;

    fn plan(load_mode: Option<LoadMode>) -> RoundPlan {
        RoundPlan {
            gamma: 4,
            level: PolicyKey::of(&SamplingParams::default(), 2),
            load_mode,
            awaiting_draft: false,
            nothing_to_propose: false,
            steady: SteadyCosts { target: true, draft: true },
        }
    }

    #[test]
    fn a_round_never_drafts_past_the_tokens_still_wanted() {
        assert_eq!(round_gamma(4, 10), 4);
        assert_eq!(round_gamma(4, 5), 4);
        assert_eq!(round_gamma(4, 3), 2);
        // The last token wanted comes from a target-only round.
        assert_eq!(round_gamma(4, 1), 0);
        assert_eq!(round_gamma(4, 0), 0);
    }

    #[test]
    fn a_fixed_gamma_is_wanted_every_round_unless_the_governor_runs_the_level_plainly() {
        assert_eq!(wanted_gamma(None, GammaChoice::Fixed(3), false), 3);
        assert_eq!(wanted_gamma(None, GammaChoice::Fixed(0), false), 0);
        assert_eq!(wanted_gamma(None, GammaChoice::Fixed(3), true), 0);
        let mut policy = AdaptiveGamma::new(4);
        assert_eq!(wanted_gamma(Some(&mut policy), GammaChoice::Adaptive { max: 4 }, true), 0);
        let mut asked = AdaptiveGamma::new(4);
        let wanted = wanted_gamma(Some(&mut asked), GammaChoice::Adaptive { max: 4 }, false);
        assert_eq!(wanted, AdaptiveGamma::new(4).next_gamma());
        assert!(wanted <= 4);
    }

    #[test]
    fn the_policy_learns_only_from_rounds_it_chose() {
        assert!(plan(None).policy_owns());
        assert!(plan(Some(LoadMode::Adaptive)).policy_owns());
        assert!(!plan(Some(LoadMode::Plain)).policy_owns());
        assert!(!RoundPlan { awaiting_draft: true, ..plan(None) }.policy_owns());
        assert!(!RoundPlan { nothing_to_propose: true, ..plan(None) }.policy_owns());
    }

    #[test]
    fn a_load_level_s_period_counts_the_rounds_the_governor_decides_once_the_cache_is_filled() {
        let governed = plan(Some(LoadMode::Plain));
        assert_eq!(governed.loaded_round(false), Some((governed.level, LoadMode::Plain)));
        assert_eq!(governed.loaded_round(true), None);
        assert_eq!(plan(None).loaded_round(false), None);
        // A round that waited for the draft counts.
        let waited = RoundPlan { awaiting_draft: true, ..plan(Some(LoadMode::Adaptive)) };
        assert_eq!(waited.loaded_round(false), Some((waited.level, LoadMode::Adaptive)));
    }
}
