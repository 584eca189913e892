//! Inverse-CDF draws on a batch of rows, each with its own uniform: the device form of the
//! host's `sample_index`.

use tch::{Kind, Tensor};

use crate::error::Result;

/// For each row of `weights` (`[m, V]` f64, non-negative), the first index whose running
/// sum exceeds the row's threshold (`[m]` f64: u × the row's total). That index always has
/// a positive weight: the running sum rises past the threshold there. Where rounding leaves
/// the threshold at or above the whole row's sum, the last index with a positive weight,
/// as on the host. Returns `[m]` i64.
pub fn draw_rows(weights: &Tensor, thresholds: &Tensor) -> Result<Tensor> {
    let vocab = weights.size()[1];
    let running = weights.f_cumsum(1, Kind::Double)?;
    let found = thresholds.f_unsqueeze(1)?.f_searchsorted(&running, false, true, "right", None::<Tensor>)?;
    let found = found.f_squeeze_dim(1)?;
    let last_positive = weights
        .f_gt(0.0)?
        .f_flip([1].as_slice())?
        .f_to_kind(Kind::Int)?
        .f_argmax(1, false)?
        .f_neg()?
        .f_add_scalar(vocab - 1)?;
    Ok(last_positive.f_where_self(&found.f_ge(vocab)?, &found)?)
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
