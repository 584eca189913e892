//! Effective distributions of a batch of rows, on the rows' device: what
//! `specd_sampling::block_distributions` computes on the host, in f64 and in the same order
//! (penalties → temperature → top-k → top-p → min-p; temperature 0 is the one-hot on the
//! lowest argmax).
//!
//! Nothing here copies to the host. Where the host's rules would refuse a row (a NaN or
//! +inf logit, no finite logit, weights a penalty made infinite), the row's flag is set and
//! its distribution is meaningless: callers copy the flags with their results and, for a
//! flagged row, ask the host path for its error ([`host_error`]).

use specd_sampling::{SamplingError, SamplingParams, TokenHistory, effective_distribution};
use tch::{Device, Kind, Tensor};

use crate::error::{DeviceSamplingError, Result};

/// What the penalties of a block's rows look at: row `r` follows
/// `generated ++ block[..r]`; repetition also sees the prompt.
#[derive(Debug, Clone, Copy, Default)]
pub struct BlockHistory<'a> {
    pub prompt: &'a [u32],
    pub generated: &'a [u32],
    pub block: &'a [u32],
}

impl<'a> BlockHistory<'a> {
    /// The history the host path gives row `r`, in `buffer`.
    fn row(&self, r: usize, buffer: &'a mut Vec<u32>) -> TokenHistory<'a> {
        buffer.clear();
        buffer.extend_from_slice(self.generated);
        buffer.extend_from_slice(&self.block[..r.min(self.block.len())]);
        TokenHistory { prompt: self.prompt, generated: buffer }
    }
}

/// The rows' effective distributions, `[n, V]` f64 summing to 1 by row, and `[n]` f64 flags
/// (non-zero: the host path refuses the row).
#[derive(Debug)]
pub struct EffectiveRows {
    pub probs: Tensor,
    pub flags: Tensor,
}

/// Below this, e^x is 0 on the host (`specd-sampling`'s kernels), and so here.
const EXP_FLOOR: f64 = -708.0;

/// Effective distributions of `logits` (`[n, V]`, any float kind, any device).
pub fn effective_rows(logits: &Tensor, params: &SamplingParams, history: BlockHistory<'_>) -> Result<EffectiveRows> {
    effective_rows_seeing(logits, params, history, true)
}

/// [`effective_rows`]; `block_seen` false is wrong on purpose: penalties at every row see
/// only the committed history (the `testing` feature's `DeviceRule::PenaltiesBlindToTheBlock`).
pub(crate) fn effective_rows_seeing(
    logits: &Tensor,
    params: &SamplingParams,
    history: BlockHistory<'_>,
    block_seen: bool,
) -> Result<EffectiveRows> {
    let (n, vocab) = rows_and_vocab(logits)?;
    if history.block.len() + 1 < n {
        return Err(SamplingError::ShapeMismatch(format!(
            "{n} logit rows need at least {} block tokens, got {}",
            n - 1,
            history.block.len()
        ))
        .into());
    }
    let device = logits.device();
    let mut scores = logits.f_to_kind(Kind::Double)?;
    let bad = scores.f_isnan()?.f_logical_or(&scores.f_eq(f64::INFINITY)?)?.f_any_dim(1, false)?;
    if params.has_penalties() {
        let seen = if block_seen { n } else { 1 };
        scores = penalised(&scores, params, history, n, seen, vocab, device)?;
    }
    let max = scores.f_amax([1].as_slice(), true)?;
    let no_finite = max.f_eq(f64::NEG_INFINITY)?.f_squeeze_dim(1)?;
    if params.is_greedy() {
        let best = scores.f_argmax(1, true)?;
        let probs =
            Tensor::f_zeros([n as i64, vocab as i64], (Kind::Double, device))?.f_scatter_value(1, &best, 1.0)?;
        let flags = bad.f_logical_or(&no_finite)?.f_to_kind(Kind::Double)?;
        return Ok(EffectiveRows { probs, flags });
    }
    // Every score is at most the maximum, so each weight is e^x for an x ≤ 0; below
    // EXP_FLOOR it is 0, as the host's kernel makes it (e^-708 is near the smallest normal).
    let x = scores.f_sub(&max)?.f_mul_scalar(1.0 / params.temperature)?;
    let mut weights = x.f_exp()?.f_where_self(&x.f_ge(EXP_FLOOR)?, &x.f_zeros_like()?)?;
    let top_k = params.top_k > 0 && (params.top_k as usize) < vocab;
    if top_k || params.top_p < 1.0 || params.min_p > 0.0 {
        weights = truncated(&weights, params, top_k, vocab, device)?;
    }
    let sum = weights.f_sum_dim_intlist([1].as_slice(), true, Kind::Double)?;
    let invalid = sum.f_isfinite()?.f_logical_not()?.f_logical_or(&sum.f_le(0.0)?)?.f_squeeze_dim(1)?;
    let flags = bad.f_logical_or(&no_finite)?.f_logical_or(&invalid)?.f_to_kind(Kind::Double)?;
    Ok(EffectiveRows { probs: weights.f_div(&sum)?, flags })
}

/// Top-k, top-p and min-p on unnormalised weights, as the host does them: one stable sort
/// by weight, descending, puts ties in id order, which is the host's order (more mass, then
/// the lower id); the kept set is then scattered back.
fn truncated(weights: &Tensor, params: &SamplingParams, top_k: bool, vocab: usize, device: Device) -> Result<Tensor> {
    let (sorted, order) = weights.f_sort_stable(true, 1, true)?;
    let rank = Tensor::f_arange(vocab as i64, (Kind::Int64, device))?.f_unsqueeze(0)?;
    let mut keep = if top_k { rank.f_lt(i64::from(params.top_k))? } else { rank.f_ge(0)? }.f_expand_as(&sorted)?;
    let mut sorted = sorted;
    if params.top_p < 1.0 {
        let kept = sorted.f_where_self(&keep, &sorted.f_zeros_like()?)?;
        // The host's total is of every weight top-k left; its running sum is in sorted order
        // and keeps a token while the mass before it is below top_p × total.
        let total = kept.f_sum_dim_intlist([1].as_slice(), true, Kind::Double)?;
        let running = kept.f_cumsum(1, Kind::Double)?;
        let before =
            Tensor::f_cat(&[running.f_zeros_like()?.f_narrow(1, 0, 1)?, running.f_narrow(1, 0, vocab as i64 - 1)?], 1)?;
        keep = keep.f_logical_and(&before.f_lt_tensor(&total.f_mul_scalar(params.top_p)?)?)?;
        sorted = kept;
    }
    if params.min_p > 0.0 {
        // The argmax survives top-k and top-p, and its weight is e^0: the first sorted one.
        let floor = sorted.f_narrow(1, 0, 1)?.f_mul_scalar(params.min_p)?;
        keep = keep.f_logical_and(&sorted.f_ge_tensor(&floor)?)?;
    }
    let mask = keep.f_zeros_like()?.f_scatter(1, &order, &keep)?;
    Ok(weights.f_where_self(&mask, &weights.f_zeros_like()?)?)
}

/// Repetition, presence and frequency penalties on `scores` (`[n, V]` f64): the counts of
/// every row's generated history are built on the device from the token ids (O(history)
/// numbers uploaded), never as dense rows on the host.
fn penalised(
    scores: &Tensor,
    params: &SamplingParams,
    history: BlockHistory<'_>,
    n: usize,
    block_seen_by: usize,
    vocab: usize,
    device: Device,
) -> Result<Tensor> {
    for &t in history.generated.iter().chain(&history.block[..n.saturating_sub(1).min(history.block.len())]) {
        check_token(t, vocab)?;
    }
    // Row r also counts the block's first r tokens (rows below `block_seen_by`).
    let (rows, tokens): (Vec<i64>, Vec<u32>) =
        (1..block_seen_by).flat_map(|r| history.block[..r].iter().map(move |&t| (r as i64, t))).unzip();
    let prompt = if params.repetition_penalty != 1.0 { history.prompt } else { &[] };
    for &t in prompt {
        check_token(t, vocab)?;
    }
    // Every id this needs goes to the device in one copy (each copy from pageable host
    // memory blocks the host): the generated tokens, the block's (row, token) pairs, the
    // prompt.
    let uploaded: Vec<i64> = history
        .generated
        .iter()
        .map(|&t| i64::from(t))
        .chain(rows.iter().copied())
        .chain(tokens.iter().chain(prompt).map(|&t| i64::from(t)))
        .collect();
    let uploaded = Tensor::f_from_slice(&uploaded)?.f_to_device(device)?;
    let mut start = 0;
    let mut part = |len: usize| -> Result<Tensor> {
        let ids = uploaded.f_narrow(0, start, len as i64)?;
        start += len as i64;
        Ok(ids)
    };
    let (generated, rows, tokens, prompt) =
        (part(history.generated.len())?, part(rows.len())?, part(tokens.len())?, part(prompt.len())?);
    let one = Tensor::f_ones([], (Kind::Double, device))?;
    let mut base = Tensor::f_zeros([vocab as i64], (Kind::Double, device))?;
    if !history.generated.is_empty() {
        let _ = base.f_index_put_(&[Some(generated)], &one, true)?;
    }
    let mut counts = base.f_unsqueeze(0)?.f_expand([n as i64, vocab as i64], false)?.f_contiguous()?;
    if rows.numel() > 0 {
        let _ = counts.f_index_put_(&[Some(rows), Some(tokens)], &one, true)?;
    }
    let mut scores = scores.shallow_clone();
    if params.repetition_penalty != 1.0 {
        let mut seen = counts.f_gt(0.0)?;
        if prompt.numel() > 0 {
            let in_prompt = Tensor::f_zeros([vocab as i64], (Kind::Bool, device))?.f_index_fill(0, &prompt, 1)?;
            seen = seen.f_logical_or(&in_prompt.f_unsqueeze(0)?)?;
        }
        let r = params.repetition_penalty;
        let positive = scores.f_gt(0.0)?;
        let penalised = scores.f_div_scalar(r)?.f_where_self(&positive, &scores.f_mul_scalar(r)?)?;
        scores = penalised.f_where_self(&seen, &scores)?;
    }
    if params.presence_penalty != 0.0 || params.frequency_penalty != 0.0 {
        // One subtraction of presence + frequency × count, as the host does it.
        let penalty = counts
            .f_gt(0.0)?
            .f_to_kind(Kind::Double)?
            .f_mul_scalar(params.presence_penalty)?
            .f_add(&counts.f_mul_scalar(params.frequency_penalty)?)?;
        scores = scores.f_sub(&penalty)?;
    }
    Ok(scores)
}

/// `[n, V]` of a 2-D tensor with a vocabulary.
pub(crate) fn rows_and_vocab(logits: &Tensor) -> Result<(usize, usize)> {
    match logits.size()[..] {
        [n, vocab] if n > 0 && vocab > 0 => Ok((n as usize, vocab as usize)),
        [_, 0] => Err(SamplingError::EmptyDistribution.into()),
        ref size => Err(SamplingError::ShapeMismatch(format!("logits of shape {size:?}: need [rows, vocab]")).into()),
    }
}

pub(crate) fn check_token(token: u32, vocab_size: usize) -> Result<()> {
    if (token as usize) < vocab_size {
        Ok(())
    } else {
        Err(SamplingError::TokenOutOfRange { token, vocab_size }.into())
    }
}

/// The host path's error for row `r` of `logits`, which the device flagged. The host
/// decides: its error names the token and the value. Should the host find nothing wrong
/// (a row at the edge of rounding), the row is refused all the same, by name.
pub(crate) fn host_error(
    logits: &Tensor,
    r: usize,
    params: &SamplingParams,
    history: BlockHistory<'_>,
) -> DeviceSamplingError {
    let row = match row_on_host(logits, r) {
        Ok(row) => row,
        Err(err) => return err,
    };
    let mut buffer = Vec::new();
    match effective_distribution(&row, params, history.row(r, &mut buffer)) {
        Err(err) => err.into(),
        Ok(_) => DeviceSamplingError::Disagreement(format!(
            "row {r}: its weights do not form a distribution on the device, though they do on the host"
        )),
    }
}

fn row_on_host(logits: &Tensor, r: usize) -> Result<Vec<f32>> {
    let row = logits.f_get(r as i64)?.f_to_kind(Kind::Float)?.f_to_device(Device::Cpu)?.f_contiguous()?;
    let mut out = vec![0f32; row.numel()];
    let len = out.len();
    row.f_copy_data(&mut out, len)?;
    Ok(out)
}
