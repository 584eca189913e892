//! Qwen3 and Gemma 3 pairs through the whole system: target node, draft node and
//! coordinator over real gRPC (specd-e2e's cluster, in this process), with the tiny random
//! checkpoints transformers writes (`scripts/make_fixtures.py`: a Qwen3 target with YaRN
//! drafted by an untied Qwen3; a Gemma 3 target with windowed and global layers drafted by a
//! smaller Gemma 3; the same draft for a target in Gemma 3 27B's Gemma3ForConditionalGeneration
//! format). For each pair:
//!
//! - greedy identity: speculative greedy output equals target-only greedy output on 12
//!   prompts of up to 8 tokens plus 12 new ones, past the Gemma target's window of 4 (f64,
//!   as in `tests/tests/greedy_hf.rs`, so no near-tie can flip an argmax);
//! - the 3-token law audit: the real `specd audit` process draws 3000 continuations with
//!   top-k 3 (27 cells) and tests them against the target's exact law (χ²; a correct
//!   cluster fails with probability 1e-3, its --alpha; the seeds are fixed, so each run is
//!   deterministic). That the same audit rejects a wrong rule is shown on the Qwen3 pair:
//!   with the naive rule (resample from p on rejection, which the coordinator has in the
//!   dense wire format) it must fail.

use std::path::Path;
use std::process::Command;

use specd_coordinator::{GammaChoice, RuleVariant};
use specd_e2e::{Cluster, ClusterOptions, hf_fixture};
use specd_model::DType;
use specd_proto::v1::generate_request::Prompt;
use specd_proto::v1::{GenerateRequest, SamplingParams, Speculation, StoppingCriteria, TokenIds};
use specd_sampling::{Purpose, StreamKey};

const NEW_TOKENS: u32 = 12;

fn prompts() -> Vec<Vec<u32>> {
    let mut rng = StreamKey::new(26, 0, 0, Purpose::Plain).stream();
    (0..12).map(|i| (0..1 + i % 8).map(|_| 3 + rng.next_u32() % 93).collect()).collect()
}

fn greedy(prompt: Vec<u32>, gamma: u32) -> GenerateRequest {
    GenerateRequest {
        prompt: Some(Prompt::TokenIds(TokenIds { ids: prompt })),
        sampling: Some(SamplingParams { temperature: Some(0.0), ..Default::default() }),
        stopping: Some(StoppingCriteria { max_new_tokens: Some(NEW_TOKENS), ignore_eos: true, ..Default::default() }),
        speculation: Some(Speculation { gamma: Some(gamma), dense: false }),
        ..Default::default()
    }
}

/// Speculative greedy equals target-only greedy; returns (drafted, accepted) tokens.
async fn greedy_identity(cluster: &Cluster, pair: &str) -> (u64, u64) {
    let mut client = cluster.client().await.unwrap();
    let (mut drafted, mut accepted) = (0, 0);
    for prompt in prompts() {
        let plain = client.generate(greedy(prompt.clone(), 0)).await.unwrap().into_inner();
        let spec = client.generate(greedy(prompt.clone(), 4)).await.unwrap().into_inner();
        assert_eq!(plain.token_ids.len(), NEW_TOKENS as usize);
        assert_eq!(spec.token_ids, plain.token_ids, "{pair}: prompt {prompt:?}");
        let stats = spec.stats.unwrap();
        drafted += stats.draft_tokens;
        accepted += stats.accepted_tokens;
    }
    (drafted, accepted)
}

/// `specd audit` (exact mode, 27 cells) against the cluster, its speculative arm in the
/// sparse wire format or the dense one; its JSON report.
async fn audit(cluster: &Cluster, dense: bool) -> serde_json::Value {
    let endpoint = cluster.endpoint.clone();
    let out = tokio::task::spawn_blocking(move || {
        Command::new(env!("CARGO_BIN_EXE_specd"))
            .args(["audit", "--endpoint", &endpoint, "--token-ids", "5,42", "--tokens", "3", "--top-k", "3"])
            .args(["--samples", "3000", "--json", "--mode", "exact"])
            .args(dense.then_some("--dense"))
            .output()
            .unwrap()
    })
    .await
    .unwrap();
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!("{e}: stdout {:?} stderr {}", out.stdout, String::from_utf8_lossy(&out.stderr));
    });
    assert_eq!(out.status.success(), report["verdict"] == "pass", "exit status follows the verdict: {report}");
    report
}

async fn check_pair(pair: &str, target: &Path, draft: &Path) {
    let options = ClusterOptions { gamma: GammaChoice::Fixed(3), dtype: DType::F64, ..ClusterOptions::default() };
    let cluster = Cluster::start(target, draft, &options).await.unwrap();
    assert_eq!(cluster.target_info().await.unwrap().dtype, "f64");
    let (drafted, accepted) = greedy_identity(&cluster, pair).await;
    eprintln!("{pair}: greedy identity on {} prompts, {accepted}/{drafted} drafted tokens accepted", prompts().len());
    assert!(drafted > 0, "{pair}: the draft drafted");
    let report = audit(&cluster, false).await;
    eprintln!("{pair}: audit {report}");
    assert_eq!(report["cells"], 27, "{pair}: {report}");
    assert_eq!(report["verdict"], "pass", "{pair}: {report}");
    cluster.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_qwen3_pair_is_exact() {
    check_pair("qwen3", &hf_fixture("qwen3_tied_yarn"), &hf_fixture("qwen3_untied")).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gemma3_pair_is_exact() {
    check_pair("gemma3", &hf_fixture("gemma3"), &hf_fixture("gemma3_draft")).await;
}

/// A target in the format of Gemma 3 4B–27B (the text model inside
/// Gemma3ForConditionalGeneration, a vision tower beside it) drafted by a text-only Gemma 3.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gemma3_multimodal_format_target_with_a_text_draft_is_exact() {
    check_pair("gemma3 multimodal", &hf_fixture("gemma3_multimodal"), &hf_fixture("gemma3_draft")).await;
}

/// The audit above has power on these models: a coordinator that resamples from p on
/// rejection fails it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_audit_rejects_a_wrong_rule_on_the_qwen3_pair() {
    let options = ClusterOptions {
        gamma: GammaChoice::Fixed(3),
        rule: RuleVariant::NaiveResampleFromTarget,
        ..ClusterOptions::default()
    };
    let cluster = Cluster::start(&hf_fixture("qwen3_tied_yarn"), &hf_fixture("qwen3_untied"), &options).await.unwrap();
    let report = audit(&cluster, true).await;
    eprintln!("qwen3 with the naive rule: audit {report}");
    assert_eq!(report["verdict"], "fail", "{report}");
    cluster.shutdown().await;
}
