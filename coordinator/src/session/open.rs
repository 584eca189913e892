//! What a generation asks the nodes for as it starts: the sessions it opens on the target
//! and the draft, and how long its first round waits for the draft's to open.

use std::time::Duration;

use specd_proto::v1::{OpenSessionRequest, SamplingSettings};

use crate::policy::AdaptiveGamma;
use crate::request::GenerationSpec;
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
            // token asked for, and the largest block a round verifies past them.
            max_tokens: u32::try_from(spec.prompt.len() + spec.max_new_tokens + spec.gamma.max() as usize + 1)
                .unwrap_or(u32::MAX),
        };
        // Drafting ahead (optimistic drafting), the draft runs up to PUSH_DEPTH blocks of γ + 1
        // past the round's: it reserves for those too.
        let ahead = if spec.optimistic { PUSH_DEPTH * (spec.gamma.max() + 1) } else { 0 };
        let draft = OpenSessionRequest { max_tokens: target.max_tokens.saturating_add(ahead), ..target.clone() };
        Self { target, draft }
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
