//! The families this crate runs, and which one a `config.json` names (`model_type` and
//! `architectures[0]`, which must agree where both are given).

use std::path::Path;

use serde_json::Value;

use crate::error::{ModelError, Result};

/// The families this crate runs; they share one forward pass, which [`crate::config::ArchFeatures`] varies.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Architecture {
    /// `LlamaForCausalLM` (`model_type: llama`).
    Llama,
    /// `MistralForCausalLM` (`model_type: mistral`), optional sliding window.
    Mistral,
    /// `Qwen2ForCausalLM` (`model_type: qwen2`): biases on q/k/v.
    Qwen2,
    /// `Qwen3ForCausalLM` (`model_type: qwen3`): RMS norms on each head's q and k.
    Qwen3,
    /// `Gemma3ForCausalLM` (`model_type: gemma3_text`): see [`super::gemma3`].
    Gemma3,
}

impl Architecture {
    /// The Hugging Face class name.
    pub fn class_name(self) -> &'static str {
        match self {
            Self::Llama => "LlamaForCausalLM",
            Self::Mistral => "MistralForCausalLM",
            Self::Qwen2 => "Qwen2ForCausalLM",
            Self::Qwen3 => "Qwen3ForCausalLM",
            Self::Gemma3 => "Gemma3ForCausalLM",
        }
    }
}

/// The family `value` (the config read from `path`) names.
pub(crate) fn architecture_of(path: &Path, value: &Value) -> Result<Architecture> {
    let unsupported = |found: String| ModelError::UnsupportedArchitecture { path: path.to_owned(), found };
    let model_type = value.get("model_type").and_then(Value::as_str);
    let class = value.get("architectures").and_then(Value::as_array).and_then(|a| a.first()).and_then(Value::as_str);
    let by_type = match model_type {
        Some("llama") => Some(Architecture::Llama),
        Some("mistral") => Some(Architecture::Mistral),
        Some("qwen2") => Some(Architecture::Qwen2),
        Some("qwen3") => Some(Architecture::Qwen3),
        Some("gemma3_text") => Some(Architecture::Gemma3),
        Some(other) => return Err(unsupported(format!("model_type {other:?}"))),
        None => None,
    };
    let by_class = match class {
        Some("LlamaForCausalLM") => Some(Architecture::Llama),
        Some("MistralForCausalLM") => Some(Architecture::Mistral),
        Some("Qwen2ForCausalLM") => Some(Architecture::Qwen2),
        Some("Qwen3ForCausalLM") => Some(Architecture::Qwen3),
        Some("Gemma3ForCausalLM") => Some(Architecture::Gemma3),
        Some(other) => return Err(unsupported(format!("architectures[0] {other:?}"))),
        None => None,
    };
    match (by_type, by_class) {
        (Some(a), Some(b)) if a != b => Err(unsupported(format!(
            "model_type {:?} disagrees with architectures[0] {:?}",
            model_type.unwrap_or_default(),
            class.unwrap_or_default()
        ))),
        (Some(a), _) | (None, Some(a)) => Ok(a),
        (None, None) => Err(unsupported("neither model_type nor architectures".into())),
    }
}
