//! Shared helpers of specd-text's tests: the Python reference (transformers, `tokenizers`)
//! run as the workspace's other tests run Python, and the test tokenizers it makes.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::{Arc, OnceLock};

use serde::Serialize;
use serde::de::DeserializeOwned;
use specd_text::Tokenizer;

/// Bump when `text_reference.py` changes the tokenizers it writes.
const TOKENIZERS_VERSION: &str = "text-v1";

pub fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().expect("text/ has a parent").to_path_buf()
}

/// `$SPECD_PYTHON`, else the workspace's `.venv` (as the model fixtures are made); a test that
/// needs it fails, rather than skips, when it cannot run.
pub fn python() -> PathBuf {
    std::env::var_os("SPECD_PYTHON").map_or_else(|| workspace_root().join(".venv/bin/python"), PathBuf::from)
}

fn script() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/text_reference.py")
}

fn run_python(args: &[&std::ffi::OsStr]) {
    let python = python();
    let status = Command::new(&python)
        .arg(script())
        .args(args)
        .status()
        .unwrap_or_else(|e| panic!("cannot run {} ({e}); set SPECD_PYTHON or make pydeps", python.display()));
    assert!(status.success(), "text_reference.py {args:?} failed ({status}); is transformers installed (make pydeps)?");
}

/// `target/fixtures/text-v1`, made on first use by `text_reference.py tokenizers`.
pub fn tokenizers_dir() -> &'static Path {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        let out = workspace_root().join("target/fixtures").join(TOKENIZERS_VERSION);
        if !out.join("metaspace/tokenizer.json").is_file() {
            std::fs::create_dir_all(out.parent().expect("fixtures parent")).expect("create target/fixtures");
            run_python(&["tokenizers".as_ref(), out.as_os_str()]);
        }
        out
    })
}

/// The path of a test tokenizer: `byte_level`, `metaspace` or `fixture_bpe`.
pub fn tokenizer_path(name: &str) -> PathBuf {
    tokenizers_dir().join(name).join("tokenizer.json")
}

pub fn tokenizer(name: &str) -> Arc<Tokenizer> {
    let path = tokenizer_path(name);
    Arc::new(Tokenizer::from_file(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display())))
}

/// Runs `text_reference.py MODE` on `job` and returns its answer.
pub fn reference<J: Serialize, R: DeserializeOwned>(mode: &str, job: &J) -> R {
    let dir = std::env::temp_dir().join(format!(
        "specd-text-{mode}-{}-{:?}",
        std::process::id(),
        std::thread::current().id()
    ));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let (input, output) = (dir.join("in.json"), dir.join("out.json"));
    std::fs::write(&input, serde_json::to_vec(job).expect("job to JSON")).expect("write job");
    run_python(&[mode.as_ref(), input.as_os_str(), output.as_os_str()]);
    let answer = serde_json::from_slice(&std::fs::read(&output).expect("read answer")).expect("answer JSON");
    let _ = std::fs::remove_dir_all(&dir);
    answer
}

/// A small seeded generator (SplitMix64) so that streams are the same on every run.
#[derive(Debug)]
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Self {
        Self(seed)
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in `0..n`.
    pub fn below(&mut self, n: usize) -> usize {
        (self.next_u64() % n as u64) as usize
    }
}
