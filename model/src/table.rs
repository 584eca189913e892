//! The table model: next-token distributions written out explicitly in a JSON file.
//!
//! It lets the law tests drive the whole system with known p and q over a tiny vocabulary.
//!
//! # File format
//!
//! ```json
//! {
//!   "vocab_size": 3,
//!   "tokens": ["A", "B", "C"],
//!   "eos_token_ids": [],
//!   "context_length": 256,
//!   "default": [0.6, 0.3, 0.1],
//!   "rules": [
//!     { "prefix": [0, 1], "probs": [0.0, 0.5, 0.5] },
//!     { "suffix": [2],    "probs": [1.0, 0.0, 0.0] }
//!   ]
//! }
//! ```
//!
//! - `vocab_size` (required, ≥ 1): ids are `0..vocab_size`.
//! - `tokens` (optional): one distinct name per id, for the first ids or all of them (the
//!   ids past the names are padding rows no token string maps to). They make `--text` work
//!   (the text is split on whitespace and each word must be a name) and enter the
//!   fingerprint.
//! - `eos_token_ids` (optional, default none), `context_length` (optional, default 4096).
//! - `default` (required): the distribution wherever no rule matches.
//! - `rules` (optional): each has exactly one of `prefix` (matches when the session's whole
//!   token history equals it) or `suffix` (matches when the history ends with it), and
//!   `probs`. The distribution for the token after history `h` is the `prefix` rule equal to
//!   `h` if any, else the matching `suffix` rule with the longest suffix, else `default`.
//!   Two rules with the same key are an error.
//!
//! Every probability vector has `vocab_size` finite, non-negative entries summing to 1
//! within 1e-6. The model returns logits `ln p` (as `f32`), and
//! [`ZERO_PROB_LOGIT`] (-1e30, finite so that temperature and penalties stay finite) where
//! `p = 0`: a softmax gives back `p` up to `f32` rounding and exactly 0 where `p = 0`.
//!
//! The tokenizer fingerprint is `sha256` over (id, name) pairs, with names defaulting to
//! the decimal id, so two table files with the same vocabulary share it.

use std::collections::HashMap;
use std::path::Path;

use serde::Deserialize;

use crate::config::read_json;
use crate::error::{ModelError, Result};
use crate::language_model::{LanguageModel, Logits, ModelInfo, SessionId, check_tokens};
use crate::sessions::{SessionTable, resolve_capacity};
use crate::tokenizer::fingerprint_of;

/// The logit standing for probability zero.
pub const ZERO_PROB_LOGIT: f32 = -1e30;

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct TableFile {
    vocab_size: usize,
    #[serde(default)]
    tokens: Option<Vec<String>>,
    #[serde(default)]
    eos_token_ids: Vec<u32>,
    #[serde(default = "default_context")]
    context_length: usize,
    default: Vec<f64>,
    #[serde(default)]
    rules: Vec<RuleFile>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RuleFile {
    prefix: Option<Vec<u32>>,
    suffix: Option<Vec<u32>>,
    probs: Vec<f64>,
}

fn default_context() -> usize {
    4096
}

/// A model whose conditional distributions are given by a table.
#[derive(Debug)]
pub struct TableModel {
    info: ModelInfo,
    names: Option<HashMap<String, u32>>,
    /// Logit rows: index 0 is the default.
    rows: Vec<Vec<f32>>,
    by_prefix: HashMap<Vec<u32>, usize>,
    by_suffix: HashMap<Vec<u32>, usize>,
    max_suffix: usize,
    sessions: SessionTable<Vec<u32>>,
    /// See [`Self::with_logits_in_tensors`].
    logits_in_tensors: bool,
}

impl TableModel {
    /// Forward passes return their rows in a CPU tensor, as a libtorch model loaded with
    /// [`crate::LoadOptions::logits_on_device`] does on a CPU: so the law tests run a node's
    /// device path on a table model.
    pub fn with_logits_in_tensors(mut self, yes: bool) -> Self {
        self.logits_in_tensors = yes;
        self
    }

    /// Reads a table file (format in the module docs).
    pub fn load(path: &Path, memory_budget: Option<u64>) -> Result<Self> {
        let value = read_json(path, "the table model file")?;
        let name = path.file_name().map_or_else(|| path.display().to_string(), |n| n.to_string_lossy().into_owned());
        Self::from_json(&name, value, memory_budget)
            .map_err(|message| ModelError::InvalidFile { path: path.to_owned(), message })
    }

    /// Builds a table model from its JSON value; errors are plain messages.
    pub fn from_json(
        name: &str,
        value: serde_json::Value,
        memory_budget: Option<u64>,
    ) -> std::result::Result<Self, String> {
        let file: TableFile = serde_json::from_value(value).map_err(|e| e.to_string())?;
        let v = file.vocab_size;
        if v == 0 || v > u32::MAX as usize {
            return Err(format!("vocab_size {v} must be at least 1"));
        }
        if file.context_length == 0 {
            return Err("context_length must be at least 1".into());
        }
        if let Some(bad) = file.eos_token_ids.iter().find(|&&t| t as usize >= v) {
            return Err(format!("eos token {bad} is outside the vocabulary of {v}"));
        }
        let names = match &file.tokens {
            None => None,
            Some(tokens) => {
                // Fewer names than rows: the rest are padding rows, as real checkpoints pad
                // their embeddings past the tokenizer.
                if tokens.is_empty() || tokens.len() > v {
                    return Err(format!("{} token names for vocab_size {v}", tokens.len()));
                }
                let mut map = HashMap::new();
                for (i, t) in tokens.iter().enumerate() {
                    if t.is_empty() || t.chars().any(char::is_whitespace) {
                        return Err(format!("token name {t:?} must be non-empty without spaces"));
                    }
                    if map.insert(t.clone(), i as u32).is_some() {
                        return Err(format!("token name {t:?} appears twice"));
                    }
                }
                Some(map)
            }
        };
        let fingerprint = match &file.tokens {
            Some(t) => fingerprint_of(t.iter().enumerate().map(|(i, s)| (i as u32, s.as_str()))),
            None => {
                let ids: Vec<String> = (0..v).map(|i| i.to_string()).collect();
                fingerprint_of(ids.iter().enumerate().map(|(i, s)| (i as u32, s.as_str())))
            }
        };
        let mut rows = vec![logit_row(&file.default, v).map_err(|e| format!("default: {e}"))?];
        let mut by_prefix = HashMap::new();
        let mut by_suffix = HashMap::new();
        for (i, rule) in file.rules.into_iter().enumerate() {
            let row = logit_row(&rule.probs, v).map_err(|e| format!("rules[{i}]: {e}"))?;
            let (key, map) = match (rule.prefix, rule.suffix) {
                (Some(p), None) => (p, &mut by_prefix),
                (None, Some(s)) => (s, &mut by_suffix),
                _ => return Err(format!("rules[{i}] needs exactly one of prefix or suffix")),
            };
            if key.is_empty() {
                return Err(format!("rules[{i}] has an empty key"));
            }
            if let Some(bad) = key.iter().find(|&&t| t as usize >= v) {
                return Err(format!("rules[{i}] names token {bad} outside the vocabulary"));
            }
            if map.insert(key, rows.len()).is_some() {
                return Err(format!("rules[{i}] repeats an earlier rule's key"));
            }
            rows.push(row);
        }
        let max_suffix = by_suffix.keys().map(Vec::len).max().unwrap_or(0);
        Ok(Self {
            info: ModelInfo {
                name: name.to_owned(),
                architecture: "Table".into(),
                vocab_size: v,
                eos_token_ids: file.eos_token_ids,
                bos_token_id: None,
                context_length: file.context_length,
                tokenizer_fingerprint: fingerprint,
                has_tokenizer: names.is_some(),
                kv_bytes_per_token: 4,
                dtype: crate::device::DType::F32,
                engine: "table",
            },
            names,
            rows,
            by_prefix,
            by_suffix,
            max_suffix,
            sessions: SessionTable::new(memory_budget),
            logits_in_tensors: false,
        })
    }

    /// The logit row that follows `history` (non-empty).
    /// The table's token names as a `tokenizer.json` (word level, split on whitespace, decoded
    /// joined by spaces): encodes and decodes as the table model does, so that the coordinator
    /// can do the text work for a table model too. `None` when the table names no tokens.
    pub fn tokenizer_json(&self) -> Option<String> {
        let vocab: serde_json::Map<String, serde_json::Value> =
            self.names.as_ref()?.iter().map(|(name, &id)| (name.clone(), id.into())).collect();
        let tokenizer = serde_json::json!({
            "version": "1.0",
            "truncation": null,
            "padding": null,
            "added_tokens": [],
            "normalizer": null,
            "pre_tokenizer": {"type": "WhitespaceSplit"},
            "post_processor": null,
            "decoder": null,
            // A word not in the table is an error, as in `encode`: the unknown token holds a
            // space, so no word is it, and it is not in the vocabulary.
            "model": {"type": "WordLevel", "vocab": vocab, "unk_token": "not a token"},
        });
        Some(tokenizer.to_string())
    }

    fn row_for(&self, history: &[u32]) -> &[f32] {
        if let Some(&r) = self.by_prefix.get(history) {
            return &self.rows[r];
        }
        for len in (1..=self.max_suffix.min(history.len())).rev() {
            if let Some(&r) = self.by_suffix.get(&history[history.len() - len..]) {
                return &self.rows[r];
            }
        }
        &self.rows[0]
    }
}

fn logit_row(probs: &[f64], v: usize) -> std::result::Result<Vec<f32>, String> {
    if probs.len() != v {
        return Err(format!("{} probabilities for vocab_size {v}", probs.len()));
    }
    if let Some(bad) = probs.iter().find(|p| !p.is_finite() || **p < 0.0) {
        return Err(format!("probability {bad} is not finite and non-negative"));
    }
    let sum: f64 = probs.iter().sum();
    if (sum - 1.0).abs() > 1e-6 {
        return Err(format!("probabilities sum to {sum}, not 1"));
    }
    Ok(probs.iter().map(|&p| if p > 0.0 { p.ln() as f32 } else { ZERO_PROB_LOGIT }).collect())
}

impl TableModel {
    /// Counts `extra` more tokens against the session's reservation, growing it by whole
    /// chunks within the budget: the history vector grows by itself, only the accounting
    /// follows.
    fn make_room(&mut self, session: SessionId, extra: usize) -> Result<()> {
        let (max, per_token) = (self.info.context_length, self.info.kv_bytes_per_token);
        if let Some(growth) = self.sessions.growth(session, extra, max, per_token)? {
            self.sessions.grown(session, growth)?;
        }
        Ok(())
    }
}

impl LanguageModel for TableModel {
    fn info(&self) -> &ModelInfo {
        &self.info
    }

    fn open_session(&mut self, capacity: Option<usize>) -> Result<SessionId> {
        let cap = resolve_capacity(capacity, self.info.context_length)?;
        let bytes = self.info.kv_bytes_per_token * cap as u64;
        self.sessions.admit(bytes)?;
        self.sessions.insert(Vec::with_capacity(cap), cap, bytes)
    }

    fn session_len(&self, session: SessionId) -> Result<usize> {
        Ok(self.sessions.get(session)?.len)
    }

    fn fork_session(&mut self, source: SessionId, len: usize, capacity: Option<usize>) -> Result<SessionId> {
        let cap = resolve_capacity(capacity, self.info.context_length)?;
        self.sessions.check_copy(source, len, cap)?;
        let bytes = self.info.kv_bytes_per_token * cap as u64;
        self.sessions.admit(bytes)?;
        let mut history = Vec::with_capacity(cap);
        history.extend_from_slice(&self.sessions.get(source)?.state[..len]);
        self.sessions.insert_holding(history, cap, bytes, len)
    }

    fn reserve(&mut self, session: SessionId, capacity: usize) -> Result<()> {
        let len = self.sessions.get(session)?.len;
        self.make_room(session, capacity.saturating_sub(len))
    }

    fn forward(&mut self, session: SessionId, tokens: &[u32]) -> Result<Logits> {
        check_tokens(tokens, self.info.vocab_size)?;
        self.make_room(session, tokens.len())?;
        let s = self.sessions.get_mut(session)?;
        let mut history = std::mem::take(&mut s.state);
        history.truncate(s.len);
        let mut data = Vec::with_capacity(tokens.len() * self.info.vocab_size);
        for &t in tokens {
            history.push(t);
            data.extend_from_slice(self.row_for(&history));
        }
        let s = self.sessions.get_mut(session)?;
        s.len = history.len();
        s.state = history;
        let logits = Logits::new(self.info.vocab_size, data)?;
        if self.logits_in_tensors { Logits::from_tensor(logits.tensor()?) } else { Ok(logits) }
    }

    fn truncate(&mut self, session: SessionId, len: usize) -> Result<()> {
        self.sessions.truncate(session, len)
    }

    fn release(&mut self, session: SessionId) -> Result<()> {
        self.sessions.remove(session)
    }

    fn set_memory_budget(&mut self, budget: Option<u64>) -> Result<()> {
        self.sessions.set_budget(budget);
        Ok(())
    }

    fn memory_in_use(&self) -> (u64, Option<u64>) {
        self.sessions.memory()
    }

    fn open_sessions(&self) -> usize {
        self.sessions.len()
    }

    fn encode(&self, text: &str) -> Result<Vec<u32>> {
        let names = self
            .names
            .as_ref()
            .ok_or_else(|| ModelError::InvalidInput(format!("{} names no tokens; pass token ids", self.info.name)))?;
        text.split_whitespace()
            .map(|w| {
                names
                    .get(w)
                    .copied()
                    .ok_or_else(|| ModelError::InvalidInput(format!("{w:?} is not a token of {}", self.info.name)))
            })
            .collect()
    }

    /// Token names joined by single spaces: the inverse of `encode`.
    fn decode(&self, ids: &[u32]) -> Result<String> {
        let names = self
            .names
            .as_ref()
            .ok_or_else(|| ModelError::InvalidInput(format!("{} names no tokens to decode with", self.info.name)))?;
        let mut by_id = vec![""; self.info.vocab_size];
        for (name, &id) in names {
            by_id[id as usize] = name;
        }
        let words: Result<Vec<&str>> = ids
            .iter()
            .map(|&id| {
                by_id.get(id as usize).copied().ok_or_else(|| {
                    ModelError::InvalidInput(format!("token id {id} is outside the vocabulary of {}", self.info.name))
                })
            })
            .collect();
        Ok(words?.join(" "))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::language_model::LanguageModel;

    #[test]
    fn the_tokenizer_json_encodes_and_decodes_as_the_table() {
        let json =
            serde_json::json!({"vocab_size": 4, "tokens": ["red", "green", "blue"], "default": [0.4, 0.3, 0.2, 0.1]});
        let table = TableModel::from_json("t", json, None).unwrap();
        let tokenizer: tokenizers::Tokenizer = table.tokenizer_json().unwrap().parse().unwrap();
        let text = "red  blue green\tred";
        let ids = tokenizer.encode(text, true).unwrap().get_ids().to_vec();
        assert_eq!(ids, table.encode(text).unwrap());
        assert_eq!(tokenizer.decode(&ids, true).unwrap(), table.decode(&ids).unwrap());
        assert!(tokenizer.encode("red purple", true).is_err(), "a word the table lacks is an error");
        assert!(table.encode("red purple").is_err());
        let unnamed = serde_json::json!({"vocab_size": 2, "default": [0.5, 0.5]});
        assert_eq!(TableModel::from_json("u", unnamed, None).unwrap().tokenizer_json(), None);
    }
}
