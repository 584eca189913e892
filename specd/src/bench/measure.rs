//! The measurement itself: one warm-up pair, then for each pass and prompt a target-only and
//! a speculative request, alternating which goes first (`--concurrency` above 1: [`load`];
//! `--workload chat`: [`chat`]).
//!
//! [`load`]: super::load
//! [`chat`]: super::chat

use specd_proto::v1::generation_client::GenerationClient;

use super::args::BenchArgs;
use super::chat;
use super::load;
use super::report;
use super::sample::run_one;
use super::totals::{Measurement, ModeTotals, PassRates};
use crate::serve::GammaFlag;

/// Measures the coordinator at `endpoint` and returns the JSON report.
pub(super) async fn measure(
    args: &BenchArgs,
    endpoint: String,
    prompts: &[String],
) -> anyhow::Result<serde_json::Value> {
    let mut client = GenerationClient::connect(endpoint.clone())
        .await
        .map_err(|e| anyhow::anyhow!("cannot reach the coordinator at {endpoint}: {e}"))?;
    let spec_gamma = match args.gamma {
        GammaFlag::Fixed(g) => Some(g),
        GammaFlag::Auto => None,
    };
    // One unmeasured pair first: connections, allocator, the models' first passes.
    run_one(&mut client, args.request(&prompts[0], Some(0), args.seed)).await?;
    run_one(&mut client, args.request(&prompts[0], spec_gamma, args.seed)).await?;
    if args.workload == "chat" {
        return chat::measure(args, &mut client, &endpoint, prompts).await;
    }
    if args.concurrency > 1 {
        return load::measure(args, &client, &endpoint, prompts, spec_gamma).await;
    }
    let mut all = Measurement::default();
    for r in 0..args.repeat {
        let (mut base, mut spec) = (ModeTotals::default(), ModeTotals::default());
        for (i, prompt) in prompts.iter().enumerate() {
            let seed = args.seed.wrapping_add(i as u64);
            let base_first = (r + i) % 2 == 0;
            let (mut base_ids, mut spec_ids) = (Vec::new(), Vec::new());
            for turn in 0..2 {
                // Each sample counts towards its pass and towards the totals of all passes.
                if (turn == 0) == base_first {
                    let sample = run_one(&mut client, args.request(prompt, Some(0), seed)).await?;
                    base.add(&sample);
                    all.target_only.add(&sample);
                    base_ids = sample.token_ids;
                } else {
                    let sample = run_one(&mut client, args.request(prompt, spec_gamma, seed)).await?;
                    spec.add(&sample);
                    all.speculative.add(&sample);
                    spec_ids = sample.token_ids;
                }
            }
            all.agreement.add(&base_ids, &spec_ids);
        }
        let pass = PassRates::new(&base, &spec);
        if !args.json {
            eprintln!(
                "pass {}/{}: target-only {:.1} tok/s, speculative {:.1} tok/s, speedup {:.2}× ({:.2}× after the first rounds)",
                r + 1,
                args.repeat,
                pass.target_only_tokens_per_s,
                pass.speculative_tokens_per_s,
                pass.speedup(),
                pass.decode_speedup()
            );
        }
        all.passes.push(pass);
    }
    Ok(report::single_client(args, &endpoint, prompts.len(), &all))
}
