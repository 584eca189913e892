//! `tokenizer.json` through the `tokenizers` crate, and the vocabulary fingerprint.

use std::path::{Path, PathBuf};

use sha2::{Digest, Sha256};

use crate::error::{ModelError, Result};

/// A Hugging Face tokenizer plus the fingerprint of its vocabulary.
#[derive(Debug)]
pub struct TextTokenizer {
    inner: tokenizers::Tokenizer,
    path: PathBuf,
    fingerprint: String,
}

impl TextTokenizer {
    /// Loads `tokenizer.json`.
    pub fn from_file(path: &Path) -> Result<Self> {
        if !path.is_file() {
            return Err(ModelError::MissingFile {
                path: path.to_owned(),
                what: "tokenizer.json is needed to encode text".into(),
            });
        }
        let inner = tokenizers::Tokenizer::from_file(path)
            .map_err(|e| ModelError::Tokenizer { path: path.to_owned(), message: e.to_string() })?;
        let mut vocab: Vec<(u32, String)> = inner.get_vocab(true).into_iter().map(|(s, id)| (id, s)).collect();
        vocab.sort();
        let fingerprint = fingerprint_of(vocab.iter().map(|(id, s)| (*id, s.as_str())));
        Ok(Self { inner, path: path.to_owned(), fingerprint })
    }

    /// `sha256:` + hex of SHA-256 over every (id, token string) pair, sorted by id, special
    /// tokens included. Equal fingerprints mean the same ids denote the same strings.
    pub fn fingerprint(&self) -> &str {
        &self.fingerprint
    }

    /// Encodes text into ids, adding the special tokens the tokenizer's post-processor adds
    /// (e.g. BOS), as `transformers` does by default.
    pub fn encode(&self, text: &str) -> Result<Vec<u32>> {
        let enc = self.inner.encode(text, true).map_err(|e| self.err(&e))?;
        Ok(enc.get_ids().to_vec())
    }

    /// Decodes ids into text, skipping special tokens.
    pub fn decode(&self, ids: &[u32]) -> Result<String> {
        self.inner.decode(ids, true).map_err(|e| self.err(&e))
    }

    fn err(&self, e: &dyn std::fmt::Display) -> ModelError {
        ModelError::Tokenizer { path: self.path.clone(), message: e.to_string() }
    }
}

/// The fingerprint of a vocabulary given as (id, string) pairs in id order.
pub fn fingerprint_of<'a>(pairs: impl IntoIterator<Item = (u32, &'a str)>) -> String {
    let mut h = Sha256::new();
    for (id, s) in pairs {
        h.update(id.to_le_bytes());
        h.update((s.len() as u64).to_le_bytes());
        h.update(s.as_bytes());
    }
    let digest = h.finalize();
    let hex: String = digest.iter().map(|b| format!("{b:02x}")).collect();
    format!("sha256:{hex}")
}
