//! Greedy identity on real (tiny, random) Hugging Face checkpoints through the cluster:
//! speculative greedy output equals target-only greedy output on 50 prompts. The models run
//! in f64, so scoring a block in one forward and scoring it token by token agree to ~1e-15
//! and no near-tie can flip an argmax between the two.

use specd_e2e::{Cluster, ClusterOptions, hf_fixture};
use specd_model::DType;
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn greedy_speculation_equals_target_only_on_hf_models() {
    let options = ClusterOptions { dtype: DType::F64, ..ClusterOptions::default() };
    let target = hf_fixture("llama_gqa_untied");
    for (draft, every_token_accepted) in [(hf_fixture("llama_gqa_untied"), true), (hf_fixture("llama_tied"), false)] {
        let cluster = Cluster::start(&target, &draft, &options).await.unwrap();
        let mut client = cluster.client().await.unwrap();
        let (mut drafted, mut accepted) = (0, 0);
        for prompt in prompts() {
            let plain = client.generate(request(prompt.clone(), 0)).await.unwrap().into_inner();
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
}
