//! The deterministic proposers (`--proposer ngram|suffix|model+ngram`) through the cluster:
//! the output law, greedy identity, and the suffix node's memory bound.
//!
//! The law audits run [`law_through_cluster::law_run`] on tables after a prompt that
//! repeats itself, `0 1 2 0 1`: its last two tokens occurred before, followed by 2, so the
//! n-gram proposes 2, the token the target finds least likely there (p = 0.1), and then
//! copies on; later rounds propose from matches in the output, or nothing (an empty block:
//! a target-only round). Each audit fails a correct system with probability
//! [`FALSE_FAILURE`]. Its power is shown on the n-gram node against the rule that treats
//! the one-hot q wrongly (on a rejection it draws from p without taking x off, so it emits
//! x again with probability p(x)): the first token's law moves from p(2) = 0.1 to 0.19, and
//! [`POWER_SAMPLES`] reject that with a p-value far below [`FALSE_FAILURE`] (5 000 gave
//! p = 2e-149, 2 000 gave p = 8e-55), whatever `SPECD_LAW_SAMPLES` says.

use std::time::Duration;

use specd_coordinator::{GammaChoice, RuleVariant};
use specd_draft_node::DraftNode;
use specd_draft_node::proposer::{MatchSpan, ProposerConfig, ProposerKind};
use specd_e2e::law_tables::{EffectiveTarget, VOCAB, cell, tables_after};
use specd_e2e::{Cluster, ClusterOptions, continuation_request, hf_fixture, scratch_dir, stream_to_end};
use specd_model::{DType, DeviceSpec};
use specd_node::NodeConfig;
use specd_proto::v1::draft_service_client::DraftServiceClient;
use specd_proto::v1::generate_request::Prompt;
use specd_proto::v1::{
    GenerateRequest, InfoRequest, OpenSessionRequest, ProposalSource, ProposeRequest, ReleaseRequest,
    SamplingParams as WireSampling, SamplingSettings, Speculation, StoppingCriteria, TokenIds,
};
use specd_sampling::chi2::chi_square_test;
use specd_sampling::law::target_sequence_law;
use specd_sampling::{Purpose, SamplingParams, StreamKey, Truncation};

use crate::law_through_cluster::{FALSE_FAILURE, law_run, samples};

/// Samples of the check that the audit catches the wrong rule: fixed, since its power is
/// what it shows.
const POWER_SAMPLES: u64 = 5_000;

/// Repeats itself: the n-gram proposes 2 after it, where p = (0.6, 0.3, 0.1).
const PROMPT: [u32; 5] = [0, 1, 2, 0, 1];

fn proposer(kind: ProposerKind) -> ProposerConfig {
    // A small suffix index: sessions keep evicting older ones during the audit.
    ProposerConfig { kind, span: MatchSpan::new(2, 4).unwrap(), suffix_budget_tokens: 4096 }
}

fn options(kind: ProposerKind, rule: RuleVariant) -> ClusterOptions {
    ClusterOptions {
        gamma: GammaChoice::Fixed(3),
        // K = 2 of 3 tokens for the model's candidates: the complement branch is exercised.
        truncation: Truncation::new(0.05, 2).unwrap(),
        rule,
        proposer: proposer(kind),
        ..ClusterOptions::default()
    }
}

async fn audit(kind: ProposerKind) {
    let run = law_run(options(kind, RuleVariant::Exact), SamplingParams::default(), false, samples(), &PROMPT).await;
    assert!(run.p_value > FALSE_FAILURE, "{kind}: p = {}", run.p_value);
    // No session lost its draft: the law held with the proposer at work throughout.
    assert_eq!(run.fallbacks, 0, "{kind}: draft losses");
    // The audit saw what it is about: deterministic candidates, some accepted, some not.
    let deterministic: Vec<_> = run.by_proposer.iter().filter(|(name, _)| name.as_str() != "model").collect();
    let (proposed, accepted) = deterministic.iter().fold((0, 0), |(p, a), (_, t)| (p + t.proposed, a + t.accepted));
    assert!(proposed > 0 && accepted > 0 && accepted < proposed, "{kind}: {:?}", run.by_proposer);
    if kind == ProposerKind::ModelNgram {
        assert!(
            run.by_proposer.get("model").is_some_and(|t| t.proposed > 0),
            "no model candidate: {:?}",
            run.by_proposer
        );
    }
}

#[tokio::test(flavor = "current_thread")]
async fn law_with_the_ngram_proposer() {
    audit(ProposerKind::Ngram).await;
}

#[tokio::test(flavor = "current_thread")]
async fn law_with_the_suffix_proposer() {
    audit(ProposerKind::Suffix).await;
}

#[tokio::test(flavor = "current_thread")]
async fn law_with_the_model_and_ngram_proposer() {
    audit(ProposerKind::ModelNgram).await;
}

#[tokio::test(flavor = "current_thread")]
async fn a_rule_that_mistreats_one_hot_q_is_caught() {
    let options = options(ProposerKind::Ngram, RuleVariant::NaiveResampleFromTarget);
    let run = law_run(options, SamplingParams::default(), false, POWER_SAMPLES, &PROMPT).await;
    assert!(run.p_value < FALSE_FAILURE, "the naive rule passed with the n-gram proposer: p = {}", run.p_value);
}

/// Pairs of the check below: a correct system fails it with probability [`FALSE_FAILURE`].
const SAME_SEED_PAIRS: u64 = 10_000;
/// Pairs of the same check against the wrong index: 2 000 gave p = 3e-24.
const SAME_SEED_POWER_PAIRS: u64 = 2_000;

/// A suffix node whose index holds one sequence, and sessions that each repeat the seed of
/// the one before: seed s runs once (its sequence fills the index), then again, counted. The
/// second run's acceptance draws are the ones that chose the sequence it would copy from,
/// so copying from it would bias the law (the first token's p(0) = 0.6 moves to about 0.47);
/// the index leaves same-seed sequences out. Returns the χ² p-value of the counted runs'
/// 3-token continuations against the target's exact law, and the suffix candidates proposed.
async fn same_seed_pairs(pairs: u64, wrong: bool) -> (f64, u64) {
    const LENGTH: usize = 3;
    let dir = scratch_dir(&format!("suffix-same-seed-{wrong}"));
    let pair = tables_after(&PROMPT, LENGTH);
    let files = pair.write(&dir).unwrap();
    let config = ProposerConfig { suffix_budget_tokens: PROMPT.len() + LENGTH, ..proposer(ProposerKind::Suffix) };
    let options = ClusterOptions { proposer: config, ..options(ProposerKind::Suffix, RuleVariant::Exact) };
    let cluster = Cluster::start(&files.target, &files.draft, &options).await.unwrap();
    if wrong {
        cluster.draft.lookup().expect("a suffix node").let_same_seed_propose();
    }
    let mut client = cluster.client().await.unwrap();
    let mut counts = vec![0u64; VOCAB.pow(LENGTH as u32)];
    let mut suffix_proposed = 0;
    for seed in 0..pairs {
        for counted in [false, true] {
            let sampling = WireSampling { temperature: Some(1.0), seed: Some(seed), ..Default::default() };
            let request = continuation_request(&PROMPT, LENGTH, sampling, false);
            let (tokens, stats) = stream_to_end(&mut client, request).await.unwrap();
            assert_eq!(tokens.len(), LENGTH);
            if counted {
                counts[cell(&tokens)] += 1;
                suffix_proposed += stats.by_proposer.get("suffix").map_or(0, |t| t.proposed);
            }
        }
    }
    cluster.shutdown().await;
    let model = EffectiveTarget { table: pair.target, params: SamplingParams::default() }.after(PROMPT.len());
    let mut expected = vec![0.0; counts.len()];
    for (seq, p) in target_sequence_law(&model, &PROMPT, LENGTH) {
        expected[cell(&seq)] = p;
    }
    let p_value = chi_square_test(&counts, &expected).unwrap().p_value;
    eprintln!(
        "suffix, same seed twice (wrong index: {wrong}): {pairs} pairs, {suffix_proposed} suffix candidates: χ² p-value {p_value:.4e}"
    );
    (p_value, suffix_proposed)
}

#[tokio::test(flavor = "current_thread")]
async fn suffix_sessions_repeating_a_held_seed_keep_the_law() {
    let (p, proposed) = same_seed_pairs(SAME_SEED_PAIRS, false).await;
    assert!(p > FALSE_FAILURE, "p = {p}");
    // The session's own sequence still proposes (the prompt repeats itself).
    assert!(proposed > 0);
    let (p, _) = same_seed_pairs(SAME_SEED_POWER_PAIRS, true).await;
    assert!(p < FALSE_FAILURE, "copying from the same seed's sequence passed: p = {p}");
}

/// Prompts that repeat a random pattern, so that every proposer finds matches.
fn repetitive_prompts() -> Vec<Vec<u32>> {
    let mut rng = StreamKey::new(27, 0, 0, Purpose::Plain).stream();
    (0..20)
        .map(|i| {
            let pattern: Vec<u32> = (0..3 + i % 5).map(|_| 3 + rng.next_u32() % 93).collect();
            [pattern.clone(), pattern.clone(), pattern[..2].to_vec()].concat()
        })
        .collect()
}

fn greedy(prompt: Vec<u32>, gamma: u32) -> GenerateRequest {
    GenerateRequest {
        prompt: Some(Prompt::TokenIds(TokenIds { ids: prompt })),
        sampling: Some(WireSampling { temperature: Some(0.0), ..Default::default() }),
        stopping: Some(StoppingCriteria { max_new_tokens: Some(16), ignore_eos: true, ..Default::default() }),
        speculation: Some(Speculation { gamma: Some(gamma), dense: false }),
        ..Default::default()
    }
}

#[tokio::test(flavor = "current_thread")]
async fn greedy_output_is_the_targets_with_each_proposer() {
    // f64 models, as in `greedy_hf`: a block's scores equal one-token passes' to ~1e-15.
    let target = hf_fixture("llama_gqa_untied");
    let draft = hf_fixture("llama_tied");
    for kind in [ProposerKind::Ngram, ProposerKind::Suffix, ProposerKind::ModelNgram] {
        let options = ClusterOptions { dtype: DType::F64, proposer: proposer(kind), ..ClusterOptions::default() };
        let cluster = Cluster::start(&target, &draft, &options).await.unwrap();
        let mut client = cluster.client().await.unwrap();
        let (mut proposed, mut skipped) = (0, 0);
        for prompt in repetitive_prompts() {
            let plain = client.generate(greedy(prompt.clone(), 0)).await.unwrap().into_inner();
            let spec = client.generate(greedy(prompt.clone(), 4)).await.unwrap().into_inner();
            assert_eq!(plain.token_ids.len(), 16);
            assert_eq!(spec.token_ids, plain.token_ids, "{kind}, prompt {prompt:?}");
            let stats = spec.stats.unwrap();
            proposed +=
                stats.by_proposer.iter().filter(|(k, _)| k.as_str() != "model").map(|(_, t)| t.proposed).sum::<u64>();
            // An n-gram draft announces that it proposes only after a match: the coordinator
            // asks it only then, so every empty proposal skipped the round trip. The others
            // are always asked.
            match kind {
                ProposerKind::Ngram => assert_eq!(stats.proposals_skipped, stats.empty_proposals, "prompt {prompt:?}"),
                _ => assert_eq!(stats.proposals_skipped, 0, "{kind}"),
            }
            skipped += stats.proposals_skipped;
        }
        assert!(proposed > 0, "{kind} proposed nothing on prompts that repeat themselves");
        if kind == ProposerKind::Ngram {
            assert!(skipped > 0, "the output ran into no round without a match");
        }
        cluster.shutdown().await;
    }
}

/// `ProposeRequest.model_only`, which a coordinator sends once a session's copies stopped
/// paying: a `model+ngram` draft then draws every candidate from its model, even after a
/// match; without it, the same request's first candidate is the copy. And
/// `OpenSessionResponse.copies_besides_model`, which such a draft sets.
#[tokio::test(flavor = "current_thread")]
async fn a_model_and_ngram_draft_asked_for_its_model_only_copies_nothing() {
    let (target, draft) = (hf_fixture("llama_gqa_untied"), hf_fixture("llama_tied"));
    let options = ClusterOptions { proposer: proposer(ProposerKind::ModelNgram), ..ClusterOptions::default() };
    let cluster = Cluster::start(&target, &draft, &options).await.unwrap();
    let mut client = DraftServiceClient::connect(cluster.draft_url.clone()).await.unwrap();
    // Ends in a repeat of its first two tokens: the 2-gram match proposes 9 first.
    let prompt = vec![7u32, 8, 9, 30, 7, 8];
    for model_only in [false, true] {
        let session_id = format!("model-only-{model_only}");
        let open = OpenSessionRequest {
            session_id: session_id.clone(),
            prompt_token_ids: prompt.clone(),
            sampling: Some(SamplingSettings::from(&SamplingParams::default())),
            seed: 1,
            ..Default::default()
        };
        // It says so as the session opens: the coordinator learns α from its model's draws.
        assert!(client.open_session(open).await.unwrap().into_inner().copies_besides_model);
        let request = ProposeRequest {
            session_id: session_id.clone(),
            rollback_to: prompt.len() as u32,
            gamma: 3,
            truncation: Some(Truncation::new(0.05, 8).unwrap().into()),
            model_only,
            ..Default::default()
        };
        let block = client.propose(request).await.unwrap().into_inner();
        let sources: Vec<_> = block.positions.iter().map(|p| p.source()).collect();
        assert_eq!(sources.len(), 3);
        if model_only {
            assert!(sources.iter().all(|s| *s == ProposalSource::Model), "{sources:?}");
        } else {
            assert_eq!((sources[0], block.positions[0].token_id), (ProposalSource::PromptMatch, 9), "{sources:?}");
        }
        client.release(ReleaseRequest { session_id, ..Default::default() }).await.unwrap();
    }
    cluster.shutdown().await;
}

/// A node config for a draft with no model: the path does not exist, and nothing reads it.
fn modelless_config() -> NodeConfig {
    NodeConfig {
        model: scratch_dir("no-model").join("absent.json"),
        device: DeviceSpec::Cpu,
        dtype: DType::F32,
        engine: Default::default(),
        attention: Default::default(),
        max_sessions: 64,
        prefix_cache: Default::default(),
        kv_budget: specd_model::KvBudget::Unbounded,
        forward_delay: Duration::ZERO,
        session_ttl: None,
        tls: Default::default(),
        metrics: None,
        threads: None,
        sampling_threads: None,
        pin_threads: false,
        batch: Default::default(),
        allow_unused_weights: false,
        distributions: Default::default(),
        faults: Default::default(),
    }
}

#[tokio::test(flavor = "current_thread")]
async fn a_suffix_node_under_32_concurrent_sessions_stays_within_its_memory_bound() {
    const SESSIONS: usize = 32;
    const BUDGET: usize = 2048;
    let config = ProposerConfig { suffix_budget_tokens: BUDGET, ..proposer(ProposerKind::Suffix) };
    let node = DraftNode::start(modelless_config(), config).await.unwrap();
    let lookup = node.lookup().expect("a suffix node has no model").clone();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let (stop, mut stopped) = tokio::sync::watch::channel(false);
    let server = tokio::spawn(specd_draft_node::serve(listener, node, async move {
        let _ = stopped.wait_for(|s| *s).await;
    }));
    let client = DraftServiceClient::connect(url).await.unwrap();
    let mut peak_tokens = 0;
    // Waves of 32 sessions open at once, each 40 rounds long: the index fills past its
    // budget on the second wave and keeps evicting after that.
    for wave in 0..4u64 {
        let mut tasks = Vec::new();
        for s in 0..SESSIONS as u64 {
            let mut client = client.clone();
            tasks.push(tokio::spawn(async move {
                let id = format!("w{wave}-s{s}");
                let mut rng = StreamKey::new(wave * 1000 + s, 0, 0, Purpose::Plain).stream();
                let prompt: Vec<u32> = (0..24).map(|_| rng.next_u32() % 50).collect();
                let sampling = SamplingSettings::from(&SamplingParams::default());
                let open = OpenSessionRequest {
                    session_id: id.clone(),
                    prompt_token_ids: prompt.clone(),
                    sampling: Some(sampling),
                    seed: s,
                    ..Default::default()
                };
                let opened = client.open_session(open).await.unwrap().into_inner();
                assert!(!opened.copies_besides_model && opened.proposes_only_after_match.is_none());
                (id, prompt, rng)
            }));
        }
        let mut sessions = Vec::new();
        for task in tasks {
            sessions.push(task.await.unwrap());
        }
        let info = client.clone().info(InfoRequest {}).await.unwrap().into_inner();
        assert_eq!(info.active_sessions as usize, SESSIONS);
        assert_eq!(info.proposer, "suffix");
        let mut tasks = Vec::new();
        for (id, prompt, mut rng) in sessions {
            let mut client = client.clone();
            let lookup = lookup.clone();
            tasks.push(tokio::spawn(async move {
                let (mut valid, mut pending) = (prompt.len(), Vec::new());
                for round in 0..40u32 {
                    let request = ProposeRequest {
                        session_id: id.clone(),
                        round,
                        rollback_to: valid as u32,
                        pending_token_ids: pending.clone(),
                        gamma: 4,
                        truncation: Some(Truncation::new(0.05, 8).unwrap().into()),
                        ..Default::default()
                    };
                    let block = client.propose(request).await.unwrap().into_inner();
                    assert!(block.positions.len() <= 4);
                    // As a coordinator would: some candidates accepted, then a token of its own.
                    let base = valid + pending.len();
                    let accepted = (rng.next_u32() as usize) % (block.positions.len() + 1);
                    valid = base + accepted;
                    pending = vec![rng.next_u32() % 50];
                    let size = lookup.index_size();
                    assert!(size.held_tokens <= size.budget_tokens && size.bytes <= size.byte_bound, "{size:?}");
                }
                client.release(ReleaseRequest { session_id: id, ..Default::default() }).await.unwrap();
            }));
        }
        for task in tasks {
            task.await.unwrap();
        }
        let size = lookup.index_size();
        assert!(size.held_tokens <= BUDGET && size.bytes <= size.byte_bound, "wave {wave}: {size:?}");
        peak_tokens = peak_tokens.max(size.held_tokens);
    }
    // The budget was reached (so the bound was tested, not just never approached).
    assert!(peak_tokens > BUDGET * 3 / 4, "the index held at most {peak_tokens} tokens");
    let _ = stop.send(true);
    server.await.unwrap().unwrap();
}
