//! Held-out figures of a pair: each model's loss, and the acceptance α = E[Σ_x min(p, q)]
//! that decides how many draft tokens survive a round (Leviathan et al. 2023, §3.1).

use serde::{Deserialize, Serialize};
use tch::{Kind, Tensor};

use crate::error::Result;
use crate::net::TrainableLlama;
use crate::train::next_token_loss;

/// What the build prints and records.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct PairReport {
    /// Mean next-token cross-entropy on held-out files, nats per token.
    pub target_loss: f64,
    pub draft_loss: f64,
    /// Mean Σ min(p, q) at temperature 1.
    pub alpha_t1: f64,
    /// Mean Σ min(p, q) with both distributions at temperature 0.8 (the bench's sampling
    /// temperature).
    pub alpha_t08: f64,
    /// How often the two argmaxes agree: α for greedy decoding.
    pub alpha_greedy: f64,
    /// Held-out positions measured.
    pub positions: usize,
}

/// Scores `windows` `[N, T + 1]` of held-out tokens with both models in float32, as the
/// nodes will run them.
pub fn evaluate(target: &TrainableLlama, draft: &TrainableLlama, windows: &Tensor) -> Result<PairReport> {
    let _no_grad = tch::no_grad_guard();
    let n = windows.size()[0];
    let (mut target_loss, mut draft_loss, mut alpha_t1, mut alpha_t08, mut alpha_greedy, mut positions) =
        (0.0, 0.0, 0.0, 0.0, 0.0, 0);
    // One window at a time keeps memory flat whatever N is.
    for i in 0..n {
        let w = windows.f_narrow(0, i, 1)?;
        let t = w.size()[1] - 1;
        let ids = w.f_narrow(1, 0, t)?;
        let labels = w.f_narrow(1, 1, t)?;
        let p_logits = target.forward(&ids, Kind::Float)?;
        let q_logits = draft.forward(&ids, Kind::Float)?;
        target_loss += next_token_loss(&p_logits, &labels)?.f_double_value(&[])? * t as f64;
        draft_loss += next_token_loss(&q_logits, &labels)?.f_double_value(&[])? * t as f64;
        let overlap = |temperature: f64| -> Result<f64> {
            let p = p_logits.f_div_scalar(temperature)?.f_softmax(-1, Kind::Float)?;
            let q = q_logits.f_div_scalar(temperature)?.f_softmax(-1, Kind::Float)?;
            Ok(p.f_minimum(&q)?.f_sum(Kind::Double)?.f_double_value(&[])?)
        };
        alpha_t1 += overlap(1.0)?;
        alpha_t08 += overlap(0.8)?;
        let agree = p_logits.f_argmax(-1, false)?.f_eq_tensor(&q_logits.f_argmax(-1, false)?)?;
        alpha_greedy += agree.f_sum(Kind::Double)?.f_double_value(&[])?;
        positions += t as usize;
    }
    let per = positions.max(1) as f64;
    Ok(PairReport {
        target_loss: target_loss / per,
        draft_loss: draft_loss / per,
        alpha_t1: alpha_t1 / per,
        alpha_t08: alpha_t08 / per,
        alpha_greedy: alpha_greedy / per,
        positions,
    })
}
