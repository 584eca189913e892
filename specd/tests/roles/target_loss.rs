//! A target that dies mid-generation: with another replica the generation moves there,
//! re-filled with what was committed, and completes; without one the client gets
//! UNAVAILABLE naming the node. Either way no token reaches the client twice. A generation
//! that moved is the one that would have run without the loss: the spare is told which of
//! the tokens it is sent are output, so that penalties keep counting them.

use std::path::Path;
use std::time::Duration;

use specd_proto::v1::generate_request::Prompt;
use specd_proto::v1::generation_client::GenerationClient;
use specd_proto::v1::{FinishReason, GenerateRequest, SamplingParams, Speculation, StoppingCriteria, TokenIds};
use tonic::Code;

use crate::common::{Running, start};

const TOKENS: u32 = 300;

fn request() -> GenerateRequest {
    GenerateRequest {
        prompt: Some(Prompt::TokenIds(TokenIds { ids: vec![1] })),
        stopping: Some(StoppingCriteria { max_new_tokens: Some(TOKENS), ignore_eos: true, ..Default::default() }),
        speculation: Some(Speculation { gamma: Some(2), dense: false }),
        // Penalties on the output: a spare that took the output for prompt would draw
        // otherwise from the round it takes over, with the same seed.
        sampling: Some(SamplingParams {
            seed: Some(5),
            presence_penalty: Some(0.8),
            frequency_penalty: Some(0.3),
            ..Default::default()
        }),
        ..Default::default()
    }
}

/// A node of `role` whose forward passes take 5 ms, so a generation lasts about a second.
fn node(role: &str, model: &Path) -> (Running, String) {
    let args = [role, "--model", model.to_str().unwrap(), "--listen", "127.0.0.1:0", "--forward-delay-ms", "5"];
    let (process, address) = start(&args, &[]);
    (process, format!("http://{address}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_target_moves_to_another_replica_or_ends_unavailable() {
    let _host = crate::alone().await;
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../target/e2e/target-loss");
    std::fs::create_dir_all(&dir).unwrap();
    let model = dir.join("model.json");
    std::fs::write(&model, r#"{"vocab_size": 4, "default": [0.4, 0.3, 0.2, 0.1]}"#).unwrap();
    let (mut first, first_url) = node("target", &model);
    let (mut second, second_url) = node("target", &model);
    let (_draft, draft_url) = node("draft", &model);

    // Two replicas: the first session goes to the first; kill it after the first message.
    let targets = format!("{first_url},{second_url}");
    let args = ["coordinator", "--target", &targets, "--draft", &draft_url, "--listen", "127.0.0.1:0"];
    let (_coordinator, endpoint) = start(&args, &[("SPECD_NODE_TIMEOUT_S", "2")]);
    let mut client = GenerationClient::connect(format!("http://{endpoint}")).await.unwrap();
    let mut stream = client.generate_stream(request()).await.unwrap().into_inner();
    let mut tokens: Vec<u32> = stream.message().await.unwrap().unwrap().token_ids;
    first.kill();
    let mut last = None;
    while let Some(message) = stream.message().await.unwrap() {
        tokens.extend(&message.token_ids);
        last = Some(message);
    }
    let last = last.unwrap();
    assert_eq!(last.finish_reason, FinishReason::Length as i32);
    assert_eq!(tokens.len(), TOKENS as usize, "every token once");
    assert_eq!(last.stats.unwrap().target_failovers, 1);

    // No replica left: the client is told, with the node's address, and got no token twice.
    let args = ["coordinator", "--target", &second_url, "--draft", &draft_url, "--listen", "127.0.0.1:0"];
    let (_alone, endpoint) = start(&args, &[("SPECD_NODE_TIMEOUT_S", "2")]);
    let mut client = GenerationClient::connect(format!("http://{endpoint}")).await.unwrap();
    // But first, the same request with nothing lost: the tokens the moved generation gave.
    let unbroken = client.generate(request()).await.unwrap().into_inner().token_ids;
    assert_eq!(unbroken, tokens, "the generation that moved is the one that would have run");
    let mut stream = client.generate_stream(request()).await.unwrap().into_inner();
    let mut received = stream.message().await.unwrap().unwrap().token_ids.len();
    second.kill();
    let status = loop {
        match tokio::time::timeout(Duration::from_secs(10), stream.message()).await.expect("an answer") {
            Ok(Some(message)) => received += message.token_ids.len(),
            Ok(None) => panic!("the generation finished without its target"),
            Err(status) => break status,
        }
    };
    assert_eq!(status.code(), Code::Unavailable, "{status:?}");
    assert!(status.message().contains(second_url.trim_start_matches("http://")), "{status:?}");
    assert!(received < TOKENS as usize);
}
