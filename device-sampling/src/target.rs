//! The target's sparse reply for a block, computed on the logits' device: p on each
//! support, the complement mass, the complement sample and the bonus token, as
//! `specd_sampling::score_block` computes them on the host, with the same keyed uniforms.
//! One copy reaches the host: Σ|S_i| + 2γ + 1 numbers and a flag per row.

use specd_sampling::{Purpose, RoundKey, SamplingError, SamplingParams, ScoredBlock, ScoredPosition};
use tch::{Device, Kind, Tensor};

use crate::draw::draw_rows;
use crate::effective::{BlockHistory, check_token, effective_rows_seeing, host_error, rows_and_vocab};
use crate::error::Result;

/// The reply, and how many bytes were copied to the host to make it.
#[derive(Debug, Clone, PartialEq)]
pub struct DeviceScored {
    pub block: ScoredBlock,
    pub bytes_to_host: usize,
}

/// Which rule [`score_block_with`] follows. Only [`DeviceRule::Exact`] is right; with the
/// `testing` feature a bug kept on purpose joins it, so that the law audits show they catch
/// a device path that goes wrong in a way no reply validation sees.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum DeviceRule {
    #[default]
    Exact,
    /// Penalties at every block position see only the committed history, not the
    /// speculated tokens before the position.
    #[cfg(feature = "testing")]
    PenaltiesBlindToTheBlock,
}

/// Scores a block from the target's logits `[γ + 1, V]` (row i follows the pending tokens
/// and the block's first i tokens) against the draft's supports S_1..S_γ. Draws use
/// `(Complement, i)` and `(Bonus, γ + 1)` of `key`, as on the host.
pub fn score_block(
    logits: &Tensor,
    params: &SamplingParams,
    history: BlockHistory<'_>,
    supports: &[&[u32]],
    key: RoundKey,
) -> Result<DeviceScored> {
    score_block_with(DeviceRule::Exact, logits, params, history, supports, key)
}

/// [`score_block`] by `rule`.
pub fn score_block_with(
    rule: DeviceRule,
    logits: &Tensor,
    params: &SamplingParams,
    history: BlockHistory<'_>,
    supports: &[&[u32]],
    key: RoundKey,
) -> Result<DeviceScored> {
    let gamma = supports.len();
    let (rows, vocab) = rows_and_vocab(logits)?;
    if rows != gamma + 1 {
        return Err(SamplingError::ShapeMismatch(format!(
            "{gamma} supports need {} target distributions, got {rows}",
            gamma + 1
        ))
        .into());
    }
    for support in supports {
        for &t in *support {
            check_token(t, vocab)?;
        }
    }
    let device = logits.device();
    let effective = effective_rows_seeing(logits, params, history, rule == DeviceRule::Exact)?;
    let probs = &effective.probs;
    // The support entries, flattened: (row, token) pairs.
    let (support_rows, support_tokens): (Vec<i64>, Vec<i64>) =
        supports.iter().enumerate().flat_map(|(i, s)| s.iter().map(move |&t| (i as i64, i64::from(t)))).unzip();
    let uniforms: Vec<f64> = (0..gamma)
        .map(|i| key.stream(i + 1, Purpose::Complement).uniform())
        .chain(std::iter::once(key.stream(gamma + 1, Purpose::Bonus).uniform()))
        .collect();
    // One copy to the device: the support's rows and tokens (exact in f64: ids are below
    // 2^53) and the uniforms. Each copy from pageable host memory blocks the host.
    let entries = support_rows.len() as i64;
    let uploaded: Vec<f64> =
        support_rows.iter().chain(&support_tokens).map(|&x| x as f64).chain(uniforms.iter().copied()).collect();
    let uploaded = Tensor::f_from_slice(&uploaded)?.f_to_device(device)?;
    let index = [
        Some(uploaded.f_narrow(0, 0, entries)?.f_to_kind(Kind::Int64)?),
        Some(uploaded.f_narrow(0, entries, entries)?.f_to_kind(Kind::Int64)?),
    ];
    let p_on_support = probs.f_index(&index)?;
    let zero = Tensor::f_zeros([], (probs.kind(), device))?;
    let outside = probs.f_narrow(0, 0, gamma as i64)?.f_index_put(&index, &zero, false)?;
    let complement_mass = outside.f_sum_dim_intlist([1].as_slice(), false, Kind::Double)?;
    // Row i < γ draws from p_i outside S_i (threshold u × its mass), row γ from p_{γ+1}
    // (u × 1, as the host draws from a normalised distribution).
    let weights = Tensor::f_cat(&[&outside, &probs.f_narrow(0, gamma as i64, 1)?], 0)?;
    let totals = Tensor::f_cat(&[&complement_mass, &Tensor::f_ones([1], (Kind::Double, device))?], 0)?;
    let thresholds = uploaded.f_narrow(0, 2 * entries, gamma as i64 + 1)?.f_mul(&totals)?;
    let drawn = draw_rows(&weights, &thresholds)?.f_to_kind(Kind::Double)?;
    // One copy to the host: p on the supports, the masses, the draws, the flags.
    let packed = Tensor::f_cat(&[&p_on_support, &complement_mass, &drawn, &effective.flags], 0)?;
    let host = to_host(&packed)?;
    let (p_on_support, rest) = host.split_at(support_rows.len());
    let (masses, rest) = rest.split_at(gamma);
    let (drawn, flags) = rest.split_at(gamma + 1);
    if let Some(r) = flags.iter().position(|&f| f != 0.0) {
        return Err(host_error(logits, r, params, history));
    }
    let mut p_on_support = p_on_support.iter().copied();
    let positions = supports
        .iter()
        .zip(masses.iter().zip(drawn))
        .map(|(support, (&complement_mass, &sample))| ScoredPosition {
            p_on_support: p_on_support.by_ref().take(support.len()).collect(),
            complement_mass,
            complement_sample: (complement_mass > 0.0).then_some(sample as u32),
        })
        .collect();
    Ok(DeviceScored {
        block: ScoredBlock { positions, bonus: drawn[gamma] as u32 },
        bytes_to_host: host.len() * size_of::<f64>(),
    })
}

/// A 1-D f64 tensor's values on the host.
pub(crate) fn to_host(values: &Tensor) -> Result<Vec<f64>> {
    let values = values.f_to_device(Device::Cpu)?.f_contiguous()?;
    let mut out = vec![0f64; values.numel()];
    let len = out.len();
    values.f_copy_data(&mut out, len)?;
    Ok(out)
}
