//! `specd audit`: a statistical check, against a running cluster, that speculative decoding
//! samples the target's law.

use std::collections::HashMap;

use clap::Args;
use serde_json::json;
use specd_proto::v1::generate_request::Prompt;
use specd_proto::v1::generation_client::GenerationClient;
use specd_proto::v1::{GenerateRequest, Speculation, StoppingCriteria, TokenIds};
use specd_sampling::chi2::two_sample_chi_square;
use tokio_stream::StreamExt;
use tonic::transport::Channel;

use crate::cli_error::{RpcFailure, invalid};
use crate::generate::SamplingFlags;

/// Check that speculation leaves the output law unchanged.
///
/// Draws N continuations of K tokens with speculation on (seeds 0..N) and N with target-only
/// decoding (γ = 0, seeds N..2N) from the same coordinator and prompt, and tests with a
/// two-sample χ² (cells with fewer than 5 expected draws pooled) that both come from one law.
/// A correct cluster fails with probability --alpha.
///
/// Example:
///   specd audit --endpoint http://127.0.0.1:50051 --token-ids 1,2 --tokens 3 --samples 20000
#[derive(Debug, Args)]
#[command(verbatim_doc_comment, allow_negative_numbers = true)]
pub struct AuditArgs {
    #[arg(long, env = "SPECD_ENDPOINT", default_value = "http://127.0.0.1:50051")]
    endpoint: String,
    /// The prompt as text.
    #[arg(long, env = "SPECD_PROMPT", conflicts_with = "token_ids", required_unless_present = "token_ids")]
    prompt: Option<String>,
    /// The prompt as token ids, comma-separated.
    #[arg(long, env = "SPECD_TOKEN_IDS", value_delimiter = ',')]
    token_ids: Option<Vec<u32>>,
    /// Tokens per continuation (K); cells are the distinct K-token continuations.
    #[arg(long, env = "SPECD_AUDIT_TOKENS", default_value_t = 3)]
    tokens: u32,
    /// Continuations per arm (N).
    #[arg(long, env = "SPECD_AUDIT_SAMPLES", default_value_t = 20_000)]
    samples: u64,
    /// Draft length of the speculative arm (default: the coordinator's policy).
    #[arg(long, env = "SPECD_GAMMA")]
    gamma: Option<u32>,
    /// Use the dense reference wire format in the speculative arm.
    #[arg(long, env = "SPECD_DENSE")]
    dense: bool,
    /// Error rate: the verdict is "fail" when the p-value is below it.
    #[arg(long, env = "SPECD_AUDIT_ALPHA", default_value_t = 1e-3)]
    alpha: f64,
    /// Requests in flight at once.
    #[arg(long, env = "SPECD_AUDIT_CONCURRENCY", default_value_t = 8)]
    concurrency: u64,
    #[command(flatten)]
    sampling: SamplingFlags,
    /// Print one JSON object.
    #[arg(long, env = "SPECD_JSON")]
    json: bool,
}

impl AuditArgs {
    fn request(&self, seed: u64, gamma: Option<u32>, dense: bool) -> GenerateRequest {
        let prompt = match (&self.prompt, &self.token_ids) {
            (Some(text), _) => Prompt::Text(text.clone()),
            (None, ids) => Prompt::TokenIds(TokenIds { ids: ids.clone().unwrap_or_default() }),
        };
        GenerateRequest {
            request_id: format!("audit-{seed}"),
            prompt: Some(prompt),
            sampling: Some(self.sampling.to_wire(Some(seed))),
            stopping: Some(StoppingCriteria {
                max_new_tokens: Some(self.tokens),
                ignore_eos: true,
                ..Default::default()
            }),
            speculation: Some(Speculation { gamma, dense }),
        }
    }
}

/// Counts of each continuation over `seeds`.
async fn draw(
    args: &AuditArgs,
    client: &GenerationClient<Channel>,
    seeds: std::ops::Range<u64>,
    gamma: Option<u32>,
    dense: bool,
) -> anyhow::Result<HashMap<Vec<u32>, u64>> {
    let mut tasks = Vec::new();
    for lane in 0..args.concurrency {
        let mut client = client.clone();
        let requests: Vec<_> = seeds
            .clone()
            .skip(lane as usize)
            .step_by(args.concurrency as usize)
            .map(|seed| args.request(seed, gamma, dense))
            .collect();
        tasks.push(tokio::spawn(async move {
            let mut counts: HashMap<Vec<u32>, u64> = HashMap::new();
            for request in requests {
                let mut stream = client.generate_stream(request).await.map_err(RpcFailure)?.into_inner();
                let mut tokens = Vec::new();
                while let Some(message) = stream.next().await {
                    tokens.extend(message.map_err(RpcFailure)?.token_ids);
                }
                *counts.entry(tokens).or_default() += 1;
            }
            anyhow::Ok(counts)
        }));
    }
    let mut all = HashMap::new();
    for task in tasks {
        for (k, v) in task.await?? {
            *all.entry(k).or_default() += v;
        }
    }
    Ok(all)
}

pub fn run(args: &AuditArgs) -> anyhow::Result<()> {
    if args.samples == 0 || args.tokens == 0 || args.concurrency == 0 {
        return Err(invalid("--samples, --tokens and --concurrency must be at least 1"));
    }
    if !(args.alpha > 0.0 && args.alpha < 1.0) {
        return Err(invalid(format!("--alpha {} must be in (0, 1)", args.alpha)));
    }
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;
    runtime.block_on(async {
        let client = GenerationClient::connect(args.endpoint.clone())
            .await
            .map_err(|e| anyhow::anyhow!("cannot reach the coordinator at {}: {e}", args.endpoint))?;
        let n = args.samples;
        let speculative = draw(args, &client, 0..n, args.gamma, args.dense).await?;
        let target_only = draw(args, &client, n..2 * n, Some(0), false).await?;
        let mut cells: Vec<&Vec<u32>> = speculative.keys().chain(target_only.keys()).collect();
        cells.sort();
        cells.dedup();
        let a: Vec<u64> = cells.iter().map(|c| speculative.get(*c).copied().unwrap_or(0)).collect();
        let b: Vec<u64> = cells.iter().map(|c| target_only.get(*c).copied().unwrap_or(0)).collect();
        let test = two_sample_chi_square(&a, &b)?;
        let verdict = if test.p_value >= args.alpha { "pass" } else { "fail" };
        if args.json {
            println!(
                "{}",
                json!({
                    "samples": n,
                    "tokens": args.tokens,
                    "cells": cells.len(),
                    "cells_tested": test.degrees_of_freedom + 1,
                    "pooled_cells": test.pooled_cells,
                    "statistic": test.statistic,
                    "degrees_of_freedom": test.degrees_of_freedom,
                    "p_value": test.p_value,
                    "alpha": args.alpha,
                    "verdict": verdict,
                })
            );
        } else {
            println!(
                "{n} speculative vs {n} target-only continuations of {} tokens: {} distinct, {} cells after pooling {}",
                args.tokens,
                cells.len(),
                test.degrees_of_freedom + 1,
                test.pooled_cells
            );
            println!(
                "two-sample χ² = {:.3} on {} degrees of freedom, p-value {:.4}: {verdict} at error rate {}",
                test.statistic, test.degrees_of_freedom, test.p_value, args.alpha
            );
        }
        if verdict == "fail" {
            return Err(anyhow::anyhow!("the audit failed: p-value {:.3e} < {}", test.p_value, args.alpha));
        }
        Ok(())
    })
}
