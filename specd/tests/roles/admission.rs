//! What the coordinator admits: only clients with its bearer token, at most
//! `--max-generations` at once (RESOURCE_EXHAUSTED beyond), and each only until the client's
//! deadline (DEADLINE_EXCEEDED, streams included), after which nothing is left on the nodes.

use std::path::Path;
use std::time::{Duration, Instant};

use specd_proto::v1::generate_request::Prompt;
use specd_proto::v1::generation_client::GenerationClient;
use specd_proto::v1::target_service_client::TargetServiceClient;
use specd_proto::v1::{GenerateRequest, InfoRequest, Speculation, StoppingCriteria, TokenIds};
use tonic::transport::Channel;
use tonic::{Code, Request};

use crate::common::start;

fn request(tokens: u32, token: Option<&str>, timeout: Option<Duration>) -> Request<GenerateRequest> {
    let mut request = Request::new(GenerateRequest {
        prompt: Some(Prompt::TokenIds(TokenIds { ids: vec![1] })),
        stopping: Some(StoppingCriteria { max_new_tokens: Some(tokens), ignore_eos: true, ..Default::default() }),
        speculation: Some(Speculation { gamma: Some(0), dense: false }),
        ..Default::default()
    });
    if let Some(token) = token {
        request.metadata_mut().insert("authorization", format!("Bearer {token}").parse().unwrap());
    }
    if let Some(timeout) = timeout {
        request.set_timeout(timeout);
    }
    request
}

async fn target_sessions(url: &str) -> u32 {
    let mut client = TargetServiceClient::connect(url.to_owned()).await.unwrap();
    client.info(InfoRequest {}).await.unwrap().into_inner().active_sessions
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn token_limit_and_deadline() {
    let _host = crate::alone().await;
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../target/e2e/admission");
    std::fs::create_dir_all(&dir).unwrap();
    let model = dir.join("model.json");
    std::fs::write(&model, r#"{"vocab_size": 4, "default": [0.4, 0.3, 0.2, 0.1]}"#).unwrap();
    // 5 ms a token: 400 tokens take 2 s.
    let (_target, target) = start(
        &["target", "--model", model.to_str().unwrap(), "--listen", "127.0.0.1:0", "--forward-delay-ms", "5"],
        &[],
    );
    let target_url = format!("http://{target}");
    let args = ["coordinator", "--target", &target_url, "--listen", "127.0.0.1:0", "--max-generations", "1"];
    let (_coordinator, endpoint) = start(&args, &[("SPECD_API_TOKEN", "s3cret")]);
    let mut client: GenerationClient<Channel> = GenerationClient::connect(format!("http://{endpoint}")).await.unwrap();

    let anonymous = client.generate(request(4, None, None)).await.unwrap_err();
    assert_eq!(anonymous.code(), Code::Unauthenticated, "{anonymous:?}");
    let wrong = client.generate(request(4, Some("guess"), None)).await.unwrap_err();
    assert_eq!(wrong.code(), Code::Unauthenticated, "{wrong:?}");
    let reply = client.generate(request(4, Some("s3cret"), None)).await.unwrap().into_inner();
    assert_eq!(reply.token_ids.len(), 4);

    // One long generation holds the only slot: a second one is refused, not queued.
    // (The slot of the 4-token generation is freed just after its reply: retry briefly.)
    let mut long = loop {
        match client.generate_stream(request(400, Some("s3cret"), None)).await {
            Ok(stream) => break stream.into_inner(),
            Err(status) if status.code() == Code::ResourceExhausted => {
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            Err(status) => panic!("{status:?}"),
        }
    };
    long.message().await.unwrap().unwrap();
    let refused = client.generate(request(4, Some("s3cret"), None)).await.unwrap_err();
    assert_eq!(refused.code(), Code::ResourceExhausted, "{refused:?}");
    assert!(refused.message().contains("in flight"), "{refused:?}");
    drop(long);
    let deadline = Instant::now() + Duration::from_secs(3);
    while target_sessions(&target_url).await > 0 {
        assert!(Instant::now() < deadline, "the dropped stream's session was not released");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }

    // A stream with a 300 ms deadline for 2 s of work ends with DEADLINE_EXCEEDED and frees
    // its session on the node.
    let started = Instant::now();
    let mut stream = client
        .generate_stream(request(400, Some("s3cret"), Some(Duration::from_millis(300))))
        .await
        .unwrap()
        .into_inner();
    let status = loop {
        match stream.message().await {
            Ok(Some(_)) => continue,
            Ok(None) => panic!("the stream finished within its deadline?"),
            Err(status) => break status,
        }
    };
    assert_eq!(status.code(), Code::DeadlineExceeded, "{status:?}");
    assert!(started.elapsed() < Duration::from_millis(1500), "stopped late: {:?}", started.elapsed());
    let deadline = Instant::now() + Duration::from_secs(3);
    while target_sessions(&target_url).await > 0 {
        assert!(Instant::now() < deadline, "the expired generation's session was not released");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}
