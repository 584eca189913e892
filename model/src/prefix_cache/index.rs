//! Which cached sequence shares the longest prefix with a prompt, and which was used least
//! recently: the prefix cache's bookkeeping, with no model in it.
//!
//! Each entry's tokens are cut into blocks of [`BLOCK`]; every whole block is indexed by a
//! hash of the salt and all the tokens up to its end (a chain, as vLLM keys its blocks), so a
//! lookup walks the prompt's blocks once and stops at the first one no entry shares: its cost
//! is the prompt's length, not what the cache holds. The match is then extended token by token
//! past the last shared block over at most [`CANDIDATES`] of the entries holding it, and the
//! chosen entry's tokens are compared with the prompt's, so a hash collision can never serve
//! another sequence's rows. An insert finds an entry with its very tokens by their hash, and
//! the entries it extends among the newest ending with each of its blocks; a removal takes
//! one id out of each of its blocks' sets; so no operation visits every entry that shares a
//! system prompt.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::hash::{DefaultHasher, Hash, Hasher};

use crate::language_model::SessionId;

/// Tokens per indexed block. A hit shares at least one whole block.
pub const BLOCK: usize = 16;

/// An entry's handle in the index; a later entry has a larger one.
pub(crate) type EntryId = u64;

/// How many of the entries holding a prompt's deepest shared block a lookup compares past it,
/// the newest first. Past that block any entry shares fewer than [`BLOCK`] more tokens, so a
/// bound costs at most that much reuse, where comparing every entry would cost a lookup time
/// in proportion to the conversations sharing a system prompt.
pub(crate) const CANDIDATES: usize = 32;

/// A sequence the cache holds: the session whose first `tokens.len()` rows are its KV.
#[derive(Debug)]
pub(crate) struct Entry {
    pub(crate) salt: String,
    pub(crate) tokens: Vec<u32>,
    pub(crate) session: SessionId,
    /// KV bytes the session holds.
    pub(crate) bytes: u64,
    /// The index's clock when it was stored or last matched.
    last_used: u64,
}

/// The longest cached prefix of a prompt.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct PrefixMatch {
    pub(crate) entry: EntryId,
    pub(crate) session: SessionId,
    /// Tokens the prompt and the entry share from the start.
    pub(crate) len: usize,
    /// The entry holds no token past the match: the prompt continues it.
    pub(crate) whole_entry: bool,
}

#[derive(Debug, Default)]
pub(crate) struct PrefixIndex {
    entries: HashMap<EntryId, Entry>,
    /// Chain hash of a block → the entries that hold that block at that place.
    blocks: HashMap<u64, BTreeSet<EntryId>>,
    /// Chain hash of an entry's last whole block → the entries it ends: where an insert finds
    /// the entries its tokens extend.
    last_blocks: HashMap<u64, BTreeSet<EntryId>>,
    /// Hash of an entry's whole sequence (its last whole block's chain hash and the tokens
    /// after it) → the entries with it: an insert finds a copy of its own tokens at once.
    sequences: HashMap<u64, BTreeSet<EntryId>>,
    /// Last use → entry, oldest first.
    by_age: BTreeMap<u64, EntryId>,
    clock: u64,
    next_id: EntryId,
    tokens: usize,
    bytes: u64,
}

impl PrefixIndex {
    pub(crate) fn len(&self) -> usize {
        self.entries.len()
    }

    /// Tokens held by all entries.
    pub(crate) fn tokens(&self) -> usize {
        self.tokens
    }

    /// KV bytes held by all entries.
    pub(crate) fn bytes(&self) -> u64 {
        self.bytes
    }

    /// The entry sharing the most tokens with `prompt` (at most `limit` of them, at least one
    /// whole block) under `salt`; it counts as used now.
    pub(crate) fn lookup(&mut self, salt: &str, prompt: &[u32], limit: usize) -> Option<PrefixMatch> {
        let prompt = &prompt[..limit.min(prompt.len())];
        let mut hash = salt_hash(salt);
        let (mut shared, mut depth): (Option<&BTreeSet<EntryId>>, usize) = (None, 0);
        for block in prompt.chunks_exact(BLOCK) {
            hash = chain(hash, block);
            match self.blocks.get(&hash) {
                Some(ids) => (shared, depth) = (Some(ids), depth + 1),
                None => break,
            }
        }
        // The shared blocks' hashes vouch for the first `start` tokens of every candidate:
        // only what follows is compared, then the chosen one's tokens all.
        let start = depth * BLOCK;
        let mut best: Option<(EntryId, usize, u64)> = None;
        let candidates = shared?.iter().rev().map(|id| (*id, &self.entries[id])).filter(|(_, e)| e.salt == salt);
        for (id, entry) in candidates.take(CANDIDATES) {
            let len = start + common_prefix(&entry.tokens[start.min(entry.tokens.len())..], &prompt[start..]);
            if best.is_none_or(|(_, best_len, used)| len > best_len || (len == best_len && entry.last_used > used)) {
                best = Some((id, len, entry.last_used));
            }
        }
        let (id, _, _) = best?;
        let entry = &self.entries[&id];
        let len = common_prefix(&entry.tokens, prompt);
        if len < BLOCK {
            return None;
        }
        let found = PrefixMatch { entry: id, session: entry.session, len, whole_entry: len == entry.tokens.len() };
        self.touch(id);
        Some(found)
    }

    /// Stores `tokens` (whose KV rows `session` holds, in `bytes`) under `salt`, and returns
    /// the entries it makes useless, for the caller to release: one with the same tokens, or
    /// a prefix of them, serves nothing this one does not.
    pub(crate) fn insert(&mut self, salt: &str, tokens: Vec<u32>, session: SessionId, bytes: u64) -> Vec<Entry> {
        let mut covered = Vec::new();
        let mut hash = salt_hash(salt);
        let mut hashes = Vec::with_capacity(tokens.len() / BLOCK);
        for block in tokens.chunks_exact(BLOCK) {
            hash = chain(hash, block);
            hashes.push(hash);
            // An entry that is a prefix of these tokens ends its whole blocks with one of
            // these: only the newest entries ending there are compared, not every entry
            // sharing it. One missed is only memory held until it is evicted.
            for &id in self.last_blocks.get(&hash).into_iter().flat_map(|ids| ids.iter().rev().take(CANDIDATES)) {
                let other = &self.entries[&id];
                if other.salt == salt && other.tokens.len() <= tokens.len() && tokens.starts_with(&other.tokens) {
                    covered.push(id);
                }
            }
        }
        // The same tokens stored before, however many entries end with the same block.
        let whole = sequence_hash(hash, &tokens);
        for &id in self.sequences.get(&whole).into_iter().flatten() {
            let other = &self.entries[&id];
            if other.salt == salt && other.tokens == tokens && !covered.contains(&id) {
                covered.push(id);
            }
        }
        let released = covered.into_iter().filter_map(|id| self.remove(id)).collect();
        let id = self.next_id;
        self.next_id += 1;
        if let Some(&last) = hashes.last() {
            self.last_blocks.entry(last).or_default().insert(id);
        }
        self.sequences.entry(whole).or_default().insert(id);
        for hash in hashes {
            self.blocks.entry(hash).or_default().insert(id);
        }
        self.tokens += tokens.len();
        self.bytes += bytes;
        self.clock += 1;
        self.by_age.insert(self.clock, id);
        self.entries.insert(id, Entry { salt: salt.to_owned(), tokens, session, bytes, last_used: self.clock });
        released
    }

    /// Takes the entry out of the index (a session adopts it, or it is evicted).
    pub(crate) fn remove(&mut self, id: EntryId) -> Option<Entry> {
        let entry = self.entries.remove(&id)?;
        self.by_age.remove(&entry.last_used);
        let mut hash = salt_hash(&entry.salt);
        for block in entry.tokens.chunks_exact(BLOCK) {
            hash = chain(hash, block);
            forget(&mut self.blocks, hash, id);
        }
        if entry.tokens.len() >= BLOCK {
            forget(&mut self.last_blocks, hash, id);
        }
        forget(&mut self.sequences, sequence_hash(hash, &entry.tokens), id);
        self.tokens -= entry.tokens.len();
        self.bytes -= entry.bytes;
        Some(entry)
    }

    /// The least recently used entry, other than `keep`.
    pub(crate) fn oldest_except(&self, keep: Option<EntryId>) -> Option<EntryId> {
        self.by_age.values().copied().find(|&id| Some(id) != keep)
    }

    fn touch(&mut self, id: EntryId) {
        if let Some(entry) = self.entries.get_mut(&id) {
            self.by_age.remove(&entry.last_used);
            self.clock += 1;
            entry.last_used = self.clock;
            self.by_age.insert(self.clock, id);
        }
    }
}

/// Takes `id` out of `hash`'s set, and the set out of `map` once empty.
fn forget(map: &mut HashMap<u64, BTreeSet<EntryId>>, hash: u64, id: EntryId) {
    if let Some(ids) = map.get_mut(&hash) {
        ids.remove(&id);
        if ids.is_empty() {
            map.remove(&hash);
        }
    }
}

fn salt_hash(salt: &str) -> u64 {
    let mut hasher = DefaultHasher::new();
    salt.hash(&mut hasher);
    hasher.finish()
}

fn chain(previous: u64, block: &[u32]) -> u64 {
    let mut hasher = DefaultHasher::new();
    previous.hash(&mut hasher);
    block.hash(&mut hasher);
    hasher.finish()
}

/// The hash of a whole sequence: `last_block`, the chain hash of its last whole block (the
/// salt's hash without one), and its tokens after that block.
fn sequence_hash(last_block: u64, tokens: &[u32]) -> u64 {
    chain(last_block, &tokens[tokens.len() / BLOCK * BLOCK..])
}

fn common_prefix(a: &[u32], b: &[u32]) -> usize {
    a.iter().zip(b).take_while(|(x, y)| x == y).count()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn seq(start: u32, len: usize) -> Vec<u32> {
        (start..start + len as u32).collect()
    }

    #[test]
    fn finds_the_longest_shared_prefix_under_the_same_salt_only() {
        let mut index = PrefixIndex::default();
        let system = seq(0, 40);
        let mut a = system.clone();
        a.extend(seq(1000, 20));
        let mut b = system.clone();
        b.extend(seq(2000, 30));
        assert!(index.insert("", a.clone(), 1, 10).is_empty());
        assert!(index.insert("", b.clone(), 2, 10).is_empty());
        assert!(index.insert("tenant", a.clone(), 3, 10).is_empty());
        assert_eq!((index.len(), index.tokens(), index.bytes()), (3, 190, 30));

        // A prompt that continues b past its end: the whole of b.
        let mut prompt = b.clone();
        prompt.extend([7, 7, 7]);
        let hit = index.lookup("", &prompt, prompt.len() - 1).unwrap();
        assert_eq!((hit.session, hit.len, hit.whole_entry), (2, b.len(), true));
        // A third conversation on the system prompt: part of an entry, mid-block.
        let mut other = system;
        other.extend(seq(3000, 10));
        let hit = index.lookup("", &other, other.len() - 1).unwrap();
        assert_eq!((hit.len, hit.whole_entry), (40, false));
        // Another tenant sees only its own entry; an unknown one sees nothing.
        assert_eq!(index.lookup("tenant", &prompt, prompt.len() - 1).unwrap().session, 3);
        assert_eq!(index.lookup("other", &prompt, prompt.len() - 1), None);
        // The limit bounds the match (a prompt's last token is never served), and less than
        // one whole block is no match.
        assert_eq!(index.lookup("", &prompt, 20).unwrap().len, 20);
        assert_eq!(index.lookup("", &prompt, 15), None);
        assert_eq!(index.lookup("", &seq(500, 40), 39), None);
    }

    #[test]
    fn an_entry_that_extends_another_replaces_it_and_eviction_goes_oldest_first() {
        let mut index = PrefixIndex::default();
        index.insert("", seq(0, 32), 1, 5);
        index.insert("", seq(100, 32), 2, 5);
        let covered = index.insert("", seq(0, 50), 3, 7);
        assert_eq!(covered.iter().map(|e| e.session).collect::<Vec<_>>(), vec![1]);
        assert_eq!((index.len(), index.tokens(), index.bytes()), (2, 82, 12));
        // Entry 2 (session 2) is now the oldest; a lookup makes it the newest.
        let oldest = index.oldest_except(None).unwrap();
        assert_eq!(index.entries[&oldest].session, 2);
        index.lookup("", &seq(100, 33), 32).unwrap();
        let oldest = index.oldest_except(None).unwrap();
        assert_eq!(index.entries[&oldest].session, 3);
        assert_eq!(index.oldest_except(Some(oldest)).map(|id| index.entries[&id].session), Some(2));
        let evicted = index.remove(oldest).unwrap();
        assert_eq!(evicted.session, 3);
        assert_eq!(index.lookup("", &seq(0, 50), 49), None);
        assert_eq!((index.len(), index.tokens(), index.bytes(), index.blocks.len()), (1, 32, 5, 2));
        assert_eq!(index.last_blocks.len(), 1);
    }

    #[test]
    fn thousands_of_conversations_on_one_system_prompt() {
        // 5 000 entries: a system prompt of three whole blocks, then 5 tokens of each one's
        // own, so that every entry holds the same whole blocks and differs past them only.
        let mut index = PrefixIndex::default();
        let system = seq(0, 48);
        let own = |i: u32| -> Vec<u32> { [system.clone(), seq(10_000 + 5 * i, 5)].concat() };
        for i in 0..5_000 {
            index.insert("", own(i), u64::from(i), 1);
        }
        assert_eq!(index.len(), 5_000);
        // A new conversation finds the system prompt; a later turn of a recent one its whole
        // entry. A later turn of an old one, past the newest CANDIDATES, finds the system
        // prompt: the bound costs it its 5 tokens of its own.
        let new = [system.clone(), seq(900_000, 5)].concat();
        assert_eq!(index.lookup("", &new, new.len() - 1).map(|m| m.len), Some(48));
        let recent = [own(4_990), vec![7]].concat();
        let hit = index.lookup("", &recent, recent.len() - 1).unwrap();
        assert_eq!((hit.session, hit.len, hit.whole_entry), (4_990, 53, true));
        let old = [own(3), vec![7]].concat();
        assert_eq!(index.lookup("", &old, old.len() - 1).map(|m| m.len), Some(48));
        // The same tokens as an old entry replace it, past the newest CANDIDATES.
        let covered = index.insert("", own(3), 3_333, 1);
        assert_eq!(covered.iter().map(|e| e.session).collect::<Vec<_>>(), vec![3]);
        // A turn that extends a recent entry replaces it; every other entry stays.
        let covered = index.insert("", [own(4_980), seq(800_000, 20)].concat(), 9_999, 1);
        assert_eq!(covered.iter().map(|e| e.session).collect::<Vec<_>>(), vec![4_980]);
        assert_eq!(index.len(), 5_000);
        // Removing every entry leaves no block behind.
        let ids: Vec<EntryId> = index.entries.keys().copied().collect();
        for id in ids {
            index.remove(id);
        }
        assert!(index.blocks.is_empty() && index.last_blocks.is_empty() && index.by_age.is_empty());
        assert!(index.sequences.is_empty());
    }

    #[test]
    fn a_hash_collision_never_serves_another_sequence() {
        let mut index = PrefixIndex::default();
        index.insert("", seq(0, 32), 1, 5);
        // Forge the index as if another sequence's first block hashed like this one's.
        let forged = chain(salt_hash(""), &seq(500, BLOCK));
        let id = *index.entries.keys().next().unwrap();
        index.blocks.insert(forged, BTreeSet::from([id]));
        assert_eq!(index.lookup("", &seq(500, 40), 39), None);
    }
}
