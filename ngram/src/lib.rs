//! specd-ngram: n-gram matching over token sequences, pure (no model, no network).
//!
//! Prompt lookup finds the longest n-gram (n from `max` down to `min`) ending the sequence
//! that also occurs earlier in it; a draft node proposes what followed it. A coordinator runs
//! the same match on a session's committed tokens: where a draft that proposes only after a
//! match (`--proposer ngram`) has none, the round runs target-only without asking it.
//!
//! One backward pass over the sequence: at each earlier position, the length of the common
//! suffix with the sequence's end (capped at `max`); the longest wins, the most recent on
//! ties (recent text predicts the next tokens best). The cost is O(length), a few µs at
//! 4 096 tokens (`cargo bench -p specd-draft-node --bench ngram`).

/// The n-gram lengths tried: a match shorter than `min` proposes nothing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MatchSpan {
    pub min: usize,
    pub max: usize,
}

impl Default for MatchSpan {
    fn default() -> Self {
        Self { min: 2, max: 4 }
    }
}

/// The longest match a proposer tries. A suffix index keeps up to this many contexts per
/// token, each up to this long, so its memory grows with the square of it.
pub const MAX_SPAN: usize = 32;

impl MatchSpan {
    pub fn new(min: usize, max: usize) -> Result<Self, String> {
        if min == 0 || min > max {
            return Err(format!("n-gram lengths {min}..={max}: need 1 <= min <= max"));
        }
        if max > MAX_SPAN {
            return Err(format!("n-gram length {max} is above the most a proposer tries, {MAX_SPAN}"));
        }
        Ok(Self { min, max })
    }
}

/// An earlier occurrence of the sequence's last `n` tokens; `next` is the index of the token
/// that followed it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NgramMatch {
    pub n: usize,
    pub next: usize,
}

/// The longest match of at least `span.min` tokens (the most recent among the longest).
pub fn longest_match(tokens: &[u32], span: MatchSpan) -> Option<NgramMatch> {
    let len = tokens.len();
    if len < 2 {
        return None;
    }
    let (tail, last) = (&tokens[..len], tokens[len - 1]);
    let mut best: Option<NgramMatch> = None;
    // `end`: the last token of an earlier window; the window must be followed by a token.
    for end in (0..len - 1).rev() {
        if tokens[end] != last {
            continue;
        }
        let limit = span.max.min(end + 1);
        let mut n = 1;
        while n < limit && tokens[end - n] == tail[len - 1 - n] {
            n += 1;
        }
        if best.is_none_or(|b| n > b.n) {
            best = Some(NgramMatch { n, next: end + 1 });
            if n == span.max {
                break;
            }
        }
    }
    best.filter(|b| b.n >= span.min)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The longest match by brute force: every n from max down, every earlier window, the
    /// most recent first.
    fn brute_force(tokens: &[u32], span: MatchSpan) -> Option<NgramMatch> {
        let len = tokens.len();
        for n in (span.min..=span.max).rev() {
            if n >= len {
                continue;
            }
            let suffix = &tokens[len - n..];
            for start in (0..len - n).rev() {
                if &tokens[start..start + n] == suffix {
                    return Some(NgramMatch { n, next: start + n });
                }
            }
        }
        None
    }

    #[test]
    fn agrees_with_brute_force() {
        let span = MatchSpan::new(1, 4).unwrap();
        let mut state = 12345u64;
        for case in 0..2000 {
            let len = 1 + case % 40;
            let vocab = 2 + (case % 5) as u64;
            let tokens: Vec<u32> = (0..len)
                .map(|_| {
                    state = state.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
                    ((state >> 33) % vocab) as u32
                })
                .collect();
            for span in [span, MatchSpan::new(2, 3).unwrap(), MatchSpan::new(3, 3).unwrap()] {
                assert_eq!(longest_match(&tokens, span), brute_force(&tokens, span), "{tokens:?} {span:?}");
            }
        }
    }

    #[test]
    fn spans_are_validated() {
        assert!(MatchSpan::new(0, 2).is_err() && MatchSpan::new(3, 2).is_err());
        assert!(MatchSpan::new(1, MAX_SPAN).is_ok() && MatchSpan::new(1, MAX_SPAN + 1).is_err());
        assert_eq!(longest_match(&[1, 2, 3, 4], MatchSpan::default()), None);
        assert_eq!(longest_match(&[9, 1, 5, 9, 1], MatchSpan::new(3, 4).unwrap()), None);
        assert_eq!(longest_match(&[9, 1, 5, 9, 1], MatchSpan::new(2, 4).unwrap()), Some(NgramMatch { n: 2, next: 2 }));
    }
}
