//! The OpenAI-compatible HTTP API as its users' tools see it: the official `openai` Python
//! client (`scripts/openai_client.py`, pinned in the Makefile's pydeps) and raw HTTP, against
//! `specd up` on a tiny transformers checkpoint.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::Command;

mod common;
use common::start_with_http;
use specd_e2e::hf_fixture;

fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn python() -> PathBuf {
    std::env::var_os("SPECD_PYTHON").map_or_else(|| workspace().join(".venv/bin/python"), PathBuf::from)
}

/// `specd up` with the HTTP API (the model drafting for itself); returns it, the HTTP address
/// and the gRPC address.
fn up(model: &Path, extra: &[&str]) -> (common::Running, String, String) {
    up_pair(model, model, extra)
}

fn up_pair(target: &Path, draft: &Path, extra: &[&str]) -> (common::Running, String, String) {
    let (target, draft) = (target.to_str().unwrap(), draft.to_str().unwrap());
    let args = ["up", "--listen", "127.0.0.1:0", "--http-listen", "127.0.0.1:0", "--target-model", target];
    let (running, grpc, http) = start_with_http(&[&args[..], &["--draft-model", draft], extra].concat(), &[]);
    (running, http.expect("up announces its HTTP API"), grpc)
}

/// Runs one check of the script, which must report at least `checks` passed steps.
fn run_client(check: &str, flags: &[&str], checks: usize) {
    let output = Command::new(python())
        .arg(workspace().join("scripts/openai_client.py"))
        .arg(check)
        .args(flags)
        .output()
        .expect("python runs");
    let (stdout, stderr) = (String::from_utf8_lossy(&output.stdout), String::from_utf8_lossy(&output.stderr));
    println!("{stdout}");
    assert!(output.status.success(), "openai client check {check} failed:\n{stdout}\n{stderr}");
    assert!(stdout.lines().filter(|l| l.starts_with("ok: ")).count() >= checks, "too few checks ran:\n{stdout}");
}

/// A fixture checkpoint with a longer context: RoPE has no learnt weights, so the same
/// weights serve more than the fixture's 64 positions (a rendered chat needs them).
fn longer(name: &str, into: &str) -> PathBuf {
    let fixture = hf_fixture(name);
    let dir = workspace().join("target/e2e").join(into);
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    for file in ["model.safetensors", "tokenizer.json"] {
        std::fs::copy(fixture.join(file), dir.join(file)).unwrap();
    }
    let mut config: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(fixture.join("config.json")).unwrap()).unwrap();
    config["max_position_embeddings"] = 1024.into();
    std::fs::write(dir.join("config.json"), config.to_string()).unwrap();
    dir
}

/// The tiny checkpoint with what a chat model's directory adds: a chat template in
/// tokenizer_config.json (Qwen2.5's, from the specd-text fixtures) and a generation_config.json
/// that makes greedy decoding the default.
fn chat_model() -> PathBuf {
    let dir = longer("llama_tied", "openai-chat-model");
    let template =
        std::fs::read_to_string(workspace().join("text/tests/fixtures/chat_templates/qwen2_5.jinja")).unwrap();
    let config = serde_json::json!({"chat_template": template, "bos_token": "<s>", "eos_token": "</s>"});
    std::fs::write(dir.join("tokenizer_config.json"), config.to_string()).unwrap();
    std::fs::write(dir.join("generation_config.json"), r#"{"bos_token_id": 1, "eos_token_id": 2, "do_sample": false}"#)
        .unwrap();
    dir
}

/// The byte-level fixture, whose tokenizer can write JSON, as a chat model whose template
/// writes tool calls in the Hermes / Qwen2.5 format (`tools_hermes.jinja`, written for
/// specd-text's tests and checked against transformers there), and its draft.
fn json_chat_pair() -> (PathBuf, PathBuf) {
    let target = longer("llama_bytes", "openai-json-model");
    let template =
        std::fs::read_to_string(workspace().join("text/tests/fixtures/chat_templates/tools_hermes.jinja")).unwrap();
    let config = serde_json::json!({"chat_template": template, "bos_token": "<s>", "eos_token": "</s>"});
    std::fs::write(target.join("tokenizer_config.json"), config.to_string()).unwrap();
    (target, longer("llama_bytes_draft", "openai-json-draft"))
}

#[test]
fn the_openai_client_gets_structured_outputs_and_tool_calls() {
    let (target, draft) = json_chat_pair();
    let (_up, http, _) = up_pair(&target, &draft, &[]);
    run_client("structured", &["--base", &format!("http://{http}/v1"), "--model", "openai-json-model"], 11);
    streamed_tool_call_over_raw_http(&http);
}

/// A named call streamed over raw HTTP, as curl sees it: the role, the call's id, type and
/// name with empty arguments, then its arguments, `tool_calls` on the last chunk, `[DONE]`.
fn streamed_tool_call_over_raw_http(http: &str) {
    let body = serde_json::json!({
        "model": "openai-json-model",
        "messages": [{"role": "user", "content": "Weather in Paris?"}],
        // Closed, so that a random-weight model can only write `{"unit": ...}`: with other
        // properties allowed, some seeds' draws (which vary with the rounds' timing) invent keys
        // until the length ends the output, and no call is complete.
        "tools": [{"type": "function", "function": {"name": "get_weather", "parameters": {
            "type": "object", "properties": {"unit": {"enum": ["C", "F"]}}, "required": ["unit"],
            "additionalProperties": false}}}],
        "tool_choice": {"type": "function", "function": {"name": "get_weather"}},
        "stream": true,
        "seed": 1,
    });
    let response = post(http, "/v1/chat/completions", &body.to_string());
    let events: Vec<&str> = response.lines().filter_map(|l| l.strip_prefix("data: ")).collect();
    assert_eq!(events.last(), Some(&"[DONE]"), "{response}");
    let chunks: Vec<serde_json::Value> =
        events[..events.len() - 1].iter().map(|e| serde_json::from_str(e).expect("a JSON chunk")).collect();
    let deltas: Vec<&serde_json::Value> = chunks.iter().map(|c| &c["choices"][0]["delta"]).collect();
    assert_eq!(deltas[0]["role"], "assistant", "{response}");
    let head = &deltas[1]["tool_calls"][0];
    assert_eq!(
        (&head["index"], &head["type"], &head["function"]["name"]),
        (&0.into(), &"function".into(), &"get_weather".into()),
        "{response}"
    );
    assert!(head["id"].as_str().is_some_and(|id| id.starts_with("call_")), "{head}");
    let arguments = deltas[2]["tool_calls"][0]["function"]["arguments"].as_str().expect("the arguments");
    let arguments: serde_json::Value = serde_json::from_str(arguments).expect("JSON arguments");
    assert!(["C", "F"].contains(&arguments["unit"].as_str().unwrap_or_default()), "{arguments}");
    assert_eq!(chunks.last().unwrap()["choices"][0]["finish_reason"], "tool_calls", "{response}");
    assert!(deltas.iter().all(|d| d.get("content").is_none_or(|c| c == "")), "no text beside a required call");
}

/// A POST over raw HTTP/1.1 as curl sends it; the whole response, headers first (200 checked).
fn post(http: &str, path: &str, body: &str) -> String {
    let mut socket = TcpStream::connect(http).unwrap();
    write!(
        socket,
        "POST {path} HTTP/1.1\r\nHost: {http}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    let mut response = String::new();
    socket.read_to_string(&mut response).unwrap();
    let (head, _) = response.split_once("\r\n\r\n").expect("headers end");
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    assert!(head.to_ascii_lowercase().contains("content-type: text/event-stream"), "{head}");
    response
}

#[test]
fn the_openai_client_completes_chats_streams_and_gets_openais_errors() {
    // Another model drafts, so that the rule rejects candidates: log-probabilities are checked
    // for tokens from every branch (accepted, residual, complement, bonus).
    let draft = longer("llama_gqa_untied", "openai-chat-draft");
    let (_up, http, grpc) = up_pair(&chat_model(), &draft, &[]);
    let base = format!("http://{http}/v1");
    let flags = ["--base", &base, "--model", "openai-chat-model", "--chat", "--greedy-default", "--grpc", &grpc];
    run_client("basics", &flags, 16);
}

#[test]
fn chat_without_a_template_is_a_400() {
    let model = hf_fixture("llama_tied");
    let (_up, http, _) = up(&model, &[]);
    run_client("basics", &["--base", &format!("http://{http}/v1"), "--model", "llama_tied"], 11);
}

#[test]
fn the_openai_client_meets_the_token_the_limit_and_frees_sessions_when_it_leaves() {
    let model = hf_fixture("llama_tied");
    let metrics = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().to_string();
    let guard = [
        "--api-token",
        "s3cret",
        "--max-generations",
        "1",
        "--forward-delay-ms",
        "40",
        "--gamma",
        "2",
        "--metrics-listen",
        &metrics,
        "--served-model-name",
        "tiny",
    ];
    let (_up, http, _) = up(&model, &guard);
    let flags = ["--base", &format!("http://{http}/v1"), "--model", "tiny", "--token", "s3cret"];
    run_client("guarded", &[&flags[..], &["--metrics", &format!("http://{metrics}/metrics")]].concat(), 6);
}

/// The roles as separate processes; the target dies: the coordinator answers 503.
#[test]
fn a_coordinator_without_its_target_answers_503() {
    let model = hf_fixture("llama_tied");
    let (mut target, target_address) =
        common::start(&["target", "--listen", "127.0.0.1:0", "--model", model.to_str().unwrap()], &[]);
    let target_url = format!("http://{target_address}");
    let args = [
        "coordinator",
        "--listen",
        "127.0.0.1:0",
        "--http-listen",
        "127.0.0.1:0",
        "--target",
        &target_url,
        "--gamma",
        "0",
    ];
    let (_coordinator, _, http) = start_with_http(&args, &[]);
    target.kill();
    let http = http.expect("the coordinator announces its HTTP API");
    run_client("unavailable", &["--base", &format!("http://{http}/v1"), "--model", "llama_tied"], 1);
}

/// Raw HTTP/1.1, as curl sends it: the events' order and framing, `[DONE]` last. The request
/// ignores the end-of-sequence token: an unseeded draw from the random fixture may end early.
#[test]
fn server_sent_events_over_raw_http() {
    let model = hf_fixture("llama_tied");
    let (_up, http, _) = up(&model, &[]);
    let body = r#"{"model":"llama_tied","prompt":"the quick","max_tokens":6,"ignore_eos":true,"stream":true,"stream_options":{"include_usage":true}}"#;
    let response = post(&http, "/v1/completions", body);
    // Chunked transfer encoding frames the events; the events themselves are `data: ` lines.
    let events: Vec<&str> = response.lines().filter_map(|l| l.strip_prefix("data: ")).collect();
    assert_eq!(events.last(), Some(&"[DONE]"), "{response}");
    let chunks: Vec<serde_json::Value> =
        events[..events.len() - 1].iter().map(|e| serde_json::from_str(e).expect("a JSON chunk")).collect();
    let usage = chunks.last().expect("a usage chunk");
    assert_eq!(usage["choices"], serde_json::json!([]));
    assert_eq!(usage["usage"]["completion_tokens"], 6);
    let finish = &chunks[chunks.len() - 2];
    assert_eq!(finish["choices"][0]["finish_reason"], "length");
    assert!(chunks[..chunks.len() - 2].iter().all(|c| c["choices"][0]["finish_reason"].is_null()));
    let ids: std::collections::HashSet<_> = chunks.iter().map(|c| c["id"].clone()).collect();
    assert_eq!(ids.len(), 1, "one id for the whole stream");
}
