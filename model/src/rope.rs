//! Rotary position embeddings (the `rotate_half` convention of Hugging Face Llama), with
//! linear and Llama-3 frequency scaling.

use std::f64::consts::PI;

use tch::{Device, Kind, Tensor};

use crate::config::{LlamaConfig, RopeScaling};
use crate::error::Result;

/// Inverse frequencies for one head dimension; cos/sin are computed per call for the
/// positions in use, so no table of the whole context is kept.
#[derive(Debug)]
pub(crate) struct Rope {
    /// `[head_dim / 2]`, float32.
    inv_freq: Tensor,
    /// Positions are divided by this (linear scaling), 1 otherwise.
    position_scale: f64,
    device: Device,
}

impl Rope {
    pub(crate) fn new(cfg: &LlamaConfig, device: Device) -> Result<Self> {
        let d = cfg.head_dim;
        let base: Vec<f64> = (0..d / 2).map(|i| 1.0 / cfg.rope_theta.powf((2 * i) as f64 / d as f64)).collect();
        let (inv, position_scale) = match cfg.rope_scaling {
            RopeScaling::None => (base, 1.0),
            RopeScaling::Linear { factor } => (base, factor),
            RopeScaling::Llama3 {
                factor,
                low_freq_factor,
                high_freq_factor,
                original_max_position_embeddings: old,
            } => {
                let low_wavelen = old / low_freq_factor;
                let high_wavelen = old / high_freq_factor;
                let scaled = base
                    .into_iter()
                    .map(|f| {
                        let wavelen = 2.0 * PI / f;
                        if wavelen < high_wavelen {
                            f
                        } else if wavelen > low_wavelen {
                            f / factor
                        } else {
                            let smooth = (old / wavelen - low_freq_factor) / (high_freq_factor - low_freq_factor);
                            (1.0 - smooth) * f / factor + smooth * f
                        }
                    })
                    .collect();
                (scaled, 1.0)
            }
        };
        let inv: Vec<f32> = inv.into_iter().map(|x| x as f32).collect();
        Ok(Self { inv_freq: Tensor::from_slice(&inv).f_to_device(device)?, position_scale, device })
    }

    /// `(cos, sin)`, each `[n, head_dim]` in `kind`, for positions `start..start + n`.
    pub(crate) fn cos_sin(&self, start: usize, n: usize, kind: Kind) -> Result<(Tensor, Tensor)> {
        let pos = Tensor::f_arange_start(start as i64, (start + n) as i64, (Kind::Float, self.device))?;
        let pos = if self.position_scale == 1.0 { pos } else { pos.f_div_scalar(self.position_scale)? };
        let freqs = pos.f_unsqueeze(1)?.f_mul(&self.inv_freq.f_unsqueeze(0)?)?;
        let emb = Tensor::f_cat(&[&freqs, &freqs], -1)?;
        Ok((emb.f_cos()?.f_to_kind(kind)?, emb.f_sin()?.f_to_kind(kind)?))
    }
}

/// `x * cos + rotate_half(x) * sin` for `x: [1, heads, n, head_dim]`.
pub(crate) fn apply_rope(x: &Tensor, cos: &Tensor, sin: &Tensor) -> Result<Tensor> {
    let d = x.size().last().copied().unwrap_or(0);
    let x1 = x.f_narrow(-1, 0, d / 2)?;
    let x2 = x.f_narrow(-1, d / 2, d / 2)?;
    let rotated = Tensor::f_cat(&[&x2.f_neg()?, &x1], -1)?;
    Ok(x.f_mul(cos)?.f_add(&rotated.f_mul(sin)?)?)
}
