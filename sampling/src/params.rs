//! Sampling settings, validated once before a generation starts.

use crate::error::{Result, SamplingError};

/// The adjustments that turn logits into the effective distribution, applied in this order:
/// penalties → temperature → top-k → top-p → min-p. The same settings and the same code
/// produce p on the target and q on the draft.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SamplingParams {
    /// 0 is greedy: the degenerate distribution on the argmax (ties: lowest token id).
    pub temperature: f64,
    /// Keep the k most likely tokens; 0 disables.
    pub top_k: u32,
    /// Keep the smallest most-likely set holding this much mass; 1 disables.
    pub top_p: f64,
    /// Drop tokens below `min_p` times the most likely token's probability; 0 disables.
    pub min_p: f64,
    /// HF-style: a seen token's logit is divided by this when positive, multiplied when not.
    /// Applies to prompt and generated tokens; 1 disables.
    pub repetition_penalty: f64,
    /// OpenAI-style: subtracted once from the logit of every generated token; 0 disables.
    pub presence_penalty: f64,
    /// OpenAI-style: subtracted per occurrence among generated tokens; 0 disables.
    pub frequency_penalty: f64,
}

impl Default for SamplingParams {
    fn default() -> Self {
        Self {
            temperature: 1.0,
            top_k: 0,
            top_p: 1.0,
            min_p: 0.0,
            repetition_penalty: 1.0,
            presence_penalty: 0.0,
            frequency_penalty: 0.0,
        }
    }
}

/// Temperatures above this are refused: they flatten any model to noise.
pub const MAX_TEMPERATURE: f64 = 100.0;

/// Positive temperatures below this are refused (1/T would overflow); 0 is greedy.
pub const MIN_POSITIVE_TEMPERATURE: f64 = 1e-6;

impl SamplingParams {
    pub fn greedy() -> Self {
        Self { temperature: 0.0, ..Self::default() }
    }

    pub fn is_greedy(&self) -> bool {
        self.temperature == 0.0
    }

    pub fn validate(&self) -> Result<()> {
        let check = |ok: bool, name: &'static str, value: f64, expected: &'static str| {
            if ok { Ok(()) } else { Err(SamplingError::InvalidParameter { name, value, expected }) }
        };
        let t = self.temperature;
        check(
            t == 0.0 || (MIN_POSITIVE_TEMPERATURE..=MAX_TEMPERATURE).contains(&t),
            "temperature",
            t,
            "must be 0 (greedy) or in [1e-6, 100]",
        )?;
        check(self.top_p > 0.0 && self.top_p <= 1.0, "top_p", self.top_p, "must be in (0, 1]; 1 disables")?;
        check((0.0..=1.0).contains(&self.min_p), "min_p", self.min_p, "must be in [0, 1]; 0 disables")?;
        let r = self.repetition_penalty;
        check(r.is_finite() && r > 0.0, "repetition_penalty", r, "must be finite and > 0; 1 disables")?;
        let pp = self.presence_penalty;
        check((-2.0..=2.0).contains(&pp), "presence_penalty", pp, "must be in [-2, 2]; 0 disables")?;
        let fp = self.frequency_penalty;
        check((-2.0..=2.0).contains(&fp), "frequency_penalty", fp, "must be in [-2, 2]; 0 disables")?;
        Ok(())
    }

    /// Whether any penalty changes the logits (the history matters then).
    pub fn has_penalties(&self) -> bool {
        self.repetition_penalty != 1.0 || self.presence_penalty != 0.0 || self.frequency_penalty != 0.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn validation_names_the_bad_setting() {
        assert!(SamplingParams::default().validate().is_ok());
        assert!(SamplingParams::greedy().validate().is_ok());
        let bad = [
            SamplingParams { temperature: -0.1, ..Default::default() },
            SamplingParams { temperature: f64::NAN, ..Default::default() },
            SamplingParams { temperature: 1e-310, ..Default::default() },
            SamplingParams { top_p: 0.0, ..Default::default() },
            SamplingParams { top_p: 1.5, ..Default::default() },
            SamplingParams { min_p: 1.1, ..Default::default() },
            SamplingParams { repetition_penalty: 0.0, ..Default::default() },
            SamplingParams { presence_penalty: 3.0, ..Default::default() },
            SamplingParams { frequency_penalty: -2.5, ..Default::default() },
        ];
        let names = [
            "temperature",
            "temperature",
            "temperature",
            "top_p",
            "top_p",
            "min_p",
            "repetition_penalty",
            "presence_penalty",
            "frequency_penalty",
        ];
        for (params, name) in bad.iter().zip(names) {
            match params.validate() {
                Err(SamplingError::InvalidParameter { name: got, .. }) => assert_eq!(got, name),
                other => panic!("{params:?} gave {other:?}"),
            }
        }
    }
}
