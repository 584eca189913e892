//! Prompt lookup: the longest n-gram ending the sequence that also occurs earlier in it
//! (`specd-ngram`, which the coordinator runs too), and what followed that occurrence as the
//! proposal.

use specd_proto::v1::ProposalSource;

pub use specd_ngram::{MAX_SPAN, MatchSpan, NgramMatch, longest_match};

/// What a lookup proposes: the tokens and where they were copied from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Lookup {
    pub tokens: Vec<u32>,
    pub source: ProposalSource,
}

/// Up to `gamma` tokens copied from after the longest match in `tokens` (whose first
/// `prompt_len` are the prompt); `None` when no match reaches `span.min`. A copy that runs
/// into the sequence's end goes on through the tokens it copied, as a repeat would.
pub fn lookup(tokens: &[u32], prompt_len: usize, span: MatchSpan, gamma: usize) -> Option<Lookup> {
    let found = longest_match(tokens, span)?;
    let mut copied = Vec::with_capacity(gamma);
    for i in 0..gamma {
        let at = found.next + i;
        // `found.next < len`, so a position past the end is one already copied.
        let token = tokens.get(at).copied().unwrap_or_else(|| copied[at - tokens.len()]);
        copied.push(token);
    }
    let source = if found.next < prompt_len { ProposalSource::PromptMatch } else { ProposalSource::OutputMatch };
    Some(Lookup { tokens: copied, source })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn proposes_what_followed_the_longest_most_recent_match() {
        // "5 6 7" occurs in the prompt followed by 8 9; "6 7" also occurs later followed by 1.
        let tokens = [5, 6, 7, 8, 9, 6, 7, 1, 2, 5, 6, 7];
        let span = MatchSpan::new(2, 3).unwrap();
        let got = lookup(&tokens, 5, span, 3).unwrap();
        assert_eq!(got, Lookup { tokens: vec![8, 9, 6], source: ProposalSource::PromptMatch });
        // With only 2-grams allowed, the most recent "6 7" wins: it is in the output.
        let got = lookup(&tokens, 5, MatchSpan::new(2, 2).unwrap(), 2).unwrap();
        assert_eq!(got, Lookup { tokens: vec![1, 2], source: ProposalSource::OutputMatch });
    }

    #[test]
    fn a_copy_that_reaches_the_end_repeats() {
        let tokens = [3, 4, 3, 4];
        let got = lookup(&tokens, 1, MatchSpan::new(1, 2).unwrap(), 5).unwrap();
        assert_eq!(got.tokens, vec![3, 4, 3, 4, 3]);
    }

    #[test]
    fn nothing_below_the_minimum() {
        assert_eq!(lookup(&[1, 2, 3, 4], 4, MatchSpan::default(), 4), None);
        assert_eq!(lookup(&[7], 1, MatchSpan::new(1, 1).unwrap(), 4), None);
        assert!(MatchSpan::new(0, 2).is_err() && MatchSpan::new(3, 2).is_err());
        assert!(MatchSpan::new(1, MAX_SPAN).is_ok() && MatchSpan::new(1, MAX_SPAN + 1).is_err());
        // "9 1" recurs but the minimum is 3.
        assert_eq!(lookup(&[9, 1, 5, 9, 1], 2, MatchSpan::new(3, 4).unwrap(), 2), None);
    }
}
