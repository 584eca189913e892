//! A model made slower by a fixed time per forward pass, to stand in for a bigger draft or
//! target in benchmarks and tests (`specd draft --forward-delay-ms`) without needing one.

use std::time::Duration;

use crate::error::Result;
use crate::language_model::{
    ForwardItem, LanguageModel, Logits, ModelInfo, OpenedSession, PrefixCacheStats, PrefixRequest, SessionId,
};
use crate::token_tree::TokenTree;

/// `inner`, with every forward pass taking `delay` longer (the model thread sleeps, as if
/// computing).
#[derive(Debug)]
pub struct Slowed<M> {
    inner: M,
    delay: Duration,
}

impl<M> Slowed<M> {
    pub fn new(inner: M, delay: Duration) -> Self {
        Self { inner, delay }
    }
}

impl<M: LanguageModel> LanguageModel for Slowed<M> {
    fn info(&self) -> &ModelInfo {
        self.inner.info()
    }
    fn open_session(&mut self, capacity: Option<usize>) -> Result<SessionId> {
        self.inner.open_session(capacity)
    }
    fn session_len(&self, session: SessionId) -> Result<usize> {
        self.inner.session_len(session)
    }
    fn fork_session(&mut self, source: SessionId, len: usize, capacity: Option<usize>) -> Result<SessionId> {
        self.inner.fork_session(source, len, capacity)
    }
    fn reserve(&mut self, session: SessionId, capacity: usize) -> Result<()> {
        self.inner.reserve(session, capacity)
    }
    fn open_with_prefix(&mut self, request: &PrefixRequest<'_>) -> Result<OpenedSession> {
        self.inner.open_with_prefix(request)
    }
    fn retire(&mut self, session: SessionId, salt: &str, committed: &[u32]) -> Result<()> {
        self.inner.retire(session, salt, committed)
    }
    fn prefix_cache_stats(&self) -> Option<PrefixCacheStats> {
        self.inner.prefix_cache_stats()
    }
    fn forward(&mut self, session: SessionId, tokens: &[u32]) -> Result<Logits> {
        std::thread::sleep(self.delay);
        self.inner.forward(session, tokens)
    }
    fn forward_last(&mut self, session: SessionId, tokens: &[u32], rows: usize) -> Result<Logits> {
        std::thread::sleep(self.delay);
        self.inner.forward_last(session, tokens, rows)
    }
    /// One delay for the whole batch: it stands for one forward pass of a bigger model.
    fn forward_batch(&mut self, items: &[ForwardItem<'_>]) -> Vec<Result<Logits>> {
        std::thread::sleep(self.delay);
        self.inner.forward_batch(items)
    }
    fn forward_tree(&mut self, session: SessionId, tree: &TokenTree) -> Result<Logits> {
        std::thread::sleep(self.delay);
        self.inner.forward_tree(session, tree)
    }
    fn keep_tree_path(&mut self, session: SessionId, base: usize, tree: &TokenTree, path: &[usize]) -> Result<()> {
        self.inner.keep_tree_path(session, base, tree, path)
    }
    fn last_batch_size(&self) -> usize {
        self.inner.last_batch_size()
    }
    fn truncate(&mut self, session: SessionId, len: usize) -> Result<()> {
        self.inner.truncate(session, len)
    }
    fn release(&mut self, session: SessionId) -> Result<()> {
        self.inner.release(session)
    }
    fn set_memory_budget(&mut self, budget: Option<u64>) -> Result<()> {
        self.inner.set_memory_budget(budget)
    }
    fn memory_in_use(&self) -> (u64, Option<u64>) {
        self.inner.memory_in_use()
    }
    fn open_sessions(&self) -> usize {
        self.inner.open_sessions()
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
    use std::time::Instant;

    use super::*;
    use crate::table::TableModel;

    #[test]
    fn forward_takes_the_delay_longer_and_gives_the_same_logits() {
        let table = || {
            let json = serde_json::json!({"vocab_size": 3, "default": [0.5, 0.3, 0.2]});
            TableModel::from_json("t", json, None).unwrap()
        };
        let (mut plain, mut slowed) = (table(), Slowed::new(table(), Duration::from_millis(20)));
        let (a, b) = (plain.open_session(None).unwrap(), slowed.open_session(None).unwrap());
        let started = Instant::now();
        let slow = slowed.forward(b, &[0, 1]).unwrap();
        assert!(started.elapsed() >= Duration::from_millis(20));
        assert_eq!(plain.forward(a, &[0, 1]).unwrap().as_slice(), slow.as_slice());
    }
}
