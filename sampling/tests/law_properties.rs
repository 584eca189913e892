//! Property tests: the enumerated output law of the rule is the target's law, for every
//! shape of p and q (zeros, one-hot, equal, disjoint supports, truncated q), dense and sparse.

mod common;

use common::HashedModel;
use proptest::prelude::*;
use specd_sampling::law::{
    WireFormat, max_law_difference, position_law, sparse_rejection_law, speculative_sequence_law, target_sequence_law,
};
use specd_sampling::{DenseDist, Truncation};

const TOLERANCE: f64 = 1e-12;

/// Weights with a good share of exact zeros and at least one positive entry.
fn weights(v: usize) -> impl Strategy<Value = Vec<f64>> {
    prop::collection::vec(prop_oneof![2 => Just(0.0), 5 => 0.0f64..1.0, 1 => Just(1.0)], v)
        .prop_filter("some mass", |w| w.iter().any(|&x| x > 0.0))
}

#[derive(Debug, Clone, Copy)]
enum Shape {
    Random,
    Equal,
    OneHot(usize),
    Disjoint,
}

fn pair() -> impl Strategy<Value = (DenseDist, DenseDist)> {
    (2usize..9)
        .prop_flat_map(|v| {
            let shape = prop_oneof![
                4 => Just(Shape::Random),
                1 => Just(Shape::Equal),
                1 => (0..v).prop_map(Shape::OneHot),
                1 => Just(Shape::Disjoint),
            ];
            (weights(v), weights(v), shape)
        })
        .prop_map(|(pw, qw, shape)| {
            let p = DenseDist::from_weights(pw).unwrap();
            let q = match shape {
                Shape::Random => DenseDist::from_weights(qw).unwrap(),
                Shape::Equal => p.clone(),
                Shape::OneHot(t) => DenseDist::one_hot(p.vocab_size(), t as u32).unwrap(),
                Shape::Disjoint => {
                    let outside: Vec<f64> = p.probs().iter().map(|&x| if x == 0.0 { 1.0 } else { 0.0 }).collect();
                    if outside.iter().any(|&x| x > 0.0) {
                        DenseDist::from_weights(outside).unwrap()
                    } else {
                        DenseDist::from_weights(qw).unwrap()
                    }
                }
            };
            (p, q)
        })
}

fn truncation() -> impl Strategy<Value = Truncation> {
    (0.0f64..0.6, 1usize..9).prop_map(|(e, k)| Truncation::new(e, k).unwrap())
}

fn max_diff(a: &[f64], b: &[f64]) -> f64 {
    a.iter().zip(b).map(|(x, y)| (x - y).abs()).fold(0.0, f64::max)
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

    #[test]
    fn dense_position_law_is_p((p, q) in pair()) {
        let law = position_law(&p, &q);
        prop_assert!(max_diff(&law.output, p.probs()) <= TOLERANCE, "{:?} vs {:?}", law.output, p.probs());
        prop_assert!((law.beta - p.overlap(&q)).abs() <= TOLERANCE);
    }

    #[test]
    fn sparse_position_law_is_p((p, q) in pair(), t in truncation()) {
        let sparse = q.truncate(t);
        let dense_q = sparse.to_dense();
        let law = position_law(&p, &dense_q);
        let rejection = sparse_rejection_law(&p, &sparse);
        let output: Vec<f64> = law.accepted_mass.iter().zip(&rejection).map(|(a, r)| a + law.rejection * r).collect();
        prop_assert!(max_diff(&output, p.probs()) <= TOLERANCE, "{:?} vs {:?}", output, p.probs());
    }

    #[test]
    fn truncation_is_a_valid_proposal((_p, q) in pair(), t in truncation()) {
        let sparse = q.truncate(t);
        prop_assert!(!sparse.is_empty() && sparse.len() <= t.max_entries);
        prop_assert!((sparse.probs().iter().sum::<f64>() - 1.0).abs() <= TOLERANCE);
        let kept: f64 = sparse.tokens().iter().map(|&x| q.prob(x)).sum();
        prop_assert!(kept >= 1.0 - t.epsilon - TOLERANCE || sparse.len() == t.max_entries);
    }

    #[test]
    fn sequence_law_of_rounds_is_the_target_law(
        seed in any::<u64>(), v in 2usize..4, gamma in 0usize..4, length in 1usize..4, t in truncation()
    ) {
        let model = HashedModel { seed, vocab_size: v };
        let target = target_sequence_law(&model, &[1], length);
        let dense = speculative_sequence_law(&model, &[1], gamma, length, WireFormat::Dense);
        let sparse = speculative_sequence_law(&model, &[1], gamma, length, WireFormat::Sparse(t));
        prop_assert!(max_law_difference(&dense, &target) <= TOLERANCE, "dense: {}", max_law_difference(&dense, &target));
        prop_assert!(max_law_difference(&sparse, &target) <= TOLERANCE, "sparse: {}", max_law_difference(&sparse, &target));
        prop_assert!(max_law_difference(&sparse, &dense) <= TOLERANCE);
    }
}
