//! Soak, short: 32 concurrent streams against `specd up` for `SPECD_SOAK_SECONDS` (default
//! 10), on table models or on the pair in `SPECD_SOAK_MODELS`: zero errors, no session left on any role afterwards (from `/metrics`), and resident
//! memory that
//! does not keep growing (printed; RELIABILITY.md records a run).

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use specd_proto::v1::generate_request::Prompt;
use specd_proto::v1::generation_client::GenerationClient;
use specd_proto::v1::{FinishReason, GenerateRequest, SamplingParams, StoppingCriteria, TokenIds};

use crate::common::start;

const STREAMS: usize = 32;

fn rss_kib(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let line = status.lines().find(|l| l.starts_with("VmRSS:")).unwrap();
    line.split_whitespace().nth(1).unwrap().parse().unwrap()
}

/// `GET /metrics` over plain HTTP/1.1.
async fn scrape(address: &str) -> String {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut stream = tokio::net::TcpStream::connect(address).await.unwrap();
    let request = format!("GET /metrics HTTP/1.1\r\nHost: {address}\r\nConnection: close\r\n\r\n");
    stream.write_all(request.as_bytes()).await.unwrap();
    let mut reply = String::new();
    stream.read_to_string(&mut reply).await.unwrap();
    reply
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn thirty_two_streams_without_errors_or_leaks() {
    let _host = crate::alone().await;
    let seconds: u64 = std::env::var("SPECD_SOAK_SECONDS").ok().and_then(|s| s.parse().ok()).unwrap_or(10);
    // SPECD_SOAK_MODELS=DIR soaks a real pair (DIR/target, DIR/draft: `specd models demo`);
    // by default two table models keep the CI version fast.
    let (target, draft) = match std::env::var_os("SPECD_SOAK_MODELS") {
        Some(pair) => (Path::new(&pair).join("target"), Path::new(&pair).join("draft")),
        None => {
            let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../target/e2e/soak");
            std::fs::create_dir_all(&dir).unwrap();
            let (target, draft) = (dir.join("target.json"), dir.join("draft.json"));
            std::fs::write(&target, r#"{"vocab_size": 8, "default": [0.3, 0.2, 0.15, 0.1, 0.1, 0.05, 0.05, 0.05]}"#)
                .unwrap();
            std::fs::write(&draft, r#"{"vocab_size": 8, "default": [0.25, 0.2, 0.15, 0.1, 0.1, 0.1, 0.05, 0.05]}"#)
                .unwrap();
            (target, draft)
        }
    };
    let metrics = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().to_string();
    // Without the prefix cache: it keeps every ended generation's committed KV until the
    // budget needs the room (by design, up to the budget), which would read here as growth.
    let args = [
        "up",
        "--prefix-cache",
        "off",
        "--listen",
        "127.0.0.1:0",
        "--http-listen",
        "off",
        "--target-model",
        target.to_str().unwrap(),
        "--metrics-listen",
        &metrics,
    ];
    let (up, endpoint) = start(&[&args[..], &["--draft-model", draft.to_str().unwrap()]].concat(), &[]);
    let pid = up.0.id();
    let client = GenerationClient::connect(format!("http://{endpoint}")).await.unwrap();

    let (generations, tokens) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
    let run = |until: Instant| {
        let mut lanes = Vec::new();
        for lane in 0..STREAMS as u64 {
            let (mut client, generations, tokens) = (client.clone(), Arc::clone(&generations), Arc::clone(&tokens));
            lanes.push(tokio::spawn(async move {
                let mut seed = lane * 1_000_000;
                while Instant::now() < until {
                    seed += 1;
                    let request = GenerateRequest {
                        prompt: Some(Prompt::TokenIds(TokenIds { ids: vec![(seed % 8) as u32] })),
                        sampling: Some(SamplingParams {
                            temperature: Some(0.9),
                            seed: Some(seed),
                            ..Default::default()
                        }),
                        stopping: Some(StoppingCriteria {
                            max_new_tokens: Some(64),
                            ignore_eos: true,
                            ..Default::default()
                        }),
                        ..Default::default()
                    };
                    let mut stream = client.generate_stream(request).await.expect("admitted").into_inner();
                    let mut last = None;
                    while let Some(message) = stream.message().await.expect("no error mid-stream") {
                        tokens.fetch_add(message.token_ids.len() as u64, Ordering::Relaxed);
                        last = Some(message.finish_reason);
                    }
                    assert_eq!(last, Some(FinishReason::Length as i32));
                    generations.fetch_add(1, Ordering::Relaxed);
                }
            }));
        }
        lanes
    };
    // A warm-up quarter, then the measured rest: memory must not keep growing after warm-up.
    for lane in run(Instant::now() + Duration::from_secs(seconds.div_ceil(4))) {
        lane.await.unwrap();
    }
    let rss_warm = rss_kib(pid);
    for lane in run(Instant::now() + Duration::from_secs(seconds)) {
        lane.await.unwrap();
    }
    let rss_end = rss_kib(pid);
    let (generations, tokens) = (generations.load(Ordering::Relaxed), tokens.load(Ordering::Relaxed));
    eprintln!(
        "soak: {STREAMS} streams, {seconds} s: {generations} generations, {tokens} tokens, 0 errors; \
         RSS after warm-up {rss_warm} KiB, at the end {rss_end} KiB"
    );
    assert!(generations > STREAMS as u64, "only {generations} generations");
    let scrape = scrape(&metrics).await;
    for role in ["target", "draft", "coordinator"] {
        let line = format!("specd_active_sessions{{role=\"{role}\"}} 0");
        assert!(scrape.lines().any(|l| l == line), "sessions left on the {role}:\n{scrape}");
    }
    // Allocator noise is fine; a leak per generation is not (thousands of generations ran).
    assert!(rss_end < rss_warm + 64 * 1024, "resident memory grew from {rss_warm} to {rss_end} KiB");
}
