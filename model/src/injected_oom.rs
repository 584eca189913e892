//! A model whose n-th forward pass fails the way a pass fails when the device's memory runs
//! out, to test that such a failure fails that pass's requests only (tests; never set in
//! service).

use tch::{Device, Kind, Tensor};

use crate::error::{ModelError, Result};
use crate::language_model::{
    ForwardItem, LanguageModel, Logits, ModelInfo, OpenedSession, PrefixCacheStats, PrefixRequest, SessionId,
};
use crate::token_tree::TokenTree;

/// `inner`, with forward pass number `fail_at` (counting from 1; a batched pass counts once)
/// failing with a real allocation failure: it asks libtorch for 4 PiB, which no allocator
/// grants, and reports what libtorch says, classified as every pass's errors are
/// ([`ModelError::classify_allocation`]). Every other pass runs as `inner` runs it.
#[derive(Debug)]
pub struct InjectedOom<M> {
    inner: M,
    fail_at: u64,
    passes: u64,
}

impl<M> InjectedOom<M> {
    pub fn new(inner: M, fail_at: u64) -> Self {
        Self { inner, fail_at, passes: 0 }
    }

    /// Counts a pass; the allocation failure when it is the one to fail.
    fn next_pass(&mut self) -> Result<()> {
        self.passes += 1;
        if self.passes != self.fail_at {
            return Ok(());
        }
        match Tensor::f_empty([1i64 << 50], (Kind::Float, Device::Cpu)) {
            Err(err) => Err(ModelError::from(err).classify_allocation()),
            Ok(_) => Err(ModelError::InvalidInput("4 PiB were allocated: cannot inject an allocation failure".into())),
        }
    }
}

impl<M: LanguageModel> LanguageModel for InjectedOom<M> {
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
        self.next_pass()?;
        self.inner.forward(session, tokens)
    }
    fn forward_last(&mut self, session: SessionId, tokens: &[u32], rows: usize) -> Result<Logits> {
        self.next_pass()?;
        self.inner.forward_last(session, tokens, rows)
    }
    fn forward_batch(&mut self, items: &[ForwardItem<'_>]) -> Vec<Result<Logits>> {
        match self.next_pass() {
            Ok(()) => self.inner.forward_batch(items),
            Err(err) => {
                let message = err.to_string();
                items.iter().map(|_| Err(ModelError::OutOfMemory(message.clone()))).collect()
            }
        }
    }
    fn forward_tree(&mut self, session: SessionId, tree: &TokenTree) -> Result<Logits> {
        self.next_pass()?;
        self.inner.forward_tree(session, tree)
    }
    fn keep_tree_path(&mut self, session: SessionId, base: usize, tree: &TokenTree, path: &[usize]) -> Result<()> {
        self.inner.keep_tree_path(session, base, tree, path)
    }
    fn last_batch_size(&self) -> usize {
        self.inner.last_batch_size()
    }
    fn warm_up(&mut self, max_tokens: usize) -> Result<usize> {
        self.inner.warm_up(max_tokens)
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
    use super::*;
    use crate::table::TableModel;

    #[test]
    fn the_chosen_pass_fails_out_of_memory_and_the_others_run() {
        let json = serde_json::json!({"vocab_size": 3, "default": [0.5, 0.3, 0.2]});
        let mut model = InjectedOom::new(TableModel::from_json("t", json, None).unwrap(), 2);
        let s = model.open_session(None).unwrap();
        model.forward(s, &[0]).unwrap();
        let err = model.forward(s, &[1]).unwrap_err();
        assert!(matches!(err, ModelError::OutOfMemory(_)), "{err}");
        assert_eq!(model.session_len(s).unwrap(), 1);
        model.forward(s, &[1]).unwrap();
        assert_eq!(model.session_len(s).unwrap(), 2);
    }
}
