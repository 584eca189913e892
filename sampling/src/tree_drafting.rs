//! How a draft draws a node's children when it drafts a tree: one after another from the
//! node's q, with or without replacement, each keyed by the child's own node index, so that
//! the verification rule ([`crate::tree_rule`]) knows the distribution every child was drawn
//! from and the draws depend on nothing but the round's key.

use crate::dist::{DenseDist, SparseDist};
use crate::error::Result;
use crate::rng::{Purpose, RoundKey};
use crate::tree_rule::ChildDraws;

/// The distribution a node's children are drawn from, as the draft holds it.
#[derive(Debug, Clone, Copy)]
pub enum ChildSource<'a> {
    Dense(&'a DenseDist),
    /// A truncated q (the sparse wire): children come from its support.
    Sparse(&'a SparseDist),
}

/// Draws up to `width` children from `q`. Child `k` is node `first_child + k` of the tree and
/// uses the uniform of stream `(Draft, first_child + k)` under `key`. Without replacement,
/// each child is drawn from q without the tokens drawn before it, renormalised; fewer than
/// `width` come back when q has fewer tokens of positive mass.
pub fn draw_children(
    q: ChildSource<'_>,
    width: usize,
    draws: ChildDraws,
    key: RoundKey,
    first_child: usize,
) -> Result<Vec<u32>> {
    // The tokens in the order the draw walks them (a sparse q's own order), with what is
    // left of their mass.
    let (order, mut left): (Vec<u32>, Vec<f64>) = match q {
        ChildSource::Sparse(s) => (s.tokens().to_vec(), s.probs().to_vec()),
        ChildSource::Dense(d) => ((0..d.vocab_size() as u32).collect(), d.probs().to_vec()),
    };
    let mut children = Vec::with_capacity(width);
    for k in 0..width {
        if left.iter().sum::<f64>() <= 0.0 {
            break;
        }
        let u = key.stream(first_child + k, Purpose::Draft).uniform();
        let i = DenseDist::from_weights(left.clone())?.sample(u) as usize;
        children.push(order[i]);
        if draws == ChildDraws::WithoutReplacement {
            left[i] = 0.0;
        }
    }
    Ok(children)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(round: u32) -> RoundKey {
        RoundKey { seed: 11, round }
    }

    #[test]
    fn without_replacement_no_token_repeats_and_small_supports_run_out() {
        let q = DenseDist::from_weights(vec![0.5, 0.0, 0.3, 0.2]).unwrap();
        for round in 0..200 {
            let children =
                draw_children(ChildSource::Dense(&q), 5, ChildDraws::WithoutReplacement, key(round), 1).unwrap();
            assert_eq!(children.len(), 3, "three tokens have mass");
            let mut sorted = children.clone();
            sorted.sort_unstable();
            assert_eq!(sorted, [0, 2, 3]);
        }
    }

    #[test]
    fn the_first_child_follows_q_and_later_ones_the_renormalised_rest() {
        // Over many rounds, the first child is q-distributed and the second, given the first
        // was token 0, is q without 0 renormalised (0.3/0.5, 0.2/0.5). 20 000 rounds: each
        // frequency within 0.02 of its probability fails with probability below 1e-6.
        let q = SparseDist::new(10, vec![7, 9, 4], vec![0.5, 0.3, 0.2]).unwrap();
        let (mut first, mut second_after_7, mut after_7) = ([0usize; 3], [0usize; 3], 0usize);
        let index = |t: u32| [7, 9, 4].iter().position(|&x| x == t).unwrap();
        let rounds = 20_000;
        for round in 0..rounds {
            let c = draw_children(ChildSource::Sparse(&q), 2, ChildDraws::WithoutReplacement, key(round), 1).unwrap();
            first[index(c[0])] += 1;
            if c[0] == 7 {
                after_7 += 1;
                second_after_7[index(c[1])] += 1;
            }
        }
        for (count, p) in first.iter().zip([0.5, 0.3, 0.2]) {
            assert!((*count as f64 / rounds as f64 - p).abs() < 0.02, "{first:?}");
        }
        assert_eq!(second_after_7[0], 0, "no repeat");
        for (count, p) in second_after_7[1..].iter().zip([0.6, 0.4]) {
            assert!((*count as f64 / after_7 as f64 - p).abs() < 0.03, "{second_after_7:?} of {after_7}");
        }
    }

    #[test]
    fn with_replacement_children_may_repeat_and_draws_are_keyed_by_node() {
        let q = DenseDist::from_weights(vec![0.9, 0.1]).unwrap();
        let repeats = (0..100)
            .filter(|&r| {
                let c = draw_children(ChildSource::Dense(&q), 2, ChildDraws::WithReplacement, key(r), 1).unwrap();
                c[0] == c[1]
            })
            .count();
        assert!(repeats > 50, "{repeats}");
        // The same key and node indices give the same children; other node indices others.
        let a = draw_children(ChildSource::Dense(&q), 8, ChildDraws::WithReplacement, key(3), 1).unwrap();
        let b = draw_children(ChildSource::Dense(&q), 8, ChildDraws::WithReplacement, key(3), 1).unwrap();
        let c = draw_children(ChildSource::Dense(&q), 8, ChildDraws::WithReplacement, key(3), 9).unwrap();
        assert_eq!(a, b);
        assert_ne!(a, c);
    }
}
