//! A prefix cache in front of a model: what ended sessions computed for their committed
//! tokens, kept for later sessions whose prompts begin the same way (a conversation's next
//! turn, an agent resending its system prompt and tool history).
//!
//! - A session that ends with its committed tokens known ([`LanguageModel::retire`]) leaves
//!   them in the cache: its rows are copied into a session of just their size (the ended one
//!   reserved what its request could reach), which the cache keeps. Only rows of committed
//!   tokens are kept: the node trims the session to them first.
//! - A session that opens ([`LanguageModel::open_with_prefix`]) starts from the entry that
//!   shares the most of its tokens ([`index`]). It takes the entry's session over when its
//!   tokens continue the entry's whole sequence (the entry would serve nothing it does not),
//!   and copies the shared rows when the entry holds more (two conversations on one system
//!   prompt).
//! - Entries count in the model's KV budget like sessions, and give way to live ones: any
//!   open, growth or pass refused for memory evicts the least recently used entry and is
//!   tried again, until it fits or the cache is empty. A live request never fails because of
//!   what the cache holds. An ending session's copy makes room the same way: it is the most
//!   recently used.
//!
//! The cache wraps one loaded model, so its entries never cross models or dtypes; a draft's
//! vocabulary limit bounds only its draws, not its KV, so entries are shared across limits.

mod index;

use crate::error::{ModelError, Result};
use crate::language_model::{
    ForwardItem, LanguageModel, Logits, ModelInfo, OpenedSession, PrefixCacheStats, PrefixRequest, SessionId,
};
use crate::token_tree::TokenTree;

use index::{EntryId, PrefixIndex};

pub use index::BLOCK as PREFIX_BLOCK;

/// Whether and what a node caches (`--prefix-cache`, `--prefix-cache-min-tokens`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PrefixCacheOptions {
    pub enabled: bool,
    /// Prefixes shorter than this are not kept, nor served.
    pub min_tokens: usize,
}

impl Default for PrefixCacheOptions {
    fn default() -> Self {
        Self { enabled: true, min_tokens: 2 * PREFIX_BLOCK }
    }
}

/// `inner` with a prefix cache (module docs).
#[derive(Debug)]
pub struct PrefixCache<M> {
    inner: M,
    index: PrefixIndex,
    min_tokens: usize,
    stats: PrefixCacheStats,
}

impl<M: LanguageModel> PrefixCache<M> {
    /// A cache keeping prefixes of at least `min_tokens` tokens (and never less than one
    /// whole block of the index).
    pub fn new(inner: M, min_tokens: usize) -> Self {
        Self { inner, index: PrefixIndex::default(), min_tokens: min_tokens.max(1), stats: PrefixCacheStats::default() }
    }

    /// Drops the least recently used entry but `keep`; `false` when there is none.
    fn evict_one(&mut self, keep: Option<EntryId>) -> bool {
        let Some(entry) = self.index.oldest_except(keep).and_then(|id| self.index.remove(id)) else {
            return false;
        };
        self.stats.evictions += 1;
        if let Err(err) = self.inner.release(entry.session) {
            tracing::warn!(%err, session = entry.session, "releasing an evicted prefix-cache entry failed");
        }
        true
    }

    /// Runs `f` again after each eviction while it fails for want of memory and an entry
    /// (other than `keep`) is left to evict. Memory refused before a pass (the budget)
    /// changes nothing; a pass that ran out of memory left its session's length as it was,
    /// and its rows past it are written again.
    fn with_room<R>(&mut self, keep: Option<EntryId>, mut f: impl FnMut(&mut M) -> Result<R>) -> Result<R> {
        loop {
            match f(&mut self.inner) {
                Err(err) if wants_memory(&err) && self.evict_one(keep) => continue,
                result => return result,
            }
        }
    }

    fn capacity(&self, requested: Option<usize>) -> usize {
        requested.unwrap_or(self.inner.info().context_length)
    }
}

fn wants_memory(err: &ModelError) -> bool {
    matches!(err, ModelError::MemoryBudget { .. } | ModelError::OutOfMemory(_))
}

impl<M: LanguageModel> LanguageModel for PrefixCache<M> {
    fn info(&self) -> &ModelInfo {
        self.inner.info()
    }

    fn open_session(&mut self, capacity: Option<usize>) -> Result<SessionId> {
        self.with_room(None, |m| m.open_session(capacity))
    }

    fn session_len(&self, session: SessionId) -> Result<usize> {
        self.inner.session_len(session)
    }

    fn fork_session(&mut self, source: SessionId, len: usize, capacity: Option<usize>) -> Result<SessionId> {
        self.with_room(None, |m| m.fork_session(source, len, capacity))
    }

    fn reserve(&mut self, session: SessionId, capacity: usize) -> Result<()> {
        self.with_room(None, |m| m.reserve(session, capacity))
    }

    fn open_with_prefix(&mut self, request: &PrefixRequest<'_>) -> Result<OpenedSession> {
        self.stats.lookups += 1;
        // The last token is always fed, so that its row scores the next one.
        let limit = request.tokens.len().saturating_sub(1);
        let found = if limit >= self.min_tokens {
            self.index.lookup(request.salt, request.tokens, limit).filter(|hit| hit.len >= self.min_tokens)
        } else {
            None
        };
        let Some(hit) = found else {
            let session = self.open_session(request.capacity)?;
            return Ok(OpenedSession { session, reused: 0 });
        };
        let session = if hit.whole_entry {
            // Taken over: the entry leaves the cache (the session stores a longer one when it
            // ends), and reserves what its request can reach.
            let entry = self.index.remove(hit.entry).expect("a matched entry is in the index");
            let capacity = self.capacity(request.capacity);
            if let Err(err) = self.with_room(None, |m| m.reserve(entry.session, capacity)) {
                let _ = self.inner.release(entry.session);
                return Err(err);
            }
            entry.session
        } else {
            self.with_room(Some(hit.entry), |m| m.fork_session(hit.session, hit.len, request.capacity))?
        };
        self.stats.hits += 1;
        self.stats.hit_tokens += hit.len as u64;
        Ok(OpenedSession { session, reused: hit.len })
    }

    fn retire(&mut self, session: SessionId, salt: &str, committed: &[u32]) -> Result<()> {
        let len = committed.len();
        if len < self.min_tokens || self.inner.session_len(session)? < len {
            return self.inner.release(session);
        }
        // Kept at its size, not at what its request reserved. Room for the copy is made as
        // for a live session, from the least recently used entries: this one is the most
        // recent.
        let copy = self.with_room(None, |m| m.fork_session(session, len, Some(len + 1)));
        self.inner.release(session)?;
        let Ok(copy) = copy else { return Ok(()) };
        let bytes = self.inner.info().kv_bytes_per_token * (len as u64 + 1);
        for covered in self.index.insert(salt, committed.to_vec(), copy, bytes) {
            self.inner.release(covered.session)?;
        }
        Ok(())
    }

    fn prefix_cache_stats(&self) -> Option<PrefixCacheStats> {
        Some(PrefixCacheStats {
            entries: self.index.len(),
            tokens: self.index.tokens(),
            bytes: self.index.bytes(),
            ..self.stats
        })
    }

    fn forward(&mut self, session: SessionId, tokens: &[u32]) -> Result<Logits> {
        self.with_room(None, |m| m.forward(session, tokens))
    }

    fn forward_last(&mut self, session: SessionId, tokens: &[u32], rows: usize) -> Result<Logits> {
        self.with_room(None, |m| m.forward_last(session, tokens, rows))
    }

    /// Items refused for memory are run again alone once entries are evicted.
    fn forward_batch(&mut self, items: &[ForwardItem<'_>]) -> Vec<Result<Logits>> {
        let mut results = self.inner.forward_batch(items);
        for (item, result) in items.iter().zip(&mut results) {
            if matches!(result, Err(err) if wants_memory(err)) && self.index.len() > 0 {
                *result = self.forward_last(item.session, item.tokens, item.rows);
            }
        }
        results
    }

    fn forward_tree(&mut self, session: SessionId, tree: &TokenTree) -> Result<Logits> {
        self.with_room(None, |m| m.forward_tree(session, tree))
    }

    fn keep_tree_path(&mut self, session: SessionId, base: usize, tree: &TokenTree, path: &[usize]) -> Result<()> {
        self.with_room(None, |m| m.keep_tree_path(session, base, tree, path))
    }

    fn last_batch_size(&self) -> usize {
        self.inner.last_batch_size()
    }

    fn warm_up(&mut self, max_tokens: usize) -> Result<usize> {
        self.inner.warm_up(max_tokens)
    }

    fn set_memory_budget(&mut self, budget: Option<u64>) -> Result<()> {
        self.inner.set_memory_budget(budget)
    }

    fn truncate(&mut self, session: SessionId, len: usize) -> Result<()> {
        self.inner.truncate(session, len)
    }

    fn release(&mut self, session: SessionId) -> Result<()> {
        self.inner.release(session)
    }

    fn memory_in_use(&self) -> (u64, Option<u64>) {
        self.inner.memory_in_use()
    }

    /// Live sessions only: the batching worker waits for this many to gather.
    fn open_sessions(&self) -> usize {
        self.inner.open_sessions().saturating_sub(self.index.len())
    }

    fn encode(&self, text: &str) -> Result<Vec<u32>> {
        self.inner.encode(text)
    }

    fn decode(&self, ids: &[u32]) -> Result<String> {
        self.inner.decode(ids)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::table::TableModel;

    /// A table model whose logits depend on the history (4 bytes a token), with a budget of
    /// `sessions` sessions of 64 tokens.
    fn model(sessions: u64) -> PrefixCache<TableModel> {
        let json = serde_json::json!({
            "vocab_size": 4, "default": [0.4, 0.3, 0.2, 0.1],
            "rules": [{"suffix": [1, 2], "probs": [0.1, 0.1, 0.1, 0.7]}]
        });
        let mut table = TableModel::from_json("t", json, None).unwrap();
        table.set_memory_budget(Some(sessions * 64 * 4)).unwrap();
        PrefixCache::new(table, 32)
    }

    fn prompt(len: usize, salt: u32) -> Vec<u32> {
        (0..len as u32).map(|i| (i * 7 + salt) % 4).collect()
    }

    #[test]
    fn a_continued_conversation_takes_its_entry_over_and_a_shared_prefix_is_copied() {
        let mut m = model(8);
        let first = prompt(40, 0);
        let opened = m.open_with_prefix(&PrefixRequest { tokens: &first, salt: "", capacity: Some(64) }).unwrap();
        assert_eq!(opened.reused, 0);
        m.forward(opened.session, &first).unwrap();
        m.retire(opened.session, "", &first).unwrap();
        let stats = m.prefix_cache_stats().unwrap();
        assert_eq!((stats.entries, stats.tokens, stats.bytes), (1, 40, 164));

        // Another conversation sharing 36 tokens: copied, the entry stays.
        let mut other = first[..36].to_vec();
        other.extend([3, 3, 3, 3, 3, 3]);
        let opened = m.open_with_prefix(&PrefixRequest { tokens: &other, salt: "", capacity: Some(64) }).unwrap();
        assert_eq!(opened.reused, 36);
        assert_eq!(m.session_len(opened.session).unwrap(), 36);
        let fresh = {
            let mut plain = model(8);
            let s = plain.open_session(Some(64)).unwrap();
            plain.forward(s, &other).unwrap()
        };
        assert_eq!(m.forward(opened.session, &other[36..]).unwrap().as_slice(), fresh.last_rows(6).unwrap().as_slice());
        m.release(opened.session).unwrap();
        assert_eq!(m.prefix_cache_stats().unwrap().entries, 1);

        // The next turn of the first: it continues the whole entry, which it takes over.
        let mut next = first.clone();
        next.extend([1, 2]);
        let opened = m.open_with_prefix(&PrefixRequest { tokens: &next, salt: "", capacity: Some(64) }).unwrap();
        assert_eq!(opened.reused, 40);
        let stats = m.prefix_cache_stats().unwrap();
        assert_eq!((stats.entries, stats.lookups, stats.hits, stats.hit_tokens), (0, 3, 2, 76));
        // Another salt sees nothing.
        m.retire(opened.session, "", &next[..41]).unwrap();
        let opened = m.open_with_prefix(&PrefixRequest { tokens: &next, salt: "b", capacity: Some(64) }).unwrap();
        assert_eq!(opened.reused, 0);
    }

    #[test]
    fn entries_give_way_to_live_sessions() {
        // Room for two sessions of 64 tokens, and entries of 41 tokens.
        let mut m = model(2);
        for salt in 0..3 {
            let p = prompt(40, salt);
            let s = m.open_with_prefix(&PrefixRequest { tokens: &p, salt: "", capacity: Some(64) }).unwrap().session;
            m.forward(s, &p).unwrap();
            m.retire(s, "", &p).unwrap();
        }
        let stats = m.prefix_cache_stats().unwrap();
        assert!(stats.entries >= 1, "{stats:?}");
        let (a, b) = (m.open_session(Some(64)).unwrap(), m.open_session(Some(64)).unwrap());
        let stats = m.prefix_cache_stats().unwrap();
        assert_eq!(stats.entries, 0, "{stats:?}");
        assert!(stats.evictions >= 1);
        assert_eq!(m.open_sessions(), 2);
        // With nothing left to evict, the budget refuses as it would without a cache.
        assert!(matches!(m.open_session(Some(64)), Err(ModelError::MemoryBudget { .. })));
        m.release(a).unwrap();
        m.release(b).unwrap();
    }

    #[test]
    fn short_prefixes_are_neither_kept_nor_served() {
        let mut m = model(4);
        let p = prompt(31, 0);
        let s = m.open_with_prefix(&PrefixRequest { tokens: &p, salt: "", capacity: Some(64) }).unwrap().session;
        m.forward(s, &p).unwrap();
        m.retire(s, "", &p).unwrap();
        assert_eq!(m.prefix_cache_stats().unwrap().entries, 0);
        assert_eq!(m.memory_in_use().0, 0);
    }
}
