//! Every number of docs/rule.md, reproduced by the library.

mod common;

use common::FixedModel;
use specd_sampling::law::{WireFormat, position_law, round_law};
use specd_sampling::{CostModel, DenseDist};

fn close(a: f64, b: f64, tol: f64) -> bool {
    (a - b).abs() <= tol
}

fn assert_all_close(got: &[f64], want: &[f64], tol: f64) {
    assert_eq!(got.len(), want.len());
    assert!(got.iter().zip(want).all(|(g, w)| close(*g, *w, tol)), "{got:?} != {want:?}");
}

fn abc(p: [f64; 3]) -> DenseDist {
    DenseDist::new(p.to_vec()).unwrap()
}

#[test]
fn worked_example() {
    let (p, q) = (abc([0.60, 0.30, 0.10]), abc([0.50, 0.25, 0.25]));
    let law = position_law(&p, &q);
    let acceptance: Vec<f64> = law.acceptance.iter().map(|a| a.unwrap()).collect();
    assert_all_close(&acceptance, &[1.0, 1.0, 0.4], 1e-15);
    assert_all_close(&law.accepted_mass, &[0.50, 0.25, 0.10], 1e-15);
    assert!(close(law.beta, 0.85, 1e-15));
    assert!(close(law.rejection, 0.15, 1e-15));
    assert_all_close(law.residual.as_ref().unwrap(), &[2.0 / 3.0, 1.0 / 3.0, 0.0], 1e-15);
    assert_all_close(&law.output, &[0.60, 0.30, 0.10], 1e-15);
}

#[test]
fn resampling_from_p_is_normalised_and_wrong() {
    let law = position_law(&abc([0.60, 0.30, 0.10]), &abc([0.50, 0.25, 0.25]));
    assert_all_close(&law.naive_output, &[0.59, 0.295, 0.115], 1e-15);
    assert!(close(law.naive_output.iter().sum(), 1.0, 1e-15));
}

#[test]
fn equal_distributions_accept_everything_but_matching_accepts_046() {
    let p = abc([0.6, 0.3, 0.1]);
    let law = position_law(&p, &p);
    assert!(law.acceptance.iter().all(|a| *a == Some(1.0)));
    assert!(close(law.beta, 1.0, 1e-15));
    assert_eq!(law.residual, None, "residual mass zero is reported, never normalised");
    assert_all_close(&law.output, p.probs(), 1e-15);
    assert!(close(law.independent_match_acceptance, 0.46, 1e-15));
}

#[test]
fn worked_example_through_a_whole_round() {
    // γ = 1: the first committed token of the round is distributed as p.
    let model = FixedModel { p: abc([0.60, 0.30, 0.10]), q: abc([0.50, 0.25, 0.25]) };
    let mut first = [0.0; 3];
    for (tokens, w) in round_law(&model, &[], 1, WireFormat::Dense) {
        first[tokens[0] as usize] += w;
    }
    assert_all_close(&first, &[0.6, 0.3, 0.1], 1e-15);
}

#[test]
fn cost_model_numbers() {
    let m = CostModel::new(0.5, 100.0, 20.0, 0.0).unwrap();
    assert!(close(m.tokens_per_round(2), 1.75, 1e-12));
    assert!(close(m.round_ms(2), 140.0, 1e-12));
    assert!(close(m.ms_per_token(2), 80.0, 1e-12));
    assert!(close(m.speedup(2), 1.25, 1e-12));
    assert!(close(m.analytic_bound(2), 1.25, 1e-12));
    let slow = CostModel::new(0.5, 100.0, 50.0, 0.0).unwrap();
    assert!(close(slow.ms_per_token(2), 114.286, 5e-4));
    assert!(close(slow.speedup(2), 0.875, 1e-12));
    assert_eq!(slow.best_gamma(16), (0, 1.0), "speculation must switch itself off");
}
