//! What Gemma 3 text (`Gemma3ForCausalLM`, `model_type: gemma3_text`) adds to the Llama
//! forward pass, read from its `config.json` as transformers 5.24 reads it:
//!
//! - embeddings multiplied by √hidden (the scale cast to the run's dtype first);
//! - RMS norms that scale by `1 + w` in float32, four per layer (before and after attention,
//!   before and after the MLP), and on each head's q and k;
//! - a GeGLU MLP with the tanh GELU (`hidden_activation`);
//! - attention scores scaled by `query_pre_attn_scalar^-1/2`;
//! - windowed ("sliding_attention") layers interleaved with global ("full_attention") ones,
//!   from `layer_types` or, in configs written before it, `sliding_window_pattern` (every
//!   n-th layer global); each kind has its own RoPE: global layers `rope_theta` (default
//!   10⁶) and `rope_scaling`, windowed layers `rope_local_base_freq` (default 10⁴), or in
//!   transformers 5 `rope_parameters` keyed by layer kind;
//! - optional final logit soft-capping.
//!
//! The larger Gemma 3 checkpoints (4B–27B) are `Gemma3ForConditionalGeneration`
//! (`model_type: gemma3`): the same text model inside, its config under `text_config` and
//! its weights under `model.language_model.` (transformers 5) or `language_model.model.`
//! (4.x), beside a vision tower this crate does not run. [`text_config`] lifts the text
//! config out; the loader renames the weights and skips the vision ones.
//!
//! Attention soft-capping (Gemma 2's `attn_logit_softcapping`) and bidirectional attention
//! are refused: no Gemma 3 text checkpoint uses them.

use serde_json::{Map, Value};

use super::features::ArchFeatures;
use super::rope_scaling::{RopeScaling, parse_rope_scaling};

/// RoPE base of global layers when the config names none (`Gemma3TextConfig.default_theta`).
const GLOBAL_THETA: f64 = 1_000_000.0;
/// RoPE base of windowed layers when the config names none.
const LOCAL_THETA: f64 = 10_000.0;
/// Every n-th layer is global when neither `layer_types` nor `sliding_window_pattern` says.
const DEFAULT_PATTERN: usize = 6;
/// `Gemma3TextConfig.query_pre_attn_scalar`'s default.
const DEFAULT_QUERY_PRE_ATTN_SCALAR: f64 = 256.0;

/// The global layers' RoPE base and scaling, and the features of a Gemma 3 config `value`
/// with `layers` layers; the activation is set by the caller.
pub(crate) fn features(
    value: &Value,
    layers: usize,
    max_position_embeddings: usize,
) -> Result<(f64, RopeScaling, ArchFeatures), String> {
    if value.get("use_bidirectional_attention").and_then(Value::as_bool) == Some(true) {
        return Err("use_bidirectional_attention = true is not supported".into());
    }
    if value.get("attn_logit_softcapping").is_some_and(|v| !v.is_null()) {
        return Err("attn_logit_softcapping is not supported".into());
    }
    let sliding_layers = match value.get("layer_types") {
        Some(Value::Array(kinds)) => {
            if kinds.len() != layers {
                return Err(format!("layer_types has {} entries for {layers} layers", kinds.len()));
            }
            kinds
                .iter()
                .map(|k| match k.as_str() {
                    Some("sliding_attention") => Ok(true),
                    Some("full_attention") => Ok(false),
                    _ => Err(format!("layer_types entry {k} is neither sliding_attention nor full_attention")),
                })
                .collect::<Result<Vec<_>, _>>()?
        }
        _ => {
            let pattern = match value.get("sliding_window_pattern") {
                None | Some(Value::Null) => DEFAULT_PATTERN,
                Some(v) => v
                    .as_u64()
                    .filter(|&n| n > 0)
                    .and_then(|n| usize::try_from(n).ok())
                    .ok_or("sliding_window_pattern must be a positive integer")?,
            };
            (0..layers).map(|i| !(i + 1).is_multiple_of(pattern)).collect()
        }
    };
    let (global, local) = rope(value, max_position_embeddings)?;
    let number = |key: &str| -> Result<Option<f64>, String> {
        match value.get(key) {
            None | Some(Value::Null) => Ok(None),
            Some(v) => v
                .as_f64()
                .filter(|x| x.is_finite() && *x > 0.0)
                .map(Some)
                .ok_or_else(|| format!("{key} must be a positive number")),
        }
    };
    let features = ArchFeatures {
        qk_norm: true,
        norm_plus_one: true,
        sandwich_norms: true,
        scale_embeddings: true,
        activation: Default::default(),
        query_pre_attn_scalar: Some(number("query_pre_attn_scalar")?.unwrap_or(DEFAULT_QUERY_PRE_ATTN_SCALAR)),
        final_logit_softcapping: number("final_logit_softcapping")?,
        sliding_layers,
        local_rope: Some(local),
        multimodal_wrapper: false,
    };
    Ok((global.0, global.1, features))
}

/// `((global theta, scaling), (local theta, scaling))`.
type RopePair = ((f64, RopeScaling), (f64, RopeScaling));

fn rope(value: &Value, max_position_embeddings: usize) -> Result<RopePair, String> {
    let theta_of = |v: Option<&Value>, default: f64| -> Result<f64, String> {
        match v {
            None | Some(Value::Null) => Ok(default),
            Some(t) => t
                .as_f64()
                .filter(|x| x.is_finite() && *x > 0.0)
                .ok_or_else(|| format!("rope theta {t} must be positive")),
        }
    };
    let scaling_of = |v: Option<&Value>| match v {
        None | Some(Value::Null) => Ok(RopeScaling::None),
        Some(r) => parse_rope_scaling(r, max_position_embeddings),
    };
    // transformers 5: one parameter dict per layer kind.
    if let Some(Value::Object(by_kind)) = value.get("rope_parameters")
        && (by_kind.contains_key("full_attention") || by_kind.contains_key("sliding_attention"))
    {
        let kind = |name: &str, default: f64| -> Result<(f64, RopeScaling), String> {
            let params = by_kind.get(name).filter(|p| !p.is_null());
            Ok((theta_of(params.and_then(|p| p.get("rope_theta")), default)?, scaling_of(params)?))
        };
        return Ok((kind("full_attention", GLOBAL_THETA)?, kind("sliding_attention", LOCAL_THETA)?));
    }
    // Before transformers 5: `rope_scaling` applies to the global layers only.
    let global = (theta_of(value.get("rope_theta"), GLOBAL_THETA)?, scaling_of(value.get("rope_scaling"))?);
    let local = (theta_of(value.get("rope_local_base_freq"), LOCAL_THETA)?, RopeScaling::None);
    Ok((global, local))
}

/// `Gemma3TextConfig`'s defaults of the sizes a config may leave out (transformers writes a
/// nested config's differences from them only).
const SIZE_DEFAULTS: [(&str, u64); 6] = [
    ("vocab_size", 262_208),
    ("hidden_size", 2304),
    ("intermediate_size", 9216),
    ("num_hidden_layers", 26),
    ("num_attention_heads", 8),
    ("num_key_value_heads", 4),
];

/// A Gemma 3 text config with the sizes it leaves out filled in.
pub(crate) fn with_size_defaults(value: &Value) -> Value {
    let mut value = value.clone();
    if let Some(object) = value.as_object_mut() {
        for (key, default) in SIZE_DEFAULTS {
            object.entry(key).or_insert(Value::from(default));
        }
    }
    value
}

/// Whether `value` is a `Gemma3ForConditionalGeneration` config (the text model nested).
pub(crate) fn is_multimodal(value: &Value) -> bool {
    value.get("model_type").and_then(Value::as_str) == Some("gemma3")
        || value.get("architectures").and_then(Value::as_array).and_then(|a| a.first()).and_then(Value::as_str)
            == Some("Gemma3ForConditionalGeneration")
}

/// The text model's config of a `Gemma3ForConditionalGeneration` config: `text_config`,
/// with the outer config's token ids, tying and dtype where the inner one has none, named
/// as the text model.
pub(crate) fn text_config(value: &Value) -> Result<Value, String> {
    let mut text: Map<String, Value> = match value.get("text_config") {
        Some(Value::Object(inner)) => inner.clone(),
        None | Some(Value::Null) => Map::new(),
        Some(_) => return Err("text_config must be an object".into()),
    };
    for key in ["eos_token_id", "bos_token_id", "tie_word_embeddings", "dtype", "torch_dtype"] {
        if let Some(outer) = value.get(key)
            && !text.contains_key(key)
        {
            text.insert(key.to_owned(), outer.clone());
        }
    }
    text.insert("model_type".into(), "gemma3_text".into());
    text.insert("architectures".into(), serde_json::json!(["Gemma3ForCausalLM"]));
    Ok(Value::Object(text))
}
