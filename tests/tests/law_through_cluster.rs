//! The output law through the whole cluster: target node, draft node and coordinator over
//! real gRPC with table models, against the exact target-only law of 3-token continuations.
//!
//! Each check draws N continuations (seeds 0..N) and applies Pearson's χ² to the 27 cells
//! against the exact joint law computed from the tables with the same sampling settings. A
//! correct system fails one check with probability `FALSE_FAILURE` over the choice of
//! seeds; the seeds are fixed, so the verdict is reproducible. The last check runs a
//! coordinator with the naive rule (resample from p) and asserts the same check rejects it;
//! the device path's audits (nodes that build their distributions with libtorch ops) are
//! shown to reject a device rule broken on purpose in the same way, and block verification's
//! audits (the coordinator's default, `--verify block`) a block rule whose draws repeat
//! across rounds. At γ = 2 a round commits at most three tokens, and most three-token
//! continuations take two rounds or more, so those checks audit rounds that start after
//! another round's stop.
//! N is `SPECD_LAW_SAMPLES` (default 50 000), sized to a stated power ([`samples`]); the
//! checks that must reject a broken rule take N / 8, which their measured power allows by far
//! ([`power_samples`]), and the device path's audits N / 4 ([`device_samples`]).

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use specd_coordinator::{GammaChoice, RuleVariant, TreeSetting};
use specd_device_sampling::DeviceRule;
use specd_e2e::law_tables::{EffectiveTarget, PROMPT, VOCAB, cell, tables_after};
use specd_e2e::{Cluster, ClusterOptions, continuation_request, scratch_dir, stream_to_end};
use specd_model::BatchPolicy;
use specd_node::Distributions;
use specd_proto::v1::{ProposerTally, SamplingParams as WireSampling, SpeculationStats};
use specd_sampling::chi2::chi_square_test;
use specd_sampling::law::target_sequence_law;
use specd_sampling::{SamplingParams, Truncation, Verification};

pub(crate) const FALSE_FAILURE: f64 = 1e-3;
const LENGTH: usize = 3;
const CLIENTS: u64 = 8;

/// N, the samples of a law audit. At N = 50 000 a check of 27 cells (26 degrees of freedom)
/// rejects, with probability 0.99 at the false-failure probability 1e-3, any law whose χ²
/// divergence Σ (observed − exact)² / exact from the target's is 1.3e-3 or more (the
/// noncentrality 64.8 that power needs, over N). The subtlest wrong rule these audits have
/// caught, a lookahead drawn with the acceptance uniforms (`optimistic`), sits at 3.9e-3 to
/// 4.7e-3 (from its p-values at 25 000, 50 000 and 200 000 samples); every other one at
/// 3e-2 or more. So N catches a bug a third the size of the subtlest one found; a larger N
/// buys sensitivity no known bug needs at a cost the whole suite pays (docs/testing.md).
pub(crate) fn samples() -> u64 {
    std::env::var("SPECD_LAW_SAMPLES").ok().and_then(|s| s.parse().ok()).unwrap_or(50_000)
}

/// The checks that must reject a rule broken on purpose need far fewer samples: χ² grows
/// with N, and at 25 000 samples the three broken rules here gave p-values of 3e-157 (draws
/// repeated across rounds: a χ² divergence of 3.2e-2) and 0 in f64 (resampling from p;
/// penalties blind to the block) against the threshold 1e-3. At N / 8 (6 250) the smallest of
/// them leaves a noncentrality of 200, where 64.8 gives power 0.99; there the four wrong
/// rules of this file gave p-values of 2e-36 (draws repeated) to 8e-188 (the naive rule).
fn power_samples() -> u64 {
    samples() / 8
}

/// The device path's audits take a quarter of N. Its distributions and draws equal the host
/// path's over every sampling setting (`device-sampling/tests/parity.rs`), so what these
/// audits add is the wiring: which rows, which history, which q the draft drew from. The
/// wiring bug they guard against, penalties blind to the block, gave p-values of 0 in f64 at
/// 25 000 samples and 2e-113 at 6 250. On CPU tensors each draw costs some forty libtorch
/// calls, which made these audits the binary's slowest at N (docs/testing.md).
pub(crate) fn device_samples() -> u64 {
    samples() / 4
}

fn wire(params: &SamplingParams, seed: u64) -> WireSampling {
    WireSampling {
        temperature: Some(params.temperature),
        top_k: Some(params.top_k as i32),
        top_p: Some(params.top_p),
        min_p: Some(params.min_p),
        repetition_penalty: Some(params.repetition_penalty),
        presence_penalty: Some(params.presence_penalty),
        frequency_penalty: Some(params.frequency_penalty),
        seed: Some(seed),
    }
}

/// Draws `n` continuations through the cluster and returns the χ² p-value against the exact law.
async fn law_p_value(options: ClusterOptions, params: SamplingParams, dense: bool, n: u64) -> f64 {
    law_check(options, params, dense, n).await.0
}

/// [`law_p_value`], and how many times generations lost their draft on the way.
async fn law_check(options: ClusterOptions, params: SamplingParams, dense: bool, n: u64) -> (f64, u64) {
    let (p, fallbacks, _) = law_check_batched(options, params, dense, n).await;
    (p, fallbacks)
}

/// [`law_check`], and the target's mean batch size over the verify passes.
async fn law_check_batched(options: ClusterOptions, params: SamplingParams, dense: bool, n: u64) -> (f64, u64, f64) {
    let run = law_run(options, params, dense, n, &PROMPT).await;
    (run.p_value, run.fallbacks, run.mean_batch)
}

/// What one law check measured.
#[derive(Debug, Default)]
pub(crate) struct LawRun {
    pub p_value: f64,
    pub fallbacks: u64,
    pub mean_batch: f64,
    /// Candidates proposed and accepted, by proposer, over every generation.
    pub by_proposer: HashMap<String, ProposerTally>,
    pub empty_proposals: u64,
    /// Rounds over every generation.
    pub rounds: u64,
    /// Generations whose last round decoded target-only after an earlier one drafted.
    pub drafted_then_plain: u64,
}

/// Draws `n` continuations of `prompt` through a cluster on [`tables_after`] and measures
/// the χ² p-value against the exact law.
pub(crate) async fn law_run(
    options: ClusterOptions,
    params: SamplingParams,
    dense: bool,
    n: u64,
    prompt: &[u32],
) -> LawRun {
    law_run_by(options, params, dense, n, prompt, CLIENTS).await
}

/// [`law_run`] with `clients` generations at a time.
async fn law_run_by(
    options: ClusterOptions,
    params: SamplingParams,
    dense: bool,
    n: u64,
    prompt: &[u32],
    clients: u64,
) -> LawRun {
    // A directory of its own: checks with the same settings run at once, and each empties
    // its directory as it starts.
    static CHECKS: AtomicUsize = AtomicUsize::new(0);
    let check = CHECKS.fetch_add(1, Ordering::Relaxed);
    let dir = scratch_dir(&format!(
        "law-{check}-{}-{dense}-{:?}-{}",
        gamma_name(options.gamma),
        options.rule,
        options.verification
    ));
    let pair = tables_after(prompt, LENGTH);
    let prompt = Arc::new(prompt.to_vec());
    let files = pair.write(&dir).unwrap();
    let cluster = Cluster::start(&files.target, &files.draft, &options).await.unwrap();
    let client = cluster.client().await.unwrap();
    let params = Arc::new(params);
    let mut tasks = Vec::new();
    for c in 0..clients {
        let (mut client, params, prompt) = (client.clone(), Arc::clone(&params), Arc::clone(&prompt));
        tasks.push(tokio::spawn(async move {
            let mut lane = Tally::default();
            for seed in (c..n).step_by(clients as usize) {
                let request = continuation_request(&prompt, LENGTH, wire(&params, seed), dense);
                let (tokens, stats) = stream_to_end(&mut client, request).await.unwrap();
                assert_eq!(tokens.len(), LENGTH);
                lane.add(&tokens, stats);
            }
            lane
        }));
    }
    let mut tally = Tally::default();
    for task in tasks {
        tally.merge(task.await.unwrap());
    }
    cluster.shutdown().await;
    let model = EffectiveTarget { table: pair.target, params: *params }.after(prompt.len());
    let mut expected = vec![0.0; tally.counts.len()];
    for (seq, p) in target_sequence_law(&model, &prompt, LENGTH) {
        expected[cell(&seq)] = p;
    }
    let p_value = chi_square_test(&tally.counts, &expected).unwrap().p_value;
    let mean_batch = tally.target_sequences as f64 / tally.target_passes.max(1) as f64;
    let run = tally.run;
    eprintln!(
        "law check: {n} samples, γ = {}, tree {:?}, dense = {dense}, rule {:?}, {} verification, proposer {}, {} draft losses, mean target batch {mean_batch:.2}, {} rounds, proposed/accepted {:?}, {} empty proposals, {} generations drafted then decoded target-only: χ² p-value {p_value:.4e}",
        gamma_name(options.gamma),
        options.tree,
        options.rule,
        options.verification,
        options.proposer.kind,
        run.fallbacks,
        run.rounds,
        run.by_proposer,
        run.empty_proposals,
        run.drafted_then_plain,
    );
    LawRun { p_value, mean_batch, ..run }
}

/// What one client's generations (then all of them, merged) counted.
#[derive(Debug)]
struct Tally {
    /// Generations per cell.
    counts: Vec<u64>,
    target_passes: u64,
    target_sequences: u64,
    /// The run's counts (its p-value and mean batch come from the merged tally).
    run: LawRun,
}

impl Default for Tally {
    fn default() -> Self {
        Self {
            counts: vec![0; VOCAB.pow(LENGTH as u32)],
            target_passes: 0,
            target_sequences: 0,
            run: LawRun::default(),
        }
    }
}

impl LawRun {
    /// One generation's counts, from its stats.
    fn of_generation(stats: SpeculationStats) -> Self {
        Self {
            fallbacks: stats.draft_fallbacks,
            empty_proposals: stats.empty_proposals,
            rounds: stats.rounds,
            drafted_then_plain: u64::from(stats.draft_tokens > 0 && stats.gamma == 0),
            by_proposer: stats.by_proposer,
            ..Self::default()
        }
    }

    /// Adds `other`'s counts to these (the p-value and mean batch are left alone: they
    /// come from the merged tally).
    fn absorb(&mut self, other: LawRun) {
        self.fallbacks += other.fallbacks;
        self.empty_proposals += other.empty_proposals;
        self.rounds += other.rounds;
        self.drafted_then_plain += other.drafted_then_plain;
        for (proposer, tally) in other.by_proposer {
            let sum = self.by_proposer.entry(proposer).or_default();
            sum.proposed += tally.proposed;
            sum.accepted += tally.accepted;
        }
    }
}

impl Tally {
    fn add(&mut self, tokens: &[u32], stats: SpeculationStats) {
        self.counts[cell(tokens)] += 1;
        self.target_passes += stats.target_forward_passes;
        self.target_sequences += stats.target_batched_sequences;
        self.run.absorb(LawRun::of_generation(stats));
    }

    fn merge(&mut self, other: Tally) {
        for (total, c) in self.counts.iter_mut().zip(other.counts) {
            *total += c;
        }
        self.target_passes += other.target_passes;
        self.target_sequences += other.target_sequences;
        self.run.absorb(other.run);
    }
}

fn gamma_name(gamma: GammaChoice) -> String {
    match gamma {
        GammaChoice::Fixed(g) => g.to_string(),
        GammaChoice::Adaptive { max } => format!("auto{max}"),
    }
}

fn small_truncation() -> ClusterOptions {
    // K = 2 of 3 tokens: the complement branch of the sparse format is exercised.
    ClusterOptions { truncation: Truncation::new(0.05, 2).unwrap(), ..ClusterOptions::default() }
}

/// Rounds of two candidates: three tokens take two rounds unless the first round accepts both.
fn across_rounds(options: ClusterOptions) -> ClusterOptions {
    ClusterOptions { gamma: GammaChoice::Fixed(2), ..options }
}

#[tokio::test(flavor = "current_thread")]
async fn sparse_law_at_temperature_one() {
    // Block verification, the default.
    let p = law_p_value(across_rounds(small_truncation()), SamplingParams::default(), false, samples()).await;
    assert!(p > FALSE_FAILURE, "sparse T=1: p = {p}");
}

#[tokio::test(flavor = "current_thread")]
async fn sparse_law_under_token_verification() {
    let options = ClusterOptions { verification: Verification::Token, ..across_rounds(small_truncation()) };
    let p = law_p_value(options, SamplingParams::default(), false, samples()).await;
    assert!(p > FALSE_FAILURE, "token verification, sparse T=1: p = {p}");
}

#[tokio::test(flavor = "current_thread")]
async fn block_verification_whose_draws_repeat_across_rounds_is_caught() {
    // Keyed by the block position alone, every round of a generation reuses the acceptance
    // and residual draws of the first: a round after a rejection knows its η fail.
    let options = ClusterOptions { rule: RuleVariant::BlockKeyedByBlockPosition, ..across_rounds(small_truncation()) };
    let p = law_p_value(options, SamplingParams::default(), false, power_samples()).await;
    assert!(p < FALSE_FAILURE, "block verification with repeated draws passed: p = {p}");
}

#[tokio::test(flavor = "current_thread")]
async fn dense_law_at_temperature_one() {
    // Token verification on the dense wire; block verification, the default, is audited on
    // it by vocab_padding's dense check.
    let options = ClusterOptions { verification: Verification::Token, ..ClusterOptions::default() };
    let p = law_p_value(options, SamplingParams::default(), true, samples()).await;
    assert!(p > FALSE_FAILURE, "dense T=1: p = {p}");
}

#[tokio::test(flavor = "current_thread")]
async fn sparse_law_with_top_k_top_p_and_penalties() {
    let p = law_p_value(small_truncation(), adjusted(), false, samples()).await;
    assert!(p > FALSE_FAILURE, "sparse with adjustments: p = {p}");
}

/// The adaptive policy's audits run one generation at a time. Under load the governor starts
/// a level target-only and a 3-token generation ends before its draft session opens, so
/// nearly every round would be target-only and the audit would measure the target's own
/// draws (docs/adaptive.md). Alone, every generation's first round drafts, and the rounds
/// after a rejection run target-only (the policy's choice where two tokens are left; where
/// one is, no draft helps); with table models and one client that schedule is the same from
/// run to run, so the verdict is too.
fn adaptive() -> ClusterOptions {
    ClusterOptions { gamma: GammaChoice::Adaptive { max: 4 }, ..small_truncation() }
}

/// Asserts that the rounds drafted (a candidate a generation at least) and that γ changed
/// within generations: a tenth of them at least ended with a target-only round after drafting.
fn assert_gamma_changed(run: &LawRun, n: u64) {
    let proposed: u64 = run.by_proposer.values().map(|t| t.proposed).sum();
    assert!(proposed >= n, "{proposed} candidates proposed for {n} generations");
    assert!(
        run.drafted_then_plain * 10 >= n,
        "only {} of {n} generations drafted and then decoded target-only",
        run.drafted_then_plain
    );
}

#[tokio::test(flavor = "current_thread")]
async fn sparse_law_with_adaptive_gamma() {
    // γ changes within a generation (a drafting round, then target-only ones after a
    // rejection): every round is exact for its γ, which depends only on finished rounds, so
    // the law is the target's.
    let n = samples();
    let run = law_run_by(adaptive(), SamplingParams::default(), false, n, &PROMPT, 1).await;
    assert_gamma_changed(&run, n);
    assert!(run.p_value > FALSE_FAILURE, "sparse with adaptive γ: p = {}", run.p_value);
}

#[tokio::test(flavor = "current_thread")]
async fn an_adaptive_check_catches_a_wrong_rule_in_its_drafting_rounds() {
    // The same check's power: the naive rule in the drafting rounds gave p = 1e-283 at N / 8.
    let options = ClusterOptions { rule: RuleVariant::NaiveResampleFromTarget, ..adaptive() };
    let n = power_samples();
    let run = law_run_by(options, SamplingParams::default(), false, n, &PROMPT, 1).await;
    assert_gamma_changed(&run, n);
    assert!(run.p_value < FALSE_FAILURE, "the naive rule passed with adaptive γ: p = {}", run.p_value);
}

#[tokio::test(flavor = "current_thread")]
async fn sparse_law_with_a_draft_that_keeps_dying() {
    // Every connection to the draft is cut after a random lifetime (mean 20 ms), whatever it
    // carries: sessions lose their draft at random rounds and finish target-only. Each round
    // is exact for its γ and a cut round is run again from scratch, so the law holds.
    let options = ClusterOptions { draft_chaos: Some(Duration::from_millis(20)), ..small_truncation() };
    let (p, fallbacks) = law_check(options, SamplingParams::default(), false, samples()).await;
    assert!(fallbacks > 0, "no draft was lost: the chaos proxy did nothing");
    assert!(p > FALSE_FAILURE, "sparse with draft losses: p = {p} ({fallbacks} fallbacks)");
}

#[tokio::test(flavor = "current_thread")]
async fn sparse_law_with_batching_across_sessions() {
    // Batching forced on (a table model's passes are far below the default minimum pass
    // time): the 8 clients' verify and draft passes share forward passes, each session's
    // logits come back to it alone, and the law is the target's. A quarter of the samples:
    // the hand-offs make this check slower than the others.
    let batch = BatchPolicy { min_pass: Duration::ZERO, ..BatchPolicy::default() };
    let options = ClusterOptions { batch, ..small_truncation() };
    let (p, _, mean_batch) = law_check_batched(options, SamplingParams::default(), false, samples() / 4).await;
    assert!(mean_batch > 1.0, "no verify pass was shared: mean batch {mean_batch}");
    assert!(p > FALSE_FAILURE, "sparse with batching: p = {p}");
}

/// Both nodes build their distributions with libtorch ops (`--distributions device`), on
/// CPU tensors here: the law is the target's, with every adjustment.
fn on_the_device() -> ClusterOptions {
    ClusterOptions { distributions: Distributions::Device, ..small_truncation() }
}

/// The adjustments of [`sparse_law_with_top_k_top_p_and_penalties`].
fn adjusted() -> SamplingParams {
    SamplingParams {
        temperature: 0.8,
        top_k: 2,
        top_p: 0.95,
        repetition_penalty: 1.3,
        presence_penalty: 0.2,
        frequency_penalty: 0.1,
        ..SamplingParams::default()
    }
}

#[tokio::test(flavor = "current_thread")]
async fn sparse_law_on_the_device_path() {
    let p = law_p_value(across_rounds(on_the_device()), SamplingParams::default(), false, device_samples()).await;
    assert!(p > FALSE_FAILURE, "device path at T = 1: p = {p}");
}

#[tokio::test(flavor = "current_thread")]
async fn sparse_law_with_top_k_top_p_and_penalties_on_the_device_path() {
    let p = law_p_value(on_the_device(), adjusted(), false, device_samples()).await;
    assert!(p > FALSE_FAILURE, "device path with adjustments: p = {p}");
}

#[tokio::test(flavor = "current_thread")]
async fn a_device_path_whose_penalties_forget_the_block_is_caught() {
    // The bug no reply validation sees: every block position penalised as if no token had
    // been speculated before it. The same audit as above must reject it (this also shows
    // that the device path is the one the target takes).
    let options = ClusterOptions { device_rule: DeviceRule::PenaltiesBlindToTheBlock, ..on_the_device() };
    let p = law_p_value(options, adjusted(), false, power_samples()).await;
    assert!(p < FALSE_FAILURE, "the broken device rule passed: p = {p}");
}

/// Trees of two children per node, two deep (six candidates a round; a round's depth is
/// capped by γ = 2, so three-token outputs span rounds, some starting below a tree's
/// accepted path and some after a complement or residual draw).
fn with_trees(options: ClusterOptions) -> ClusterOptions {
    ClusterOptions { tree: TreeSetting::Shape("2,2".parse().unwrap()), ..across_rounds(options) }
}

/// Asserts that the rounds drafted trees and not chains: a chain at γ = 2 proposes at most
/// two candidates a round.
fn assert_trees_ran(run: &LawRun) {
    let proposed: u64 = run.by_proposer.values().map(|t| t.proposed).sum();
    let per_round = proposed as f64 / run.rounds.max(1) as f64;
    assert!(per_round > 2.5, "{per_round:.2} candidates a round: the rounds drafted chains, not trees");
}

#[tokio::test(flavor = "current_thread")]
async fn sparse_tree_law_with_penalties() {
    // Penalties make every node's p depend on its own path, never on its siblings'.
    let run = law_run(with_trees(small_truncation()), adjusted(), false, samples(), &PROMPT).await;
    assert_trees_ran(&run);
    assert!(run.p_value > FALSE_FAILURE, "χ² p-value {}", run.p_value);
}

#[tokio::test(flavor = "current_thread")]
async fn sparse_tree_law_with_penalties_on_the_device_path() {
    // The draft draws its q on the device path; the target builds a tree's distributions on
    // the host whatever the flag says (target-node/src/verify.rs). The device path's quarter
    // ([`device_samples`]): the audit above holds the tree rule to its full size, and the
    // wrong rule below is caught at an eighth.
    let run = law_run(with_trees(on_the_device()), adjusted(), false, device_samples(), &PROMPT).await;
    assert_trees_ran(&run);
    assert!(run.p_value > FALSE_FAILURE, "χ² p-value {}", run.p_value);
}

#[tokio::test(flavor = "current_thread")]
async fn dense_tree_law_at_temperature_one() {
    // The dense wire's tree rule (full rows both ways), T = 1 without truncation. A quarter
    // of the samples: the rule is the sparse one's on full distributions, and the wrong rule
    // below is caught on this wire at an eighth.
    let run =
        law_run(with_trees(ClusterOptions::default()), SamplingParams::default(), true, samples() / 4, &PROMPT).await;
    assert_trees_ran(&run);
    assert!(run.p_value > FALSE_FAILURE, "χ² p-value {}", run.p_value);
}

#[tokio::test(flavor = "current_thread")]
async fn a_tree_rule_that_keeps_rejected_mass_is_caught() {
    // Each next child tried against p itself, the rejected children's mass left in.
    let options =
        ClusterOptions { rule: RuleVariant::NaiveResampleFromTarget, ..with_trees(ClusterOptions::default()) };
    let run = law_run(options, SamplingParams::default(), true, power_samples(), &PROMPT).await;
    assert_trees_ran(&run);
    assert!(run.p_value < FALSE_FAILURE, "the wrong tree rule passed: p = {}", run.p_value);
}

#[tokio::test(flavor = "current_thread")]
async fn broken_coordinator_is_caught() {
    let options = ClusterOptions { rule: RuleVariant::NaiveResampleFromTarget, ..ClusterOptions::default() };
    let p = law_p_value(options, SamplingParams::default(), true, power_samples()).await;
    assert!(p < FALSE_FAILURE, "the naive rule passed: p = {p}");
}
