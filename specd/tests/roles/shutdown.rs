//! SIGTERM drains: the coordinator stops admitting, lets the generation in flight finish,
//! releases its sessions on both nodes, then exits cleanly.

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use specd_proto::v1::draft_service_client::DraftServiceClient;
use specd_proto::v1::generate_request::Prompt;
use specd_proto::v1::generation_client::GenerationClient;
use specd_proto::v1::target_service_client::TargetServiceClient;
use specd_proto::v1::{
    FinishReason, GenerateRequest, InfoRequest, SamplingParams, Speculation, StoppingCriteria, TokenIds,
};

use crate::common::start;

const TOKENS: u32 = 300;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_lets_the_generation_in_flight_finish_then_exits() {
    let _host = crate::alone().await;
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../target/e2e/shutdown");
    std::fs::create_dir_all(&dir).unwrap();
    let model = dir.join("model.json");
    std::fs::write(&model, r#"{"vocab_size": 4, "default": [0.4, 0.3, 0.2, 0.1]}"#).unwrap();
    let model = model.to_str().unwrap();
    // 5 ms a forward pass: 300 tokens at γ = 2 take about 2 s.
    let node = |role| [role, "--model", model, "--listen", "127.0.0.1:0", "--forward-delay-ms", "5"];
    let (_target, target) = start(&node("target"), &[]);
    let (_draft, draft) = start(&node("draft"), &[]);
    let (target_url, draft_url) = (format!("http://{target}"), format!("http://{draft}"));
    let args = ["coordinator", "--target", &target_url, "--draft", &draft_url, "--listen", "127.0.0.1:0"];
    let (mut coordinator, endpoint) = start(&args, &[]);
    let endpoint = format!("http://{endpoint}");

    let request = GenerateRequest {
        prompt: Some(Prompt::TokenIds(TokenIds { ids: vec![1] })),
        sampling: Some(SamplingParams { seed: Some(3), ..Default::default() }),
        stopping: Some(StoppingCriteria { max_new_tokens: Some(TOKENS), ignore_eos: true, ..Default::default() }),
        speculation: Some(Speculation { gamma: Some(2), dense: false }),
        ..Default::default()
    };
    let mut client = GenerationClient::connect(endpoint.clone()).await.unwrap();
    let mut stream = client.generate_stream(request).await.unwrap().into_inner();
    let first = stream.message().await.unwrap().unwrap();
    let pid = coordinator.0.id().to_string();
    assert!(Command::new("kill").args(["-TERM", &pid]).status().unwrap().success());
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(GenerationClient::connect(endpoint).await.is_err(), "a draining coordinator takes no new connection");

    let mut tokens = first.token_ids.clone();
    let mut last = first;
    while let Some(message) = stream.message().await.unwrap() {
        tokens.extend(&message.token_ids);
        last = message;
    }
    assert_eq!(last.finish_reason, FinishReason::Length as i32);
    assert_eq!(tokens.len(), TOKENS as usize, "the generation in flight finished");

    let deadline = Instant::now() + Duration::from_secs(10);
    let status = loop {
        if let Some(status) = coordinator.0.try_wait().unwrap() {
            break status;
        }
        assert!(Instant::now() < deadline, "the coordinator did not exit");
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert!(status.success(), "{status}");
    let target_info = TargetServiceClient::connect(target_url).await.unwrap().info(InfoRequest {}).await.unwrap();
    let draft_info = DraftServiceClient::connect(draft_url).await.unwrap().info(InfoRequest {}).await.unwrap();
    assert_eq!(target_info.into_inner().active_sessions, 0, "the target holds nothing of the drained coordinator");
    assert_eq!(draft_info.into_inner().active_sessions, 0, "the draft holds nothing of the drained coordinator");
}
