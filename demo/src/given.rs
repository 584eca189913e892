//! Models the build is given instead of starting from nothing (`specd models demo
//! --target-from`, `--draft-from`): shipped models of the same preset, checked whole before
//! any training, so that a new draft can be distilled against the very target the repository
//! ships, or the shipped draft trained further, without paying again for the hours they cost.

use std::path::{Path, PathBuf};

use serde_json::Value;
use specd_model::LlamaConfig;
use specd_model::checksums::{CHECKSUMS_FILE, sha256_of, verify_checksums};

use crate::error::{DemoError, Result};
use crate::export::{WeightsFormat, config_json};
use crate::spec::DemoSpec;

const WEIGHTS_FILE: &str = "model.safetensors";

/// What a build is given: a shipped target, and the shipped draft to train further if any.
/// Checked whole when opened, so that a wrong one is refused before any work.
#[derive(Debug, Clone)]
pub struct GivenPair {
    pub target: GivenModel,
    /// Shares the target's tokenizer: a draft is trained further against the target it was
    /// distilled from.
    pub draft: Option<GivenModel>,
}

impl GivenPair {
    /// Opens `target_dir` (`--target-from`) and `draft_dir` (`--draft-from`) as `spec`'s
    /// target and draft.
    pub fn open(target_dir: &Path, draft_dir: Option<&Path>, spec: &DemoSpec) -> Result<Self> {
        let target = GivenModel::open("--target-from", target_dir, &spec.llama_config(spec.target))?;
        let draft = draft_dir
            .map(|dir| GivenModel::open_beside("--draft-from", dir, &spec.llama_config(spec.draft), &target))
            .transpose()?;
        Ok(Self { target, draft })
    }
}

/// A checked model directory.
#[derive(Debug, Clone)]
pub struct GivenModel {
    pub dir: PathBuf,
    /// Lower-case hex SHA-256 of its weights: what the cache keys hold for it.
    pub weights_sha256: String,
}

impl GivenModel {
    /// Checks that `dir` is a model this builder shipped for `cfg`: every file its
    /// `SHA256SUMS` lists matches, and its `config.json` is the one `cfg` is written as (the
    /// number format aside), so its weights fit the store the build declares. `flag` names
    /// the option that gave it, for the messages.
    pub fn open(flag: &str, dir: &Path, cfg: &LlamaConfig) -> Result<Self> {
        let invalid = |why: String| DemoError::InvalidInput(format!("{flag} {}: {why}", dir.display()));
        if verify_checksums(dir)? == 0 {
            return Err(invalid(format!(
                "it has no {CHECKSUMS_FILE}; give a model directory that `specd models demo --ship-to` wrote"
            )));
        }
        let config_path = dir.join("config.json");
        let text = std::fs::read_to_string(&config_path)
            .map_err(|source| DemoError::Io { path: config_path.clone(), source })?;
        let found: Value = serde_json::from_str(&text).map_err(|e| invalid(format!("config.json is not JSON: {e}")))?;
        let expected = config_json(cfg, WeightsFormat::Bf16);
        if let Some(field) = first_difference(&expected, &found) {
            return Err(invalid(format!(
                "its config.json has {field} = {}, but this preset's model there has {}: build with the preset that made it",
                found.get(field).unwrap_or(&Value::Null),
                expected[field]
            )));
        }
        for file in [WEIGHTS_FILE, "tokenizer.json"] {
            if !dir.join(file).is_file() {
                return Err(invalid(format!("it has no {file}")));
            }
        }
        let weights = dir.join(WEIGHTS_FILE);
        let weights_sha256 = sha256_of(&weights).map_err(|source| DemoError::Io { path: weights, source })?;
        Ok(Self { dir: dir.to_owned(), weights_sha256 })
    }

    /// [`Self::open`], for a model that must share `beside`'s tokenizer (a draft trained
    /// further against the target it was distilled from).
    pub fn open_beside(flag: &str, dir: &Path, cfg: &LlamaConfig, beside: &GivenModel) -> Result<Self> {
        let model = Self::open(flag, dir, cfg)?;
        let read = |path: PathBuf| std::fs::read(&path).map_err(|source| DemoError::Io { path, source });
        if read(model.tokenizer_json())? != read(beside.tokenizer_json())? {
            return Err(DemoError::InvalidInput(format!(
                "{flag} {}: its tokenizer.json is not the one of {}",
                dir.display(),
                beside.dir.display()
            )));
        }
        Ok(model)
    }

    /// Its directory and digest, as the build's record states them.
    pub fn summary(&self) -> Value {
        serde_json::json!({"dir": self.dir, "weights_sha256": self.weights_sha256})
    }

    pub fn weights(&self) -> PathBuf {
        self.dir.join(WEIGHTS_FILE)
    }

    pub fn tokenizer_json(&self) -> PathBuf {
        self.dir.join("tokenizer.json")
    }
}

/// The first field of `expected` (in its order) whose value `found` does not have, the
/// number format aside: a bf16 or an f32 copy of the same model is the same target.
fn first_difference<'a>(expected: &'a Value, found: &Value) -> Option<&'a str> {
    let expected = expected.as_object()?;
    expected
        .iter()
        .find(|(key, value)| key.as_str() != "torch_dtype" && found.get(key.as_str()) != Some(*value))
        .map(|(key, _)| key.as_str())
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn the_first_differing_field_is_named_and_the_number_format_is_not_one() {
        let expected = json!({"hidden_size": 384, "num_hidden_layers": 6, "torch_dtype": "bfloat16"});
        assert_eq!(first_difference(&expected, &json!({"hidden_size": 384, "num_hidden_layers": 6})), None);
        assert_eq!(
            first_difference(&expected, &json!({"hidden_size": 384, "num_hidden_layers": 6, "torch_dtype": "float32"})),
            None
        );
        assert_eq!(
            first_difference(&expected, &json!({"hidden_size": 128, "num_hidden_layers": 2})),
            Some("hidden_size")
        );
        assert_eq!(first_difference(&expected, &json!({"hidden_size": 384})), Some("num_hidden_layers"));
    }
}
