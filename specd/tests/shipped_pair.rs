//! The demo pair the repository ships in `models/demo` (what `make demo` runs): it loads, its
//! files match their `SHA256SUMS` (which `sha256sum` checks too), its card has every field
//! and the target's held-out loss meets the shipping bar, it fits the repository's size bound,
//! and the demo's prompt is continued for real. The build and the card's writing are tested on the
//! tiny preset in `demo_pair.rs`; this file holds the shipped artefact to what it claims.

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::Value;

fn shipped() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().expect("specd/ has a parent").join("models/demo")
}

fn card() -> Value {
    let text =
        std::fs::read(shipped().join("card.json")).expect("models/demo/card.json: the repository ships the pair");
    serde_json::from_slice(&text).expect("card JSON")
}

fn number(card: &Value, pointer: &str) -> f64 {
    card.pointer(pointer).and_then(Value::as_f64).unwrap_or_else(|| panic!("card.json lacks {pointer}: {card}"))
}

#[test]
fn the_shipped_pair_matches_its_checksums_loads_and_meets_its_card() {
    let dir = shipped();
    for model in ["target", "draft"] {
        let check = Command::new("sha256sum")
            .args(["-c", "--quiet", "SHA256SUMS"])
            .current_dir(dir.join(model))
            .output()
            .expect("sha256sum runs");
        assert!(check.status.success(), "{model}: {}", String::from_utf8_lossy(&check.stdout));
        let logits = Command::new(env!("CARGO_BIN_EXE_specd"))
            .args(["logits", "--model", dir.join(model).to_str().unwrap(), "--text", "import os", "--json"])
            .output()
            .expect("specd runs");
        assert!(logits.status.success(), "{model}: {}", String::from_utf8_lossy(&logits.stderr));
    }
    let card = card();
    // The fields the issue asks a card for, named here rather than taken from specd.
    for field in ["command", "seed", "commit", "host", "steps", "tokens_seen", "held_out_loss", "alpha", "copy_probe"] {
        assert!(card.get(field).is_some_and(|v| !v.is_null()), "card.json lacks {field}: {card}");
    }
    assert!(number(&card, "/held_out_loss/target") <= 3.4, "held-out loss above the shipping bar: {card}");
    for alpha in ["/alpha/t0", "/alpha/t0_8", "/alpha/t1"] {
        assert!((0.0..=1.0).contains(&number(&card, alpha)), "{alpha}: {card}");
    }
    assert!(number(&card, "/copy_probe/second_copy_nats") > 0.0, "the copy probe's figures: {card}");
    let bytes: u64 = walk(&dir).iter().map(|f| std::fs::metadata(f).unwrap().len()).sum();
    assert!(bytes <= 40 << 20, "models/demo holds {bytes} bytes, above the 40 MB bound");
}

fn walk(dir: &Path) -> Vec<PathBuf> {
    let mut files = Vec::new();
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() { files.extend(walk(&path)) } else { files.push(path) }
    }
    files
}

/// The demo streams a completion of `scripts/demo_prompt.txt` at T = 0.8: the target must
/// continue it, not end it at once. Target-only (γ = 0, so each seed's output is fixed) over
/// eight seeds, the demo's own among them: every completion runs past 32 tokens. The output
/// law is the target's with or without the draft, so what holds here holds for the demo's
/// speculative run in law.
#[test]
fn the_demo_prompt_is_continued_for_real() {
    let dir = shipped();
    let (target, draft) = (dir.join("target"), dir.join("draft"));
    let (_up, address) = common::start(
        &[
            "up",
            "--target-model",
            target.to_str().unwrap(),
            "--draft-model",
            draft.to_str().unwrap(),
            "--listen",
            "127.0.0.1:0",
        ],
        &[],
    );
    let prompt_file = Path::new(env!("CARGO_MANIFEST_DIR")).join("../scripts/demo_prompt.txt");
    let prompt = std::fs::read_to_string(prompt_file).expect("the demo's prompt");
    let endpoint = format!("http://{address}");
    for seed in 1..=8 {
        let seed = seed.to_string();
        let args = [
            "generate",
            "--endpoint",
            &endpoint,
            "--prompt",
            &prompt,
            "--max-new-tokens",
            "64",
            "--temperature",
            "0.8",
            "--seed",
            &seed,
            "--gamma",
            "0",
            "--json",
        ];
        let output = Command::new(env!("CARGO_BIN_EXE_specd")).args(args).output().expect("specd runs");
        assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
        let reply: Value = serde_json::from_slice(&output.stdout).expect("JSON reply");
        let tokens = reply["token_ids"].as_array().map_or(0, Vec::len);
        assert!(tokens > 32, "seed {seed}: the target stopped after {tokens} tokens: {reply}");
    }
}
