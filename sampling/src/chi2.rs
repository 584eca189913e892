//! Pearson's χ² goodness-of-fit test, for the statistical tests of the law.

use crate::error::{Result, SamplingError};

/// Cells with an expected count below this are pooled (the usual validity rule of thumb).
pub const MIN_EXPECTED_COUNT: f64 = 5.0;

/// The outcome of a goodness-of-fit test.
#[derive(Debug, Clone, PartialEq)]
pub struct ChiSquare {
    pub statistic: f64,
    pub degrees_of_freedom: usize,
    /// P(χ²_df ≥ statistic). 0 when a cell of probability 0 was observed.
    pub p_value: f64,
    /// How many cells were merged into the pooled cell.
    pub pooled_cells: usize,
}

/// Tests observed counts against expected probabilities (which must sum to 1).
///
/// Cells with expected count below [`MIN_EXPECTED_COUNT`] are pooled into one cell; if that
/// cell is still too small it joins the smallest other cell. An observation in a cell of
/// probability zero is an impossible outcome and gives p-value 0.
pub fn chi_square_test(observed: &[u64], expected_probs: &[f64]) -> Result<ChiSquare> {
    if observed.len() != expected_probs.len() {
        return Err(SamplingError::ShapeMismatch(format!(
            "{} observed cells for {} probabilities",
            observed.len(),
            expected_probs.len()
        )));
    }
    let n: u64 = observed.iter().sum();
    if n == 0 {
        return Err(SamplingError::NoObservations);
    }
    let n = n as f64;
    let mut cells: Vec<(f64, f64)> = Vec::new();
    let mut pooled = (0.0, 0.0);
    let mut pooled_cells = 0;
    for (index, (&o, &p)) in observed.iter().zip(expected_probs).enumerate() {
        if !(p.is_finite() && p >= 0.0) {
            return Err(SamplingError::InvalidProbability { index, value: p });
        }
        if p == 0.0 {
            if o > 0 {
                return Ok(ChiSquare {
                    statistic: f64::INFINITY,
                    degrees_of_freedom: 0,
                    p_value: 0.0,
                    pooled_cells: 0,
                });
            }
            continue;
        }
        let e = n * p;
        if e < MIN_EXPECTED_COUNT {
            pooled.0 += o as f64;
            pooled.1 += e;
            pooled_cells += 1;
        } else {
            cells.push((o as f64, e));
        }
    }
    if pooled_cells > 0 {
        if pooled.1 < MIN_EXPECTED_COUNT && !cells.is_empty() {
            let smallest = (0..cells.len()).min_by(|&a, &b| cells[a].1.total_cmp(&cells[b].1)).expect("non-empty");
            cells[smallest].0 += pooled.0;
            cells[smallest].1 += pooled.1;
        } else {
            cells.push(pooled);
        }
    }
    let statistic: f64 = cells.iter().map(|(o, e)| (o - e) * (o - e) / e).sum();
    let degrees_of_freedom = cells.len().saturating_sub(1);
    let p_value = if degrees_of_freedom == 0 { 1.0 } else { chi_square_survival(statistic, degrees_of_freedom) };
    Ok(ChiSquare { statistic, degrees_of_freedom, p_value, pooled_cells })
}

/// Pearson's χ² test that two samples over the same cells come from one law (a 2 × C
/// contingency table). Cells whose smaller expected count is below [`MIN_EXPECTED_COUNT`]
/// are pooled into one cell, as in [`chi_square_test`].
pub fn two_sample_chi_square(a: &[u64], b: &[u64]) -> Result<ChiSquare> {
    if a.len() != b.len() {
        return Err(SamplingError::ShapeMismatch(format!("{} cells against {}", a.len(), b.len())));
    }
    let (na, nb) = (a.iter().sum::<u64>() as f64, b.iter().sum::<u64>() as f64);
    if na == 0.0 || nb == 0.0 {
        return Err(SamplingError::NoObservations);
    }
    let share_a = na / (na + nb);
    let min_share = share_a.min(1.0 - share_a);
    let mut cells: Vec<(f64, f64)> = Vec::new();
    let (mut pooled, mut pooled_cells) = ((0.0, 0.0), 0);
    for (&x, &y) in a.iter().zip(b) {
        let (x, y) = (x as f64, y as f64);
        if x + y == 0.0 {
            continue;
        }
        if (x + y) * min_share < MIN_EXPECTED_COUNT {
            pooled.0 += x;
            pooled.1 += y;
            pooled_cells += 1;
        } else {
            cells.push((x, y));
        }
    }
    if pooled_cells > 0 {
        cells.push(pooled);
    }
    let statistic: f64 = cells
        .iter()
        .map(|&(x, y)| {
            let (ea, eb) = ((x + y) * share_a, (x + y) * (1.0 - share_a));
            (x - ea) * (x - ea) / ea + (y - eb) * (y - eb) / eb
        })
        .sum();
    let degrees_of_freedom = cells.len().saturating_sub(1);
    let p_value = if degrees_of_freedom == 0 { 1.0 } else { chi_square_survival(statistic, degrees_of_freedom) };
    Ok(ChiSquare { statistic, degrees_of_freedom, p_value, pooled_cells })
}

/// P(χ²_k ≥ x) = Q(k/2, x/2), the regularised upper incomplete gamma function.
pub fn chi_square_survival(x: f64, k: usize) -> f64 {
    if x <= 0.0 {
        return 1.0;
    }
    upper_regularised_gamma(k as f64 / 2.0, x / 2.0)
}

fn upper_regularised_gamma(a: f64, x: f64) -> f64 {
    if x < a + 1.0 { 1.0 - lower_series(a, x) } else { upper_continued_fraction(a, x) }
}

/// P(a, x) by its power series; converges quickly for x < a + 1.
fn lower_series(a: f64, x: f64) -> f64 {
    let mut term = 1.0 / a;
    let mut sum = term;
    let mut denom = a;
    for _ in 0..10_000 {
        denom += 1.0;
        term *= x / denom;
        sum += term;
        if term.abs() < sum.abs() * 1e-16 {
            break;
        }
    }
    (sum.ln() - x + a * x.ln() - ln_gamma(a)).exp()
}

/// Q(a, x) by Lentz's continued fraction; converges quickly for x ≥ a + 1.
fn upper_continued_fraction(a: f64, x: f64) -> f64 {
    const TINY: f64 = 1e-300;
    let mut b = x + 1.0 - a;
    let mut c = 1.0 / TINY;
    let mut d = 1.0 / b;
    let mut h = d;
    for i in 1..10_000 {
        let an = -(i as f64) * (i as f64 - a);
        b += 2.0;
        d = an * d + b;
        if d.abs() < TINY {
            d = TINY;
        }
        c = b + an / c;
        if c.abs() < TINY {
            c = TINY;
        }
        d = 1.0 / d;
        let delta = d * c;
        h *= delta;
        if (delta - 1.0).abs() < 1e-16 {
            break;
        }
    }
    (-x + a * x.ln() - ln_gamma(a)).exp() * h
}

/// ln Γ(x) for x > 0 (Lanczos, g = 7, n = 9; relative error below 1e-15).
fn ln_gamma(x: f64) -> f64 {
    const G: f64 = 7.0;
    const COEFFS: [f64; 9] = [
        0.999_999_999_999_809_9,
        676.520_368_121_885_1,
        -1_259.139_216_722_402_8,
        771.323_428_777_653_1,
        -176.615_029_162_140_6,
        12.507_343_278_686_905,
        -0.138_571_095_265_720_12,
        9.984_369_578_019_572e-6,
        1.505_632_735_149_311_6e-7,
    ];
    if x < 0.5 {
        let pi = std::f64::consts::PI;
        return (pi / (pi * x).sin()).ln() - ln_gamma(1.0 - x);
    }
    let x = x - 1.0;
    let mut sum = COEFFS[0];
    for (i, &c) in COEFFS.iter().enumerate().skip(1) {
        sum += c / (x + i as f64);
    }
    let t = x + G + 0.5;
    0.5 * (2.0 * std::f64::consts::PI).ln() + (x + 0.5) * t.ln() - t + sum.ln()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn survival_matches_closed_forms_and_tables() {
        // k = 2: Q(1, x/2) = exp(-x/2).
        for x in [0.1, 1.0, 2.0, 7.5, 30.0] {
            assert!((chi_square_survival(x, 2) - (-x / 2.0_f64).exp()).abs() < 1e-13, "x = {x}");
        }
        // k = 1: P(χ² ≥ x) = erfc(sqrt(x/2)); 0.05 critical values from standard tables.
        assert!((chi_square_survival(3.841_458_820_694_124, 1) - 0.05).abs() < 1e-10);
        assert!((chi_square_survival(18.307_038_053_275_146, 10) - 0.05).abs() < 1e-10);
        assert!((chi_square_survival(6.634_896_601_021_214, 1) - 0.01).abs() < 1e-10);
        assert!((ln_gamma(10.0) - 362_880f64.ln()).abs() < 1e-12);
        assert!((ln_gamma(0.5) - std::f64::consts::PI.sqrt().ln()).abs() < 1e-13);
    }

    #[test]
    fn goodness_of_fit_accepts_a_fit_and_rejects_a_misfit() {
        let fit = chi_square_test(&[600, 300, 100], &[0.6, 0.3, 0.1]).unwrap();
        assert_eq!(fit.statistic, 0.0);
        assert_eq!(fit.p_value, 1.0);
        let misfit = chi_square_test(&[500, 300, 200], &[0.6, 0.3, 0.1]).unwrap();
        assert!(misfit.p_value < 1e-20, "{misfit:?}");
        assert_eq!(misfit.degrees_of_freedom, 2);
    }

    #[test]
    fn two_samples_of_one_law_pass_and_of_two_laws_fail() {
        let same = two_sample_chi_square(&[600, 300, 100], &[1200, 600, 200]).unwrap();
        assert!(same.statistic < 1e-20 && same.p_value > 0.999_999, "{same:?}");
        assert_eq!(same.degrees_of_freedom, 2);
        let different = two_sample_chi_square(&[600, 300, 100], &[500, 300, 200]).unwrap();
        assert!(different.p_value < 1e-9, "{different:?}");
        let pooled = two_sample_chi_square(&[500, 2, 1], &[500, 1, 2]).unwrap();
        assert_eq!((pooled.pooled_cells, pooled.degrees_of_freedom), (2, 1));
        assert!(two_sample_chi_square(&[1], &[1, 2]).is_err());
        assert_eq!(two_sample_chi_square(&[0, 0], &[1, 2]), Err(SamplingError::NoObservations));
    }

    #[test]
    fn small_cells_are_pooled_and_impossible_cells_fail() {
        let r = chi_square_test(&[97, 2, 1, 0], &[0.97, 0.01, 0.01, 0.01]).unwrap();
        assert_eq!(r.pooled_cells, 3);
        assert_eq!(r.degrees_of_freedom, 0, "the pooled cell joined the only big one");
        let r = chi_square_test(&[985, 3, 4, 8], &[0.985, 0.003, 0.004, 0.008]).unwrap();
        assert_eq!((r.pooled_cells, r.degrees_of_freedom), (2, 2), "3 + 4 pooled to 7 stands alone");
        let impossible = chi_square_test(&[10, 1], &[1.0, 0.0]).unwrap();
        assert_eq!(impossible.p_value, 0.0);
        assert_eq!(chi_square_test(&[0, 0], &[0.5, 0.5]), Err(SamplingError::NoObservations));
    }
}
