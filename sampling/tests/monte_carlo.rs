//! Monte Carlo tests of the real sampler against the exact law, with their power shown.
//!
//! Each test runs the real round loop (draft sampling, target pieces, rule) with fixed
//! seeds and applies Pearson's χ² test to the counts of the first L generated tokens against
//! the target-only law. A correct sampler fails such a test with probability equal to its
//! threshold, `FALSE_FAILURE`, over the choice of seeds; with fixed seeds the verdict is
//! reproducible. Each test then runs the naive rule (resample from p) on the same seeds and
//! asserts that the same test *rejects* it: the test can see the bug it guards against.

mod common;

use common::{FixedModel, HashedModel, Rule, cell_index, generate};
use specd_sampling::chi2::chi_square_test;
use specd_sampling::law::{PrefixModel, WireFormat, target_sequence_law};
use specd_sampling::{DenseDist, Truncation};

/// Probability that a correct sampler fails one of these tests (the χ² threshold).
const FALSE_FAILURE: f64 = 1e-3;

fn chi2_p_value(
    model: &dyn PrefixModel,
    v: usize,
    gamma: usize,
    length: usize,
    wire: WireFormat,
    runs: u64,
    rule: Rule,
) -> f64 {
    let mut counts = vec![0u64; v.pow(length as u32)];
    for seed in 0..runs {
        let seq = generate(model, &[0], gamma, length, wire, seed, rule);
        counts[cell_index(&seq, v)] += 1;
    }
    let mut expected = vec![0.0; counts.len()];
    for (seq, prob) in target_sequence_law(model, &[0], length) {
        expected[cell_index(&seq, v)] = prob;
    }
    chi_square_test(&counts, &expected).unwrap().p_value
}

fn abc_model() -> FixedModel {
    FixedModel { p: DenseDist::new(vec![0.6, 0.3, 0.1]).unwrap(), q: DenseDist::new(vec![0.5, 0.25, 0.25]).unwrap() }
}

#[test]
fn worked_example_first_token_passes_and_naive_fails() {
    let model = abc_model();
    let exact = chi2_p_value(&model, 3, 1, 1, WireFormat::Dense, 100_000, Rule::Exact);
    assert!(exact > FALSE_FAILURE, "exact rule rejected: p = {exact}");
    // The naive law (0.59, 0.295, 0.115) is 0.0025·N away in χ² terms: about 250 at N = 1e5.
    let naive = chi2_p_value(&model, 3, 1, 1, WireFormat::Dense, 100_000, Rule::Naive);
    assert!(naive < FALSE_FAILURE, "the test cannot see the naive rule: p = {naive}");
}

#[test]
fn three_token_law_with_blocks_dense_and_sparse() {
    let model = HashedModel { seed: 2024, vocab_size: 3 };
    for gamma in [2, 4] {
        let dense = chi2_p_value(&model, 3, gamma, 3, WireFormat::Dense, 30_000, Rule::Exact);
        assert!(dense > FALSE_FAILURE, "dense γ={gamma}: p = {dense}");
        let t = Truncation::new(0.25, 2).unwrap();
        let sparse = chi2_p_value(&model, 3, gamma, 3, WireFormat::Sparse(t), 30_000, Rule::Exact);
        assert!(sparse > FALSE_FAILURE, "sparse γ={gamma}: p = {sparse}");
    }
}

#[test]
fn three_token_law_catches_the_naive_rule() {
    let model = abc_model();
    let exact = chi2_p_value(&model, 3, 2, 3, WireFormat::Dense, 30_000, Rule::Exact);
    assert!(exact > FALSE_FAILURE, "exact: p = {exact}");
    let naive = chi2_p_value(&model, 3, 2, 3, WireFormat::Dense, 30_000, Rule::Naive);
    assert!(naive < FALSE_FAILURE, "naive not caught: p = {naive}");
}
