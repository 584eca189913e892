//! Dense and sparse next-token distributions, and the draft's truncation to a sparse q.

use std::cmp::Reverse;
use std::collections::BinaryHeap;

use crate::error::{Result, SamplingError};
use crate::kernels::{overlap_and_excess, sample_index};

/// How far from 1 a given list of probabilities may sum before it is refused.
pub const NORMALISATION_TOLERANCE: f64 = 1e-6;

/// Below this distance from 1 a sum is taken as rounding noise and not renormalised.
const ROUNDING_SLACK: f64 = 1e-12;

/// A distribution over the whole vocabulary, normalised on construction.
#[derive(Debug, Clone, PartialEq)]
pub struct DenseDist {
    probs: Vec<f64>,
}

impl DenseDist {
    /// Validates (finite, non-negative, sums to 1 within [`NORMALISATION_TOLERANCE`]) and
    /// renormalises so that later arithmetic starts from an exact-as-possible sum.
    pub fn new(probs: Vec<f64>) -> Result<Self> {
        let sum = checked_sum(&probs)?;
        if (sum - 1.0).abs() > NORMALISATION_TOLERANCE {
            return Err(SamplingError::NotNormalised { sum, tolerance: NORMALISATION_TOLERANCE });
        }
        Ok(Self::renormalised(probs, sum))
    }

    /// Builds from non-negative weights of any positive total (e.g. a residual).
    pub fn from_weights(weights: Vec<f64>) -> Result<Self> {
        let sum = checked_sum(&weights)?;
        if sum <= 0.0 {
            return Err(SamplingError::NotNormalised { sum, tolerance: NORMALISATION_TOLERANCE });
        }
        Ok(Self::renormalised(weights, sum))
    }

    /// [`DenseDist::from_weights`] for weights that are finite and non-negative by
    /// construction, with their sum taken by the caller: no validating pass over them.
    #[inline(always)]
    pub(crate) fn from_summed_weights(weights: Vec<f64>, sum: f64) -> Result<Self> {
        if weights.is_empty() {
            return Err(SamplingError::EmptyDistribution);
        }
        if !(sum > 0.0 && sum.is_finite()) {
            return Err(SamplingError::NotNormalised { sum, tolerance: NORMALISATION_TOLERANCE });
        }
        Ok(Self::renormalised(weights, sum))
    }

    /// The degenerate distribution on `token`: greedy decoding.
    pub fn one_hot(vocab_size: usize, token: u32) -> Result<Self> {
        check_token(token, vocab_size)?;
        let mut probs = vec![0.0; vocab_size];
        probs[token as usize] = 1.0;
        Ok(Self { probs })
    }

    #[inline(always)]
    fn renormalised(mut probs: Vec<f64>, sum: f64) -> Self {
        // Sums off by rounding alone are left as given, so that 0.6,0.3,0.1 stays those numbers.
        if (sum - 1.0).abs() > ROUNDING_SLACK {
            probs.iter_mut().for_each(|p| *p /= sum);
        }
        Self { probs }
    }

    pub fn vocab_size(&self) -> usize {
        self.probs.len()
    }

    pub fn probs(&self) -> &[f64] {
        &self.probs
    }

    /// p(token); 0 for tokens outside the vocabulary.
    pub fn prob(&self, token: u32) -> f64 {
        self.probs.get(token as usize).copied().unwrap_or(0.0)
    }

    /// Inverse-CDF sample with the uniform `u` in [0, 1).
    pub fn sample(&self, u: f64) -> u32 {
        let probs = &self.probs;
        sample_index(probs.len(), |i| probs[i], 1.0, u).expect("a validated distribution has positive mass") as u32
    }

    /// The smallest set of tokens holding at least `1 - truncation.epsilon` of the mass, at
    /// most `truncation.max_entries` of them, renormalised: the q the draft samples from.
    pub fn truncate(&self, truncation: Truncation) -> SparseDist {
        let order = most_probable(&self.probs, truncation.max_entries);
        let ranked: Vec<(u32, f64)> = order.into_iter().map(|t| (t, self.probs[t as usize])).collect();
        truncation.of_ranked(self.probs.len(), &ranked)
    }

    /// Expected acceptance Σ_x min(p(x), q(x)) of a draft q against this p.
    pub fn overlap(&self, q: &DenseDist) -> f64 {
        overlap_and_excess(&self.probs, &q.probs).0
    }
}

/// The draft's truncation of its q: keep 1-ε of the mass, at most K tokens.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Truncation {
    pub epsilon: f64,
    pub max_entries: usize,
}

impl Truncation {
    /// The truncated q of a distribution over `vocab_size` tokens given by its most probable
    /// tokens with positive mass, best first (more mass, then the lower id), at most
    /// `max_entries` of them: the smallest prefix holding at least `1 - epsilon`, renormalised.
    /// A node that computes the distribution elsewhere (on a GPU) sends only those tokens
    /// here, and so draws from the same q as [`DenseDist::truncate`] up to rounding.
    pub fn of_ranked(&self, vocab_size: usize, ranked: &[(u32, f64)]) -> SparseDist {
        let target_mass = 1.0 - self.epsilon;
        let mut kept = 0.0;
        let mut len = 0;
        for &(_, mass) in ranked.iter().take(self.max_entries) {
            kept += mass;
            len += 1;
            if kept >= target_mass {
                break;
            }
        }
        let (tokens, probs) = ranked[..len].iter().map(|&(t, mass)| (t, mass / kept)).unzip();
        SparseDist { vocab_size, tokens, probs }
    }

    pub fn new(epsilon: f64, max_entries: usize) -> Result<Self> {
        if !(0.0..1.0).contains(&epsilon) {
            return Err(SamplingError::InvalidParameter {
                name: "epsilon",
                value: epsilon,
                expected: "must be in [0, 1)",
            });
        }
        if max_entries == 0 {
            return Err(SamplingError::InvalidParameter {
                name: "max_entries",
                value: 0.0,
                expected: "must be at least 1",
            });
        }
        Ok(Self { epsilon, max_entries })
    }
}

/// A distribution given on a support S; zero outside it.
#[derive(Debug, Clone, PartialEq)]
pub struct SparseDist {
    vocab_size: usize,
    tokens: Vec<u32>,
    probs: Vec<f64>,
}

impl SparseDist {
    /// Validates (tokens in range and distinct, probabilities finite, positive, summing to 1
    /// within [`NORMALISATION_TOLERANCE`]) and renormalises.
    pub fn new(vocab_size: usize, tokens: Vec<u32>, probs: Vec<f64>) -> Result<Self> {
        if tokens.len() != probs.len() {
            return Err(SamplingError::ShapeMismatch(format!(
                "{} tokens but {} probabilities",
                tokens.len(),
                probs.len()
            )));
        }
        let sum = checked_sum(&probs)?;
        if let Some(index) = probs.iter().position(|&p| p == 0.0) {
            return Err(SamplingError::InvalidProbability { index, value: 0.0 });
        }
        if (sum - 1.0).abs() > NORMALISATION_TOLERANCE {
            return Err(SamplingError::NotNormalised { sum, tolerance: NORMALISATION_TOLERANCE });
        }
        let mut seen = tokens.clone();
        seen.sort_unstable();
        for pair in seen.windows(2) {
            if pair[0] == pair[1] {
                return Err(SamplingError::DuplicateToken { token: pair[0] });
            }
        }
        for &t in &tokens {
            check_token(t, vocab_size)?;
        }
        let probs =
            if (sum - 1.0).abs() > ROUNDING_SLACK { probs.into_iter().map(|p| p / sum).collect() } else { probs };
        Ok(Self { vocab_size, tokens, probs })
    }

    pub fn vocab_size(&self) -> usize {
        self.vocab_size
    }

    /// The support S, in the order the probabilities are given.
    pub fn tokens(&self) -> &[u32] {
        &self.tokens
    }

    pub fn probs(&self) -> &[f64] {
        &self.probs
    }

    pub fn len(&self) -> usize {
        self.tokens.len()
    }

    pub fn is_empty(&self) -> bool {
        self.tokens.is_empty()
    }

    /// q(token); 0 outside the support.
    pub fn prob(&self, token: u32) -> f64 {
        self.tokens.iter().position(|&t| t == token).map_or(0.0, |i| self.probs[i])
    }

    pub fn sample(&self, u: f64) -> u32 {
        sample_weights(self.tokens.iter().copied().zip(self.probs.iter().copied()), 1.0, u)
            .expect("a validated sparse distribution has positive mass")
    }

    pub fn to_dense(&self) -> DenseDist {
        let mut probs = vec![0.0; self.vocab_size];
        for (&t, &p) in self.tokens.iter().zip(&self.probs) {
            probs[t as usize] = p;
        }
        DenseDist { probs }
    }
}

/// Inverse-CDF draw from `(token, weight)` pairs of total `total` with `u` in [0, 1).
/// Rounding can leave `u * total` just past the running sum: the last token of positive
/// weight is returned then, never one of zero weight. `None` when every weight is zero.
pub(crate) fn sample_weights(weights: impl Iterator<Item = (u32, f64)>, total: f64, u: f64) -> Option<u32> {
    let threshold = u * total;
    let mut running = 0.0;
    let mut last_positive = None;
    for (token, w) in weights {
        if w <= 0.0 {
            continue;
        }
        running += w;
        last_positive = Some(token);
        if threshold < running {
            return last_positive;
        }
    }
    last_positive
}

/// The (at most) `k` tokens of positive mass with the most of it, most first, ties to the
/// lower id.
fn most_probable(probs: &[f64], k: usize) -> Vec<u32> {
    debug_assert!(k > 0, "a truncation keeps at least one token (Truncation::new refuses 0)");
    if k == 0 {
        return Vec::new();
    }
    // A token's rank: more mass first, then the lower id. Positive f64s order as their bits.
    let rank = |token: usize, mass: f64| (mass.to_bits(), Reverse(token as u32));
    // One pass keeping the best k so far, the worst of them on top of a min-heap. Once k are
    // kept, a token must carry more than that worst one's mass: the same mass loses on its
    // higher id. Most tokens of a large vocabulary are dismissed by that one comparison.
    let mut kept = BinaryHeap::with_capacity(k.min(probs.len()));
    let mut entry_mass = 0.0;
    for (token, &mass) in probs.iter().enumerate() {
        if mass <= entry_mass {
            continue;
        }
        if kept.len() < k {
            kept.push(Reverse(rank(token, mass)));
        } else if let Some(mut worst) = kept.peek_mut() {
            *worst = Reverse(rank(token, mass));
        }
        if kept.len() == k {
            entry_mass = kept.peek().map_or(0.0, |Reverse((bits, _))| f64::from_bits(*bits));
        }
    }
    // Ascending order of `Reverse(rank)` is best first.
    kept.into_sorted_vec().into_iter().map(|Reverse((_, Reverse(token)))| token).collect()
}

fn checked_sum(probs: &[f64]) -> Result<f64> {
    if probs.is_empty() {
        return Err(SamplingError::EmptyDistribution);
    }
    let mut sum = 0.0;
    for (index, &value) in probs.iter().enumerate() {
        if !value.is_finite() || value < 0.0 {
            return Err(SamplingError::InvalidProbability { index, value });
        }
        sum += value;
    }
    Ok(sum)
}

pub(crate) fn check_token(token: u32, vocab_size: usize) -> Result<()> {
    if (token as usize) < vocab_size { Ok(()) } else { Err(SamplingError::TokenOutOfRange { token, vocab_size }) }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn refuses_bad_lists_and_says_the_sum() {
        let err = DenseDist::new(vec![0.5, 0.4]).unwrap_err();
        assert_eq!(err, SamplingError::NotNormalised { sum: 0.9, tolerance: 1e-6 });
        assert!(err.to_string().contains("0.9"));
        assert!(matches!(
            DenseDist::new(vec![0.5, f64::NAN, 0.5]),
            Err(SamplingError::InvalidProbability { index: 1, .. })
        ));
        assert!(matches!(DenseDist::new(vec![1.5, -0.5]), Err(SamplingError::InvalidProbability { index: 1, .. })));
        assert_eq!(DenseDist::new(vec![]), Err(SamplingError::EmptyDistribution));
    }

    #[test]
    fn the_most_probable_tokens_are_those_a_full_sort_puts_first() {
        // Masses from a small set, so that ties (broken by the lower id) and zeros are common.
        let levels = [0.0, 0.0, 1.0, 2.0, 2.0, 3.0, 5.0, 8.0];
        let mut state = 0x9e37_79b9_7f4a_7c15_u64;
        for vocab in [1usize, 2, 7, 64, 300] {
            let masses: Vec<f64> = (0..vocab)
                .map(|_| {
                    state = state.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1_442_695_040_888_963_407);
                    levels[(state >> 61) as usize]
                })
                .collect();
            let mut sorted: Vec<u32> = (0..vocab as u32).filter(|&t| masses[t as usize] > 0.0).collect();
            sorted.sort_by(|a, b| masses[*b as usize].total_cmp(&masses[*a as usize]).then(a.cmp(b)));
            for k in [1, 2, 5, 63, 64, vocab, vocab + 3] {
                let expected: Vec<u32> = sorted.iter().copied().take(k).collect();
                assert_eq!(most_probable(&masses, k), expected, "vocab {vocab}, k {k}, masses {masses:?}");
            }
        }
    }

    #[test]
    fn truncation_keeps_the_smallest_heavy_set_and_caps_it() {
        let p = DenseDist::new(vec![0.05, 0.5, 0.3, 0.15, 0.0]).unwrap();
        let q = p.truncate(Truncation::new(0.1, 10).unwrap());
        assert_eq!(q.tokens(), &[1, 2, 3]);
        assert!((q.probs().iter().sum::<f64>() - 1.0).abs() < 1e-15);
        assert!((q.prob(1) - 0.5 / 0.95).abs() < 1e-15);
        let capped = p.truncate(Truncation::new(0.0, 2).unwrap());
        assert_eq!(capped.tokens(), &[1, 2]);
        let whole = p.truncate(Truncation::new(0.0, 10).unwrap());
        assert_eq!(whole.tokens(), &[1, 2, 3, 0], "zero-mass tokens are never kept");
    }

    #[test]
    fn truncation_breaks_ties_by_lowest_id() {
        let p = DenseDist::new(vec![0.25; 4]).unwrap();
        let q = p.truncate(Truncation::new(0.0, 2).unwrap());
        assert_eq!(q.tokens(), &[0, 1]);
    }

    #[test]
    fn sampling_never_returns_a_zero_mass_token() {
        let p = DenseDist::new(vec![0.0, 0.3, 0.0, 0.7, 0.0]).unwrap();
        assert_eq!(p.sample(0.0), 1);
        assert_eq!(p.sample(0.299_999), 1);
        assert_eq!(p.sample(0.3), 3);
        assert_eq!(p.sample(1.0 - f64::EPSILON), 3);
    }

    #[test]
    fn sparse_validation() {
        assert!(matches!(
            SparseDist::new(3, vec![0, 0], vec![0.5, 0.5]),
            Err(SamplingError::DuplicateToken { token: 0 })
        ));
        assert!(matches!(
            SparseDist::new(3, vec![0, 3], vec![0.5, 0.5]),
            Err(SamplingError::TokenOutOfRange { token: 3, vocab_size: 3 })
        ));
        assert!(matches!(
            SparseDist::new(3, vec![0, 1], vec![1.0, 0.0]),
            Err(SamplingError::InvalidProbability { index: 1, .. })
        ));
        let q = SparseDist::new(4, vec![3, 1], vec![0.25, 0.75]).unwrap();
        assert_eq!(q.to_dense().probs(), &[0.0, 0.75, 0.0, 0.25]);
        assert_eq!(q.prob(2), 0.0);
    }
}
