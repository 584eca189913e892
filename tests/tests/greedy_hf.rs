//! Greedy identity on real (tiny, random) Hugging Face checkpoints through the cluster:
//! speculative greedy output equals target-only greedy output on 50 prompts. The models run
//! in f64, so scoring a block in one forward and scoring it token by token agree to ~1e-15
//! and no near-tie can flip an argmax between the two (nor between a batched pass and a
//! pass of one session).

use std::time::Duration;

use specd_e2e::{Cluster, ClusterOptions, hf_fixture};
use specd_model::{BatchPolicy, DType, PrefixCacheOptions};
use specd_node::Distributions;
use specd_proto::v1::generate_request::Prompt;
use specd_proto::v1::{GenerateRequest, SamplingParams, Speculation, StoppingCriteria, TokenIds};
use specd_sampling::{Purpose, StreamKey};

fn prompts() -> Vec<Vec<u32>> {
    let mut rng = StreamKey::new(5, 0, 0, Purpose::Plain).stream();
    (0..50).map(|i| (0..1 + i % 8).map(|_| 3 + rng.next_u32() % 93).collect()).collect()
}

fn request(prompt: Vec<u32>, gamma: u32) -> GenerateRequest {
    GenerateRequest {
        prompt: Some(Prompt::TokenIds(TokenIds { ids: prompt })),
        sampling: Some(SamplingParams { temperature: Some(0.0), ..Default::default() }),
        stopping: Some(StoppingCriteria { max_new_tokens: Some(16), ignore_eos: true, ..Default::default() }),
        speculation: Some(Speculation { gamma: Some(gamma), dense: false }),
        ..Default::default()
    }
}

#[tokio::test(flavor = "current_thread")]
async fn greedy_speculation_equals_target_only_on_hf_models() {
    greedy_identity(ClusterOptions::default(), 50).await;
}

/// With `--tree`: at temperature 0 the draft's q is one token, so every node has one child
/// and the tree is a chain, but both nodes take their tree paths (the draft's walk, the
/// target's tree-masked pass and the path it keeps) in every round.
#[tokio::test(flavor = "current_thread")]
async fn greedy_speculation_equals_target_only_with_trees() {
    let tree = specd_coordinator::TreeSetting::Shape("3,2,1,1".parse().unwrap());
    let options = ClusterOptions { tree, ..ClusterOptions::default() };
    greedy_identity(options, 20).await;
}

/// With the round streams handed to both nodes in process (`specd up`'s default) instead of
/// sent over gRPC: the same messages, so the same output; and every speculative generation
/// opened its rounds there.
#[tokio::test(flavor = "current_thread")]
async fn greedy_speculation_equals_target_only_with_rounds_in_process() {
    let options = ClusterOptions { in_process_rounds: true, dtype: DType::F64, ..ClusterOptions::default() };
    let (target, draft) = (hf_fixture("llama_gqa_untied"), hf_fixture("llama_tied"));
    let cluster = Cluster::start(&target, &draft, &options).await.unwrap();
    let mut client = cluster.client().await.unwrap();
    let prompts: Vec<_> = prompts().into_iter().take(10).collect();
    let mut outputs = Vec::new();
    for prompt in &prompts {
        let plain = client.generate(request(prompt.clone(), 0)).await.unwrap().into_inner();
        let spec = client.generate(request(prompt.clone(), 4)).await.unwrap().into_inner();
        assert_eq!((plain.token_ids.len(), &spec.token_ids), (16, &plain.token_ids), "prompt {prompt:?}");
        assert!(spec.stats.unwrap().draft_tokens > 0, "the speculative generation drafted");
        outputs.push(spec.token_ids);
    }
    let (target_streams, draft_streams) = cluster.in_process_round_streams();
    assert!(target_streams >= 2 * prompts.len(), "every generation's target rounds in process: {target_streams}");
    assert!(draft_streams >= prompts.len(), "every speculative generation's draft rounds in process: {draft_streams}");
    cluster.shutdown().await;
    // The same generations over gRPC give the same tokens.
    let over_grpc = ClusterOptions { in_process_rounds: false, ..options };
    let cluster = Cluster::start(&target, &draft, &over_grpc).await.unwrap();
    let mut grpc_client = cluster.client().await.unwrap();
    for (prompt, in_process) in prompts.iter().zip(&outputs) {
        let spec = grpc_client.generate(request(prompt.clone(), 4)).await.unwrap().into_inner();
        assert_eq!(&spec.token_ids, in_process, "over gRPC against in process, prompt {prompt:?}");
    }
    cluster.shutdown().await;
}

/// Both nodes keep the models' logits in tensors and build their distributions with
/// libtorch ops (`--distributions device`, on CPU tensors here). Speculation on the device
/// path equals target-only decoding on it, and that equals target-only decoding on the host
/// path: the device's p is the host's, not only consistent with itself.
#[tokio::test(flavor = "current_thread")]
async fn greedy_speculation_equals_target_only_on_the_device_path() {
    let on_device = ClusterOptions { distributions: Distributions::Device, ..ClusterOptions::default() };
    let device_plain = greedy_identity(on_device, 20).await;
    let on_host = ClusterOptions { dtype: DType::F64, distributions: Distributions::Host, ..ClusterOptions::default() };
    let target = hf_fixture("llama_gqa_untied");
    let cluster = Cluster::start(&target, &target, &on_host).await.unwrap();
    let mut client = cluster.client().await.unwrap();
    for (prompt, device) in prompts().into_iter().zip(device_plain) {
        let host = client.generate(request(prompt.clone(), 0)).await.unwrap().into_inner();
        assert_eq!(host.token_ids, device, "target-only, host against device path, prompt {prompt:?}");
    }
    cluster.shutdown().await;
}

/// Speculative greedy output equals target-only greedy output on `prompts` prompts, with a
/// draft equal to the target (every candidate accepted) and a different one (mostly not).
/// Returns the target-only outputs.
async fn greedy_identity(options: ClusterOptions, prompts: usize) -> Vec<Vec<u32>> {
    let options = ClusterOptions { dtype: DType::F64, ..options };
    let target = hf_fixture("llama_gqa_untied");
    let mut plain_outputs = Vec::new();
    for (draft, every_token_accepted) in [(hf_fixture("llama_gqa_untied"), true), (hf_fixture("llama_tied"), false)] {
        let cluster = Cluster::start(&target, &draft, &options).await.unwrap();
        let mut client = cluster.client().await.unwrap();
        let (mut drafted, mut accepted) = (0, 0);
        plain_outputs.clear();
        for prompt in self::prompts().into_iter().take(prompts) {
            let plain = client.generate(request(prompt.clone(), 0)).await.unwrap().into_inner();
            plain_outputs.push(plain.token_ids.clone());
            let spec = client.generate(request(prompt.clone(), 4)).await.unwrap().into_inner();
            assert_eq!(plain.token_ids.len(), 16);
            assert_eq!(spec.token_ids, plain.token_ids, "draft {}, prompt {prompt:?}", draft.display());
            let stats = spec.stats.unwrap();
            drafted += stats.draft_tokens;
            accepted += stats.accepted_tokens;
        }
        if every_token_accepted {
            assert_eq!(accepted, drafted, "a draft equal to the target has every candidate accepted");
        } else {
            assert!(accepted < drafted / 2, "a different random draft is mostly rejected: {accepted}/{drafted}");
        }
        cluster.shutdown().await;
    }
    plain_outputs
}

/// The same identity under load with batching across sessions forced on (these tiny models'
/// passes are below the default minimum pass time): 16 clients at once, speculative and
/// target-only requests mixed, so verify passes, decode steps and prefills of different
/// sessions share forward passes on both nodes. The stats must show that they did.
#[tokio::test(flavor = "current_thread")]
async fn greedy_speculation_equals_target_only_with_batched_concurrent_sessions() {
    let batch = BatchPolicy { min_pass: Duration::ZERO, ..BatchPolicy::default() };
    let options = ClusterOptions { dtype: DType::F64, batch, ..ClusterOptions::default() };
    let (target, draft) = (hf_fixture("llama_gqa_untied"), hf_fixture("llama_tied"));
    let cluster = Cluster::start(&target, &draft, &options).await.unwrap();
    let client = cluster.client().await.unwrap();
    let mut tasks = Vec::new();
    for (i, prompt) in prompts().into_iter().enumerate().take(32) {
        let mut client = client.clone();
        tasks.push(tokio::spawn(async move {
            // Half the clients ask target-only first, half speculative first.
            let order = if i % 2 == 0 { [0, 4] } else { [4, 0] };
            let mut replies = Vec::new();
            for gamma in order {
                replies.push(client.generate(request(prompt.clone(), gamma)).await.unwrap().into_inner());
            }
            if i % 2 == 1 {
                replies.reverse();
            }
            (prompt, replies)
        }));
    }
    let (mut passes, mut sequences) = (0, 0);
    for task in tasks {
        let (prompt, replies) = task.await.unwrap();
        assert_eq!(replies[0].token_ids.len(), 16);
        assert_eq!(replies[1].token_ids, replies[0].token_ids, "prompt {prompt:?}");
        for reply in &replies {
            let stats = reply.stats.clone().unwrap();
            passes += stats.target_forward_passes;
            sequences += stats.target_batched_sequences;
        }
    }
    let mean = sequences as f64 / passes as f64;
    eprintln!("greedy under load: mean target batch {mean:.2} over {passes} verify passes");
    assert!(mean > 1.5, "16 concurrent clients should share the target's passes: mean batch {mean:.2}");
    cluster.shutdown().await;
}

/// Five conversations of four turns (20 prompts), all opening with one 18-token system
/// prompt; each turn is the one before, the model's 8-token reply and 3 user tokens. With the
/// prefix caches on, both nodes start every prompt but the first from what earlier
/// generations left (asserted from the stats), and greedy output, speculative and
/// target-only, equals target-only output with the caches off. The target's budget holds
/// two sessions' reservations, so its cache must give way to the live sessions again and
/// again. A request under another `cache_salt` finds nothing, and gets the same output.
#[tokio::test(flavor = "current_thread")]
async fn greedy_output_is_the_same_with_the_prefix_cache_on_and_off() {
    const SYSTEM: usize = 18;
    let mut rng = StreamKey::new(11, 0, 0, Purpose::Plain).stream();
    let mut tokens = |n: usize| -> Vec<u32> { (0..n).map(|_| 3 + rng.next_u32() % 93).collect() };
    let system = tokens(SYSTEM);
    let users: Vec<Vec<Vec<u32>>> = (0..5).map(|_| (0..4).map(|_| tokens(3)).collect()).collect();
    let conversation_request = |prompt: Vec<u32>, gamma: u32, salt: &str| GenerateRequest {
        stopping: Some(StoppingCriteria { max_new_tokens: Some(8), ignore_eos: true, ..Default::default() }),
        cache_salt: salt.to_owned(),
        ..request(prompt, gamma)
    };
    let (target, draft) = (hf_fixture("llama_gqa_untied"), hf_fixture("llama_tied"));
    let small = PrefixCacheOptions { enabled: true, min_tokens: 16 };

    // The reference: target-only, no cache.
    let off = ClusterOptions {
        dtype: DType::F64,
        prefix_cache: PrefixCacheOptions { enabled: false, ..small },
        ..ClusterOptions::default()
    };
    let cluster = Cluster::start(&target, &draft, &off).await.unwrap();
    let mut client = cluster.client().await.unwrap();
    let mut reference = Vec::new();
    for turns in &users {
        let mut prompt = system.clone();
        for user in turns {
            prompt.extend(user);
            let reply = client.generate(conversation_request(prompt.clone(), 0, "")).await.unwrap().into_inner();
            assert_eq!(reply.stats.unwrap().target_cached_tokens, 0, "no cache, nothing reused");
            reference.push((prompt.clone(), reply.token_ids.clone()));
            prompt.extend(reply.token_ids);
        }
    }
    cluster.shutdown().await;

    // f64 KV: 2 layers × 2 (keys, values) × 2 heads × 8 dims × 8 bytes a token; two
    // sessions of the fixture's whole context of 64.
    let budget = 2 * 64 * 512;
    let on = ClusterOptions {
        dtype: DType::F64,
        prefix_cache: small,
        target_kv_budget: specd_model::KvBudget::Bytes(budget),
        ..ClusterOptions::default()
    };
    let cluster = Cluster::start(&target, &draft, &on).await.unwrap();
    let mut client = cluster.client().await.unwrap();
    let (mut turn, mut previous_len) = (0, 0);
    for (i, (prompt, want)) in reference.iter().enumerate() {
        let continues = i % 4 != 0;
        // Speculative last: the next turn starts from the entry its rounds left.
        for gamma in [0, 4] {
            let reply = client.generate(conversation_request(prompt.clone(), gamma, "")).await.unwrap().into_inner();
            assert_eq!(&reply.token_ids, want, "γ = {gamma}, prompt {i} (turn {turn})");
            let stats = reply.stats.unwrap();
            let usage = reply.usage.unwrap();
            assert_eq!(usage.cached_prompt_tokens, stats.target_cached_tokens);
            let cached = stats.target_cached_tokens as usize;
            if i > 0 {
                // A conversation's first turn finds at least the system prompt; a later one at
                // least the turn before's prompt (its reply's rows, less rejected candidates'
                // and the last token, which no pass fed); never the whole prompt.
                let least = if continues { previous_len } else { SYSTEM };
                assert!(
                    (least..prompt.len()).contains(&cached),
                    "γ = {gamma}, prompt {i}: {cached} cached of {}",
                    prompt.len()
                );
            }
            if gamma > 0 && i > 0 {
                assert!(
                    stats.draft_cached_tokens as usize >= SYSTEM,
                    "prompt {i}: the draft reused {}",
                    stats.draft_cached_tokens
                );
            }
        }
        previous_len = prompt.len();
        turn = (turn + 1) % 4;
    }
    // Another tenant's salt: nothing shared, the same output.
    let (prompt, want) = reference.last().unwrap();
    let reply = client.generate(conversation_request(prompt.clone(), 4, "tenant-b")).await.unwrap().into_inner();
    assert_eq!(&reply.token_ids, want);
    let stats = reply.stats.unwrap();
    assert_eq!((stats.target_cached_tokens, stats.draft_cached_tokens), (0, 0), "another salt reuses nothing");
    cluster.shutdown().await;
}
