//! The draft's truncated q and its candidate, from a row of logits on the device: the
//! effective distribution is built there, its `max_entries` most likely tokens (ties to the
//! lower id) come to the host, and the host truncates and draws from them exactly as
//! `DenseDist::truncate` and `SparseDist::sample` do.

use specd_sampling::{SamplingParams, SparseDist, TokenHistory, Truncation};
use tch::{Kind, Tensor};

use crate::effective::{BlockHistory, effective_rows, host_error, rows_and_vocab};
use crate::error::Result;
use crate::target::to_host;

/// A candidate, the q it was drawn from, and the bytes copied to the host to draw it.
#[derive(Debug, Clone, PartialEq)]
pub struct DraftDraw {
    pub token: u32,
    pub q: SparseDist,
    pub bytes_to_host: usize,
}

/// Draws a candidate with the uniform `u` from the truncated q of `logits` (`[1, V]`) after
/// `history`.
pub fn draw_truncated(
    logits: &Tensor,
    params: &SamplingParams,
    history: TokenHistory<'_>,
    truncation: Truncation,
    u: f64,
) -> Result<DraftDraw> {
    let (_, vocab) = rows_and_vocab(logits)?;
    let history = BlockHistory { prompt: history.prompt, generated: history.generated, block: &[] };
    let effective = effective_rows(logits, params, history)?;
    let k = truncation.max_entries.min(vocab) as i64;
    let (sorted, order) = effective.probs.f_sort_stable(true, 1, true)?;
    let best = sorted.f_narrow(1, 0, k)?.f_squeeze_dim(0)?;
    let best_ids = order.f_narrow(1, 0, k)?.f_squeeze_dim(0)?.f_to_kind(Kind::Double)?;
    let host = to_host(&Tensor::f_cat(&[&best, &best_ids, &effective.flags], 0)?)?;
    let k = k as usize;
    if host[2 * k] != 0.0 {
        return Err(host_error(logits, 0, params, history));
    }
    // The host's ranking leaves out tokens without mass.
    let ranked: Vec<(u32, f64)> =
        host[k..2 * k].iter().zip(&host[..k]).filter(|&(_, &p)| p > 0.0).map(|(&t, &p)| (t as u32, p)).collect();
    if ranked.is_empty() {
        return Err(host_error(logits, 0, params, history));
    }
    let q = truncation.of_ranked(vocab, &ranked);
    Ok(DraftDraw { token: q.sample(u), q, bytes_to_host: host.len() * size_of::<f64>() })
}

/// The most likely token of the effective distribution of `logits` (`[1, V]`) after
/// `history`, ties to the lowest id: the draft's guess of the target's next token when it
/// drafts ahead. One number comes to the host.
pub fn most_likely(logits: &Tensor, params: &SamplingParams, history: TokenHistory<'_>) -> Result<u32> {
    rows_and_vocab(logits)?;
    let history = BlockHistory { prompt: history.prompt, generated: history.generated, block: &[] };
    let effective = effective_rows(logits, params, history)?;
    let best = effective.probs.f_argmax(1, false)?.f_to_kind(Kind::Double)?;
    let host = to_host(&Tensor::f_cat(&[&best, &effective.flags], 0)?)?;
    if host[1] != 0.0 {
        return Err(host_error(logits, 0, params, history));
    }
    Ok(host[0] as u32)
}
