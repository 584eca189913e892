//! A draft node is an accelerator, not a dependency: when its process is killed in the
//! middle of a generation, the generation finishes (target-only rounds) and says so in its
//! stats; when a draft answers on that address again, the session drafts again.

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use specd_proto::v1::generate_request::Prompt;
use specd_proto::v1::generation_client::GenerationClient;
use specd_proto::v1::{FinishReason, GenerateRequest, SamplingParams, Speculation, StoppingCriteria, TokenIds};

use crate::common::start;

const TOKENS: u32 = 600;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killing_the_draft_mid_generation_falls_back_and_recovers() {
    let _host = crate::alone().await;
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../target/e2e/draft-loss");
    std::fs::create_dir_all(&dir).unwrap();
    let (target_model, draft_model) = (dir.join("target.json"), dir.join("draft.json"));
    std::fs::write(&target_model, r#"{"vocab_size": 4, "default": [0.4, 0.3, 0.2, 0.1]}"#).unwrap();
    std::fs::write(&draft_model, r#"{"vocab_size": 4, "default": [0.35, 0.3, 0.2, 0.15]}"#).unwrap();
    let (target_model, draft_model) =
        (target_model.to_str().unwrap().to_owned(), draft_model.to_str().unwrap().to_owned());
    // Slowed down so that the generation lasts about two seconds: target-only rounds take
    // 5 ms a token, speculative ones about 8 ms for 3.7 tokens.
    let node = |model: &str, delay_ms: &str| {
        vec!["--model".to_owned(), model.to_owned(), "--forward-delay-ms".into(), delay_ms.into()]
    };
    let target_args =
        [vec!["target".to_owned(), "--listen".into(), "127.0.0.1:0".into()], node(&target_model, "5")].concat();
    let (_target, target) = start(&target_args.iter().map(String::as_str).collect::<Vec<_>>(), &[]);
    let draft_args =
        |listen: &str| [vec!["draft".to_owned(), "--listen".into(), listen.into()], node(&draft_model, "1")].concat();
    let first_draft = draft_args("127.0.0.1:0");
    let (draft, draft_address) = start(&first_draft.iter().map(String::as_str).collect::<Vec<_>>(), &[]);
    let (target_url, draft_url) = (format!("http://{target}"), format!("http://{draft_address}"));
    let coordinator_args = [
        "coordinator",
        "--target",
        &target_url,
        "--draft",
        &draft_url,
        "--listen",
        "127.0.0.1:0",
        "--node-timeout-s",
        "2",
    ];
    let (_coordinator, endpoint) = start(&coordinator_args, &[]);

    let request = GenerateRequest {
        prompt: Some(Prompt::TokenIds(TokenIds { ids: vec![1] })),
        sampling: Some(SamplingParams { temperature: Some(1.0), seed: Some(9), ..Default::default() }),
        stopping: Some(StoppingCriteria { max_new_tokens: Some(TOKENS), ignore_eos: true, ..Default::default() }),
        speculation: Some(Speculation { gamma: Some(3), dense: false }),
        ..Default::default()
    };
    let mut client = GenerationClient::connect(format!("http://{endpoint}")).await.unwrap();
    let mut stream = client.generate_stream(request).await.unwrap().into_inner();
    // Kill the draft (SIGKILL) 0.2 s in; a new one answers on the same address 0.3 s later,
    // before the session's first retry (1 s after the loss).
    let restarted = Arc::new(AtomicBool::new(false));
    let chaos = {
        let restarted = Arc::clone(&restarted);
        let again = draft_args(&draft_address);
        std::thread::spawn(move || {
            let mut draft = draft;
            std::thread::sleep(Duration::from_millis(200));
            draft.kill();
            std::thread::sleep(Duration::from_millis(300));
            let back = start(&again.iter().map(String::as_str).collect::<Vec<_>>(), &[]).0;
            restarted.store(true, Ordering::SeqCst);
            back
        })
    };
    let mut tokens: Vec<u32> = Vec::new();
    let mut last = None;
    let mut drafted_when_back = None;
    let started = Instant::now();
    while let Some(message) = stream.message().await.unwrap() {
        tokens.extend(&message.token_ids);
        if drafted_when_back.is_none() && restarted.load(Ordering::SeqCst) {
            drafted_when_back = message.stats.as_ref().map(|s| s.draft_tokens);
        }
        last = Some(message);
    }
    let _draft_again = chaos.join().unwrap();
    let last = last.unwrap();
    assert_eq!(last.finish_reason, FinishReason::Length as i32, "the generation finishes");
    assert_eq!(tokens.len(), TOKENS as usize, "every token, none twice");
    assert!(tokens.iter().all(|t| *t < 4));
    let stats = last.stats.unwrap();
    assert_eq!(stats.draft_fallbacks, 1, "{stats:?}");
    let drafted_when_back = drafted_when_back.expect("the generation outlasted the restart");
    assert!(
        stats.draft_tokens > drafted_when_back + 30,
        "the session drafts again once the draft is back: {drafted_when_back} then {stats:?} (took {:?})",
        started.elapsed()
    );
}
