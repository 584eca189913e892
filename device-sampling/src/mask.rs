//! Output constraints on the device: rows of logits with every token their row's
//! [`TokenMask`] forbids set to `-inf`, as `TokenMask::apply_to_logits` does on the host. The
//! masks cross as their bit words (V / 32 numbers a row) and are expanded where the logits
//! are, so a constrained block copies 1/32 of a row of flags per position, not a row.

use std::borrow::Borrow;

use specd_sampling::{SamplingError, TokenMask};
use tch::{Kind, Tensor};

use crate::effective::rows_and_vocab;
use crate::error::Result;

/// `logits` (`[n, V]`) with row `r` masked by `masks[r]`; a row whose mask is `None` is left
/// as it is (a row no rule reads: see `specd_node::FollowedConstraint`). A mask that allows
/// nothing is the host's error. Owned or borrowed masks: a draft masks every step's row with
/// its session's mask (16 KB at a vocabulary of 128 256), which it need not copy.
pub fn masked_rows<M: Borrow<TokenMask>>(logits: &Tensor, masks: &[Option<M>]) -> Result<Tensor> {
    let (rows, vocab) = rows_and_vocab(logits)?;
    if masks.len() != rows {
        return Err(SamplingError::ShapeMismatch(format!("{} masks for {rows} rows of logits", masks.len())).into());
    }
    if masks.iter().all(Option::is_none) {
        return Ok(logits.shallow_clone());
    }
    let width = vocab.div_ceil(32);
    let mut words = Vec::with_capacity(rows * width);
    for mask in masks {
        match mask.as_ref().map(Borrow::borrow) {
            Some(mask) => {
                if mask.count() == 0 {
                    return Err(SamplingError::EmptyDistribution.into());
                }
                let mask_words = mask.words();
                // The bit pattern as i32 (libtorch has no u32 shifts on every device); only
                // bit tests read it.
                words.extend((0..width).map(|w| mask_words.get(w).copied().unwrap_or(0) as i32));
            }
            None => words.extend(std::iter::repeat_n(-1i32, width)),
        }
    }
    let device = logits.device();
    let words = Tensor::from_slice(&words).f_view([rows as i64, width as i64])?.f_to_device(device)?;
    let ids = Tensor::f_arange(vocab as i64, (Kind::Int64, device))?;
    let word_of_id = ids.f_floor_divide_scalar(32)?;
    let bit_of_id = ids.f_remainder(32)?.f_to_kind(Kind::Int)?;
    let allowed = words.f_index_select(1, &word_of_id)?.f_bitwise_right_shift(&bit_of_id)?.f_bitwise_and(1)?.f_ne(0)?;
    Ok(logits.f_masked_fill(&allowed.f_logical_not()?, f64::NEG_INFINITY)?)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Masked on the device as on the host, across a word boundary and past the mask's width
    /// (a row wider than the mask: its extra ids are forbidden).
    #[test]
    fn the_device_masks_as_the_host_does() {
        let vocab = 70;
        let host: Vec<f32> = (0..2 * vocab).map(|i| (i as f32 * 0.37).sin()).collect();
        let mask = TokenMask::allow_only(66, &[0, 3, 31, 32, 33, 63, 64, 65]).unwrap();
        let masks = [Some(&mask), None];
        let logits = Tensor::from_slice(&host).view([2, vocab as i64]);
        let masked = masked_rows(&logits, &masks).unwrap();
        let device: Vec<f32> = Vec::try_from(masked.flatten(0, 1)).unwrap();
        let mut expected = host;
        mask.apply_to_logits(&mut expected[..vocab]).unwrap();
        assert_eq!(device, expected);
        assert!(device[66..vocab].iter().all(|l| *l == f32::NEG_INFINITY));
        let nothing = TokenMask::allow_only(vocab, &[]).unwrap();
        assert!(masked_rows(&logits, &[Some(&nothing), None]).is_err());
        assert!(masked_rows(&logits, &masks[..1]).is_err());
    }
}
