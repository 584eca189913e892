//! Inverse-CDF draws on a batch of rows, each with its own uniform: the device form of the
//! host's `sample_index`.

use tch::{Kind, Tensor};

use crate::error::Result;

/// For each row of `weights` (`[m, V]` f64, non-negative), the first index with a positive
/// weight whose running sum exceeds the row's threshold (`[m]` f64: u × the row's total);
/// where rounding leaves the threshold at or above the whole row's sum, the last index with
/// a positive weight, as on the host. Returns `[m]` i64.
///
/// The positive weight is asked for, not implied: a GPU's cumsum is a parallel scan, whose
/// running sums may differ in the last bit from one index to the next even where the weight
/// between them is zero, and a draw must never land on a token without mass (in a complement
/// row, those are the support's tokens).
pub fn draw_rows(weights: &Tensor, thresholds: &Tensor) -> Result<Tensor> {
    let vocab = weights.size()[1];
    let running = weights.f_cumsum(1, Kind::Double)?;
    let positive = weights.f_gt(0.0)?;
    let hit = running.f_gt_tensor(&thresholds.f_unsqueeze(1)?)?.f_logical_and(&positive)?;
    // The first hit; argmax of an all-zero row is 0, so rows without one are told apart.
    let first_hit = hit.f_to_kind(Kind::Int)?.f_argmax(1, false)?;
    let any_hit = hit.f_any_dim(1, false)?;
    let last_positive = weights
        .f_gt(0.0)?
        .f_flip([1].as_slice())?
        .f_to_kind(Kind::Int)?
        .f_argmax(1, false)?
        .f_neg()?
        .f_add_scalar(vocab - 1)?;
    Ok(first_hit.f_where_self(&any_hit, &last_positive)?)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn draws(weights: &[f64], thresholds: &[f64]) -> Vec<i64> {
        let w =
            Tensor::from_slice(weights).view([1, weights.len() as i64]).expand([thresholds.len() as i64, -1], false);
        let t = Tensor::from_slice(thresholds);
        Vec::<i64>::try_from(draw_rows(&w, &t).unwrap()).unwrap()
    }

    #[test]
    fn the_first_index_past_the_threshold_and_never_a_zero_weight() {
        let w = [0.0, 0.25, 0.0, 0.5, 0.25, 0.0];
        assert_eq!(draws(&w, &[0.0, 0.2499, 0.25, 0.7499, 0.75, 0.9999]), vec![1, 1, 3, 3, 4, 4]);
        // Rounding that leaves the threshold past the sum: the last positive weight.
        assert_eq!(draws(&w, &[1.0, 1.5]), vec![4, 4]);
    }
}
