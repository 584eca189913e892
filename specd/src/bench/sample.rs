//! One request of `specd bench`: its tokens and wall time, the coordinator's stats, and the
//! same for its first round alone, read off the stream of rounds.
//!
//! A request's first round also runs the prompt through the models (and waits for the
//! nodes' sessions to open), a cost that speculation does not shorten and that the analytic
//! bound leaves out. Totals after the first round, up to the last tokens, are the decoding
//! rate the bound is about.

use std::time::{Duration, Instant};

use specd_proto::v1::generation_client::GenerationClient;
use specd_proto::v1::{GenerateRequest, SpeculationStats};
use tokio_stream::StreamExt;
use tonic::transport::Channel;

use crate::cli_error::RpcFailure;

/// One request's outcome.
#[derive(Debug, Default, Clone)]
pub(crate) struct Sample {
    pub(crate) tokens: u64,
    /// From the request to its last reply.
    pub(crate) wall: Duration,
    pub(crate) stats: SpeculationStats,
    pub(crate) token_ids: Vec<u32>,
    /// The output as text, where the request's prompt was text.
    pub(crate) text: String,
    /// The prompt's tokens, as the coordinator counted them.
    pub(crate) prompt_tokens: u64,
    /// From the request to its last tokens, before its last reply (finish reason, usage).
    pub(crate) to_last_tokens: Duration,
    /// Its first round: the tokens it streamed, the time they took from the request, and the
    /// stats as they stood then.
    pub(crate) first_round: Option<Box<Sample>>,
}

impl Sample {
    /// Everything after the first round: tokens, time and the stats that add up per round.
    /// A request of one round has nothing after it.
    pub(crate) fn after_first_round(&self) -> Sample {
        let Some(first) = &self.first_round else { return Sample::default() };
        let (s, f) = (&self.stats, &first.stats);
        let stats = SpeculationStats {
            rounds: s.rounds.saturating_sub(f.rounds),
            draft_tokens: s.draft_tokens.saturating_sub(f.draft_tokens),
            accepted_tokens: s.accepted_tokens.saturating_sub(f.accepted_tokens),
            draft_ns: s.draft_ns.saturating_sub(f.draft_ns),
            verify_ns: s.verify_ns.saturating_sub(f.verify_ns),
            round_wall_ns: s.round_wall_ns.saturating_sub(f.round_wall_ns),
            acceptance_sum: (s.acceptance_sum - f.acceptance_sum).max(0.0),
            evaluated_positions: s.evaluated_positions.saturating_sub(f.evaluated_positions),
            drafted_rounds: s.drafted_rounds.saturating_sub(f.drafted_rounds),
            expected_accepted_token: (s.expected_accepted_token - f.expected_accepted_token).max(0.0),
            expected_accepted_block: (s.expected_accepted_block - f.expected_accepted_block).max(0.0),
            verification: s.verification.clone(),
            ..SpeculationStats::default()
        };
        Sample {
            tokens: self.tokens.saturating_sub(first.tokens),
            wall: self.to_last_tokens.saturating_sub(first.wall),
            stats,
            token_ids: self.token_ids.get(first.token_ids.len()..).unwrap_or_default().to_vec(),
            to_last_tokens: self.to_last_tokens.saturating_sub(first.wall),
            ..Sample::default()
        }
    }
}

/// Runs one request, streamed so that its first round is seen on its own.
pub(crate) async fn run_one(
    client: &mut GenerationClient<Channel>,
    request: tonic::Request<GenerateRequest>,
) -> anyhow::Result<Sample> {
    let started = Instant::now();
    let mut stream = client.generate_stream(request).await.map_err(RpcFailure)?.into_inner();
    let (mut token_ids, mut stats, mut usage, mut first_round) = (Vec::new(), None, None, None);
    let mut text = String::new();
    let (mut to_last_tokens, mut answered) = (Duration::ZERO, None);
    while let Some(message) = stream.next().await {
        let message = message.map_err(RpcFailure)?;
        if !message.token_ids.is_empty() {
            to_last_tokens = started.elapsed();
        }
        // The last reply (finish reason and usage) is the request's end for its client; the
        // stream closes after the nodes' sessions are released.
        if message.usage.is_some() {
            answered = Some(started.elapsed());
        }
        token_ids.extend_from_slice(&message.token_ids);
        text.push_str(&message.text);
        stats = message.stats.or(stats);
        usage = message.usage.or(usage);
        if first_round.is_none() && !message.token_ids.is_empty() {
            first_round = Some(Box::new(Sample {
                tokens: message.token_ids.len() as u64,
                wall: to_last_tokens,
                stats: stats.clone().unwrap_or_default(),
                token_ids: message.token_ids,
                to_last_tokens,
                ..Sample::default()
            }));
        }
    }
    let wall = answered.unwrap_or_else(|| started.elapsed());
    let tokens = usage.map_or(token_ids.len() as u64, |u| u64::from(u.completion_tokens));
    let prompt_tokens = usage.map_or(0, |u| u64::from(u.prompt_tokens));
    let stats = stats.unwrap_or_default();
    Ok(Sample { tokens, wall, stats, token_ids, text, prompt_tokens, to_last_tokens, first_round })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn after_the_first_round_is_the_rest_of_the_request() {
        let stats = |rounds, verify_ms: u64, acceptance_sum: f64| SpeculationStats {
            rounds,
            verify_ns: verify_ms * 1_000_000,
            acceptance_sum,
            drafted_rounds: rounds,
            expected_accepted_token: acceptance_sum,
            expected_accepted_block: 2.0 * acceptance_sum,
            verification: "block".into(),
            ..SpeculationStats::default()
        };
        let first = Sample {
            tokens: 3,
            wall: Duration::from_millis(40),
            stats: stats(1, 30, 2.0),
            token_ids: vec![1, 2, 3],
            to_last_tokens: Duration::from_millis(40),
            ..Sample::default()
        };
        let whole = Sample {
            tokens: 10,
            wall: Duration::from_millis(110),
            stats: stats(4, 75, 5.5),
            token_ids: (1..=10).collect(),
            to_last_tokens: Duration::from_millis(100),
            first_round: Some(Box::new(first)),
            ..Sample::default()
        };
        // The 10 ms after the last tokens are the generation's end, not decoding.
        let rest = whole.after_first_round();
        assert_eq!((rest.tokens, rest.wall, rest.token_ids), (7, Duration::from_millis(60), (4..=10).collect()));
        assert_eq!((rest.stats.rounds, rest.stats.verify_ns, rest.stats.acceptance_sum), (3, 45_000_000, 3.5));
        let s = &rest.stats;
        assert_eq!((s.drafted_rounds, s.expected_accepted_token, s.expected_accepted_block), (3, 3.5, 7.0));
        assert_eq!(s.verification, "block");
        let one_round = Sample { first_round: None, ..whole };
        assert_eq!(one_round.after_first_round().tokens, 0);
    }
}
