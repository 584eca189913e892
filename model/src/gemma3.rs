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
//! Attention soft-capping (Gemma 2's `attn_logit_softcapping`) and bidirectional attention
//! are refused: no Gemma 3 text checkpoint uses them.

use serde_json::Value;

use crate::config::{ArchFeatures, RopeScaling, parse_rope_scaling};

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
