//! `GET /metrics` after a generation: the counters agree with the response's own stats, and
//! the nodes' gauges return to zero; the draft's prefix-cache gauges show a turn decoded
//! target-only filed there.

use std::time::{Duration, Instant};

use specd_coordinator::GammaChoice;
use specd_e2e::law_tables::{TableFiles, TablePair};
use specd_e2e::{Cluster, ClusterOptions, Table, scratch_dir};
use specd_model::PrefixCacheOptions;
use specd_proto::v1::generate_request::Prompt;
use specd_proto::v1::{FinishReason, GenerateRequest, SamplingParams, Speculation, StoppingCriteria, TokenIds};
use specd_telemetry::Metrics;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// A plain HTTP/1.1 GET of `url` (`http://host:port/path`); the body of a 200 reply.
async fn get(url: &str) -> String {
    let rest = url.strip_prefix("http://").expect("http url");
    let (host, path) = rest.split_at(rest.find('/').expect("a path"));
    let mut stream = TcpStream::connect(host).await.expect("connect");
    let request = format!("GET {path} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n");
    stream.write_all(request.as_bytes()).await.expect("send");
    let mut reply = String::new();
    stream.read_to_string(&mut reply).await.expect("read");
    let (head, body) = reply.split_once("\r\n\r\n").expect("a header");
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    assert!(head.to_ascii_lowercase().contains("content-type: application/openmetrics-text"), "{head}");
    assert_parses(body);
    body.to_owned()
}

/// The OpenMetrics text format: `# TYPE`/`# HELP`/`# UNIT` lines, samples
/// `name{label="value",...} number`, and `# EOF` last.
fn assert_parses(text: &str) {
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.last(), Some(&"# EOF"), "no # EOF at the end");
    for line in &lines[..lines.len() - 1] {
        if let Some(comment) = line.strip_prefix("# ") {
            let kind = comment.split(' ').next().unwrap_or_default();
            assert!(["TYPE", "HELP", "UNIT"].contains(&kind), "bad comment line {line:?}");
            continue;
        }
        let (series, number) = line.rsplit_once(' ').unwrap_or_else(|| panic!("no value in {line:?}"));
        assert!(number.parse::<f64>().is_ok() || ["+Inf", "-Inf", "NaN"].contains(&number), "bad value in {line:?}");
        let name_end = series.find('{').unwrap_or(series.len());
        let name = &series[..name_end];
        assert!(
            !name.is_empty()
                && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_' || c == ':')
                && !name.starts_with(|c: char| c.is_ascii_digit()),
            "bad metric name in {line:?}"
        );
        if name_end < series.len() {
            let labels = series[name_end..].strip_prefix('{').and_then(|l| l.strip_suffix('}'));
            let labels = labels.unwrap_or_else(|| panic!("bad label set in {line:?}"));
            for pair in labels.split(',').filter(|p| !p.is_empty()) {
                let (key, value) = pair.split_once('=').unwrap_or_else(|| panic!("bad label in {line:?}"));
                assert!(key.chars().all(|c| c.is_ascii_alphanumeric() || c == '_'), "bad label name in {line:?}");
                assert!(
                    value.len() >= 2 && value.starts_with('"') && value.ends_with('"'),
                    "unquoted label in {line:?}"
                );
            }
        }
    }
}

/// Checks `holds` every 20 ms until it does; fails with `never` after 5 s.
async fn wait_until<F: Future<Output = bool>>(never: &str, mut holds: impl FnMut() -> F) {
    let start = Instant::now();
    while !holds().await {
        assert!(start.elapsed() < Duration::from_secs(5), "{never}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// The value of one series (`name{labels}` exactly as exposed).
fn value(text: &str, series: &str) -> f64 {
    text.lines()
        .find_map(|l| l.strip_prefix(series)?.strip_prefix(' ')?.parse().ok())
        .unwrap_or_else(|| panic!("no {series} in\n{text}"))
}

/// The sum over every series of the family `name` with labels.
fn sum(text: &str, name: &str) -> f64 {
    let prefix = format!("{name}{{");
    text.lines().filter(|l| l.starts_with(&prefix)).filter_map(|l| l.rsplit_once(' ')?.1.parse::<f64>().ok()).sum()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_agree_with_the_generation_stats() {
    let dir = scratch_dir("metrics");
    let target = Table { vocab_size: 4, default: vec![0.4, 0.3, 0.2, 0.1], rules: vec![] };
    let draft = Table { vocab_size: 4, default: vec![0.25, 0.25, 0.25, 0.25], rules: vec![] };
    let TableFiles { target: t, draft: d } = TablePair { target, draft }.write(&dir).unwrap();
    let options =
        ClusterOptions { gamma: GammaChoice::Fixed(3), metrics: Some(Metrics::new()), ..ClusterOptions::default() };
    let cluster = Cluster::start(&t, &d, &options).await.unwrap();
    let url = cluster.metrics_url.clone().expect("metrics served");

    let before = get(&url).await;
    assert_eq!(value(&before, "specd_rounds_total"), 0.0);
    assert_eq!(value(&before, "specd_active_sessions{role=\"target\"}"), 0.0);

    let request = GenerateRequest {
        prompt: Some(Prompt::TokenIds(TokenIds { ids: vec![1, 2] })),
        sampling: Some(SamplingParams { temperature: Some(1.0), seed: Some(7), ..Default::default() }),
        stopping: Some(StoppingCriteria { max_new_tokens: Some(40), ..Default::default() }),
        speculation: Some(Speculation { gamma: Some(3), dense: false }),
        ..Default::default()
    };
    let reply = cluster.client().await.unwrap().generate(request).await.unwrap().into_inner();
    assert_eq!(reply.finish_reason, FinishReason::Length as i32);
    let stats = reply.stats.unwrap();

    let text = get(&url).await;
    assert_eq!(value(&text, "specd_rounds_total"), stats.rounds as f64, "{text}");
    assert_eq!(value(&text, "specd_draft_tokens_total"), stats.draft_tokens as f64);
    assert_eq!(value(&text, "specd_accepted_tokens_total"), stats.accepted_tokens as f64);
    assert_eq!(value(&text, "specd_optimistic_attempts_total"), stats.optimistic_attempts as f64);
    assert_eq!(value(&text, "specd_optimistic_hits_total"), stats.optimistic_hits as f64);
    assert_eq!(sum(&text, "specd_accepted_tokens_per_pos_total"), stats.accepted_tokens as f64);
    for (position, &accepted) in stats.accepted_per_position.iter().enumerate().filter(|(_, n)| **n > 0) {
        let series = format!("specd_accepted_tokens_per_pos_total{{position=\"{}\"}}", position + 1);
        assert_eq!(value(&text, &series), accepted as f64);
    }
    assert_eq!(value(&text, "specd_emitted_tokens_total"), reply.token_ids.len() as f64);
    assert_eq!(value(&text, "specd_requests_total{finish_reason=\"length\"}"), 1.0);
    assert_eq!(sum(&text, "specd_requests_total"), 1.0);
    assert_eq!(value(&text, "specd_round_seconds_count"), stats.rounds as f64);
    assert_eq!(value(&text, "specd_round_draft_seconds_count"), stats.rounds as f64);
    assert_eq!(value(&text, "specd_round_verify_seconds_count"), stats.rounds as f64);
    assert_eq!(value(&text, "specd_round_network_seconds_count"), stats.rounds as f64);
    assert_eq!(value(&text, "specd_time_to_first_token_seconds_count"), 1.0);
    assert_eq!(value(&text, "specd_inter_token_latency_seconds_count"), reply.token_ids.len() as f64);
    assert!(value(&text, "specd_time_to_first_token_seconds_sum") > 0.0);

    // Both nodes release their sessions just after the last message; the gauges follow.
    let finished = Instant::now();
    loop {
        let text = get(&url).await;
        let open: Vec<f64> = ["coordinator", "target", "draft"]
            .iter()
            .map(|role| value(&text, &format!("specd_active_sessions{{role=\"{role}\"}}")))
            .collect();
        if open.iter().all(|&n| n == 0.0) {
            assert!(value(&text, "specd_kv_cache_bytes{role=\"target\"}") >= 0.0);
            assert!(value(&text, "specd_kv_cache_bytes{role=\"draft\"}") >= 0.0);
            break;
        }
        assert!(finished.elapsed() < Duration::from_secs(2), "sessions still open {open:?}:\n{text}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    cluster.shutdown().await;
}

/// A turn that the adaptive policy decodes target-only opens no draft session, and is filed
/// on the draft after its reply all the same: the conversation's next drafted turn finds the
/// whole conversation in the draft's prefix cache, not only the turns the draft served.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_turn_decoded_target_only_is_filed_on_the_draft_for_the_next() {
    let dir = scratch_dir("draft-filing");
    let target = Table { vocab_size: 4, default: vec![0.7, 0.1, 0.1, 0.1], rules: vec![] };
    let draft = Table { vocab_size: 4, default: vec![0.1, 0.1, 0.1, 0.7], rules: vec![] };
    let TableFiles { target: t, draft: d } = TablePair { target, draft }.write(&dir).unwrap();
    let options = ClusterOptions {
        gamma: GammaChoice::Adaptive { max: 4 },
        // A draft that agrees on 40 % and takes 20 ms a step, against a target pass of
        // microseconds: once the first session has measured that, the policy decodes the
        // sessions after it target-only (but for an explorer now and then).
        forward_delays: (Duration::ZERO, Duration::from_millis(20)),
        prefix_cache: PrefixCacheOptions { enabled: true, min_tokens: 8 },
        metrics: Some(Metrics::new()),
        ..ClusterOptions::default()
    };
    let cluster = Cluster::start(&t, &d, &options).await.unwrap();
    let url = cluster.metrics_url.clone().expect("metrics served");
    let mut client = cluster.client().await.unwrap();
    let turn = |conversation: &[u32], gamma: Option<u32>| GenerateRequest {
        prompt: Some(Prompt::TokenIds(TokenIds { ids: conversation.to_vec() })),
        sampling: Some(SamplingParams { temperature: Some(1.0), seed: Some(7), ..Default::default() }),
        stopping: Some(StoppingCriteria { max_new_tokens: Some(6), ignore_eos: true, ..Default::default() }),
        speculation: Some(Speculation { gamma, dense: false }),
        ..Default::default()
    };
    let draft_bytes = || async { value(&get(&url).await, "specd_prefix_cache_bytes{role=\"draft\"}") };

    let mut conversation: Vec<u32> = (0..20).map(|i| i % 4).collect();
    let mut decoded_target_only = false;
    for _ in 0..6 {
        conversation.extend([1, 2, 3]);
        // The turn before released its sessions before its reply came: this is what the
        // draft's cache held after it.
        let before = draft_bytes().await;
        let reply = client.generate(turn(&conversation, None)).await.unwrap().into_inner();
        conversation.extend(&reply.token_ids);
        let stats = reply.stats.unwrap();
        if stats.draft_forward_passes == 0 && stats.draft_cached_tokens == 0 {
            decoded_target_only = true;
            // Filed in the background: the draft's cache grows once the filing pass is over
            // (a cache that went on without filing never would, and this times out).
            wait_until("the turn was never filed on the draft", || async { draft_bytes().await > before }).await;
            // The coordinator counts the filing once the draft has answered its release,
            // which races the node's cache growing: wait for the count as well.
            let filings = |outcome: &'static str| {
                let url = url.clone();
                async move { value(&get(&url).await, &format!("specd_draft_filings_total{{outcome=\"{outcome}\"}}")) }
            };
            wait_until("the filing was never counted", || async { filings("filed").await >= 1.0 }).await;
            assert_eq!(filings("filed").await, 1.0, "one turn decoded target-only, one filing");
            assert_eq!(filings("failed").await, 0.0);
            break;
        }
    }
    assert!(decoded_target_only, "the policy drafted every turn with a slow draft that disagrees");

    // The next turn drafts (a fixed γ): its draft session starts from the whole conversation,
    // the target-only turn's reply included.
    let filed = conversation.len();
    conversation.extend([2, 1]);
    let reply = client.generate(turn(&conversation, Some(2))).await.unwrap().into_inner();
    let stats = reply.stats.unwrap();
    assert!(stats.draft_forward_passes > 0, "{stats:?}");
    assert_eq!(stats.draft_cached_tokens as usize, filed, "{stats:?}");
    assert_eq!(stats.target_cached_tokens as usize, filed - 1, "the target lacks its last token's row: {stats:?}");
    cluster.shutdown().await;
}
