//! `specd bench --concurrency N`: throughput under load. N clients send requests at once,
//! target-only and speculative in alternating passes, and the report gives aggregate tokens/s,
//! per-request latency percentiles and the mean batch size the nodes reached (batching across
//! sessions, issue #10), next to one client alone on the same prompts.

use std::time::{Duration, Instant};

use serde_json::json;
use specd_proto::v1::generation_client::GenerationClient;
use tonic::transport::Channel;

use super::args::BenchArgs;
use super::sample::{Sample, run_one};
use super::statistics::{percentile, spread};
use super::totals::Totals;

/// What one mode measured over a pass (or over all passes): its requests and the wall time
/// they took together. Everything reported is summed from the samples when asked.
#[derive(Debug, Default, Clone)]
struct Load {
    samples: Vec<Sample>,
    wall: Duration,
}

impl Load {
    fn merge(&mut self, other: &Load) {
        self.samples.extend_from_slice(&other.samples);
        self.wall += other.wall;
    }

    fn sum(&self, field: impl Fn(&Sample) -> u64) -> u64 {
        self.samples.iter().map(field).sum()
    }

    fn tokens_per_s(&self) -> f64 {
        self.sum(|s| s.tokens) as f64 / self.wall.as_secs_f64().max(1e-9)
    }

    /// [`Totals::tokens_per_round`] over every request of the pass.
    fn tokens_per_round(&self) -> serde_json::Value {
        let mut totals = Totals::default();
        for sample in &self.samples {
            totals.add(sample);
        }
        totals.tokens_per_round()
    }

    fn report(&self) -> serde_json::Value {
        let ratio = |a: u64, b: u64| if b == 0 { 0.0 } else { a as f64 / b as f64 };
        let latencies: Vec<f64> = self.samples.iter().map(|s| s.wall.as_secs_f64() * 1e3).collect();
        let acceptance: f64 = self.samples.iter().map(|s| s.stats.acceptance_sum).sum();
        let evaluated = self.sum(|s| s.stats.evaluated_positions);
        json!({
            "aggregate_tokens_per_s": self.tokens_per_s(),
            "requests": self.samples.len(),
            "latency_ms": {
                "p50": percentile(&latencies, 0.50),
                "p90": percentile(&latencies, 0.90),
                "p99": percentile(&latencies, 0.99),
                "max": latencies.iter().copied().fold(0.0, f64::max),
            },
            "mean_batch_size": {
                "target": ratio(
                    self.sum(|s| s.stats.target_batched_sequences),
                    self.sum(|s| s.stats.target_forward_passes),
                ),
                "draft": ratio(
                    self.sum(|s| s.stats.draft_batched_sequences),
                    self.sum(|s| s.stats.draft_forward_passes),
                ),
            },
            "mean_gamma": ratio(self.sum(|s| s.stats.draft_tokens), self.sum(|s| s.stats.rounds)),
            "alpha": if evaluated == 0 { 0.0 } else { acceptance / evaluated as f64 },
            "tokens_per_round": self.tokens_per_round(),
        })
    }
}

/// One pass of one mode: `clients` clients share `requests` requests (request i: prompt
/// i mod the number of prompts, seed + i), each sending its next as soon as the last is
/// done. The wall time is the pass's, from the first request to the last reply.
async fn pass(
    args: &BenchArgs,
    client: &GenerationClient<Channel>,
    prompts: &[String],
    gamma: Option<u32>,
    clients: usize,
    requests: usize,
) -> anyhow::Result<Load> {
    let started = Instant::now();
    let mut tasks = Vec::with_capacity(clients);
    for c in 0..clients {
        let mut client = client.clone();
        let mine: Vec<_> = (c..requests)
            .step_by(clients)
            .map(|i| args.request(&prompts[i % prompts.len()], gamma, args.seed.wrapping_add(i as u64)))
            .collect();
        tasks.push(tokio::spawn(async move {
            let mut samples = Vec::with_capacity(mine.len());
            for request in mine {
                samples.push(run_one(&mut client, request).await?);
            }
            anyhow::Ok(samples)
        }));
    }
    let mut samples = Vec::with_capacity(requests);
    for task in tasks {
        samples.extend(task.await??);
    }
    Ok(Load { samples, wall: started.elapsed() })
}

/// Measures both modes at `args.concurrency` clients and with one client, interleaved.
pub(super) async fn measure(
    args: &BenchArgs,
    client: &GenerationClient<Channel>,
    endpoint: &str,
    prompts: &[String],
    spec_gamma: Option<u32>,
) -> anyhow::Result<serde_json::Value> {
    let n = args.concurrency;
    // Every client has work in every pass, and every prompt is used.
    let requests = n.max(prompts.len()).div_ceil(n) * n;
    let modes = [("target_only", Some(0)), ("speculative", spec_gamma)];
    let mut loaded: [Load; 2] = Default::default();
    let mut single: [Load; 2] = Default::default();
    let mut ratios = Vec::new();
    for r in 0..args.repeat {
        let mut this_pass: [Load; 2] = Default::default();
        for turn in 0..2 {
            // Alternate which mode goes first, as the single-client bench does.
            let m = (turn + r) % 2;
            let load = pass(args, client, prompts, modes[m].1, n, requests).await?;
            let alone = pass(args, client, prompts, modes[m].1, 1, prompts.len()).await?;
            loaded[m].merge(&load);
            single[m].merge(&alone);
            this_pass[m] = load;
        }
        let ratio = this_pass[1].tokens_per_s() / this_pass[0].tokens_per_s();
        if !args.json {
            eprintln!(
                "pass {}/{}: {n} clients: target-only {:.1} tok/s, speculative {:.1} tok/s, speedup {ratio:.2}×",
                r + 1,
                args.repeat,
                this_pass[0].tokens_per_s(),
                this_pass[1].tokens_per_s()
            );
        }
        ratios.push(ratio);
    }
    let mut report = json!({
        "endpoint": endpoint,
        "concurrency": n,
        "requests_per_pass": requests,
        "prompts": prompts.len(),
        "repeat": args.repeat,
        "max_new_tokens": args.max_new_tokens,
        "temperature": args.temperature,
        "dtype": args.dtype_label(),
        "openmp_wait": args.openmp_wait(),
        "gamma": spec_gamma.map_or(json!("auto"), |g| json!(g)),
        "speedup": spread(&ratios, loaded[1].tokens_per_s() / loaded[0].tokens_per_s()),
    });
    for (m, (name, _)) in modes.iter().enumerate() {
        let mut mode = loaded[m].report();
        mode["single_client_tokens_per_s"] = json!(single[m].tokens_per_s());
        mode["scaling"] = json!(loaded[m].tokens_per_s() / single[m].tokens_per_s());
        report[*name] = mode;
    }
    Ok(report)
}

/// The human-readable form of [`measure`]'s report.
pub(super) fn print_table(report: &serde_json::Value) -> std::io::Result<()> {
    let s = &report["speedup"];
    let g = |key: &str| s[key].as_f64().unwrap_or(f64::NAN);
    outln!(
        "{} clients at once, {} requests per pass × {} passes, {} new tokens each, T = {}, γ = {}",
        report["concurrency"],
        report["requests_per_pass"],
        report["repeat"],
        report["max_new_tokens"],
        report["temperature"],
        report["gamma"]
    );
    for (name, label) in [("target_only", "target-only"), ("speculative", "speculative")] {
        let m = &report[name];
        let f = |key: &str| m[key].as_f64().unwrap_or(f64::NAN);
        let l = |key: &str| m["latency_ms"][key].as_f64().unwrap_or(f64::NAN);
        let b = |key: &str| m["mean_batch_size"][key].as_f64().unwrap_or(f64::NAN);
        outln!(
            "{label:<13} {:>8.1} tokens/s aggregate ({:.2}× one client's {:.1});  latency p50 {:.0} ms, p90 {:.0} ms, p99 {:.0} ms;  mean batch: target {:.2}, draft {:.2};  mean γ {:.2}",
            f("aggregate_tokens_per_s"),
            f("scaling"),
            f("single_client_tokens_per_s"),
            l("p50"),
            l("p90"),
            l("p99"),
            b("target"),
            b("draft"),
            f("mean_gamma")
        );
    }
    outln!("speedup       {:.2}× median ({:.2}–{:.2}) at this load", g("median"), g("min"), g("max"));
    Ok(())
}
