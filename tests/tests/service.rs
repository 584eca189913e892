//! The cluster as a client sees it: greedy identity, cancellation, bad input, unreachable peers.

use std::time::{Duration, Instant};

use specd_coordinator::{CoordinatorConfig, GammaChoice, RuleVariant};
use specd_e2e::{Cluster, ClusterOptions, Table, scratch_dir};
use specd_proto::v1::draft_service_client::DraftServiceClient;
use specd_proto::v1::generate_request::Prompt;
use specd_proto::v1::{
    FinishReason, GenerateRequest, NextTokenLawRequest, OpenSessionRequest, SamplingParams, SamplingSettings,
    Speculation, StoppingCriteria, TokenIds,
};
use specd_sampling::{Purpose, StreamKey, Truncation};
use tokio_stream::StreamExt;
use tonic::Code;

const VOCAB: usize = 6;

/// Rows depending on the last token, with clear maxima: a deterministic greedy chain.
fn suffix_table(salt: u32) -> Table {
    let rules = (0..VOCAB as u32)
        .map(|last| {
            let mut rng = StreamKey::new(u64::from(last), salt, 0, Purpose::Plain).stream();
            let w: Vec<f64> = (0..VOCAB).map(|_| 0.05 + rng.next_uniform()).collect();
            let total: f64 = w.iter().sum();
            (vec![last], w.iter().map(|x| x / total).collect())
        })
        .collect();
    Table { vocab_size: VOCAB, default: vec![1.0 / VOCAB as f64; VOCAB], rules }
}

/// The table format's rules match the whole history; a suffix table needs `suffix` keys.
fn write_suffix_table(table: &Table, path: &std::path::Path) -> std::path::PathBuf {
    let rules: Vec<_> =
        table.rules.iter().map(|(suffix, probs)| serde_json::json!({"suffix": suffix, "probs": probs})).collect();
    let file = serde_json::json!({"vocab_size": table.vocab_size, "default": table.default, "rules": rules});
    std::fs::write(path, serde_json::to_vec(&file).unwrap()).unwrap();
    path.to_owned()
}

fn request(prompt: Vec<u32>, max_new_tokens: u32, temperature: f64, gamma: Option<u32>) -> GenerateRequest {
    GenerateRequest {
        prompt: Some(Prompt::TokenIds(TokenIds { ids: prompt })),
        sampling: Some(SamplingParams { temperature: Some(temperature), seed: Some(1), ..Default::default() }),
        stopping: Some(StoppingCriteria { max_new_tokens: Some(max_new_tokens), ..Default::default() }),
        speculation: Some(Speculation { gamma, dense: false }),
        ..Default::default()
    }
}

async fn start(name: &str, target: &Table, draft: &Table) -> Cluster {
    start_with(name, target, draft, &ClusterOptions::default()).await
}

async fn start_with(name: &str, target: &Table, draft: &Table, options: &ClusterOptions) -> Cluster {
    let dir = scratch_dir(name);
    let t = write_suffix_table(target, &dir.join("target.json"));
    let d = write_suffix_table(draft, &dir.join("draft.json"));
    Cluster::start(&t, &d, options).await.unwrap()
}

fn prompts() -> Vec<Vec<u32>> {
    (0..50u32).map(|i| (0..=(i % 4)).map(|j| (i * 7 + j * 3) % VOCAB as u32).collect()).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn greedy_speculation_equals_target_only_greedy() {
    let target = suffix_table(1);
    for (name, draft, all_accepted) in [("greedy-same", target.clone(), true), ("greedy-other", suffix_table(2), false)]
    {
        let cluster = start(name, &target, &draft).await;
        let mut client = cluster.client().await.unwrap();
        let (mut drafted, mut accepted) = (0, 0);
        for prompt in prompts() {
            let plain = client.generate(request(prompt.clone(), 24, 0.0, Some(0))).await.unwrap().into_inner();
            let spec = client.generate(request(prompt.clone(), 24, 0.0, Some(4))).await.unwrap().into_inner();
            assert_eq!(spec.token_ids, plain.token_ids, "{name}, prompt {prompt:?}");
            assert_eq!(plain.token_ids.len(), 24);
            let stats = spec.stats.unwrap();
            drafted += stats.draft_tokens;
            accepted += stats.accepted_tokens;
        }
        if all_accepted {
            assert_eq!(accepted, drafted, "a draft equal to the target has every token accepted");
        } else {
            assert!(accepted < drafted, "a different draft is sometimes rejected");
        }
        cluster.shutdown().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dropped_stream_releases_both_sessions_within_a_second() {
    let cluster = start("cancel", &suffix_table(1), &suffix_table(2)).await;
    let mut client = cluster.client().await.unwrap();
    let mut stream = client.generate_stream(request(vec![1, 2], 4000, 1.0, Some(3))).await.unwrap().into_inner();
    let first = stream.next().await.unwrap().unwrap();
    assert!(!first.token_ids.is_empty());
    assert_eq!(cluster.target_info().await.unwrap().active_sessions, 1);
    drop(stream);
    let dropped = Instant::now();
    loop {
        let (t, d) = (cluster.target_info().await.unwrap(), cluster.draft_info().await.unwrap());
        if t.active_sessions == 0 && d.active_sessions == 0 {
            break;
        }
        assert!(dropped.elapsed() < Duration::from_secs(1), "sessions still open: target {t:?}, draft {d:?}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    cluster.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn finished_generations_leave_no_sessions() {
    let cluster = start("finish", &suffix_table(1), &suffix_table(2)).await;
    let mut client = cluster.client().await.unwrap();
    let reply = client.generate(request(vec![3], 10, 1.0, Some(2))).await.unwrap().into_inner();
    assert_eq!(reply.finish_reason, FinishReason::Length as i32);
    assert_eq!(reply.usage.unwrap().completion_tokens, 10);
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(cluster.target_info().await.unwrap().active_sessions, 0);
    assert_eq!(cluster.draft_info().await.unwrap().active_sessions, 0);
    cluster.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wire_bytes_split_by_role_add_up_to_the_totals() {
    let cluster = start("wire-bytes", &suffix_table(1), &suffix_table(2)).await;
    let mut client = cluster.client().await.unwrap();
    for gamma in [0, 3] {
        let stats =
            client.generate(request(vec![2, 4], 16, 1.0, Some(gamma))).await.unwrap().into_inner().stats.unwrap();
        let sent = stats.wire_bytes_sent_to_draft + stats.wire_bytes_sent_to_target;
        let received = stats.wire_bytes_received_from_draft + stats.wire_bytes_received_from_target;
        assert_eq!((sent, received), (stats.wire_bytes_sent, stats.wire_bytes_received), "γ = {gamma}: {stats:?}");
        assert!(stats.wire_bytes_sent_to_target > 0 && stats.wire_bytes_received_from_target > 0, "{stats:?}");
        if gamma == 0 {
            // Target-only rounds never talk to the draft.
            assert_eq!((stats.wire_bytes_sent_to_draft, stats.wire_bytes_received_from_draft), (0, 0), "{stats:?}");
        } else {
            assert!(stats.wire_bytes_sent_to_draft > 0 && stats.wire_bytes_received_from_draft > 0, "{stats:?}");
        }
    }
    cluster.shutdown().await;
}

/// A draft equal to the target, greedy: every candidate is accepted and every guess right, so
/// every round after the first can take a block pushed ahead; a slow target pass makes sure
/// the push is there first.
/// Over gRPC and with the rounds handed over in process (`specd up`'s default), whose reply
/// side carries the pushed blocks the same way.
fn all_hits(corrupt_pushes: bool, in_process_rounds: bool) -> ClusterOptions {
    ClusterOptions {
        optimistic: true,
        forward_delays: (Duration::from_millis(5), Duration::ZERO),
        corrupt_pushes,
        in_process_rounds,
        ..ClusterOptions::default()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rounds_take_the_blocks_the_draft_pushed_ahead() {
    let target = suffix_table(1);
    for in_process in [false, true] {
        let cluster = start_with("pushed", &target, &target, &all_hits(false, in_process)).await;
        let mut client = cluster.client().await.unwrap();
        for prompt in prompts().into_iter().take(5) {
            let plain = client.generate(request(prompt.clone(), 30, 0.0, Some(0))).await.unwrap().into_inner();
            let spec = client.generate(request(prompt.clone(), 30, 0.0, Some(3))).await.unwrap().into_inner();
            assert_eq!(spec.token_ids, plain.token_ids, "prompt {prompt:?}");
            let stats = spec.stats.unwrap();
            // 30 tokens: 7 rounds of 4, then one of 2 whose γ = 1 no block was drafted for.
            assert_eq!((stats.rounds, stats.optimistic_attempts), (8, 7), "{stats:?}");
            assert_eq!(stats.optimistic_hits, 6, "{stats:?}");
            assert!(stats.optimistic_pushed >= 4 && stats.optimistic_pushed <= stats.optimistic_hits, "{stats:?}");
            assert_eq!(stats.draft_fallbacks, 0, "{stats:?}");
        }
        assert_eq!(cluster.in_process_round_streams().1 > 0, in_process, "in process: {in_process}");
        cluster.shutdown().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_draft_pushing_garbage_is_dropped_and_the_generation_goes_on() {
    let target = suffix_table(1);
    for in_process in [false, true] {
        let cluster = start_with("pushed-garbage", &target, &target, &all_hits(true, in_process)).await;
        let mut client = cluster.client().await.unwrap();
        let prompt = vec![1, 3];
        let plain = client.generate(request(prompt.clone(), 30, 0.0, Some(0))).await.unwrap().into_inner();
        let spec = client.generate(request(prompt.clone(), 30, 0.0, Some(3))).await.unwrap().into_inner();
        assert_eq!(spec.token_ids, plain.token_ids, "in process: {in_process}");
        let stats = spec.stats.unwrap();
        assert!(stats.draft_fallbacks >= 1, "{stats:?}");
        assert_eq!(stats.optimistic_pushed, 0, "{stats:?}");
        assert_eq!(cluster.in_process_round_streams().1 > 0, in_process, "in process: {in_process}");
        cluster.shutdown().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_input_is_invalid_argument_with_a_reason() {
    let cluster = start("bad-input", &suffix_table(1), &suffix_table(2)).await;
    let mut client = cluster.client().await.unwrap();
    let sampling = |s: SamplingParams| GenerateRequest { sampling: Some(s), ..request(vec![1], 4, 1.0, None) };
    let stopping = |s: StoppingCriteria| GenerateRequest {
        stopping: Some(StoppingCriteria { max_new_tokens: Some(4), ..s }),
        ..request(vec![1], 4, 1.0, None)
    };
    // Every field a client can get wrong, each named in the message.
    let cases = [
        (request(vec![], 4, 1.0, None), "prompt is empty"),
        (GenerateRequest { prompt: None, ..request(vec![1], 4, 1.0, None) }, "prompt is empty"),
        (request(vec![1], 0, 1.0, None), "max_new_tokens is 0"),
        (request(vec![1], 100_000, 1.0, None), "does not fit"),
        (request(vec![1], 4, -0.5, None), "temperature -0.5"),
        (request(vec![1], 4, f64::NAN, None), "temperature NaN"),
        (sampling(SamplingParams { top_p: Some(0.0), ..Default::default() }), "top_p 0"),
        (sampling(SamplingParams { top_p: Some(1.5), ..Default::default() }), "top_p 1.5"),
        (sampling(SamplingParams { top_k: Some(-1), ..Default::default() }), "top_k -1 is negative"),
        (request(vec![1], 4, 1.0, Some(1000)), "gamma 1000 is above the maximum"),
        (request(vec![99], 4, 1.0, None), "prompt token 99 is outside the vocabulary"),
        (sampling(SamplingParams { min_p: Some(1.5), ..Default::default() }), "min_p 1.5"),
        (sampling(SamplingParams { repetition_penalty: Some(0.0), ..Default::default() }), "repetition_penalty 0"),
        (sampling(SamplingParams { presence_penalty: Some(3.0), ..Default::default() }), "presence_penalty 3"),
        (sampling(SamplingParams { frequency_penalty: Some(-2.5), ..Default::default() }), "frequency_penalty -2.5"),
        (stopping(StoppingCriteria { stop_token_ids: vec![99], ..Default::default() }), "stop token 99"),
        (stopping(StoppingCriteria { stop_strings: vec![String::new()], ..Default::default() }), "stop_strings"),
    ];
    for (req, needle) in cases {
        let status = client.generate(req.clone()).await.unwrap_err();
        assert_eq!(status.code(), Code::InvalidArgument, "{req:?}: {status:?}");
        assert!(status.message().contains(needle), "{needle:?} not in {:?}", status.message());
        let status = client.generate_stream(req).await.unwrap_err();
        assert_eq!(status.code(), Code::InvalidArgument);
    }
    cluster.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unreachable_node_is_unavailable_with_its_address() {
    let free = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = format!("http://{}", free.local_addr().unwrap());
    drop(free);
    let config = CoordinatorConfig {
        targets: vec![address.clone()],
        drafts: vec![],
        default_gamma: GammaChoice::Fixed(4),
        default_max_new_tokens: 16,
        truncation: Truncation::new(0.0, 8).unwrap(),
        node_timeout: Duration::from_secs(2),
        rule: RuleVariant::Exact,
        verification: specd_sampling::Verification::default(),
        optimistic: true,
        tree: Default::default(),
        metrics: None,
        tls: Default::default(),
        admission: Default::default(),
        tokenizer: None,
        generation_config: true,
        discovery: Default::default(),
        in_process: Default::default(),
    };
    let err = specd_coordinator::connect(&config).await.unwrap_err();
    assert_eq!(err.code(), Code::Unavailable);
    assert!(err.to_string().contains(&address), "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nodes_with_different_vocabularies_or_tokenizers_are_refused_naming_both() {
    let dir = scratch_dir("incompatible");
    let write = |name: &str, body: &str| {
        let path = dir.join(name);
        std::fs::write(&path, body).unwrap();
        path
    };
    let target = write("target.json", r#"{"vocab_size": 2, "tokens": ["yes", "no"], "default": [0.5, 0.5]}"#);
    let renamed = write("renamed.json", r#"{"vocab_size": 2, "tokens": ["oui", "non"], "default": [0.5, 0.5]}"#);
    // The same tokenizer with a padding row more than the target has: accepted, since the
    // draft then draws from the target's ids only (tests/tests/vocab_padding.rs).
    let wider = write("wider.json", r#"{"vocab_size": 3, "tokens": ["yes", "no"], "default": [0.5, 0.25, 0.25]}"#);
    let unnamed = write("unnamed.json", r#"{"vocab_size": 3, "default": [0.5, 0.25, 0.25]}"#);
    let err = Cluster::start(&target, &renamed, &ClusterOptions::default()).await.unwrap_err().to_string();
    assert!(err.contains("tokenizers differ") && err.contains("target.json") && err.contains("renamed.json"), "{err}");
    let cluster = Cluster::start(&target, &wider, &ClusterOptions::default()).await.unwrap();
    assert_eq!(cluster.draft_info().await.unwrap().vocab_size, 3);
    cluster.shutdown().await;
    let err = Cluster::start(&target, &unnamed, &ClusterOptions::default()).await.unwrap_err().to_string();
    assert!(err.contains("tokenizers differ") && err.contains("unnamed.json"), "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn text_prompts_text_output_and_stop_strings() {
    let dir = scratch_dir("text");
    let names: Vec<String> = ["red", "green", "blue", "cyan", "pink", "gold"].iter().map(|s| s.to_string()).collect();
    let with_names = |table: &Table, file: &str| {
        let rules: Vec<_> =
            table.rules.iter().map(|(suffix, probs)| serde_json::json!({"suffix": suffix, "probs": probs})).collect();
        let body = serde_json::json!({"vocab_size": VOCAB, "tokens": names, "default": table.default, "rules": rules});
        let path = dir.join(file);
        std::fs::write(&path, serde_json::to_vec(&body).unwrap()).unwrap();
        path
    };
    let target = with_names(&suffix_table(1), "target.json");
    let draft = with_names(&suffix_table(2), "draft.json");
    let cluster = Cluster::start(&target, &draft, &ClusterOptions::default()).await.unwrap();
    let mut client = cluster.client().await.unwrap();
    let text_request = |stop: Vec<String>| GenerateRequest {
        prompt: Some(Prompt::Text("red green".into())),
        stopping: Some(StoppingCriteria { max_new_tokens: Some(12), stop_strings: stop, ..Default::default() }),
        ..request(vec![], 12, 0.0, Some(3))
    };
    let full = client.generate(text_request(vec![])).await.unwrap().into_inner();
    let words: Vec<&str> = full.token_ids.iter().map(|&t| names[t as usize].as_str()).collect();
    // The text is what the output adds to the prompt's text: its first word after a space.
    assert_eq!(full.text, format!(" {}", words.join(" ")), "the text is the decoded output");
    assert_eq!(full.usage.unwrap().prompt_tokens, 2);
    // Stop at the third generated word: the text ends before it, the tokens include it.
    let stop = format!(" {}", words[2]);
    let first = full.text.find(&stop).unwrap();
    let stopped = client.generate(text_request(vec![stop.clone()])).await.unwrap().into_inner();
    assert_eq!(stopped.finish_reason, FinishReason::Stop as i32);
    assert_eq!(stopped.text, full.text[..first]);
    let kept = stopped.token_ids.len();
    assert!(kept <= 3 && full.token_ids[..kept] == stopped.token_ids[..], "{stopped:?}");
    cluster.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn next_token_law_is_the_targets_effective_distribution() {
    let target = suffix_table(11);
    let cluster = start("next-token-law", &target, &suffix_table(12)).await;
    let mut client = cluster.client().await.unwrap();
    let law = |prompt: Vec<u32>, generated: Vec<u32>, sampling: SamplingParams| NextTokenLawRequest {
        prompt_token_ids: prompt,
        generated_token_ids: generated,
        sampling: Some(sampling),
    };
    // T = 1: the suffix table's row for the last token, every token listed.
    let t1 = SamplingParams { temperature: Some(1.0), ..Default::default() };
    let reply = client.next_token_law(law(vec![0], vec![3], t1)).await.unwrap().into_inner();
    assert_eq!(reply.token_ids, (0..VOCAB as u32).collect::<Vec<_>>());
    for (p, expected) in reply.probs.iter().zip(target.rules[3].1.iter()) {
        assert!((p - expected).abs() < 1e-6, "{:?} vs {:?}", reply.probs, target.rules[3].1);
    }
    // top-k 2: the two most likely tokens of that row, renormalised.
    let top2 = SamplingParams { temperature: Some(1.0), top_k: Some(2), ..Default::default() };
    let reply = client.next_token_law(law(vec![0, 3], vec![], top2)).await.unwrap().into_inner();
    let mut ranked: Vec<(usize, f64)> = target.rules[3].1.iter().copied().enumerate().collect();
    ranked.sort_by(|a, b| b.1.total_cmp(&a.1));
    let mut best: Vec<u32> = ranked[..2].iter().map(|(i, _)| *i as u32).collect();
    best.sort_unstable();
    assert_eq!(reply.token_ids, best);
    assert!((reply.probs.iter().sum::<f64>() - 1.0).abs() < 1e-9);
    // Greedy: one token with probability 1.
    let greedy = SamplingParams { temperature: Some(0.0), ..Default::default() };
    let reply = client.next_token_law(law(vec![3], vec![], greedy)).await.unwrap().into_inner();
    assert_eq!(reply.token_ids, vec![ranked[0].0 as u32]);
    assert_eq!(reply.probs, vec![1.0]);
    for bad in [
        law(vec![], vec![], SamplingParams::default()),
        law(vec![VOCAB as u32], vec![], SamplingParams::default()),
        law(vec![1], vec![], SamplingParams { top_p: Some(0.0), ..Default::default() }),
    ] {
        let status = client.next_token_law(bad.clone()).await.unwrap_err();
        assert_eq!(status.code(), Code::InvalidArgument, "{bad:?}: {status:?}");
    }
    cluster.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nodes_release_sessions_nobody_uses_after_the_ttl() {
    let dir = scratch_dir("session-ttl");
    let t = write_suffix_table(&suffix_table(1), &dir.join("target.json"));
    let d = write_suffix_table(&suffix_table(2), &dir.join("draft.json"));
    let options = ClusterOptions { session_ttl: Some(Duration::from_millis(300)), ..ClusterOptions::default() };
    let cluster = Cluster::start(&t, &d, &options).await.unwrap();
    // A coordinator that opened a session and died: nobody will release it.
    let mut draft = DraftServiceClient::connect(cluster.draft_url.clone()).await.unwrap();
    let open = OpenSessionRequest {
        session_id: "orphan".into(),
        prompt_token_ids: vec![1, 2],
        sampling: Some(SamplingSettings {
            temperature: 1.0,
            top_p: 1.0,
            repetition_penalty: 1.0,
            ..Default::default()
        }),
        seed: 1,
        ..Default::default()
    };
    draft.open_session(open).await.unwrap();
    assert_eq!(cluster.draft_info().await.unwrap().active_sessions, 1);
    // Generations in use are not touched: one runs while the orphan expires.
    let mut client = cluster.client().await.unwrap();
    let reply = client.generate(request(vec![3], 20, 1.0, Some(2))).await.unwrap().into_inner();
    assert_eq!(reply.usage.unwrap().completion_tokens, 20);
    let deadline = Instant::now() + Duration::from_secs(3);
    while cluster.draft_info().await.unwrap().active_sessions > 0 {
        assert!(Instant::now() < deadline, "the orphan session was never released");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    cluster.shutdown().await;
}

/// Across a slow link to the draft, a session that knows drafting pays only by so much does
/// not wait two round trips for its draft session to open: its first rounds run target-only,
/// and the draft, once open, is handed the tokens they committed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_decodes_target_only_while_its_draft_session_opens() {
    // Rows keyed on the last two tokens: a draft that missed or doubled a token committed
    // while it was opening drafts from the wrong row.
    let mut target = suffix_table(1);
    for (a, b) in (0..VOCAB as u32).flat_map(|a| (0..VOCAB as u32).map(move |b| (a, b))) {
        let mut rng = StreamKey::new(u64::from(a * VOCAB as u32 + b), 7, 0, Purpose::Plain).stream();
        let w: Vec<f64> = (0..VOCAB).map(|_| 0.05 + rng.next_uniform()).collect();
        let total: f64 = w.iter().sum();
        target.rules.push((vec![a, b], w.iter().map(|x| x / total).collect()));
    }
    let options = ClusterOptions {
        gamma: GammaChoice::Adaptive { max: 6 },
        optimistic: false,
        // A target pass of 40 ms and a 50 ms round trip to a draft that agrees with it:
        // drafting pays about 3×, so waiting for the draft is worth 40·(1 − 1/3) ≈ 27 ms,
        // less than the 100 ms its two calls take.
        forward_delays: (Duration::from_millis(40), Duration::ZERO),
        draft_one_way_delay: Some(Duration::from_millis(25)),
        ..ClusterOptions::default()
    };
    let cluster = start_with("draft-opens", &target, &target, &options).await;
    let mut client = cluster.client().await.unwrap();
    let first_round = |stats: &Option<specd_proto::v1::SpeculationStats>| stats.as_ref().map(|s| s.draft_tokens);
    for (i, prompt) in prompts().into_iter().take(4).enumerate() {
        let plain = client.generate(request(prompt.clone(), 30, 0.0, Some(0))).await.unwrap().into_inner();
        let mut stream = client.generate_stream(request(prompt.clone(), 30, 0.0, None)).await.unwrap().into_inner();
        let first = stream.next().await.unwrap().unwrap();
        let (mut tokens, mut last) = (first.token_ids.clone(), None);
        while let Some(message) = stream.next().await {
            let message = message.unwrap();
            tokens.extend_from_slice(&message.token_ids);
            last = message.stats.or(last);
        }
        assert_eq!(tokens, plain.token_ids, "prompt {prompt:?}");
        let stats = last.unwrap();
        if i == 0 {
            // Nothing learnt yet to weigh the wait by: the first session waits.
            assert!(first_round(&first.stats).unwrap() > 0, "{:?}", first.stats);
        } else {
            assert_eq!(first_round(&first.stats), Some(0), "session {i} waited for its draft: {:?}", first.stats);
            assert!(stats.draft_tokens > 0, "it drafts once the draft is open: {stats:?}");
        }
        // A draft equal to the target has every token accepted, so long as it holds what
        // the rounds before it committed.
        assert_eq!(stats.accepted_tokens, stats.draft_tokens, "session {i}: {stats:?}");
        assert_eq!(stats.draft_fallbacks, 0, "session {i}: {stats:?}");
    }
    // One token is one target-only round, over before the draft session has opened: the
    // generation answers, and releases it once it has opened.
    let reply = client.generate(request(vec![2], 1, 0.0, None)).await.unwrap().into_inner();
    assert_eq!(reply.usage.unwrap().completion_tokens, 1);
    let deadline = Instant::now() + Duration::from_secs(3);
    while cluster.draft_info().await.unwrap().active_sessions > 0 {
        assert!(Instant::now() < deadline, "a draft session was left open");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    cluster.shutdown().await;
}

/// Releasing a draft session across a slow link is a round trip that the client does not
/// wait for: the last reply comes right after the last tokens, and the stream closes once the
/// nodes hold nothing of the generation.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_last_reply_does_not_wait_for_the_releases() {
    let target = suffix_table(1);
    let options = ClusterOptions {
        optimistic: false,
        // A 100 ms round trip to the draft.
        draft_one_way_delay: Some(Duration::from_millis(50)),
        ..ClusterOptions::default()
    };
    let cluster = start_with("last-reply", &target, &target, &options).await;
    let mut client = cluster.client().await.unwrap();
    let mut stream = client.generate_stream(request(vec![1, 2], 12, 0.0, Some(3))).await.unwrap().into_inner();
    let (mut last_tokens, mut answered) = (None, None);
    while let Some(message) = stream.next().await {
        let message = message.unwrap();
        if !message.token_ids.is_empty() {
            last_tokens = Some(Instant::now());
        }
        if let Some(usage) = message.usage {
            assert_eq!(usage.completion_tokens, 12);
            answered = Some(Instant::now());
            assert!(message.stats.unwrap().draft_tokens > 0, "the draft took part");
        }
    }
    let closed = Instant::now();
    let (last_tokens, answered) = (last_tokens.unwrap(), answered.unwrap());
    assert!(answered - last_tokens < Duration::from_millis(50), "the reply waited {:?}", answered - last_tokens);
    assert!(closed - answered >= Duration::from_millis(90), "closed {:?} after the reply", closed - answered);
    assert_eq!(cluster.draft_info().await.unwrap().active_sessions, 0, "closed before the draft released");
    cluster.shutdown().await;
}
