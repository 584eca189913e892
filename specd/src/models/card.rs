//! The model card of a shipped demo pair: `card.json`, every figure a reader needs to trust
//! or repeat the build (the command, seed, commit, host, steps, tokens, held-out loss, α),
//! and a `README.md` that says the same in prose. `scripts/copy_probe.py --card` adds the
//! copy probe's figures to `card.json` (transformers measures them, not specd).

use std::path::Path;
use std::process::Command;

use serde_json::{Value, json};
use specd_demo::given::GivenModel;
use specd_demo::{BuildOutcome, DemoSpec, MatmulKind, PairReport};
use specd_model::{DeviceSpec, cpu_features};

/// Where and how the pair was built, as the card records it.
#[derive(Debug, Clone)]
pub struct Provenance {
    /// The command line, as typed.
    pub command: String,
    pub seed: u64,
    pub preset: String,
    pub spec: DemoSpec,
    pub matmul: MatmulKind,
    pub device: DeviceSpec,
}

/// The commit the binary's checkout is at (`-dirty` when it has uncommitted changes), or
/// `unknown` outside a git checkout.
fn commit() -> String {
    let git = |args: &[&str]| {
        Command::new("git")
            .args(args)
            .output()
            .ok()
            .filter(|o| o.status.success())
            .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_owned())
    };
    match git(&["rev-parse", "HEAD"]) {
        Some(head) if git(&["status", "--porcelain", "--untracked-files=no"]).is_some_and(|s| s.is_empty()) => head,
        Some(head) => format!("{head}-dirty"),
        None => "unknown".into(),
    }
}

/// Where a given model (`role`: target or draft) came from: its directory, its weights'
/// SHA-256, and what the card of the pair it was shipped in (`DIR/../card.json`) says of its
/// build, where there is one.
fn origin(given: Option<&GivenModel>, role: &str) -> Value {
    let Some(given) = given else { return Value::Null };
    let card: Option<Value> = given
        .dir
        .parent()
        .and_then(|pair| std::fs::read_to_string(pair.join("card.json")).ok())
        .and_then(|text| serde_json::from_str(&text).ok());
    let from_card = |pointer: &str| card.as_ref().and_then(|c| c.pointer(pointer)).cloned().unwrap_or(Value::Null);
    // A model that pair's own build was given unchanged (a target given with --target-from
    // again) was built by the build its card names for it, not by that pair's build.
    let earlier = from_card(&format!("/{role}_from"));
    let (command, commit) = if earlier["weights_sha256"].as_str() == Some(given.weights_sha256.as_str()) {
        (earlier["command"].clone(), earlier["commit"].clone())
    } else {
        (from_card("/command"), from_card("/commit"))
    };
    json!({
        "dir": given.dir,
        "weights_sha256": given.weights_sha256,
        "command": command,
        "commit": commit,
        "steps": from_card(&format!("/steps/{role}")),
        "tokens_seen": from_card(&format!("/tokens_seen/{role}")),
    })
}

/// The card of `outcome`'s shipped pair. Where the target was given, its steps and tokens are
/// those its own card records (null where it has none), not this build's preset's; where the
/// draft was trained further, its own card's are added to this build's.
pub fn card(provenance: &Provenance, outcome: &BuildOutcome, shipped: &PairReport) -> Value {
    let spec = &provenance.spec;
    let tokens_per_step = spec.batch * spec.context;
    let target_origin = origin(outcome.given_target.as_ref(), "target");
    let draft_origin = origin(outcome.given_draft.as_ref(), "draft");
    let (target_steps, target_tokens) = if target_origin.is_null() {
        (json!(spec.target_steps), json!(spec.target_steps * tokens_per_step))
    } else {
        (target_origin["steps"].clone(), target_origin["tokens_seen"].clone())
    };
    let (draft_steps, draft_tokens) = if draft_origin.is_null() {
        (json!(spec.draft_steps), json!(spec.draft_steps * tokens_per_step))
    } else {
        let plus = |before: &Value, now: usize| before.as_u64().map_or(Value::Null, |b| json!(b + now as u64));
        (
            plus(&draft_origin["steps"], spec.draft_steps),
            plus(&draft_origin["tokens_seen"], spec.draft_steps * tokens_per_step),
        )
    };
    json!({
        "command": provenance.command,
        "seed": provenance.seed,
        "preset": provenance.preset,
        "spec": spec,
        "commit": commit(),
        "host": {
            "cpu": cpu_features::cpu_model_name(),
            "bf16_instructions": cpu_features::has_bf16_instructions(),
            "bf16_matrix_units": cpu_features::has_bf16_matrix_units(),
            "cores": std::thread::available_parallelism().map_or(1, |n| n.get()),
        },
        "device": provenance.device.to_string(),
        "matmul": provenance.matmul.name(),
        "steps": {"target": target_steps, "draft": draft_steps},
        "tokens_seen": {"target": target_tokens, "draft": draft_tokens},
        "target_from": target_origin,
        "draft_from": draft_origin,
        "corpus": {
            "root": outcome.corpus_root,
            "fingerprint": outcome.corpus_fingerprint,
            "training_tokens": outcome.train_tokens,
        },
        "parameters": {"target": outcome.target_parameters, "draft": outcome.draft_parameters},
        "weights": {"target": "bf16", "draft": "f32"},
        "held_out_loss": {"target": shipped.target_loss, "draft": shipped.draft_loss, "positions": shipped.positions},
        "alpha": {"t0": shipped.alpha_greedy, "t0_8": shipped.alpha_t08, "t1": shipped.alpha_t1},
        "copy_probe": Value::Null,
    })
}

/// The card in prose, for people browsing the repository.
pub fn readme(card: &Value) -> String {
    let f = |v: &Value| v.as_f64().map_or_else(|| "?".into(), |x| format!("{x:.3}"));
    let n = |v: &Value| v.as_u64().map_or_else(|| "?".into(), |x| format!("{:.1} M", x as f64 / 1e6));
    let given = |field: &str, what: &str, that: &str| {
        let origin = &card[field];
        if origin.is_null() {
            return String::new();
        }
        format!(
            " {what} (weights SHA-256 {}); {that} was built with `{}` at commit {}.",
            origin["weights_sha256"].as_str().unwrap_or("?"),
            origin["command"].as_str().unwrap_or("?"),
            origin["commit"].as_str().unwrap_or("?"),
        )
    };
    let origins = given("target_from", "The target was given with `--target-from`", "it")
        + &given("draft_from", "The draft was trained further from the one given with `--draft-from`", "that one");
    format!(
        "# The specd demo pair\n\n\
         A Llama target and a much smaller Llama draft distilled from it, trained by specd on the \
         Python standard library's sources, for `make demo` and `specd bench`. They show the \
         machinery; their code is code-shaped, not correct.\n\n\
         | | target | draft |\n|---|---|---|\n\
         | parameters | {} | {} |\n| weights | bf16 | f32 |\n| training tokens | {} | {} |\n\
         | held-out loss (nats/token) | {} | {} |\n\n\
         Acceptance α = mean Σ min(p, q) on held-out text: {} greedy, {} at T = 0.8, {} at T = 1.\n\n\
         Built with `{}` at commit {} on {} ({} cores).{} Every file of `target/` and `draft/` is \
         listed in their `SHA256SUMS`, which specd checks at load. All figures, and the copy \
         probe's (`scripts/copy_probe.py --card`), are in `card.json`.\n",
        n(&card["parameters"]["target"]),
        n(&card["parameters"]["draft"]),
        n(&card["tokens_seen"]["target"]),
        n(&card["tokens_seen"]["draft"]),
        f(&card["held_out_loss"]["target"]),
        f(&card["held_out_loss"]["draft"]),
        f(&card["alpha"]["t0"]),
        f(&card["alpha"]["t0_8"]),
        f(&card["alpha"]["t1"]),
        card["command"].as_str().unwrap_or("?"),
        card["commit"].as_str().unwrap_or("?"),
        card["host"]["cpu"].as_str().unwrap_or("an unknown CPU"),
        card["host"]["cores"],
        origins,
    )
}

/// Writes `card.json` and `README.md` into the shipped pair's directory.
pub fn write(dir: &Path, card: &Value) -> anyhow::Result<()> {
    std::fs::write(dir.join("card.json"), serde_json::to_string_pretty(card)? + "\n")?;
    std::fs::write(dir.join("README.md"), readme(card))?;
    Ok(())
}
