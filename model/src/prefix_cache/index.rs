//! Which cached sequence shares the longest prefix with a prompt, and which was used least
//! recently: the prefix cache's bookkeeping, with no model in it.
//!
//! Each entry's tokens are cut into blocks of [`BLOCK`]; every whole block is indexed by a
//! hash of the salt and all the tokens up to its end (a chain, as vLLM keys its blocks), so a
//! lookup walks the prompt's blocks once and stops at the first one no entry shares: its cost
//! is the prompt's length, not what the cache holds. The match is then extended token by token
//! past the last shared block, and the chosen entry's tokens are compared with the prompt's,
//! so a hash collision can never serve another sequence's rows.

use std::collections::{BTreeMap, HashMap};
use std::hash::{DefaultHasher, Hash, Hasher};

use crate::language_model::SessionId;

/// Tokens per indexed block. A hit shares at least one whole block.
pub const BLOCK: usize = 16;

/// An entry's handle in the index.
pub(crate) type EntryId = u64;

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
    blocks: HashMap<u64, Vec<EntryId>>,
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
        let (mut shared, mut depth): (Option<&Vec<EntryId>>, usize) = (None, 0);
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
        for &id in shared? {
            let entry = &self.entries[&id];
            if entry.salt != salt {
                continue;
            }
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
        for (depth, block) in tokens.chunks_exact(BLOCK).enumerate() {
            hash = chain(hash, block);
            hashes.push(hash);
            // An entry that is a prefix of these tokens holds every block up to its last whole
            // one: it is checked there, once, and not at each block it shares (a system prompt
            // shared by every entry would make that a comparison per entry and block).
            for &id in self.blocks.get(&hash).into_iter().flatten() {
                let other = &self.entries[&id];
                if other.tokens.len() / BLOCK == depth + 1
                    && other.salt == salt
                    && other.tokens.len() <= tokens.len()
                    && tokens.starts_with(&other.tokens)
                {
                    covered.push(id);
                }
            }
        }
        let released = covered.into_iter().filter_map(|id| self.remove(id)).collect();
        let id = self.next_id;
        self.next_id += 1;
        for hash in hashes {
            self.blocks.entry(hash).or_default().push(id);
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
            if let Some(ids) = self.blocks.get_mut(&hash) {
                ids.retain(|&other| other != id);
                if ids.is_empty() {
                    self.blocks.remove(&hash);
                }
            }
        }
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
    }

    #[test]
    fn a_hash_collision_never_serves_another_sequence() {
        let mut index = PrefixIndex::default();
        index.insert("", seq(0, 32), 1, 5);
        // Forge the index as if another sequence's first block hashed like this one's.
        let forged = chain(salt_hash(""), &seq(500, BLOCK));
        let id = *index.entries.keys().next().unwrap();
        index.blocks.insert(forged, vec![id]);
        assert_eq!(index.lookup("", &seq(500, 40), 39), None);
    }
}
