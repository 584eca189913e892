//! `config.json` and `generation_config.json` of a Llama-family checkpoint (Llama, Mistral,
//! Qwen2, Qwen3, Gemma 3 text), parsed into a [`LlamaConfig`].
//!
//! - `architecture`: the families, and which one a config names;
//! - `features`: what sets a family's forward pass apart from Llama's;
//! - `rope_scaling`: how the rotary frequencies are scaled;
//! - `gemma3`: what Gemma 3 adds, read from its config.

mod architecture;
mod features;
mod gemma3;
mod rope_scaling;

use std::path::{Path, PathBuf};

use serde::Deserialize;
use serde_json::Value;

use crate::device::DType;
use crate::error::{ModelError, Result};
pub use architecture::Architecture;
use architecture::architecture_of;
pub use features::{Activation, ArchFeatures};
pub use rope_scaling::RopeScaling;
use rope_scaling::parse_rope_scaling;

/// The parts of `config.json` the forward pass needs, validated.
#[derive(Debug, Clone, PartialEq)]
pub struct LlamaConfig {
    pub architecture: Architecture,
    pub vocab_size: usize,
    pub hidden_size: usize,
    pub intermediate_size: usize,
    pub num_hidden_layers: usize,
    pub num_attention_heads: usize,
    pub num_key_value_heads: usize,
    pub head_dim: usize,
    pub rms_norm_eps: f64,
    pub rope_theta: f64,
    pub rope_scaling: RopeScaling,
    pub max_position_embeddings: usize,
    pub tie_word_embeddings: bool,
    /// Bias on q/k/v projections (always for Qwen2, `attention_bias` for Llama).
    pub qkv_bias: bool,
    /// Bias on the output projection (`attention_bias` for Llama).
    pub o_bias: bool,
    /// Biases in the MLP (`mlp_bias` for Llama).
    pub mlp_bias: bool,
    /// A query at position i sees keys j with i - j < window (Mistral `sliding_window`; in
    /// Gemma 3 only on the layers [`ArchFeatures::sliding_layers`] marks).
    pub sliding_window: Option<usize>,
    pub bos_token_id: Option<u32>,
    pub eos_token_ids: Vec<u32>,
    /// The dtype the checkpoint says its weights are in (`dtype`, or `torch_dtype` before
    /// transformers 5), which `--dtype auto` keeps on a GPU.
    pub checkpoint_dtype: Option<DType>,
    pub features: ArchFeatures,
}

#[derive(Debug, Deserialize)]
struct RawConfig {
    vocab_size: usize,
    hidden_size: usize,
    intermediate_size: usize,
    num_hidden_layers: usize,
    num_attention_heads: usize,
    num_key_value_heads: Option<usize>,
    head_dim: Option<usize>,
    #[serde(default = "default_eps")]
    rms_norm_eps: f64,
    rope_theta: Option<f64>,
    rope_scaling: Option<Value>,
    rope_parameters: Option<Value>,
    #[serde(default = "default_max_pos")]
    max_position_embeddings: usize,
    #[serde(default)]
    tie_word_embeddings: bool,
    #[serde(default)]
    attention_bias: bool,
    #[serde(default)]
    mlp_bias: bool,
    hidden_act: Option<String>,
    hidden_activation: Option<String>,
    sliding_window: Option<usize>,
    use_sliding_window: Option<bool>,
    bos_token_id: Option<Value>,
    eos_token_id: Option<Value>,
    partial_rotary_factor: Option<f64>,
    dtype: Option<String>,
    torch_dtype: Option<String>,
}

fn default_eps() -> f64 {
    1e-6
}

fn default_max_pos() -> usize {
    2048
}

/// The sizes of a Llama model; the rest of its config is Llama 3's ([`LlamaConfig::llama`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LlamaShape {
    pub vocab_size: usize,
    pub hidden_size: usize,
    pub intermediate_size: usize,
    pub layers: usize,
    pub heads: usize,
    pub kv_heads: usize,
    pub head_dim: usize,
    pub context: usize,
}

impl LlamaConfig {
    /// A Llama of `shape` with Llama 3's settings (RoPE θ 500 000, RMS ε 1e-5, tied
    /// embeddings, no biases, no window, BOS 1 and EOS 2): the config tests and benchmarks
    /// build random models from.
    pub fn llama(shape: LlamaShape) -> Self {
        LlamaConfig {
            architecture: Architecture::Llama,
            vocab_size: shape.vocab_size,
            hidden_size: shape.hidden_size,
            intermediate_size: shape.intermediate_size,
            num_hidden_layers: shape.layers,
            num_attention_heads: shape.heads,
            num_key_value_heads: shape.kv_heads,
            head_dim: shape.head_dim,
            rms_norm_eps: 1e-5,
            rope_theta: 500_000.0,
            rope_scaling: RopeScaling::None,
            max_position_embeddings: shape.context,
            tie_word_embeddings: true,
            qkv_bias: false,
            o_bias: false,
            mlp_bias: false,
            sliding_window: None,
            bos_token_id: Some(1),
            eos_token_ids: vec![2],
            checkpoint_dtype: None,
            features: Default::default(),
        }
    }

    /// Reads `dir/config.json` and `dir/generation_config.json` (optional; its EOS ids win).
    pub fn from_dir(dir: &Path) -> Result<Self> {
        let path = dir.join("config.json");
        let value = read_json(&path, "config.json describes the architecture")?;
        let mut cfg = Self::from_value(&path, &value)?;
        let gen_path = dir.join("generation_config.json");
        if gen_path.is_file() {
            let generation = read_json(&gen_path, "")?;
            if let Some(eos) = generation.get("eos_token_id") {
                let ids = token_ids(&gen_path, "eos_token_id", eos)?;
                if !ids.is_empty() {
                    cfg.eos_token_ids = ids;
                }
            }
            if let Some(bos) = generation.get("bos_token_id")
                && let Some(&id) = token_ids(&gen_path, "bos_token_id", bos)?.first()
            {
                cfg.bos_token_id = Some(id);
            }
        }
        Ok(cfg)
    }

    /// Parses and validates a `config.json` value; `path` is for error messages.
    pub fn from_value(path: &Path, value: &Value) -> Result<Self> {
        let invalid = |message: String| ModelError::InvalidFile { path: path.to_owned(), message };
        let multimodal = gemma3::is_multimodal(value);
        let text;
        let value = if multimodal {
            text = gemma3::text_config(value).map_err(invalid)?;
            &text
        } else {
            value
        };
        let architecture = architecture_of(path, value)?;
        let filled;
        let value = if architecture == Architecture::Gemma3 {
            filled = gemma3::with_size_defaults(value);
            &filled
        } else {
            value
        };
        let raw: RawConfig = serde_json::from_value(value.clone()).map_err(|e| invalid(e.to_string()))?;
        let activation = match (architecture, raw.hidden_activation.as_deref().or(raw.hidden_act.as_deref())) {
            (Architecture::Gemma3, None | Some("gelu_pytorch_tanh" | "gelu_tanh")) => Activation::GeluTanh,
            (Architecture::Gemma3, Some("gelu")) => Activation::Gelu,
            (Architecture::Gemma3, Some(other)) => {
                return Err(invalid(format!(
                    "hidden_activation {other:?} is not supported (gelu_pytorch_tanh or gelu)"
                )));
            }
            (_, None | Some("silu")) => Activation::Silu,
            (_, Some(other)) => return Err(invalid(format!("hidden_act {other:?} is not supported (only silu)"))),
        };
        if raw.partial_rotary_factor.is_some_and(|f| f != 1.0) {
            return Err(invalid("partial_rotary_factor != 1 is not supported".into()));
        }
        let heads = raw.num_attention_heads;
        let kv_heads = raw.num_key_value_heads.unwrap_or(heads);
        if heads == 0 || kv_heads == 0 || !heads.is_multiple_of(kv_heads) {
            return Err(invalid(format!(
                "num_attention_heads {heads} must be a positive multiple of num_key_value_heads {kv_heads}"
            )));
        }
        let max_position_embeddings = match (architecture, value.get("max_position_embeddings")) {
            // transformers' Gemma 3 default; the others default to 2048 here.
            (Architecture::Gemma3, None) => 131_072,
            _ => raw.max_position_embeddings,
        };
        if raw.hidden_size == 0
            || raw.vocab_size == 0
            || raw.num_hidden_layers == 0
            || raw.intermediate_size == 0
            || max_position_embeddings == 0
        {
            return Err(invalid("sizes must be positive".into()));
        }
        let head_dim = match (raw.head_dim, architecture) {
            (Some(d), _) => d,
            // Defaults of Qwen3Config and Gemma3TextConfig, not hidden / heads.
            (None, Architecture::Qwen3) => 128,
            (None, Architecture::Gemma3) => 256,
            (None, _) if raw.hidden_size.is_multiple_of(heads) => raw.hidden_size / heads,
            (None, _) => {
                return Err(invalid(format!(
                    "hidden_size {} is not divisible by num_attention_heads {heads}",
                    raw.hidden_size
                )));
            }
        };
        // Bounds far above any real model keep every size product (parameters, cache bytes)
        // inside u64 and turn absurd configs into errors instead of allocation failures.
        for (name, value, max) in [
            ("vocab_size", raw.vocab_size, 1 << 24),
            ("hidden_size", raw.hidden_size, 1 << 20),
            ("intermediate_size", raw.intermediate_size, 1 << 20),
            ("num_hidden_layers", raw.num_hidden_layers, 1 << 10),
            ("num_attention_heads", heads, 1 << 12),
            ("head_dim", head_dim, 1 << 12),
            ("max_position_embeddings", max_position_embeddings, 1 << 24),
        ] {
            if value > max {
                return Err(invalid(format!("{name} {value} exceeds the supported maximum {max}")));
            }
        }
        if head_dim == 0 || head_dim % 2 != 0 {
            return Err(invalid(format!("head_dim {head_dim} must be even and positive")));
        }
        if !(raw.rms_norm_eps.is_finite() && raw.rms_norm_eps >= 0.0) {
            return Err(invalid("rms_norm_eps must be finite and non-negative".into()));
        }
        let (rope_theta, rope_scaling, mut features) = if architecture == Architecture::Gemma3 {
            gemma3::features(value, raw.num_hidden_layers, max_position_embeddings).map_err(invalid)?
        } else {
            // transformers 5 writes `rope_parameters` (theta inside); 4.x writes `rope_theta`
            // and `rope_scaling`.
            let rope = raw.rope_parameters.as_ref().or(raw.rope_scaling.as_ref());
            let rope_theta =
                rope.and_then(|r| r.get("rope_theta")).and_then(Value::as_f64).or(raw.rope_theta).unwrap_or(10_000.0);
            let rope_scaling = match rope {
                None | Some(Value::Null) => RopeScaling::None,
                Some(r) => parse_rope_scaling(r, max_position_embeddings).map_err(invalid)?,
            };
            (rope_theta, rope_scaling, ArchFeatures::default())
        };
        if !(rope_theta.is_finite() && rope_theta > 0.0) {
            return Err(invalid(format!("rope_theta {rope_theta} must be positive")));
        }
        features.activation = activation;
        features.multimodal_wrapper = multimodal;
        let sliding_window_key = value.get("sliding_window");
        let (qkv_bias, o_bias, mlp_bias, sliding_window) = match architecture {
            Architecture::Llama => (raw.attention_bias, raw.attention_bias, raw.mlp_bias, None),
            // MistralConfig's default window is 4096: a config without the key is windowed,
            // one with `null` is not.
            Architecture::Mistral => {
                (false, false, false, if sliding_window_key.is_none() { Some(4096) } else { raw.sliding_window })
            }
            Architecture::Qwen2 | Architecture::Qwen3 => {
                // Qwen2 and Qwen3 window only the layers from `max_window_layers` on; no released
                // checkpoint turns it on, so refuse rather than approximate.
                if raw.use_sliding_window == Some(true) {
                    return Err(invalid(format!(
                        "{} use_sliding_window = true is not supported",
                        architecture.class_name()
                    )));
                }
                let qwen3 = architecture == Architecture::Qwen3;
                features.qk_norm = qwen3;
                // Qwen3 biases every attention projection when `attention_bias` says so;
                // Qwen2 always biases q/k/v and never o.
                if qwen3 { (raw.attention_bias, raw.attention_bias, false, None) } else { (true, false, false, None) }
            }
            Architecture::Gemma3 => (
                raw.attention_bias,
                raw.attention_bias,
                false,
                if sliding_window_key.is_none() { Some(4096) } else { raw.sliding_window },
            ),
        };
        if sliding_window == Some(0) {
            return Err(invalid("sliding_window must be positive".into()));
        }
        let tie_word_embeddings = match (architecture, value.get("tie_word_embeddings")) {
            // Gemma3TextConfig ties by default; the others do not.
            (Architecture::Gemma3, None) => true,
            _ => raw.tie_word_embeddings,
        };
        let eos_token_ids = match &raw.eos_token_id {
            Some(v) => token_ids(path, "eos_token_id", v)?,
            None => Vec::new(),
        };
        let bos_token_id = match &raw.bos_token_id {
            Some(v) => token_ids(path, "bos_token_id", v)?.first().copied(),
            None => None,
        };
        let checkpoint_dtype = match raw.dtype.as_deref().or(raw.torch_dtype.as_deref()) {
            None => None,
            Some(name) => Some(name.parse().map_err(|_| invalid(format!("dtype {name:?} is not a float dtype")))?),
        };
        Ok(Self {
            architecture,
            vocab_size: raw.vocab_size,
            hidden_size: raw.hidden_size,
            intermediate_size: raw.intermediate_size,
            num_hidden_layers: raw.num_hidden_layers,
            num_attention_heads: heads,
            num_key_value_heads: kv_heads,
            head_dim,
            rms_norm_eps: raw.rms_norm_eps,
            rope_theta,
            rope_scaling,
            max_position_embeddings,
            tie_word_embeddings,
            qkv_bias,
            o_bias,
            mlp_bias,
            sliding_window,
            bos_token_id,
            eos_token_ids,
            checkpoint_dtype,
            features,
        })
    }

    /// The sliding window of layer `layer`, if it has one.
    pub fn layer_window(&self, layer: usize) -> Option<usize> {
        let windowed = self.features.sliding_layers.get(layer).copied().unwrap_or(true);
        if windowed { self.sliding_window } else { None }
    }

    /// Number of parameters implied by the config.
    pub fn num_parameters(&self) -> u64 {
        let h = self.hidden_size as u64;
        let qd = (self.num_attention_heads * self.head_dim) as u64;
        let kvd = (self.num_key_value_heads * self.head_dim) as u64;
        let i = self.intermediate_size as u64;
        let v = self.vocab_size as u64;
        let attn = h * qd * 2 + h * kvd * 2;
        let qk_norms = if self.features.qk_norm { 2 * self.head_dim as u64 } else { 0 };
        let norms = if self.features.sandwich_norms { 4 * h } else { 2 * h };
        let layer = attn + 3 * h * i + norms + qk_norms;
        let head = if self.tie_word_embeddings { 0 } else { v * h };
        v * h + head + h + self.num_hidden_layers as u64 * layer
    }
}

fn token_ids(path: &Path, key: &str, v: &Value) -> Result<Vec<u32>> {
    let bad = || ModelError::InvalidFile {
        path: path.to_owned(),
        message: format!("{key} must be a token id or a list of token ids"),
    };
    let one = |x: &Value| x.as_u64().and_then(|n| u32::try_from(n).ok()).ok_or_else(bad);
    match v {
        Value::Null => Ok(Vec::new()),
        Value::Array(items) => items.iter().map(one).collect(),
        x => Ok(vec![one(x)?]),
    }
}

/// Reads and parses a JSON file; `what` explains why a missing file matters.
pub(crate) fn read_json(path: &Path, what: &str) -> Result<Value> {
    if !path.is_file() {
        return Err(ModelError::MissingFile { path: path.to_owned(), what: what.to_owned() });
    }
    let text = std::fs::read_to_string(path).map_err(|source| ModelError::Io { path: path.to_owned(), source })?;
    serde_json::from_str(&text)
        .map_err(|e| ModelError::InvalidFile { path: PathBuf::from(path), message: e.to_string() })
}
