//! Log-probabilities for clients: a token's under the target's effective distribution, and
//! the most likely alternatives at a position.

use crate::dist::DenseDist;

/// The most OpenAI-style APIs allow per token.
pub const MAX_TOP_LOGPROBS: u32 = 20;

/// ln p, with `-inf` for a token of probability 0 (the client layer decides how to show it).
pub fn logprob(p: f64) -> f64 {
    p.ln()
}

/// The `n` most likely tokens of `p` with their log-probabilities, most likely first, ties by
/// id; tokens of probability 0 are left out. O(V) for any `n`.
pub fn top_logprobs(p: &DenseDist, n: usize) -> Vec<(u32, f64)> {
    if n == 0 {
        return Vec::new();
    }
    let mut likely: Vec<(u32, f64)> =
        p.probs().iter().enumerate().filter(|(_, q)| **q > 0.0).map(|(id, &q)| (id as u32, q)).collect();
    let order = |a: &(u32, f64), b: &(u32, f64)| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0));
    if likely.len() > n {
        likely.select_nth_unstable_by(n - 1, order);
        likely.truncate(n);
    }
    likely.sort_unstable_by(order);
    likely.into_iter().map(|(id, q)| (id, logprob(q))).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_most_likely_first_ties_by_id_zeros_left_out() {
        let p = DenseDist::new(vec![0.1, 0.4, 0.0, 0.1, 0.4]).unwrap();
        let ids = |n| top_logprobs(&p, n).into_iter().map(|(id, _)| id).collect::<Vec<_>>();
        assert_eq!(ids(2), vec![1, 4]);
        assert_eq!(ids(3), vec![1, 4, 0]);
        assert_eq!(ids(20), vec![1, 4, 0, 3], "a token of probability 0 is no alternative");
        assert!(ids(0).is_empty());
        let top = top_logprobs(&p, 1);
        assert!((top[0].1 - 0.4f64.ln()).abs() < 1e-15);
    }
}
