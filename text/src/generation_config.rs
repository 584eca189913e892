//! The model's own sampling defaults, from `generation_config.json`.
//!
//! Only the fields the file sets are defaults (as vLLM reads them): a request's own value wins,
//! and a field the file leaves out leaves the server's default in place.

use serde::Deserialize;

use crate::error::TextError;

/// Sampling defaults with transformers' meaning.
///
/// - `do_sample: Some(false)` means greedy decoding whatever `temperature` says (transformers
///   then ignores temperature, top_p and top_k); a server applies it as temperature 0. See
///   [`GenerationDefaults::is_greedy`].
/// - `top_k: Some(0)` means no top-k cut, as in transformers; [`GenerationDefaults::top_k_limit`]
///   gives the cut or `None`.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct GenerationDefaults {
    pub temperature: Option<f32>,
    pub top_p: Option<f32>,
    pub top_k: Option<u32>,
    pub repetition_penalty: Option<f32>,
    pub do_sample: Option<bool>,
}

#[derive(Deserialize)]
struct File {
    temperature: Option<f64>,
    top_p: Option<f64>,
    top_k: Option<i64>,
    repetition_penalty: Option<f64>,
    do_sample: Option<bool>,
}

const FILE: &str = "generation_config.json";

impl GenerationDefaults {
    /// Parses `generation_config.json`; fields other than these five are ignored, `null` is
    /// the same as absent, and values transformers would refuse are errors.
    pub fn from_json(json: &str) -> Result<Self, TextError> {
        let file: File = serde_json::from_str(json).map_err(|e| bad(e.to_string()))?;
        if let Some(t) = file.temperature.filter(|t| !t.is_finite() || *t < 0.0) {
            return Err(bad(format!("temperature must be a finite number >= 0, not {t}")));
        }
        if let Some(p) = file.top_p.filter(|p| !(*p > 0.0 && *p <= 1.0)) {
            return Err(bad(format!("top_p must be in (0, 1], not {p}")));
        }
        if let Some(r) = file.repetition_penalty.filter(|r| !r.is_finite() || *r <= 0.0) {
            return Err(bad(format!("repetition_penalty must be a finite number > 0, not {r}")));
        }
        let top_k = match file.top_k {
            None => None,
            Some(k) => Some(u32::try_from(k).map_err(|_| bad(format!("top_k must be an integer >= 0, not {k}")))?),
        };
        Ok(Self {
            temperature: file.temperature.map(|t| t as f32),
            top_p: file.top_p.map(|p| p as f32),
            top_k,
            repetition_penalty: file.repetition_penalty.map(|r| r as f32),
            do_sample: file.do_sample,
        })
    }

    /// True when the file asks for greedy decoding (`do_sample: false`): apply as temperature 0.
    pub fn is_greedy(&self) -> bool {
        self.do_sample == Some(false)
    }

    /// The top-k cut the file asks for; `None` when it sets none or sets 0 (no cut).
    pub fn top_k_limit(&self) -> Option<u32> {
        self.top_k.filter(|&k| k > 0)
    }
}

fn bad(message: String) -> TextError {
    TextError::Json { file: FILE, message }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_the_five_fields_and_ignores_the_rest() {
        // Qwen2.5-7B-Instruct's generation_config.json, as published.
        let qwen = r#"{"bos_token_id": 151643, "pad_token_id": 151643, "do_sample": true,
            "eos_token_id": [151645, 151643], "repetition_penalty": 1.05, "temperature": 0.7,
            "top_p": 0.8, "top_k": 20, "transformers_version": "4.37.0"}"#;
        let d = GenerationDefaults::from_json(qwen).unwrap();
        assert_eq!(
            d,
            GenerationDefaults {
                temperature: Some(0.7),
                top_p: Some(0.8),
                top_k: Some(20),
                repetition_penalty: Some(1.05),
                do_sample: Some(true),
            }
        );
        assert!(!d.is_greedy());
        assert_eq!(d.top_k_limit(), Some(20));
    }

    #[test]
    fn absent_and_null_fields_are_no_default() {
        let d =
            GenerationDefaults::from_json(r#"{"bos_token_id": 1, "eos_token_id": 2, "temperature": null}"#).unwrap();
        assert_eq!(d, GenerationDefaults::default());
        assert!(!d.is_greedy(), "no do_sample is not greedy");
    }

    #[test]
    fn do_sample_false_is_greedy_and_top_k_zero_is_no_cut() {
        let d =
            GenerationDefaults::from_json(r#"{"do_sample": false, "temperature": 0.6, "top_k": 0, "temperature": 1}"#);
        // Duplicate keys are refused by serde: the file must be plain JSON.
        assert!(d.is_err());
        let d = GenerationDefaults::from_json(r#"{"do_sample": false, "temperature": 1, "top_k": 0}"#).unwrap();
        assert!(d.is_greedy());
        assert_eq!(d.temperature, Some(1.0), "integers are numbers too");
        assert_eq!(d.top_k, Some(0));
        assert_eq!(d.top_k_limit(), None);
    }

    #[test]
    fn refuses_values_transformers_refuses_and_malformed_json() {
        for bad in [
            r#"{"temperature": -0.5}"#,
            r#"{"top_p": 0}"#,
            r#"{"top_p": 1.5}"#,
            r#"{"top_k": -1}"#,
            r#"{"repetition_penalty": 0}"#,
            r#"{"temperature": "hot"}"#,
            "not json",
        ] {
            let e = GenerationDefaults::from_json(bad).unwrap_err();
            assert!(matches!(e, TextError::Json { file: "generation_config.json", .. }), "{bad}: {e}");
            assert!(!e.is_callers_fault());
        }
    }
}
