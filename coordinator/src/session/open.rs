//! What a generation asks the nodes for as it starts: the sessions it opens on the target
//! and the draft, and how long its first round waits for the draft's to open.

use std::time::Duration;

use specd_proto::v1::{OpenSessionRequest, SamplingSettings};

use crate::policy::AdaptiveGamma;
use crate::request::{GenerationSpec, TreeSetting};
use crate::session::propose::PUSH_DEPTH;

/// The open requests of a generation's sessions.
#[derive(Debug, Clone, PartialEq)]
pub struct OpenRequests {
    pub target: OpenSessionRequest,
    pub draft: OpenSessionRequest,
}

impl OpenRequests {
    /// The sessions `spec` needs, as session `session_id` of a model of `vocab_size` tokens.
    pub fn of(spec: &GenerationSpec, session_id: &str, vocab_size: usize) -> Self {
        let target = OpenSessionRequest {
            session_id: session_id.to_owned(),
            prompt_token_ids: spec.prompt.clone(),
            sampling: Some(SamplingSettings::from(&spec.params)),
            seed: spec.seed,
            vocab_limit: vocab_size as u32,
            // What the session can reach, for the nodes' KV reservation: the prompt, every
            // token asked for, and the largest block a round verifies past them (a tree's
            // every node: the target holds them all until the next round).
            max_tokens: u32::try_from(spec.prompt.len() + spec.max_new_tokens + largest_block(spec) + 1)
                .unwrap_or(u32::MAX),
            prompt_len: 0,
            cache_salt: spec.cache_salt.clone(),
            constraint: spec.constraint.as_ref().map(|c| c.wire.clone()),
        };
        // Drafting ahead (optimistic drafting), the draft runs up to PUSH_DEPTH blocks of γ + 1
        // past the round's: it reserves for those too.
        let ahead = if spec.optimistic { PUSH_DEPTH * (spec.gamma.max() + 1) } else { 0 };
        let draft = OpenSessionRequest { max_tokens: target.max_tokens.saturating_add(ahead), ..target.clone() };
        Self { target, draft }
    }
}

/// The most candidates one round verifies: γ's bound, or a tree's every node.
fn largest_block(spec: &GenerationSpec) -> usize {
    let chain = spec.gamma.max() as usize;
    match &spec.tree {
        TreeSetting::Off => chain,
        TreeSetting::Shape(tree) => tree.candidates().max(chain),
        TreeSetting::Auto => crate::policy::trees::auto_shape(spec.gamma.max()).map_or(chain, |t| t.candidates()),
    }
}

/// How long the first round waits for the draft's session to open (`None`: until it is open
/// or has failed). A fixed γ asked for every round to draft; the adaptive `policy` weighs
/// waiting, and a load level whose sessions decode plainly (`governed_plain`) has nothing to
/// wait for.
pub fn draft_open_grace(policy: Option<&AdaptiveGamma>, governed_plain: bool) -> Option<Duration> {
    match policy {
        Some(_) if governed_plain => Some(Duration::ZERO),
        Some(policy) => policy.draft_open_grace(),
        None => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::request::{GammaChoice, RuleVariant, Wire};
    use specd_sampling::SamplingParams;

    fn spec(gamma: GammaChoice, optimistic: bool) -> GenerationSpec {
        GenerationSpec {
            request_id: "r".into(),
            prompt: vec![1, 2, 3],
            params: SamplingParams::default(),
            seed: 7,
            max_new_tokens: 10,
            stop_token_ids: Vec::new(),
            stop_strings: Vec::new(),
            eos_token_ids: Vec::new(),
            gamma,
            wire: Wire::Dense,
            rule: RuleVariant::Exact,
            verification: specd_sampling::Verification::Block,
            optimistic,
            tree: TreeSetting::Off,
            detokenize: false,
            logprobs: None,
            cache_salt: "tenant".into(),
            constraint: None,
        }
    }

    #[test]
    fn the_nodes_reserve_for_the_prompt_every_token_asked_for_and_the_blocks_past_them() {
        let requests = OpenRequests::of(&spec(GammaChoice::Fixed(4), false), "s", 100);
        assert_eq!(requests.target.session_id, "s");
        assert_eq!(requests.target.prompt_token_ids, [1, 2, 3]);
        assert_eq!((requests.target.seed, requests.target.vocab_limit), (7, 100));
        assert_eq!((requests.target.cache_salt.as_str(), requests.draft.cache_salt.as_str()), ("tenant", "tenant"));
        // 3 prompt tokens, 10 asked for, a block of γ = 4 and its bonus token.
        assert_eq!(requests.target.max_tokens, 18);
        assert_eq!(requests.draft, requests.target);
        // Drafting ahead, the draft also holds the blocks it pushes: PUSH_DEPTH of γ + 1.
        let ahead = OpenRequests::of(&spec(GammaChoice::Adaptive { max: 4 }, true), "s", 100);
        assert_eq!(ahead.target.max_tokens, 18);
        assert_eq!(ahead.draft.max_tokens, 18 + PUSH_DEPTH * 5);
        assert_eq!(OpenSessionRequest { max_tokens: 18, ..ahead.draft }, ahead.target);
    }

    #[test]
    fn a_fixed_gamma_waits_for_its_draft_and_a_plain_load_level_does_not() {
        assert_eq!(draft_open_grace(None, false), None);
        assert_eq!(draft_open_grace(None, true), None);
        let policy = AdaptiveGamma::new(4);
        assert_eq!(draft_open_grace(Some(&policy), true), Some(Duration::ZERO));
        // Alone, the adaptive policy decides; with nothing measured it waits until open.
        assert_eq!(draft_open_grace(Some(&policy), false), policy.draft_open_grace());
        assert_eq!(draft_open_grace(Some(&policy), false), None);
    }
}
