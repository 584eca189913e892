//! Optimistic drafting (docs/architecture.md) through the whole cluster: the draft drafts each next
//! block while the target verifies, and a right guess is served at once.
//!
//! - with the same seed, the output is the same token for token with optimistic drafting on
//!   and off (a block drafted ahead is the block its request would have drafted), at
//!   temperature 1 on table models and greedy on Hugging Face checkpoints, where it also
//!   equals target-only decoding;
//! - the law of 4-token continuations (γ = 1, so that the second round can be a hit) passes
//!   Pearson's χ² against the exact target-only law with optimistic drafting on, and the
//!   same check rejects a draft whose blocks drafted ahead reuse the coordinator's
//!   acceptance uniforms (`Purpose::Accept`). N is `SPECD_LAW_SAMPLES` (default 50 000,
//!   [`samples`]): over the 81 cells (80 degrees of freedom) it rejects with probability 0.99
//!   any law at χ² divergence 1.9e-3 or more (noncentrality 94.8 over N). The device path's
//!   audit takes N / 4 ([`device_samples`]), the rejection 50 000 whatever N is
//!   ([`power_samples`]).
//!
//! Serving a block drafted after a wrong guess would not be caught by a law test, and need
//! not be: its q is still the distribution its candidates were drawn from, so the rule stays
//! exact; only acceptance drops (and the draft's history would go wrong).

use specd_coordinator::GammaChoice;
use specd_e2e::law_tables::{EffectiveTarget, PROMPT, TableFiles, TablePair, VOCAB, cell, tables};
use specd_e2e::{Cluster, ClusterOptions, Table, hf_fixture, scratch_dir};
use specd_model::DType;
use specd_node::Distributions;
use specd_proto::v1::generate_request::Prompt;
use specd_proto::v1::{
    GenerateRequest, SamplingParams as WireSampling, Speculation, SpeculationStats, StoppingCriteria, TokenIds,
};
use specd_sampling::chi2::chi_square_test;
use specd_sampling::law::target_sequence_law;
use specd_sampling::{Purpose, SamplingParams, StreamKey, Truncation};
use tokio_stream::StreamExt;

const FALSE_FAILURE: f64 = 1e-3;
const LENGTH: usize = 4;
const CLIENTS: u64 = 8;

use crate::law_through_cluster::{device_samples, samples};

/// Draws reused across purposes gave p-values of 2e-9 at 25 000 samples, 1e-29 at 50 000 and
/// 2e-154 at 200 000 against the threshold 1e-3: a χ² divergence of 3.9e-3 to 4.7e-3. At
/// 50 000 that is a noncentrality of 196 or more, where 94.8 gives power 0.99; at 25 000 the
/// margin would be thin.
fn power_samples() -> u64 {
    50_000
}

fn request(prompt: &[u32], temperature: f64, seed: u64, tokens: usize, gamma: Option<u32>) -> GenerateRequest {
    GenerateRequest {
        prompt: Some(Prompt::TokenIds(TokenIds { ids: prompt.to_vec() })),
        sampling: Some(WireSampling { temperature: Some(temperature), seed: Some(seed), ..Default::default() }),
        stopping: Some(StoppingCriteria {
            max_new_tokens: Some(tokens as u32),
            ignore_eos: true,
            ..Default::default()
        }),
        speculation: Some(Speculation { gamma, dense: false }),
        ..Default::default()
    }
}

/// K = 2 of 3 tokens: the complement branch of the sparse format is exercised.
fn options(gamma: u32, optimistic: bool) -> ClusterOptions {
    ClusterOptions {
        gamma: GammaChoice::Fixed(gamma),
        truncation: Truncation::new(0.05, 2).unwrap(),
        optimistic,
        ..ClusterOptions::default()
    }
}

/// Streams one generation: its tokens and its final stats.
async fn generate(
    client: &mut specd_proto::v1::generation_client::GenerationClient<tonic::transport::Channel>,
    request: GenerateRequest,
) -> (Vec<u32>, SpeculationStats) {
    let mut stream = client.generate_stream(request).await.unwrap().into_inner();
    let (mut tokens, mut stats) = (Vec::new(), SpeculationStats::default());
    while let Some(message) = stream.next().await {
        let message = message.unwrap();
        // Stats are the generation's so far: the last message has them all.
        stats = message.stats.unwrap_or(stats);
        tokens.extend(message.token_ids);
    }
    (tokens, stats)
}

#[tokio::test(flavor = "current_thread")]
async fn same_seed_same_tokens_with_and_without_optimistic_drafting() {
    let dir = scratch_dir("optimistic-same-seed");
    let pair = tables(LENGTH);
    let files = pair.write(&dir).unwrap();
    let on = Cluster::start(&files.target, &files.draft, &options(2, true)).await.unwrap();
    let off = Cluster::start(&files.target, &files.draft, &options(2, false)).await.unwrap();
    let (mut on_client, mut off_client) = (on.client().await.unwrap(), off.client().await.unwrap());
    let (mut attempts, mut hits) = (0, 0);
    for seed in 0..300 {
        let (with, stats) = generate(&mut on_client, request(&PROMPT, 1.0, seed, 16, None)).await;
        let (without, plain_stats) = generate(&mut off_client, request(&PROMPT, 1.0, seed, 16, None)).await;
        assert_eq!(with, without, "seed {seed}");
        assert_eq!(with.len(), 16);
        assert_eq!((plain_stats.optimistic_attempts, plain_stats.optimistic_hits), (0, 0));
        assert_eq!(stats.accepted_tokens, plain_stats.accepted_tokens, "seed {seed}");
        assert!(stats.optimistic_hits <= stats.optimistic_attempts);
        attempts += stats.optimistic_attempts;
        hits += stats.optimistic_hits;
    }
    eprintln!("same seed: {hits} optimistic hits of {attempts} attempts");
    assert!(hits > 100, "{hits} hits of {attempts}");
    on.shutdown().await;
    off.shutdown().await;
}

#[tokio::test(flavor = "current_thread")]
async fn greedy_with_optimistic_drafting_equals_target_only_on_hf_models() {
    let target = hf_fixture("llama_gqa_untied");
    let prompts: Vec<Vec<u32>> = {
        let mut rng = StreamKey::new(6, 0, 0, Purpose::Plain).stream();
        (0..20).map(|i| (0..1 + i % 8).map(|_| 3 + rng.next_u32() % 93).collect()).collect()
    };
    for draft in [hf_fixture("llama_gqa_untied"), hf_fixture("llama_tied")] {
        let on = ClusterOptions { dtype: DType::F64, ..options(3, true) };
        let off = ClusterOptions { dtype: DType::F64, ..options(3, false) };
        let (on, off) =
            (Cluster::start(&target, &draft, &on).await.unwrap(), Cluster::start(&target, &draft, &off).await.unwrap());
        let (mut on_client, mut off_client) = (on.client().await.unwrap(), off.client().await.unwrap());
        let mut hits = 0;
        for prompt in &prompts {
            let (plain, _) = generate(&mut off_client, request(prompt, 0.0, 1, 16, Some(0))).await;
            let (with, stats) = generate(&mut on_client, request(prompt, 0.0, 1, 16, None)).await;
            let (without, _) = generate(&mut off_client, request(prompt, 0.0, 1, 16, None)).await;
            assert_eq!(plain.len(), 16);
            assert_eq!(with, plain, "optimistic on, draft {}, prompt {prompt:?}", draft.display());
            assert_eq!(without, plain, "optimistic off, draft {}, prompt {prompt:?}", draft.display());
            hits += stats.optimistic_hits;
        }
        eprintln!("greedy, draft {}: {hits} optimistic hits", draft.display());
        if draft == target {
            // Every candidate is accepted and the greedy guess is the bonus token: every
            // round after the first is a hit, except where the last rounds shrink γ.
            assert!(hits >= 20, "{hits}");
        }
        on.shutdown().await;
        off.shutdown().await;
    }
}

/// What a law check saw: the χ² p-value of the continuations against the exact law, and
/// the optimistic hits on the way.
struct LawCheck {
    p_value: f64,
    hits: u64,
}

/// Draws `n` 4-token continuations through the cluster.
async fn law_check(options: ClusterOptions, n: u64) -> LawCheck {
    let dir = scratch_dir(&format!("optimistic-law-{:?}-{}", options.lookahead_purpose, options.distributions));
    let pair = tables(LENGTH);
    let files = pair.write(&dir).unwrap();
    let cluster = Cluster::start(&files.target, &files.draft, &options).await.unwrap();
    let client = cluster.client().await.unwrap();
    let mut tasks = Vec::new();
    for c in 0..CLIENTS {
        let mut client = client.clone();
        tasks.push(tokio::spawn(async move {
            let mut counts = vec![0u64; VOCAB.pow(LENGTH as u32)];
            let mut hits = 0;
            for seed in (c..n).step_by(CLIENTS as usize) {
                let (tokens, stats) = generate(&mut client, request(&PROMPT, 1.0, seed, LENGTH, None)).await;
                assert_eq!(tokens.len(), LENGTH);
                counts[cell(&tokens)] += 1;
                hits += stats.optimistic_hits;
            }
            (counts, hits)
        }));
    }
    let mut counts = vec![0u64; VOCAB.pow(LENGTH as u32)];
    let mut hits = 0;
    for task in tasks {
        let (lane, lane_hits) = task.await.unwrap();
        hits += lane_hits;
        for (total, c) in counts.iter_mut().zip(lane) {
            *total += c;
        }
    }
    cluster.shutdown().await;
    let model = EffectiveTarget { table: pair.target, params: SamplingParams::default() };
    let mut expected = vec![0.0; counts.len()];
    for (seq, p) in target_sequence_law(&model, &PROMPT, LENGTH) {
        expected[cell(&seq)] = p;
    }
    let p_value = chi_square_test(&counts, &expected).unwrap().p_value;
    eprintln!(
        "optimistic law check: {n} samples, lookahead draws {:?}, {hits} optimistic hits: χ² p-value {p_value:.4e}",
        options.lookahead_purpose
    );
    LawCheck { p_value, hits }
}

#[tokio::test(flavor = "current_thread")]
async fn law_with_optimistic_drafting() {
    let n = samples();
    let LawCheck { p_value: p, hits } = law_check(options(1, true), n).await;
    assert!(hits > n / 10, "only {hits} optimistic hits in {n} generations");
    assert!(p > FALSE_FAILURE, "optimistic drafting: p = {p} ({hits} hits)");
}

/// The same audit with both nodes building their distributions with libtorch ops
/// (`--distributions device`, CPU tensors): the draft's guesses and blocks drafted ahead come
/// from the device path too.
#[tokio::test(flavor = "current_thread")]
async fn law_with_optimistic_drafting_on_the_device_path() {
    let n = device_samples();
    let options = ClusterOptions { distributions: Distributions::Device, ..options(1, true) };
    let LawCheck { p_value: p, hits } = law_check(options, n).await;
    assert!(hits > n / 10, "only {hits} optimistic hits in {n} generations");
    assert!(p > FALSE_FAILURE, "optimistic drafting on the device path: p = {p} ({hits} hits)");
}

#[tokio::test(flavor = "current_thread")]
async fn lookahead_reusing_the_acceptance_draws_is_caught() {
    let n = power_samples();
    let broken = ClusterOptions { lookahead_purpose: Purpose::Accept, ..options(1, true) };
    let LawCheck { p_value: p, hits } = law_check(broken, n).await;
    assert!(hits > n / 10, "only {hits} optimistic hits in {n} generations");
    assert!(p < FALSE_FAILURE, "a lookahead drawn with the acceptance uniforms passed: p = {p} ({hits} hits)");
}

/// Not a test: tokens per second with optimistic drafting on and off on loopback, with
/// forward passes slowed to stand in for real models (`SPECD_MEASURE_DRAFT_MS`, default 5;
/// `SPECD_MEASURE_TARGET_MS`, default 20; γ = `SPECD_MEASURE_GAMMA`, default 4; 128 tokens
/// for each of `SPECD_MEASURE_SEEDS` seeds, default 8), and a round trip of
/// `SPECD_MEASURE_RTT_MS` (default 0) between coordinator and draft. The delays are sleeps,
/// so the figures hold on a loaded machine better than model runs do. Run with
/// `cargo test --release -p specd-e2e --test cluster -- --ignored --nocapture optimistic::measure`.
#[tokio::test(flavor = "current_thread")]
#[ignore = "a measurement, not a test"]
async fn measure_optimistic_drafting_on_loopback() {
    let env = |name: &str, default: u64| std::env::var(name).ok().and_then(|s| s.parse().ok()).unwrap_or(default);
    let (draft_ms, target_ms, gamma) =
        (env("SPECD_MEASURE_DRAFT_MS", 5), env("SPECD_MEASURE_TARGET_MS", 20), env("SPECD_MEASURE_GAMMA", 4) as u32);
    let seeds = env("SPECD_MEASURE_SEEDS", 8);
    let rtt_ms = env("SPECD_MEASURE_RTT_MS", 0);
    let dir = scratch_dir("optimistic-measure");
    // One distribution at every position: α = Σ min(p, q) = 0.9, and q's mode is p's.
    let target = Table { vocab_size: 5, default: vec![0.6, 0.2, 0.1, 0.05, 0.05], rules: Vec::new() };
    let draft = Table { vocab_size: 5, default: vec![0.5, 0.25, 0.1, 0.1, 0.05], rules: Vec::new() };
    let TableFiles { target, draft } = TablePair { target, draft }.write(&dir).unwrap();
    let delays = (std::time::Duration::from_millis(target_ms), std::time::Duration::from_millis(draft_ms));
    for pass in 0..2 {
        for optimistic in [false, true] {
            let options = ClusterOptions {
                forward_delays: delays,
                draft_one_way_delay: (rtt_ms > 0).then(|| std::time::Duration::from_micros(rtt_ms * 500)),
                truncation: Truncation::new(1e-4, 64).unwrap(),
                ..options(gamma, optimistic)
            };
            let cluster = Cluster::start(&target, &draft, &options).await.unwrap();
            let mut client = cluster.client().await.unwrap();
            let started = std::time::Instant::now();
            let (mut tokens, mut total) = (0, SpeculationStats::default());
            for seed in 0..seeds {
                let (out, stats) = generate(&mut client, request(&PROMPT, 1.0, seed, 128, None)).await;
                tokens += out.len();
                total.rounds += stats.rounds;
                total.accepted_tokens += stats.accepted_tokens;
                total.draft_tokens += stats.draft_tokens;
                total.draft_ns += stats.draft_ns;
                total.round_wall_ns += stats.round_wall_ns;
                total.optimistic_attempts += stats.optimistic_attempts;
                total.optimistic_hits += stats.optimistic_hits;
                total.optimistic_pushed += stats.optimistic_pushed;
            }
            let seconds = started.elapsed().as_secs_f64();
            let rounds = total.rounds as f64;
            eprintln!(
                "pass {pass}, optimistic {}: {:.1} tokens/s, {:.2} tokens/round, round {:.2} ms, draft {:.2} ms/round, hits {}/{} ({:.0}%, {} pushed), accepted {}/{}",
                if optimistic { "on " } else { "off" },
                tokens as f64 / seconds,
                tokens as f64 / rounds,
                total.round_wall_ns as f64 / rounds / 1e6,
                total.draft_ns as f64 / rounds / 1e6,
                total.optimistic_hits,
                total.optimistic_attempts,
                100.0 * total.optimistic_hits as f64 / (total.optimistic_attempts as f64).max(1.0),
                total.optimistic_pushed,
                total.accepted_tokens,
                total.draft_tokens,
            );
            cluster.shutdown().await;
        }
    }
}
