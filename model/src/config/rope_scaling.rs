//! How a checkpoint scales its rotary position frequencies, read from one RoPE parameter
//! dict (`rope_scaling`, or transformers 5's `rope_parameters`).

use serde_json::Value;

/// How rotary position frequencies are scaled.
#[derive(Debug, Clone, PartialEq)]
pub enum RopeScaling {
    /// Plain RoPE.
    None,
    /// Positions divided by `factor`.
    Linear { factor: f64 },
    /// Llama 3.x frequency-dependent scaling.
    Llama3 { factor: f64, low_freq_factor: f64, high_freq_factor: f64, original_max_position_embeddings: f64 },
    /// YaRN (Qwen3's long context): frequencies blended between interpolated and
    /// extrapolated by a linear ramp over the dimensions, and cos/sin scaled by
    /// `attention_factor`; defaults resolved as transformers resolves them.
    Yarn {
        factor: f64,
        original_max_position_embeddings: f64,
        beta_fast: f64,
        beta_slow: f64,
        attention_factor: f64,
        truncate: bool,
    },
}

/// One RoPE parameter dict's scaling (`rope_type` or `type`); `max_position_embeddings` is
/// YaRN's default `original_max_position_embeddings`, as transformers sets it.
pub(crate) fn parse_rope_scaling(r: &Value, max_position_embeddings: usize) -> Result<RopeScaling, String> {
    let kind = r.get("rope_type").or_else(|| r.get("type")).and_then(Value::as_str).unwrap_or("default");
    let num = |key: &str| -> Result<f64, String> {
        r.get(key)
            .and_then(Value::as_f64)
            .filter(|x| x.is_finite() && *x > 0.0)
            .ok_or_else(|| format!("rope scaling {kind:?} needs a positive {key}"))
    };
    match kind {
        "default" => Ok(RopeScaling::None),
        "linear" => Ok(RopeScaling::Linear { factor: num("factor")? }),
        "llama3" => {
            let s = RopeScaling::Llama3 {
                factor: num("factor")?,
                low_freq_factor: num("low_freq_factor")?,
                high_freq_factor: num("high_freq_factor")?,
                original_max_position_embeddings: num("original_max_position_embeddings")?,
            };
            if let RopeScaling::Llama3 { low_freq_factor, high_freq_factor, .. } = s
                && high_freq_factor <= low_freq_factor
            {
                return Err("llama3 rope scaling needs high_freq_factor > low_freq_factor".into());
            }
            Ok(s)
        }
        "yarn" => {
            let optional = |key: &str| r.get(key).and_then(Value::as_f64).filter(|x| *x != 0.0);
            let factor = num("factor")?;
            let original = optional("original_max_position_embeddings").unwrap_or(max_position_embeddings as f64);
            // transformers: `attention_factor`, else mscale / mscale_all_dim when both are
            // set, else 0.1 ln(factor) + 1.
            let mscale = |scale: f64, m: f64| if scale <= 1.0 { 1.0 } else { 0.1 * m * scale.ln() + 1.0 };
            let attention_factor = match (optional("attention_factor"), optional("mscale"), optional("mscale_all_dim"))
            {
                (Some(a), _, _) => a,
                (None, Some(m), Some(all)) => mscale(factor, m) / mscale(factor, all),
                _ => mscale(factor, 1.0),
            };
            Ok(RopeScaling::Yarn {
                factor,
                original_max_position_embeddings: original,
                beta_fast: optional("beta_fast").unwrap_or(32.0),
                beta_slow: optional("beta_slow").unwrap_or(1.0),
                attention_factor,
                truncate: r.get("truncate").and_then(Value::as_bool).unwrap_or(true),
            })
        }
        other => Err(format!("rope scaling type {other:?} is not supported")),
    }
}
