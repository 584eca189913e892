//! What both engines read from a checkpoint directory besides its weights: its name and its
//! optional `tokenizer.json`, the [`ModelInfo`] they describe, and text in and out.

use std::path::Path;

use crate::config::LlamaConfig;
use crate::device::DType;
use crate::error::{ModelError, Result};
use crate::kv_cache::KvCache;
use crate::language_model::ModelInfo;
use crate::tokenizer::TextTokenizer;

#[derive(Debug)]
pub(crate) struct CheckpointText {
    /// The directory's name.
    pub(crate) name: String,
    pub(crate) tokenizer: Option<TextTokenizer>,
}

impl CheckpointText {
    pub(crate) fn read(dir: &Path) -> Result<Self> {
        let path = dir.join("tokenizer.json");
        let tokenizer = if path.is_file() { Some(TextTokenizer::from_file(&path)?) } else { None };
        let name = dir.file_name().map_or_else(|| dir.display().to_string(), |n| n.to_string_lossy().into_owned());
        Ok(Self { name, tokenizer })
    }

    /// The facts of a model of `cfg` with this name and tokenizer, kept in `dtype` (its KV
    /// cache too) and run by `engine`.
    pub(crate) fn info(&self, cfg: &LlamaConfig, dtype: DType, engine: &'static str) -> ModelInfo {
        let tokenizer_fingerprint = self
            .tokenizer
            .as_ref()
            .map_or_else(|| format!("untokenized:vocab_size={}", cfg.vocab_size), |t| t.fingerprint().to_owned());
        ModelInfo {
            name: self.name.clone(),
            architecture: cfg.architecture.class_name().to_owned(),
            vocab_size: cfg.vocab_size,
            eos_token_ids: cfg.eos_token_ids.clone(),
            bos_token_id: cfg.bos_token_id,
            context_length: cfg.max_position_embeddings,
            tokenizer_fingerprint,
            has_tokenizer: self.tokenizer.is_some(),
            kv_bytes_per_token: KvCache::bytes(
                cfg.num_hidden_layers,
                cfg.num_key_value_heads,
                1,
                cfg.head_dim,
                dtype.size_in_bytes(),
            ),
            dtype,
            engine,
        }
    }

    pub(crate) fn encode(&self, text: &str) -> Result<Vec<u32>> {
        match &self.tokenizer {
            Some(t) => t.encode(text),
            None => Err(ModelError::InvalidInput(format!("{} has no tokenizer.json; pass token ids", self.name))),
        }
    }

    pub(crate) fn decode(&self, ids: &[u32]) -> Result<String> {
        match &self.tokenizer {
            Some(t) => t.decode(ids),
            None => Err(ModelError::InvalidInput(format!("{} has no tokenizer.json to decode with", self.name))),
        }
    }
}
