//! Rotary position embeddings (the `rotate_half` convention of Hugging Face Llama), with
//! linear, Llama-3 and YaRN frequency scaling.

use std::f64::consts::PI;

use tch::{Device, Kind, Tensor};

use crate::config::RopeScaling;
use crate::error::Result;

/// Inverse frequencies for one head dimension; cos/sin are computed per call for the
/// positions in use, so no table of the whole context is kept.
#[derive(Debug)]
pub struct Rope {
    /// `[head_dim / 2]`, float32.
    inv_freq: Tensor,
    /// Positions are divided by this (linear scaling), 1 otherwise.
    position_scale: f64,
    /// cos and sin are multiplied by this (YaRN's attention factor), 1 otherwise.
    attention_factor: f64,
    device: Device,
}

/// RoPE's inverse frequencies for one head dimension and how positions and cos/sin are
/// scaled: what the libtorch [`Rope`] and the host engine's pass both compute from.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Frequencies {
    /// `[head_dim / 2]`, float32 as transformers keeps them.
    pub(crate) inv_freq: Vec<f32>,
    /// Positions are divided by this (linear scaling), 1 otherwise.
    pub(crate) position_scale: f64,
    /// cos and sin are multiplied by this (YaRN's attention factor), 1 otherwise.
    pub(crate) attention_factor: f64,
}

impl Frequencies {
    pub(crate) fn new(head_dim: usize, theta: f64, scaling: &RopeScaling) -> Self {
        let d = head_dim;
        let base: Vec<f64> = (0..d / 2).map(|i| 1.0 / theta.powf((2 * i) as f64 / d as f64)).collect();
        let mut attention_factor = 1.0;
        let (inv, position_scale) = match *scaling {
            RopeScaling::None => (base, 1.0),
            RopeScaling::Linear { factor } => (base, factor),
            RopeScaling::Yarn {
                factor,
                original_max_position_embeddings: old,
                beta_fast,
                beta_slow,
                attention_factor: attention,
                truncate,
            } => {
                attention_factor = attention;
                (yarn(&base, d, theta, factor, old, beta_fast, beta_slow, truncate), 1.0)
            }
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
        Self { inv_freq: inv.into_iter().map(|x| x as f32).collect(), position_scale, attention_factor }
    }
}

impl Rope {
    pub fn new(head_dim: usize, theta: f64, scaling: &RopeScaling, device: Device) -> Result<Self> {
        let Frequencies { inv_freq, position_scale, attention_factor } = Frequencies::new(head_dim, theta, scaling);
        Ok(Self {
            inv_freq: Tensor::from_slice(&inv_freq).f_to_device(device)?,
            position_scale,
            attention_factor,
            device,
        })
    }

    /// `(cos, sin)`, each `[n, head_dim]` in `kind`, for positions `start..start + n`.
    pub fn cos_sin(&self, start: usize, n: usize, kind: Kind) -> Result<(Tensor, Tensor)> {
        let pos = Tensor::f_arange_start(start as i64, (start + n) as i64, (Kind::Float, self.device))?;
        let pos = if self.position_scale == 1.0 { pos } else { pos.f_div_scalar(self.position_scale)? };
        let freqs = pos.f_unsqueeze(1)?.f_mul(&self.inv_freq.f_unsqueeze(0)?)?;
        let emb = Tensor::f_cat(&[&freqs, &freqs], -1)?;
        let (cos, sin) = (emb.f_cos()?, emb.f_sin()?);
        let (cos, sin) = if self.attention_factor == 1.0 {
            (cos, sin)
        } else {
            (cos.f_mul_scalar(self.attention_factor)?, sin.f_mul_scalar(self.attention_factor)?)
        };
        Ok((cos.f_to_kind(kind)?, sin.f_to_kind(kind)?))
    }
}

/// cos and sin of every position below a length, in the model's dtype, computed once and
/// extended when a pass reaches past them: a pass then takes views of its positions
/// instead of computing them (about ten operations a run and kind of layer, each a kernel
/// launch on a GPU). Each entry is what [`Rope::cos_sin`] computes for its position alone,
/// since every step is elementwise.
#[derive(Debug)]
pub struct RopeTables {
    rope: Rope,
    kind: Kind,
    /// Positions never exceed this (the context length), so the table is never made longer.
    limit: usize,
    /// `[len, head_dim]` each, where `len` is what has been computed.
    cos: Option<Tensor>,
    sin: Option<Tensor>,
}

/// The first table's length: most prompts fit it, and it costs 256 KiB at a head of 128 in
/// float32.
const FIRST_TABLE_POSITIONS: usize = 256;

impl RopeTables {
    pub fn new(rope: Rope, kind: Kind, limit: usize) -> Self {
        Self { rope, kind, limit, cos: None, sin: None }
    }

    /// `(cos, sin)`, each `[n, head_dim]` in the tables' dtype, for positions `start..start + n`:
    /// views of the tables, extended first (at least doubled, up to the limit) if they end
    /// before `start + n`.
    pub fn cos_sin(&mut self, start: usize, n: usize) -> Result<(Tensor, Tensor)> {
        let end = start + n;
        let len = self.cos.as_ref().map_or(0, |c| c.size()[0] as usize);
        if end > len {
            let grown = end.max((2 * len).max(FIRST_TABLE_POSITIONS).min(self.limit));
            let (cos, sin) = self.rope.cos_sin(0, grown, self.kind)?;
            self.cos = Some(cos);
            self.sin = Some(sin);
        }
        let view = |t: &Option<Tensor>| -> Result<Tensor> {
            let t = t.as_ref().expect("the tables were just computed");
            Ok(t.f_narrow(0, start as i64, n as i64)?)
        };
        Ok((view(&self.cos)?, view(&self.sin)?))
    }
}

/// YaRN's inverse frequencies, as transformers computes them: dimensions that turn fewer
/// than `beta_slow` times over the original context are interpolated (divided by `factor`),
/// those that turn more than `beta_fast` times are kept, and a linear ramp blends between.
#[allow(clippy::too_many_arguments)]
fn yarn(
    base: &[f64],
    dim: usize,
    theta: f64,
    factor: f64,
    original: f64,
    beta_fast: f64,
    beta_slow: f64,
    truncate: bool,
) -> Vec<f64> {
    let d = dim as f64;
    let correction_dim = |rotations: f64| d * (original / (rotations * 2.0 * PI)).ln() / (2.0 * theta.ln());
    let (mut low, mut high) = (correction_dim(beta_fast), correction_dim(beta_slow));
    if truncate {
        (low, high) = (low.floor(), high.ceil());
    }
    let (low, mut high) = (low.max(0.0), high.min(d - 1.0));
    if low == high {
        // transformers' guard against a zero-width ramp.
        high += 0.001;
    }
    base.iter()
        .enumerate()
        .map(|(i, &extrapolated)| {
            let ramp = ((i as f64 - low) / (high - low)).clamp(0.0, 1.0);
            let keep = 1.0 - ramp;
            (extrapolated / factor) * (1.0 - keep) + extrapolated * keep
        })
        .collect()
}

/// `x * cos + rotate_half(x) * sin` for `x` whose last dimension is the head's, with `cos`
/// and `sin` broadcast against it (`[n, head_dim]` for `x: [1, heads, n, head_dim]`,
/// `[n, 1, head_dim]` for `x: [1, n, heads, head_dim]`).
pub fn apply_rope(x: &Tensor, cos: &Tensor, sin: &Tensor) -> Result<Tensor> {
    let d = x.size().last().copied().unwrap_or(0);
    let x1 = x.f_narrow(-1, 0, d / 2)?;
    let x2 = x.f_narrow(-1, d / 2, d / 2)?;
    let rotated = Tensor::f_cat(&[&x2.f_neg()?, &x1], -1)?;
    Ok(x.f_mul(cos)?.f_add(&rotated.f_mul(sin)?)?)
}
