//! The training text: Python sources, which every machine with Python has.

use std::path::{Path, PathBuf};
use std::process::Command;

use sha2::{Digest, Sha256};

use crate::error::{DemoError, Result};

/// One file of the corpus.
#[derive(Debug, Clone)]
pub struct Document {
    /// Relative to the corpus root, with `/` separators; decides the split.
    pub name: String,
    pub text: String,
}

/// The corpus split into training and held-out files (every file lands wholly in one).
#[derive(Debug)]
pub struct Corpus {
    pub root: PathBuf,
    pub train: Vec<Document>,
    pub held_out: Vec<Document>,
    /// SHA-256 over names and contents: the cache key for everything trained on it.
    pub fingerprint: String,
}

/// Directories whose files are not ordinary library code (huge generated tables, vendored
/// packages, the test suite's fixtures with deliberately broken syntax).
const SKIPPED_DIRS: [&str; 6] = ["test", "tests", "site-packages", "dist-packages", "__pycache__", "idlelib"];

/// The Python standard library's source directory, asked of `python3` (or `$SPECD_PYTHON`).
pub fn python_stdlib() -> Result<PathBuf> {
    let python = std::env::var("SPECD_PYTHON").unwrap_or_else(|_| "python3".into());
    let missing = |why: String| {
        DemoError::Corpus(format!(
            "cannot find the Python standard library to train on ({why}); pass --corpus DIR with .py files"
        ))
    };
    let out = Command::new(&python)
        .args(["-c", "import sysconfig; print(sysconfig.get_paths()['stdlib'])"])
        .output()
        .map_err(|e| missing(format!("running {python}: {e}")))?;
    if !out.status.success() {
        return Err(missing(format!("{python} exited with {}", out.status)));
    }
    let dir = PathBuf::from(String::from_utf8_lossy(&out.stdout).trim());
    if !dir.is_dir() {
        return Err(missing(format!("{} is not a directory", dir.display())));
    }
    Ok(dir)
}

/// Reads `.py` files under `root` in path order until `max_bytes`, and holds out about one
/// file in ten (chosen by a hash of its name, so the split does not move when files are added).
pub fn load(root: &Path, max_bytes: usize) -> Result<Corpus> {
    let mut paths = Vec::new();
    collect(root, &mut paths)?;
    paths.sort();
    let mut hasher = Sha256::new();
    let (mut train, mut held_out, mut total) = (Vec::new(), Vec::new(), 0usize);
    for path in paths {
        let Ok(text) = std::fs::read_to_string(&path) else { continue };
        if text.trim().is_empty() {
            continue;
        }
        if total + text.len() > max_bytes && total > 0 {
            break;
        }
        total += text.len();
        let name = path.strip_prefix(root).unwrap_or(&path).to_string_lossy().replace('\\', "/");
        hasher.update(name.as_bytes());
        hasher.update([0]);
        hasher.update(text.as_bytes());
        hasher.update([0]);
        let held = Sha256::digest(name.as_bytes())[0] % 10 == 0;
        let doc = Document { name, text };
        if held { held_out.push(doc) } else { train.push(doc) }
    }
    if train.is_empty() || held_out.is_empty() {
        return Err(DemoError::Corpus(format!(
            "{} has too few .py files to train on and hold some out ({} train, {} held out)",
            root.display(),
            train.len(),
            held_out.len()
        )));
    }
    let fingerprint = format!("sha256:{:x}", hasher.finalize());
    Ok(Corpus { root: root.to_owned(), train, held_out, fingerprint })
}

fn collect(dir: &Path, out: &mut Vec<PathBuf>) -> Result<()> {
    let entries = std::fs::read_dir(dir).map_err(|source| DemoError::Io { path: dir.to_owned(), source })?;
    for entry in entries.flatten() {
        let path = entry.path();
        let name = entry.file_name();
        let name = name.to_string_lossy();
        let Ok(kind) = entry.file_type() else { continue };
        if kind.is_dir() {
            if !SKIPPED_DIRS.contains(&name.as_ref()) && !name.starts_with('.') {
                collect(&path, out)?;
            }
        } else if kind.is_file() && name.ends_with(".py") {
            out.push(path);
        }
    }
    Ok(())
}

impl Corpus {
    pub fn train_bytes(&self) -> usize {
        self.train.iter().map(|d| d.text.len()).sum()
    }
}
