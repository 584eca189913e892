//! Suffix drafting over recent requests (after SuffixDecoding, arXiv 2411.04975): for every
//! context of 1 to `depth` tokens in the sequences of recently finished sessions, how often
//! each token followed it. A session proposes, one token at a time, the most frequent
//! continuation of its longest context found there or in its own sequence so far.
//!
//! Memory is bounded: the index holds at most `budget` tokens of finished sessions (the
//! oldest are dropped first, their counts taken back out), and so at most `budget × depth`
//! contexts. A session in flight counts only its own sequence, which its node holds anyway.
//!
//! Exactness needs the candidates independent of the round's acceptance draws, which are
//! keyed by (seed, round, position). A finished session with the same seed had its tokens
//! chosen by those very draws, so a session whose seed is in the index proposes from its own
//! sequence only (a seed repeated by a client, or `specd bench`'s passes; a seed the
//! coordinator picks is random and repeats with probability ~2^-64).

use std::collections::{HashMap, VecDeque};

use specd_proto::v1::ProposalSource;

use crate::proposer::ngram::MatchSpan;

/// Continuation counts over recent sessions' sequences.
#[derive(Debug, Clone)]
pub struct SuffixIndex {
    depth: usize,
    budget: usize,
    /// Held sequences with the seed of the session that wrote each.
    sequences: VecDeque<(u64, Vec<u32>)>,
    /// How many held sequences each seed wrote.
    seeds: HashMap<u64, usize>,
    /// Wrong, for the test that shows the law check catches it: propose from sequences of
    /// the session's own seed too.
    same_seed_proposes: bool,
    held: usize,
    /// Context → (next token, times seen), for contexts of 1 to `depth` tokens.
    counts: HashMap<Box<[u32]>, Vec<(u32, u32)>>,
}

impl SuffixIndex {
    /// An empty index of contexts up to `depth` tokens over at most `budget` tokens.
    pub fn new(depth: usize, budget: usize) -> Self {
        Self {
            depth: depth.max(1),
            budget,
            sequences: VecDeque::new(),
            seeds: HashMap::new(),
            same_seed_proposes: false,
            held: 0,
            counts: HashMap::new(),
        }
    }

    /// Tokens of finished sessions held now (at most the budget).
    pub fn held_tokens(&self) -> usize {
        self.held
    }

    /// Distinct contexts held now (at most `held_tokens × depth`).
    pub fn contexts(&self) -> usize {
        self.counts.len()
    }

    /// The bound [`Self::approx_bytes`] stays under at the budget: every held token in
    /// `depth` contexts of its own.
    pub fn byte_bound(&self) -> usize {
        self.budget.saturating_mul(self.depth.saturating_mul(Self::context_bytes(self.depth)).saturating_add(4))
    }

    /// Bytes the index uses, roughly: the tokens, and per context its key, its counts and
    /// the hash table's slot.
    pub fn approx_bytes(&self) -> usize {
        let counts: usize = self.counts.iter().map(|(k, v)| k.len() * 4 + v.capacity() * 8).sum();
        self.held * 4 + counts + self.counts.len() * (16 + 24 + 8) + self.seeds.len() * 32
    }

    fn context_bytes(depth: usize) -> usize {
        // Key, table slot, and counts: a Vec of 8-byte entries holds at least 4 (32 bytes)
        // and at most twice its entries, and entries are at most contexts (≤ held × depth);
        // plus a share of the seeds' table (at most one seed per held token).
        depth.saturating_mul(4).saturating_add(48 + 32 + 16 + 32)
    }

    /// Adds the sequence (its last `budget` tokens) of a finished session with `seed`,
    /// dropping the oldest sequences until the budget holds.
    pub fn insert(&mut self, seed: u64, sequence: &[u32]) {
        let sequence = &sequence[sequence.len().saturating_sub(self.budget)..];
        if sequence.len() < 2 {
            return;
        }
        while self.held + sequence.len() > self.budget {
            let Some((old_seed, oldest)) = self.sequences.pop_front() else { break };
            self.held -= oldest.len();
            self.count(&oldest, false);
            if let Some(n) = self.seeds.get_mut(&old_seed) {
                *n -= 1;
                if *n == 0 {
                    self.seeds.remove(&old_seed);
                }
            }
        }
        self.count(sequence, true);
        self.held += sequence.len();
        *self.seeds.entry(seed).or_default() += 1;
        self.sequences.push_back((seed, sequence.to_vec()));
    }

    /// Lets sequences of a session's own seed propose: **wrong** (the law check of
    /// `tests/tests/proposers.rs` must catch it); for that test only.
    pub fn let_same_seed_propose(&mut self) {
        self.same_seed_proposes = true;
    }

    /// Whether a held sequence was written by a session with `seed`.
    pub fn holds_seed(&self, seed: u64) -> bool {
        self.seeds.contains_key(&seed)
    }

    fn count(&mut self, sequence: &[u32], add: bool) {
        for i in 1..sequence.len() {
            for n in 1..=self.depth.min(i) {
                let context = &sequence[i - n..i];
                let next = sequence[i];
                if add {
                    let entry = self.counts.entry(context.into()).or_default();
                    match entry.iter_mut().find(|(t, _)| *t == next) {
                        Some((_, c)) => *c += 1,
                        None => entry.push((next, 1)),
                    }
                } else if let Some(entry) = self.counts.get_mut(context) {
                    if let Some(at) = entry.iter().position(|(t, _)| *t == next) {
                        entry[at].1 -= 1;
                        if entry[at].1 == 0 {
                            entry.swap_remove(at);
                        }
                    }
                    if entry.is_empty() {
                        self.counts.remove(context);
                    }
                }
            }
        }
    }

    /// Up to `gamma` tokens after `sequence` of a session with `seed`: at each step the most
    /// frequent continuation (lowest token on ties) of the longest context of `span.min` to
    /// `span.max` tokens (at most the index's depth) seen in the index or earlier in the
    /// sequence, counting both; the index is left out when it holds a sequence of the same
    /// seed (see the module docs). Stops at the first step with no such context.
    pub fn propose(&self, seed: u64, sequence: &[u32], span: MatchSpan, gamma: usize) -> Vec<u32> {
        let max = span.max.min(self.depth);
        let use_index = self.same_seed_proposes || !self.holds_seed(seed);
        let mut extended = sequence.to_vec();
        let mut proposed = Vec::with_capacity(gamma);
        while proposed.len() < gamma {
            let Some(next) = self.next_token(&extended, span.min, max, use_index) else { break };
            extended.push(next);
            proposed.push(next);
        }
        proposed
    }

    fn next_token(&self, sequence: &[u32], min: usize, max: usize, use_index: bool) -> Option<u32> {
        let len = sequence.len();
        // How long a common suffix each earlier position shares with the sequence's end.
        let shared: Vec<(usize, u32)> = (0..len.saturating_sub(1))
            .filter_map(|end| {
                let limit = max.min(end + 1);
                let n = (0..limit).take_while(|&k| sequence[end - k] == sequence[len - 1 - k]).count();
                (n > 0).then(|| (n, sequence[end + 1]))
            })
            .collect();
        for n in (min..=max.min(len)).rev() {
            let mut counts: HashMap<u32, u32> = HashMap::new();
            let indexed = if use_index { self.counts.get(&sequence[len - n..]) } else { None };
            for (token, c) in indexed.into_iter().flatten() {
                *counts.entry(*token).or_default() += c;
            }
            for (_, token) in shared.iter().filter(|(m, _)| *m >= n) {
                *counts.entry(*token).or_default() += 1;
            }
            if let Some((token, _)) = counts.into_iter().max_by_key(|&(t, c)| (c, std::cmp::Reverse(t))) {
                return Some(token);
            }
        }
        None
    }
}

/// The source every suffix proposal is reported with.
pub const SOURCE: ProposalSource = ProposalSource::Suffix;

#[cfg(test)]
mod tests {
    use super::*;

    /// The seed of the finished sessions, and of the session proposing.
    const SEED: u64 = 7;
    const OTHER: u64 = 8;

    #[test]
    fn proposes_the_most_frequent_continuation_of_the_longest_context() {
        let mut index = SuffixIndex::new(3, 1000);
        index.insert(SEED, &[1, 2, 3, 4]);
        index.insert(SEED, &[1, 2, 3, 5]);
        index.insert(SEED, &[9, 2, 3, 5]);
        let span = MatchSpan::new(1, 3).unwrap();
        // "2 3" → 5 twice, 4 once; then "3 5" ends every sequence: nothing more.
        assert_eq!(index.propose(OTHER, &[7, 2, 3], span, 4), vec![5]);
        // "1 2 3" is the longer context: 4 and 5 once each, the lowest wins.
        assert_eq!(index.propose(OTHER, &[1, 2, 3], span, 1), vec![4]);
        // The session's own sequence counts too: "6 2 3" is followed by 6 earlier in it.
        assert_eq!(index.propose(OTHER, &[2, 3, 6, 2, 3, 6, 2, 3], span, 2), vec![6, 2]);
        assert!(index.propose(OTHER, &[42], span, 3).is_empty());
    }

    #[test]
    fn stays_within_its_budget_and_forgets_the_oldest() {
        let mut index = SuffixIndex::new(4, 100);
        for s in 0..50u32 {
            let sequence: Vec<u32> = (0..30).map(|i| (s * 31 + i * 7) % 97).collect();
            index.insert(SEED, &sequence);
            assert!(index.held_tokens() <= 100);
            assert!(index.contexts() <= index.held_tokens() * 4);
            assert!(index.approx_bytes() <= index.byte_bound());
        }
        // Emptying it by eviction leaves no counts behind.
        let mut small = SuffixIndex::new(2, 4);
        small.insert(SEED, &[1, 2, 3, 4]);
        small.insert(SEED, &[5, 6, 7, 8]);
        assert_eq!(small.contexts(), 3 + 2);
        assert_eq!(small.propose(OTHER, &[1, 2], MatchSpan::new(1, 2).unwrap(), 1), Vec::<u32>::new());
        // A sequence longer than the budget keeps its end.
        small.insert(SEED, &[1, 2, 3, 4, 5, 6]);
        assert_eq!(small.held_tokens(), 4);
        assert_eq!(small.propose(OTHER, &[4], MatchSpan::new(1, 2).unwrap(), 2), vec![5, 6]);
    }

    #[test]
    fn a_session_whose_seed_wrote_a_held_sequence_proposes_from_its_own_only() {
        let mut index = SuffixIndex::new(3, 8);
        index.insert(SEED, &[1, 2, 3, 4]);
        let span = MatchSpan::new(1, 3).unwrap();
        assert_eq!(index.propose(OTHER, &[2, 3], span, 1), vec![4]);
        assert!(index.propose(SEED, &[2, 3], span, 1).is_empty(), "copied what the same draws chose");
        // Its own sequence still counts.
        assert_eq!(index.propose(SEED, &[2, 3, 9, 2, 3], span, 1), vec![9]);
        // Once that sequence is evicted the seed is free again.
        index.insert(OTHER, &[5, 6, 7, 8, 9, 10]);
        assert!(!index.holds_seed(SEED));
        assert_eq!(index.propose(SEED, &[6, 7], span, 1), vec![8]);
    }

    #[test]
    fn the_byte_bound_saturates_instead_of_overflowing() {
        assert_eq!(SuffixIndex::new(usize::MAX / 2, usize::MAX).byte_bound(), usize::MAX);
    }
}
