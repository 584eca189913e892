//! KV memory by the request, through the servers: a target of Llama-3.2-1B's cache shape (16
//! layers, 8 KV heads of 64, 131 072 positions, f32: 64 KiB a token; a tiny width elsewhere,
//! random weights) under a budget of 2.5 sessions admits two sessions of a request's reach
//! and refuses the third with RESOURCE_EXHAUSTED naming the bytes needed, in use and the
//! budget, at the node and through the coordinator; and a pass that runs out of memory fails
//! its request with RESOURCE_EXHAUSTED while the node stays SERVING and serves the next ones;
//! and the sessions of generations run through the coordinator reserve exactly their reach.

use std::path::{Path, PathBuf};

use specd_coordinator::GammaChoice;
use specd_e2e::{Cluster, ClusterOptions, scratch_dir, stream_to_end};
use specd_model::{KvBudget, PrefixCacheOptions};
use specd_proto::v1::draft_service_client::DraftServiceClient;
use specd_proto::v1::generate_request::Prompt;
use specd_proto::v1::target_service_client::TargetServiceClient;
use specd_proto::v1::{
    GenerateRequest, InfoRequest, OpenSessionRequest, ReleaseRequest, SamplingParams, SamplingSettings,
    StoppingCriteria, TokenIds,
};
use tch::{Device, Kind, Tensor};
use tonic::Code;
use tonic_health::pb::HealthCheckRequest;
use tonic_health::pb::health_check_response::ServingStatus;
use tonic_health::pb::health_client::HealthClient;

const LAYERS: i64 = 16;
const KV_HEADS: i64 = 8;
const HEAD_DIM: i64 = 64;
const HEADS: i64 = 32;
const HIDDEN: i64 = 64;
const INTERMEDIATE: i64 = 128;
const VOCAB: i64 = 96;
/// K and V of every layer in f32.
const BYTES_PER_TOKEN: u64 = 2 * (LAYERS * KV_HEADS * HEAD_DIM) as u64 * 4;
const GAMMA: u32 = 4;
const MAX_NEW: u32 = 16;
const PROMPT: [u32; 5] = [3, 14, 15, 9, 26];
/// What the coordinator asks a node to reserve: prompt + max_new_tokens + γ + 1.
const REACH: u64 = PROMPT.len() as u64 + MAX_NEW as u64 + GAMMA as u64 + 1;
const PER_SESSION: u64 = REACH * BYTES_PER_TOKEN;

/// Writes the 1B-shaped checkpoint (config.json and random safetensors weights).
fn one_b_shaped_checkpoint(dir: &Path) -> PathBuf {
    let config = serde_json::json!({
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": HIDDEN,
        "intermediate_size": INTERMEDIATE,
        "num_hidden_layers": LAYERS,
        "num_attention_heads": HEADS,
        "num_key_value_heads": KV_HEADS,
        "head_dim": HEAD_DIM,
        "vocab_size": VOCAB,
        "max_position_embeddings": 131_072,
        "rms_norm_eps": 1e-5,
        "rope_theta": 500_000.0,
        "tie_word_embeddings": true,
        "bos_token_id": 1,
        "eos_token_id": 2,
        "hidden_act": "silu",
        "dtype": "float32",
    });
    std::fs::write(dir.join("config.json"), config.to_string()).unwrap();
    tch::manual_seed(5);
    let random = |shape: &[i64]| Tensor::randn(shape, (Kind::Float, Device::Cpu)) * 0.02;
    let ones = |size: i64| Tensor::ones([size], (Kind::Float, Device::Cpu));
    let mut tensors = vec![("model.embed_tokens.weight".to_owned(), random(&[VOCAB, HIDDEN]))];
    tensors.push(("model.norm.weight".to_owned(), ones(HIDDEN)));
    for l in 0..LAYERS {
        let p = format!("model.layers.{l}");
        tensors.extend([
            (format!("{p}.input_layernorm.weight"), ones(HIDDEN)),
            (format!("{p}.post_attention_layernorm.weight"), ones(HIDDEN)),
            (format!("{p}.self_attn.q_proj.weight"), random(&[HEADS * HEAD_DIM, HIDDEN])),
            (format!("{p}.self_attn.k_proj.weight"), random(&[KV_HEADS * HEAD_DIM, HIDDEN])),
            (format!("{p}.self_attn.v_proj.weight"), random(&[KV_HEADS * HEAD_DIM, HIDDEN])),
            (format!("{p}.self_attn.o_proj.weight"), random(&[HIDDEN, HEADS * HEAD_DIM])),
            (format!("{p}.mlp.gate_proj.weight"), random(&[INTERMEDIATE, HIDDEN])),
            (format!("{p}.mlp.up_proj.weight"), random(&[INTERMEDIATE, HIDDEN])),
            (format!("{p}.mlp.down_proj.weight"), random(&[HIDDEN, INTERMEDIATE])),
        ]);
    }
    Tensor::write_safetensors(&tensors, dir.join("model.safetensors")).unwrap();
    dir.to_owned()
}

fn request(seed: u64) -> GenerateRequest {
    GenerateRequest {
        prompt: Some(Prompt::TokenIds(TokenIds { ids: PROMPT.to_vec() })),
        sampling: Some(SamplingParams { temperature: Some(1.0), seed: Some(seed), ..Default::default() }),
        stopping: Some(StoppingCriteria { max_new_tokens: Some(MAX_NEW), ignore_eos: true, ..Default::default() }),
        ..Default::default()
    }
}

fn open(id: &str) -> OpenSessionRequest {
    OpenSessionRequest {
        session_id: id.into(),
        prompt_token_ids: PROMPT.to_vec(),
        sampling: Some(SamplingSettings {
            temperature: 1.0,
            top_p: 1.0,
            repetition_penalty: 1.0,
            ..Default::default()
        }),
        seed: 1,
        max_tokens: REACH as u32,
        ..Default::default()
    }
}

async fn start(name: &str, budget: KvBudget, oom_at_pass: Option<u64>) -> Cluster {
    start_with(name, budget, oom_at_pass, false).await
}

/// [`start`], with the coordinator's rounds handed to the nodes in process or not.
async fn start_with(name: &str, budget: KvBudget, oom_at_pass: Option<u64>, in_process_rounds: bool) -> Cluster {
    let model = one_b_shaped_checkpoint(&scratch_dir(name));
    let options = ClusterOptions {
        gamma: GammaChoice::Fixed(GAMMA),
        target_kv_budget: budget,
        target_oom_at_pass: oom_at_pass,
        in_process_rounds,
        ..ClusterOptions::default()
    };
    Cluster::start(&model, &model, &options).await.unwrap()
}

/// Waits (up to 5 s) until neither node holds a session or any KV cache: a generation's last
/// reply does not wait for its releases.
async fn all_released(cluster: &Cluster) {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
    loop {
        let (target, draft) = (cluster.target_info().await.unwrap(), cluster.draft_info().await.unwrap());
        if target.active_sessions + draft.active_sessions == 0 && target.kv_cache_bytes + draft.kv_cache_bytes == 0 {
            return;
        }
        assert!(std::time::Instant::now() < deadline, "sessions left open: {target:?} {draft:?}");
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
}

fn assert_names_the_numbers(status: &tonic::Status, in_use: u64, budget: u64) {
    assert_eq!(status.code(), Code::ResourceExhausted, "{status:?}");
    for number in [PER_SESSION, in_use, budget] {
        assert!(status.message().contains(&number.to_string()), "{number} missing from: {}", status.message());
    }
}

#[tokio::test(flavor = "current_thread")]
async fn the_budget_admits_whole_requests_and_refuses_the_next_naming_the_numbers() {
    let budget = PER_SESSION * 5 / 2;
    let cluster = start("kv_budget_admission", KvBudget::Bytes(budget), None).await;
    let mut target = TargetServiceClient::connect(cluster.target_url.clone()).await.unwrap();
    target.open_session(open("a")).await.unwrap();
    target.open_session(open("b")).await.unwrap();
    assert_eq!(cluster.target_info().await.unwrap().kv_cache_bytes, 2 * PER_SESSION);
    let refused = target.open_session(open("c")).await.unwrap_err();
    assert_names_the_numbers(&refused, 2 * PER_SESSION, budget);
    // Through the coordinator: the same refusal, before any pass.
    let mut client = cluster.client().await.unwrap();
    let refused = stream_to_end(&mut client, request(1)).await.unwrap_err();
    let status = refused.downcast_ref::<tonic::Status>().expect("a gRPC status");
    assert_names_the_numbers(status, 2 * PER_SESSION, budget);
    // A released session makes room for a generation, which then runs to its end.
    target.release(ReleaseRequest { session_id: "a".into(), ..Default::default() }).await.unwrap();
    let (tokens, _) = stream_to_end(&mut client, request(1)).await.unwrap();
    assert_eq!(tokens.len(), MAX_NEW as usize);
    cluster.shutdown().await;
}

#[tokio::test(flavor = "current_thread")]
async fn a_pass_out_of_memory_fails_its_request_and_the_node_serves_on() {
    // Over gRPC, and with the rounds in process, where the node's error comes back the same.
    for in_process in [false, true] {
        oom_fails_its_request(in_process).await;
    }
}

async fn oom_fails_its_request(in_process: bool) {
    // The target's second pass (the first session's second round) fails to allocate.
    let cluster = start_with("kv_budget_oom", KvBudget::Bytes(4 * PER_SESSION), Some(2), in_process).await;
    let mut client = cluster.client().await.unwrap();
    let failed = stream_to_end(&mut client, request(7)).await.unwrap_err();
    let status = failed.downcast_ref::<tonic::Status>().expect("a gRPC status");
    assert_eq!(status.code(), Code::ResourceExhausted, "in process {in_process}: {status:?}");
    assert!(status.message().contains("out of memory"), "{status:?}");
    assert_eq!(cluster.in_process_round_streams().0 > 0, in_process);
    let channel = tonic::transport::Endpoint::from_shared(cluster.target_url.clone()).unwrap().connect().await.unwrap();
    let mut health = HealthClient::new(channel);
    let serving = health.check(HealthCheckRequest { service: String::new() }).await.unwrap().into_inner();
    assert_eq!(serving.status, ServingStatus::Serving as i32);
    // The next requests run to their ends and agree: nothing the failed pass touched leaked
    // into them.
    let (first, _) = stream_to_end(&mut client, request(7)).await.unwrap();
    let (second, _) = stream_to_end(&mut client, request(7)).await.unwrap();
    assert_eq!(first.len(), MAX_NEW as usize);
    assert_eq!(first, second);
    // Every session, the failed one's too, is released: no KV cache stays reserved.
    all_released(&cluster).await;
    cluster.shutdown().await;
}

#[tokio::test(flavor = "current_thread")]
async fn both_nodes_reserve_a_generations_reach_and_grow_no_further() {
    // A slower target, so that a generation lasts long enough to be watched.
    let model = one_b_shaped_checkpoint(&scratch_dir("kv_budget_reach"));
    // Without prefix caches: what one generation reserves is watched alone, not beside what
    // the ones before left.
    let options = ClusterOptions {
        gamma: GammaChoice::Fixed(GAMMA),
        forward_delays: (std::time::Duration::from_millis(3), std::time::Duration::ZERO),
        prefix_cache: PrefixCacheOptions { enabled: false, ..PrefixCacheOptions::default() },
        ..ClusterOptions::default()
    };
    let cluster = Cluster::start(&model, &model, &options).await.unwrap();
    let mut client = cluster.client().await.unwrap();
    let max_new = 61;
    let reach_bytes = (PROMPT.len() as u64 + max_new + u64::from(GAMMA) + 1) * BYTES_PER_TOKEN;
    let (done, mut finished) = tokio::sync::watch::channel(false);
    let (draft_url, target_url) = (cluster.draft_url.clone(), cluster.target_url.clone());
    let watcher = tokio::spawn(async move {
        let mut draft = DraftServiceClient::connect(draft_url).await.unwrap();
        let mut target = TargetServiceClient::connect(target_url).await.unwrap();
        let mut most = (0, 0);
        while !*finished.borrow_and_update() {
            let d = draft.info(InfoRequest::default()).await.unwrap().into_inner().kv_cache_bytes;
            let t = target.info(InfoRequest::default()).await.unwrap().into_inner().kv_cache_bytes;
            most = (most.0.max(d), most.1.max(t));
        }
        most
    });
    for seed in 0..3 {
        let mut r = request(seed);
        r.stopping.as_mut().expect("set").max_new_tokens = Some(max_new as u32);
        let (tokens, _) = stream_to_end(&mut client, r).await.unwrap();
        assert_eq!(tokens.len(), max_new as usize);
        // One generation's sessions at a time are watched.
        all_released(&cluster).await;
    }
    done.send(true).unwrap();
    let (draft_most, target_most) = watcher.await.unwrap();
    // Seen while open (the lower bound), and never grown (the upper). The draft reserves for
    // the blocks it drafts ahead too (optimistic drafting, the cluster's default).
    let ahead_bytes = u64::from(specd_coordinator::session::propose::PUSH_DEPTH * (GAMMA + 1)) * BYTES_PER_TOKEN;
    assert_eq!((draft_most, target_most), (reach_bytes + ahead_bytes, reach_bytes));
    cluster.shutdown().await;
}
