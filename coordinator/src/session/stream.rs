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
/// `completion_tokens` generated (the target's prefix cache held `stats.target_cached_tokens`
/// of the prompt).
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
        usage: Some(Usage {
            prompt_tokens: prompt_tokens as u32,
            completion_tokens: completion_tokens as u32,
            cached_prompt_tokens: stats.target_cached_tokens,
        }),
        stats: Some(stats),
        ..Default::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use specd_proto::v1::OutputLogprob;

    #[test]
    fn a_round_s_message_carries_what_it_committed_and_no_finish() {
        let stats = SpeculationStats { rounds: 3, ..Default::default() };
        let logprobs = vec![OutputLogprob { logprob: -0.5, top: Vec::new() }];
        let committed = Committed {
            token_ids: vec![4, 5],
            text: "ab".into(),
            logprobs: logprobs.clone(),
            finish: Some(FinishReason::Eos),
        };
        let message = round_message("r", committed, stats.clone());
        let expected = GenerateResponse {
            request_id: "r".into(),
            token_ids: vec![4, 5],
            text: "ab".into(),
            logprobs,
            stats: Some(stats),
            ..Default::default()
        };
        assert_eq!(message, expected);
        assert_eq!(message.finish_reason, FinishReason::Unspecified as i32);
        assert_eq!(message.usage, None);
    }

    #[test]
    fn the_last_message_carries_the_finish_reason_and_the_usage_and_no_tokens() {
        let stats = SpeculationStats { rounds: 3, ..Default::default() };
        let message = last_message("r", FinishReason::Length, 7, 16, stats.clone());
        assert_eq!(message.finish_reason, FinishReason::Length as i32);
        assert_eq!(message.usage, Some(Usage { prompt_tokens: 7, completion_tokens: 16, cached_prompt_tokens: 0 }));
        assert_eq!(message.stats, Some(stats));
        assert!(message.token_ids.is_empty() && message.text.is_empty() && message.logprobs.is_empty());
    }
}
