//! `specd audit`: a statistical check, against a running cluster, that speculative decoding
//! samples the target's law.

use std::collections::HashMap;

use clap::Args;
use serde_json::json;
use specd_proto::v1::generation_client::GenerationClient;
use specd_proto::v1::{GenerateRequest, NextTokenLawRequest, Speculation, StoppingCriteria};
use specd_sampling::chi2::{ChiSquare, chi_square_test, two_sample_chi_square};
use tokio_stream::StreamExt;
use tonic::transport::Channel;

use crate::cli_error::{RpcFailure, invalid};
use crate::client_args::ClientArgs;
use crate::generate::SamplingFlags;

/// Check that speculation leaves the output law unchanged.
///
/// Draws N continuations of K tokens with speculation on (seeds 0..N) and compares their
/// empirical law with the target's:
///   exact       the target's exact law of K-token continuations, built from its next-token
///               laws (the NextTokenLaw RPC) over every prefix with p > 0; a χ² goodness-of-fit
///               test. Needs --token-ids and at most --max-cells continuations.
///   two-sample  N more continuations with target-only decoding (γ = 0, seeds N..2N); a
///               two-sample χ² test.
///   auto        exact when the target's law fits in --max-cells, else two-sample.
/// Cells with fewer than 5 expected draws are pooled. A correct cluster fails with
/// probability --alpha.
///
/// Example:
///   specd audit --endpoint http://127.0.0.1:50051 --token-ids 1,2 --tokens 3 --samples 20000
#[derive(Debug, Args)]
#[command(verbatim_doc_comment, allow_negative_numbers = true)]
pub struct AuditArgs {
    #[command(flatten)]
    client: ClientArgs,
    /// Tokens per continuation (K); cells are the distinct K-token continuations.
    #[arg(long, env = "SPECD_AUDIT_TOKENS", default_value_t = 3)]
    tokens: u32,
    /// Continuations per arm (N).
    #[arg(long, env = "SPECD_AUDIT_SAMPLES", default_value_t = 20_000)]
    samples: u64,
    /// Draft length of the speculative arm (default: the coordinator's policy).
    #[arg(long, env = "SPECD_AUDIT_GAMMA")]
    gamma: Option<u32>,
    /// Use the dense reference wire format in the speculative arm.
    #[arg(long, env = "SPECD_DENSE")]
    dense: bool,
    /// Error rate: the verdict is "fail" when the p-value is below it.
    #[arg(long, env = "SPECD_AUDIT_ALPHA", default_value_t = 1e-3)]
    alpha: f64,
    /// What the speculative samples are compared with.
    #[arg(long, env = "SPECD_AUDIT_MODE", value_enum, default_value_t = AuditMode::Auto)]
    mode: AuditMode,
    /// The most continuations the exact law may have.
    #[arg(long, env = "SPECD_AUDIT_MAX_CELLS", default_value_t = 4096)]
    max_cells: usize,
    /// Requests in flight at once.
    #[arg(long, env = "SPECD_AUDIT_CONCURRENCY", default_value_t = 8)]
    concurrency: u64,
    #[command(flatten)]
    sampling: SamplingFlags,
    /// Print one JSON object.
    #[arg(long, env = "SPECD_JSON")]
    json: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum AuditMode {
    Auto,
    Exact,
    TwoSample,
}

impl AuditArgs {
    fn request(&self, seed: u64, gamma: Option<u32>, dense: bool) -> GenerateRequest {
        GenerateRequest {
            request_id: format!("audit-{seed}"),
            prompt: Some(self.client.prompt()),
            sampling: Some(self.sampling.to_wire(Some(seed))),
            stopping: Some(StoppingCriteria {
                max_new_tokens: Some(self.tokens),
                ignore_eos: true,
                ..Default::default()
            }),
            speculation: Some(Speculation { gamma, dense }),
            logprobs: None,
            cache_salt: String::new(),
            constraint: None,
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
            .map(|seed| args.client.request(args.request(seed, gamma, dense)))
            .collect::<anyhow::Result<_>>()?;
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

/// The target's exact law of K-token continuations, by breadth-first expansion of every
/// prefix with p > 0; `None` when it has more than `max_cells` continuations.
async fn exact_law(
    args: &AuditArgs,
    client: &GenerationClient<Channel>,
    prompt: &[u32],
) -> anyhow::Result<Option<Vec<(Vec<u32>, f64)>>> {
    let mut level: Vec<(Vec<u32>, f64)> = vec![(Vec::new(), 1.0)];
    for _ in 0..args.tokens {
        let mut next = Vec::new();
        for (prefix, mass) in &level {
            let request = NextTokenLawRequest {
                prompt_token_ids: prompt.to_vec(),
                generated_token_ids: prefix.clone(),
                sampling: Some(args.sampling.to_wire(None)),
            };
            let request = args.client.request(request)?;
            let law = client.clone().next_token_law(request).await.map_err(RpcFailure)?.into_inner();
            if law.token_ids.len() != law.probs.len() {
                anyhow::bail!(
                    "the coordinator sent {} tokens with {} probabilities",
                    law.token_ids.len(),
                    law.probs.len()
                );
            }
            for (token, p) in law.token_ids.iter().zip(&law.probs) {
                let mut sequence = prefix.clone();
                sequence.push(*token);
                next.push((sequence, mass * p));
            }
            if next.len() > args.max_cells {
                return Ok(None);
            }
        }
        level = next;
    }
    Ok(Some(level))
}

/// The outcome of one audit.
struct Verdict {
    mode: AuditMode,
    cells: usize,
    test: ChiSquare,
}

async fn audit(args: &AuditArgs, client: &GenerationClient<Channel>) -> anyhow::Result<Verdict> {
    let n = args.samples;
    let exact = match (args.mode, &args.client.token_ids) {
        (AuditMode::TwoSample, _) => None,
        (AuditMode::Exact, None) => {
            return Err(invalid("--mode exact needs the prompt as --token-ids: the law is computed on token ids"));
        }
        (AuditMode::Auto, None) => None,
        (mode, Some(prompt)) => {
            let law = exact_law(args, client, prompt).await?;
            if law.is_none() && mode == AuditMode::Exact {
                return Err(invalid(format!(
                    "the target's law has more than --max-cells {} continuations of {} tokens",
                    args.max_cells, args.tokens
                )));
            }
            law
        }
    };
    let speculative = draw(args, client, 0..n, args.gamma, args.dense).await?;
    if let Some(law) = exact {
        // Continuations the target cannot produce get probability 0: seeing one fails the test.
        let mut cells: Vec<(Vec<u32>, f64)> = law;
        let known: std::collections::HashSet<&Vec<u32>> = cells.iter().map(|(c, _)| c).collect();
        let impossible: Vec<Vec<u32>> = speculative.keys().filter(|c| !known.contains(c)).cloned().collect();
        cells.extend(impossible.into_iter().map(|c| (c, 0.0)));
        let observed: Vec<u64> = cells.iter().map(|(c, _)| speculative.get(c).copied().unwrap_or(0)).collect();
        let probs: Vec<f64> = cells.iter().map(|(_, p)| *p).collect();
        let test = chi_square_test(&observed, &probs)?;
        return Ok(Verdict { mode: AuditMode::Exact, cells: cells.len(), test });
    }
    let target_only = draw(args, client, n..2 * n, Some(0), false).await?;
    let mut cells: Vec<&Vec<u32>> = speculative.keys().chain(target_only.keys()).collect();
    cells.sort();
    cells.dedup();
    let a: Vec<u64> = cells.iter().map(|c| speculative.get(*c).copied().unwrap_or(0)).collect();
    let b: Vec<u64> = cells.iter().map(|c| target_only.get(*c).copied().unwrap_or(0)).collect();
    let test = two_sample_chi_square(&a, &b)?;
    Ok(Verdict { mode: AuditMode::TwoSample, cells: cells.len(), test })
}

pub fn run(args: &AuditArgs) -> anyhow::Result<()> {
    if args.samples == 0 || args.tokens == 0 || args.concurrency == 0 || args.max_cells == 0 {
        return Err(invalid("--samples, --tokens, --concurrency and --max-cells must be at least 1"));
    }
    if !(args.alpha > 0.0 && args.alpha < 1.0) {
        return Err(invalid(format!("--alpha {} must be in (0, 1)", args.alpha)));
    }
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;
    runtime.block_on(async {
        let client = args.client.connect().await?;
        let Verdict { mode, cells, test } = audit(args, &client).await?;
        let n = args.samples;
        let verdict = if test.p_value >= args.alpha { "pass" } else { "fail" };
        let mode_name = match mode {
            AuditMode::Exact => "exact",
            _ => "two-sample",
        };
        if args.json {
            outln!(
                "{}",
                json!({
                    "mode": mode_name,
                    "samples": n,
                    "tokens": args.tokens,
                    "cells": cells,
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
            let against = match mode {
                AuditMode::Exact => "the target's exact law".to_owned(),
                _ => format!("{n} target-only continuations"),
            };
            outln!(
                "{n} speculative continuations of {} tokens against {against}: {cells} cells, {} after pooling {}",
                args.tokens,
                test.degrees_of_freedom + 1,
                test.pooled_cells
            );
            outln!(
                "{mode_name} χ² = {:.3} on {} degrees of freedom, p-value {:.4}: {verdict} at error rate {}",
                test.statistic,
                test.degrees_of_freedom,
                test.p_value,
                args.alpha
            );
        }
        if verdict == "fail" {
            return Err(anyhow::anyhow!("the audit failed: p-value {:.3e} < {}", test.p_value, args.alpha));
        }
        Ok(())
    })
}
