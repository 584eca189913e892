//! What the client is sent: a message for each round, with the tokens and text it committed
//! and the stats so far, and a last one with the finish reason and the usage.

use specd_proto::v1::{FinishReason, GenerateResponse, SpeculationStats, Usage};

use crate::session::commit::Committed;

/// The message of a round that committed `committed`.
pub fn round_message(request_id: &str, committed: Committed, stats: SpeculationStats) -> GenerateResponse {
    GenerateResponse {
        request_id: request_id.to_owned(),
        text: committed.text,
        token_ids: committed.token_ids,
        stats: Some(stats),
        logprobs: committed.logprobs,
        ..Default::default()
    }
}

/// The last message of a generation that ended for `finish`, of a `prompt_tokens` prompt and
/// `completion_tokens` generated.
pub fn last_message(
    request_id: &str,
    finish: FinishReason,
    prompt_tokens: usize,
    completion_tokens: usize,
    stats: SpeculationStats,
) -> GenerateResponse {
    GenerateResponse {
        request_id: request_id.to_owned(),
        finish_reason: finish as i32,
        usage: Some(Usage { prompt_tokens: prompt_tokens as u32, completion_tokens: completion_tokens as u32 }),
        stats: Some(stats),
        ..Default::default()
    }
}
