//! Shared test helpers: the fixture cache and reference files.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

use anyhow::{Context, Result, bail};
use serde::Deserialize;
use specd_model::{DType, DeviceSpec, LlamaModel, LoadOptions, Logits};

/// Bump when `scripts/make_fixtures.py` changes what it writes.
const FIXTURE_VERSION: &str = "model-v5";

pub const FIXTURES: [&str; 9] = [
    "llama_gqa_untied",
    "llama_tied",
    "qwen2",
    "mistral_sharded",
    "mistral_window",
    "qwen3_tied_yarn",
    "qwen3_untied",
    "gemma3",
    "gemma3_multimodal",
];

pub fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().expect("model/ has a parent").to_path_buf()
}

/// `target/fixtures/model-v5`, made by `scripts/make_fixtures.py` on first use (PyPI
/// `transformers` + torch, random weights, nothing downloaded).
pub fn fixtures_dir() -> &'static Path {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| make_fixtures().expect("cannot make fixtures"))
}

fn make_fixtures() -> Result<PathBuf> {
    let root = workspace_root();
    let out = root.join("target").join("fixtures").join(FIXTURE_VERSION);
    if out.join("VERSION").is_file() {
        return Ok(out);
    }
    std::fs::create_dir_all(out.parent().context("fixture parent")?)?;
    let python = std::env::var_os("SPECD_PYTHON").map_or_else(|| root.join(".venv/bin/python"), PathBuf::from);
    let status = Command::new(&python)
        .arg(root.join("scripts/make_fixtures.py"))
        .arg(&out)
        .status()
        .with_context(|| format!("running {}", python.display()))?;
    if !status.success() || !out.join("VERSION").is_file() {
        bail!("scripts/make_fixtures.py failed ({status}); is transformers installed (make pydeps)?");
    }
    Ok(out)
}

pub fn fixture(name: &str) -> PathBuf {
    fixtures_dir().join(name)
}

#[derive(Debug, Deserialize)]
pub struct Reference {
    pub tokens: Vec<u32>,
    pub logits: Vec<Vec<f32>>,
    /// transformers' logits for the model cast to bf16.
    pub bf16_logits: Vec<Vec<f32>>,
    pub text: String,
    pub text_ids: Vec<u32>,
    pub eos: Vec<u32>,
}

pub fn reference(name: &str) -> Result<Reference> {
    let text = std::fs::read_to_string(fixture(name).join("reference.json"))?;
    Ok(serde_json::from_str(&text)?)
}

pub fn cpu_f32() -> LoadOptions {
    LoadOptions { device: DeviceSpec::Cpu, dtype: DType::F32, ..LoadOptions::default() }
}

pub fn load(name: &str) -> Result<LlamaModel> {
    Ok(LlamaModel::load(&fixture(name), &cpu_f32())?)
}

/// Largest |a - b| over two logit tables of equal shape.
pub fn max_abs_diff(a: &[Vec<f32>], b: &[Vec<f32>]) -> f32 {
    assert_eq!(a.len(), b.len(), "row counts differ");
    a.iter()
        .zip(b)
        .flat_map(|(x, y)| {
            assert_eq!(x.len(), y.len(), "row widths differ");
            x.iter().zip(y).map(|(p, q)| (p - q).abs())
        })
        .fold(0.0, f32::max)
}

/// Concatenates the rows of several forwards.
pub fn rows(parts: &[Logits]) -> Vec<Vec<f32>> {
    parts.iter().flat_map(Logits::to_rows).collect()
}
