//! `specd generate`: a client of the public Generation API.

use std::io::Write;

use clap::Args;
use serde_json::json;
use specd_proto::v1::{FinishReason, GenerateRequest, GenerateResponse, SamplingParams, Speculation, StoppingCriteria};
use tokio_stream::StreamExt;

use crate::cli_error::{RpcFailure, invalid};
use crate::client_args::ClientArgs;
use crate::constraint_args::ConstraintFlags;

/// Generate text from a running coordinator (`specd up` or `specd coordinator`).
///
/// Example:
///   specd generate --endpoint http://127.0.0.1:50051 --token-ids 1,2,3 --max-new-tokens 32 --stream
#[derive(Debug, Args)]
#[command(verbatim_doc_comment, allow_negative_numbers = true)]
pub struct GenerateArgs {
    #[command(flatten)]
    client: ClientArgs,
    /// Tokens to generate at most (default: the coordinator's).
    #[arg(long, env = "SPECD_GENERATE_MAX_NEW_TOKENS")]
    max_new_tokens: Option<u32>,
    #[command(flatten)]
    sampling: SamplingFlags,
    /// Makes the output reproducible.
    #[arg(long, env = "SPECD_SEED")]
    seed: Option<u64>,
    /// Draft length (0: target-only); default: the coordinator's policy.
    #[arg(long, env = "SPECD_GENERATE_GAMMA")]
    gamma: Option<u32>,
    /// Use the dense reference wire format.
    #[arg(long, env = "SPECD_DENSE")]
    dense: bool,
    /// Stop after any of these token ids, comma-separated.
    #[arg(long, env = "SPECD_STOP_TOKEN_IDS", value_delimiter = ',')]
    stop_token_ids: Vec<u32>,
    /// Keep generating past the model's EOS.
    #[arg(long, env = "SPECD_IGNORE_EOS")]
    ignore_eos: bool,
    /// Print tokens as they arrive.
    #[arg(long, env = "SPECD_STREAM")]
    stream: bool,
    /// Print the final response as one JSON object.
    #[arg(long, env = "SPECD_JSON")]
    json: bool,
    #[command(flatten)]
    constraint: ConstraintFlags,
}

/// The sampling settings of a request, as flags.
#[derive(Debug, Clone, Args)]
pub struct SamplingFlags {
    /// 0 is greedy.
    #[arg(long, env = "SPECD_TEMPERATURE")]
    temperature: Option<f64>,
    /// Keep the k most likely tokens; 0 disables.
    #[arg(long, env = "SPECD_TOP_K")]
    top_k: Option<i32>,
    /// Keep the smallest most-likely set holding this mass; 1 disables.
    #[arg(long, env = "SPECD_TOP_P")]
    top_p: Option<f64>,
    /// Drop tokens below this fraction of the most likely one; 0 disables.
    #[arg(long, env = "SPECD_MIN_P")]
    min_p: Option<f64>,
    #[arg(long, env = "SPECD_REPETITION_PENALTY")]
    repetition_penalty: Option<f64>,
    #[arg(long, env = "SPECD_PRESENCE_PENALTY")]
    presence_penalty: Option<f64>,
    #[arg(long, env = "SPECD_FREQUENCY_PENALTY")]
    frequency_penalty: Option<f64>,
}

impl SamplingFlags {
    pub fn to_wire(&self, seed: Option<u64>) -> SamplingParams {
        SamplingParams {
            temperature: self.temperature,
            top_k: self.top_k,
            top_p: self.top_p,
            min_p: self.min_p,
            repetition_penalty: self.repetition_penalty,
            presence_penalty: self.presence_penalty,
            frequency_penalty: self.frequency_penalty,
            seed,
        }
    }
}

impl GenerateArgs {
    fn request(&self) -> GenerateRequest {
        GenerateRequest {
            request_id: String::new(),
            prompt: Some(self.client.prompt()),
            sampling: Some(self.sampling.to_wire(self.seed)),
            stopping: Some(StoppingCriteria {
                max_new_tokens: self.max_new_tokens,
                stop_strings: Vec::new(),
                stop_token_ids: self.stop_token_ids.clone(),
                ignore_eos: self.ignore_eos,
            }),
            speculation: Some(Speculation { gamma: self.gamma, dense: self.dense }),
            logprobs: None,
            cache_salt: String::new(),
            constraint: self.constraint.to_wire(),
        }
    }
}

pub fn run(args: &GenerateArgs) -> anyhow::Result<()> {
    if args.client.token_ids.as_ref().is_some_and(Vec::is_empty) {
        return Err(invalid("--token-ids is empty"));
    }
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
    runtime.block_on(async {
        let mut client = args.client.connect().await?;
        let request = args.client.request(args.request())?;
        let mut stream = client.generate_stream(request).await.map_err(RpcFailure)?.into_inner();
        let mut all = GenerateResponse::default();
        let mut stdout = std::io::stdout();
        while let Some(message) = stream.next().await {
            let message = message.map_err(RpcFailure)?;
            if args.stream && !args.json {
                if message.text.is_empty() {
                    for t in &message.token_ids {
                        write!(stdout, "{t} ")?;
                    }
                } else {
                    write!(stdout, "{}", message.text)?;
                }
                stdout.flush()?;
            }
            all.token_ids.extend(&message.token_ids);
            all.text.push_str(&message.text);
            all.request_id = message.request_id;
            all.finish_reason = message.finish_reason;
            all.usage = message.usage.or(all.usage);
            all.stats = message.stats.or(all.stats);
        }
        Ok(print_result(args, &all)?)
    })
}

fn finish_name(code: i32) -> &'static str {
    match FinishReason::try_from(code).unwrap_or(FinishReason::Unspecified) {
        FinishReason::Length => "length",
        FinishReason::Eos => "eos",
        FinishReason::Stop => "stop",
        FinishReason::Cancelled => "cancelled",
        FinishReason::Unspecified => "unspecified",
    }
}

fn print_result(args: &GenerateArgs, r: &GenerateResponse) -> std::io::Result<()> {
    let stats = r.stats.clone().unwrap_or_default();
    let usage = r.usage.unwrap_or_default();
    if args.json {
        let out = json!({
            "request_id": r.request_id,
            "token_ids": r.token_ids,
            "text": r.text,
            "finish_reason": finish_name(r.finish_reason),
            "usage": {"prompt_tokens": usage.prompt_tokens, "completion_tokens": usage.completion_tokens},
            "stats": {
                "rounds": stats.rounds,
                "draft_tokens": stats.draft_tokens,
                "accepted_tokens": stats.accepted_tokens,
                "accepted_per_position": stats.accepted_per_position,
                "gamma": stats.gamma,
                "draft_ns": stats.draft_ns,
                "verify_ns": stats.verify_ns,
                "round_wall_ns": stats.round_wall_ns,
                "wire_bytes_sent": stats.wire_bytes_sent,
                "wire_bytes_received": stats.wire_bytes_received,
                "wire_bytes_sent_to_draft": stats.wire_bytes_sent_to_draft,
                "wire_bytes_received_from_draft": stats.wire_bytes_received_from_draft,
                "wire_bytes_sent_to_target": stats.wire_bytes_sent_to_target,
                "wire_bytes_received_from_target": stats.wire_bytes_received_from_target,
                "draft_fallbacks": stats.draft_fallbacks,
                "target_failovers": stats.target_failovers,
                "acceptance_sum": stats.acceptance_sum,
                "evaluated_positions": stats.evaluated_positions,
                "optimistic_attempts": stats.optimistic_attempts,
                "optimistic_hits": stats.optimistic_hits,
                "optimistic_pushed": stats.optimistic_pushed,
            },
        });
        outln!("{out}");
        return Ok(());
    }
    if args.stream {
        outln!();
    } else if r.text.is_empty() {
        let ids: Vec<String> = r.token_ids.iter().map(u32::to_string).collect();
        outln!("{}", ids.join(" "));
    } else {
        outln!("{}", r.text);
    }
    let rate = if stats.draft_tokens > 0 { stats.accepted_tokens as f64 / stats.draft_tokens as f64 } else { 0.0 };
    let per_round = if stats.rounds > 0 { usage.completion_tokens as f64 / stats.rounds as f64 } else { 0.0 };
    let alpha = if stats.evaluated_positions > 0 {
        format!("; α = {:.3}", stats.acceptance_sum / stats.evaluated_positions as f64)
    } else {
        String::new()
    };
    eprintln!(
        "finish: {}; {} tokens in {} rounds ({per_round:.2} per round); accepted {}/{} drafted ({:.1}%){alpha}",
        finish_name(r.finish_reason),
        usage.completion_tokens,
        stats.rounds,
        stats.accepted_tokens,
        stats.draft_tokens,
        100.0 * rate
    );
    Ok(())
}
