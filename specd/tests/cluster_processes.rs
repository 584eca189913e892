//! The roles as real processes: `specd up`, `specd generate`, `specd audit`, and a Python
//! client (grpcio, stubs generated from proto/ during the test) that must get the same
//! tokens as `specd generate` for the same seed.

use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::Value;

mod common;
use common::{Running, start};

fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn scratch(name: &str) -> PathBuf {
    let dir = workspace().join("target/e2e").join(name);
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// `specd up` on table models, with `extra` flags; returns the process and its `host:port`.
fn up_with(dir: &Path, extra: &[&str]) -> (Running, String) {
    let target = dir.join("target.json");
    let draft = dir.join("draft.json");
    std::fs::write(
        &target,
        r#"{"vocab_size": 4, "default": [0.4, 0.3, 0.2, 0.1], "rules": [{"suffix": [1], "probs": [0.1, 0.1, 0.2, 0.6]}]}"#,
    )
    .unwrap();
    std::fs::write(&draft, r#"{"vocab_size": 4, "default": [0.25, 0.25, 0.25, 0.25]}"#).unwrap();
    let (target, draft) = (target.to_str().unwrap(), draft.to_str().unwrap());
    // A fixed γ: with the adaptive default, rounds (and so the tokens a seed gives) follow
    // measured timings.
    start(
        &[
            "up",
            "--listen",
            "127.0.0.1:0",
            "--http-listen",
            "off",
            "--target-model",
            target,
            "--draft-model",
            draft,
            "--gamma",
            "4",
        ]
        .iter()
        .chain(extra)
        .copied()
        .collect::<Vec<_>>(),
        &[],
    )
}

/// `specd up` on table models; returns the process and its `host:port`.
fn up(dir: &Path) -> (Running, String) {
    up_with(dir, &[])
}

fn json_of(output: &std::process::Output) -> Value {
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
    serde_json::from_slice(&output.stdout).unwrap()
}

fn python() -> PathBuf {
    std::env::var_os("SPECD_PYTHON").map_or_else(|| workspace().join(".venv/bin/python"), PathBuf::from)
}

/// `specd up` hands its rounds to its nodes in process unless told otherwise; over loopback
/// gRPC (`--round-transport grpc`) the same seeds give the same tokens, which are keyed by
/// seed, round and position alone (docs/randomness.md).
#[test]
fn up_gives_the_same_tokens_with_rounds_in_process_and_over_grpc() {
    let (_in_process, in_process) = up(&scratch("rounds-in-process"));
    let (_grpc, grpc) = up_with(&scratch("rounds-grpc"), &["--round-transport", "grpc"]);
    let tokens = |address: &str, seed: u64| {
        let output = Command::new(env!("CARGO_BIN_EXE_specd"))
            .args(["generate", "--endpoint", &format!("http://{address}"), "--token-ids", "1,2"])
            .args(["--max-new-tokens", "16", "--seed", &seed.to_string(), "--json"])
            .output()
            .unwrap();
        json_of(&output)["token_ids"].clone()
    };
    for seed in [1u64, 2, 3] {
        let (a, b) = (tokens(&in_process, seed), tokens(&grpc, seed));
        assert_eq!(a.as_array().map(Vec::len), Some(16), "seed {seed}: {a}");
        assert_eq!(a, b, "seed {seed}: in process, then over gRPC");
    }
}

#[test]
fn python_client_gets_the_same_tokens_as_specd_generate() {
    let (_up, address) = up(&scratch("python-client"));
    for seed in [1u64, 2, 3] {
        let ours = Command::new(env!("CARGO_BIN_EXE_specd"))
            .args(["generate", "--endpoint", &format!("http://{address}"), "--token-ids", "1,2"])
            .args(["--max-new-tokens", "12", "--seed", &seed.to_string(), "--json"])
            .output()
            .unwrap();
        let ours = json_of(&ours);
        let theirs = Command::new(python())
            .arg(workspace().join("scripts/python_client.py"))
            .args(["--endpoint", &address, "--token-ids", "1,2", "--max-new-tokens", "12", "--seed", &seed.to_string()])
            .output()
            .unwrap();
        let theirs = json_of(&theirs);
        assert_eq!(ours["token_ids"], theirs["token_ids"], "seed {seed}");
        assert_eq!(ours["token_ids"].as_array().unwrap().len(), 12);
        assert_eq!(theirs["finish_reason"], "FINISH_REASON_LENGTH");
    }
}

#[test]
fn audit_passes_against_a_correct_cluster_in_both_modes() {
    let (_up, address) = up(&scratch("audit"));
    let audit = |mode: &str| {
        let out = Command::new(env!("CARGO_BIN_EXE_specd"))
            .args(["audit", "--endpoint", &format!("http://{address}"), "--token-ids", "1"])
            .args(["--tokens", "2", "--samples", "3000", "--json", "--mode", mode])
            .output()
            .unwrap();
        json_of(&out)
    };
    // The table's law has 4² continuations: small enough for the exact law.
    let report = audit("auto");
    assert_eq!(report["mode"], "exact", "{report}");
    assert_eq!(report["verdict"], "pass", "{report}");
    assert_eq!(report["cells"], 16, "all 4² continuations");
    let report = audit("two-sample");
    assert_eq!(report["mode"], "two-sample", "{report}");
    assert_eq!(report["verdict"], "pass", "{report}");
    assert_eq!(report["cells"], 16, "all 4² continuations seen");
}

#[test]
fn generate_reports_grpc_errors_with_their_code() {
    let (_up, address) = up(&scratch("generate-errors"));
    let out = Command::new(env!("CARGO_BIN_EXE_specd"))
        .args(["generate", "--endpoint", &format!("http://{address}"), "--token-ids", "9"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("InvalidArgument") && stderr.contains("outside the vocabulary"), "{stderr}");
}

/// grpcio's own reflection client (grpcio-reflection speaks v1alpha, as do other tools of its
/// age; grpcurl speaks v1) lists each role's services and calls its specd service with
/// classes built from the descriptors it was sent.
#[test]
fn grpcios_reflection_client_lists_and_calls_every_role() {
    let dir = scratch("reflection");
    let (target_json, draft_json) = (dir.join("target.json"), dir.join("draft.json"));
    std::fs::write(&target_json, r#"{"vocab_size": 4, "default": [0.1, 0.2, 0.3, 0.4]}"#).unwrap();
    std::fs::write(&draft_json, r#"{"vocab_size": 4, "default": [0.25, 0.25, 0.25, 0.25]}"#).unwrap();
    let (_target, target) =
        start(&["target", "--model", target_json.to_str().unwrap(), "--listen", "127.0.0.1:0"], &[]);
    let (_draft, draft) = start(&["draft", "--model", draft_json.to_str().unwrap(), "--listen", "127.0.0.1:0"], &[]);
    let (_coordinator, coordinator) = start(
        &[
            "coordinator",
            "--listen",
            "127.0.0.1:0",
            "--target",
            &format!("http://{target}"),
            "--draft",
            &format!("http://{draft}"),
        ],
        &[],
    );
    let reflect = |address: &str, service: &str| {
        let out = Command::new(python())
            .arg(workspace().join("scripts/reflection_client.py"))
            .args([address, service])
            .output()
            .unwrap();
        json_of(&out)
    };
    for (role, address, service) in [
        ("coordinator", &coordinator, "specd.v1.Generation"),
        ("target", &target, "specd.v1.TargetService"),
        ("draft", &draft, "specd.v1.DraftService"),
    ] {
        let answer = reflect(address, service);
        let services: Vec<&str> = answer["services"].as_array().unwrap().iter().map(|s| s.as_str().unwrap()).collect();
        assert!(services.contains(&service), "{role}: {services:?}");
        assert!(services.contains(&"grpc.health.v1.Health"), "{role}: {services:?}");
        let reply = &answer["reply"];
        if role == "coordinator" {
            // Greedy on the table target: its most likely token (3), four times.
            assert_eq!(reply["token_ids"], serde_json::json!([3, 3, 3, 3]), "{answer}");
        } else {
            assert_eq!(reply["role"], role, "{answer}");
            assert_eq!(reply["vocab_size"], 4, "{answer}");
        }
    }
}
