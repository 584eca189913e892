//! A session's token history on a node, and how it follows the coordinator's rollback points.
//!
//! The committed sequence C lives in the coordinator. A node holds a copy of a prefix of C
//! followed by the tokens it speculated last round, and a KV cache over a prefix of that. Each
//! request names `rollback_to` (the length of C whose entries stay valid) and the committed
//! tokens after it that the node has not seen (`pending`). Cached work for a rejected suffix
//! is dropped, never reused.

use specd_model::{ModelError, Result};

/// The token history of one session on a node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SessionHistory {
    prompt_len: usize,
    tokens: Vec<u32>,
    cached: usize,
}

/// What the model must do to catch up with a request: truncate its cache to `keep` tokens,
/// then forward `feed` (never empty, so the last row scores the next token).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CatchUp {
    pub keep: usize,
    pub feed: Vec<u32>,
}

impl SessionHistory {
    pub fn new(prompt: Vec<u32>) -> Result<Self> {
        if prompt.is_empty() {
            return Err(ModelError::InvalidInput("the prompt has no tokens".into()));
        }
        Ok(Self { prompt_len: prompt.len(), tokens: prompt, cached: 0 })
    }

    pub fn prompt(&self) -> &[u32] {
        &self.tokens[..self.prompt_len]
    }

    /// Everything after the prompt: committed output, then any speculated tokens.
    pub fn generated(&self) -> &[u32] {
        &self.tokens[self.prompt_len..]
    }

    pub fn tokens(&self) -> &[u32] {
        &self.tokens
    }

    pub fn len(&self) -> usize {
        self.tokens.len()
    }

    pub fn is_empty(&self) -> bool {
        self.tokens.is_empty()
    }

    /// Tokens covered by the KV cache.
    pub fn cached(&self) -> usize {
        self.cached
    }

    /// Applies a rollback point and the pending committed tokens, and says how the cache
    /// catches up. Refuses a rollback into the prompt or past what this node has seen.
    pub fn catch_up(&mut self, rollback_to: usize, pending: &[u32]) -> Result<CatchUp> {
        if rollback_to > self.tokens.len() {
            return Err(ModelError::InvalidInput(format!(
                "rollback_to {rollback_to} is past the {} tokens this node holds for the session",
                self.tokens.len()
            )));
        }
        if rollback_to < self.prompt_len {
            return Err(ModelError::InvalidInput(format!(
                "rollback_to {rollback_to} would cut into the prompt of {} tokens",
                self.prompt_len
            )));
        }
        self.tokens.truncate(rollback_to);
        self.tokens.extend_from_slice(pending);
        // Cache entries past the rollback point belong to rejected tokens, even when the
        // pending tokens make the history as long again.
        let keep = self.cached.min(rollback_to).min(self.tokens.len() - 1);
        self.cached = keep;
        Ok(CatchUp { keep, feed: self.tokens[keep..].to_vec() })
    }

    /// Records tokens that were forwarded through the model after the history: speculated
    /// candidates, which the next rollback point keeps or drops.
    pub fn push_forwarded(&mut self, tokens: &[u32]) {
        self.tokens.extend_from_slice(tokens);
        self.cached = self.tokens.len();
    }

    /// Records that the cache now covers the whole history (after forwarding a catch-up).
    pub fn mark_cached(&mut self) {
        self.cached = self.tokens.len();
    }

    /// Forgets what the cache holds, after a failed forward left it in an unknown state: the
    /// next catch-up truncates it to zero and re-feeds the whole history.
    pub fn forget_cache(&mut self) {
        self.cached = 0;
    }

    /// Appends a token that is sampled but not forwarded yet (the draft's last candidate).
    pub fn push_unforwarded(&mut self, token: u32) {
        self.tokens.push(token);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn follows_rollback_points() {
        let mut h = SessionHistory::new(vec![1, 2, 3]).unwrap();
        let first = h.catch_up(3, &[]).unwrap();
        assert_eq!(first, CatchUp { keep: 0, feed: vec![1, 2, 3] });
        h.mark_cached();
        h.push_forwarded(&[10, 11, 12]);
        assert_eq!(h.generated(), &[10, 11, 12]);
        // Two of three candidates accepted, then the corrected token 20.
        let next = h.catch_up(5, &[20]).unwrap();
        assert_eq!(next, CatchUp { keep: 5, feed: vec![20] });
        assert_eq!(h.tokens(), &[1, 2, 3, 10, 11, 20]);
        h.mark_cached();
        // Nothing pending: the last token is re-fed so its row scores the next token.
        let again = h.catch_up(6, &[]).unwrap();
        assert_eq!(again, CatchUp { keep: 5, feed: vec![20] });
    }

    #[test]
    fn never_keeps_cache_of_rejected_tokens() {
        let mut h = SessionHistory::new(vec![1, 2, 3]).unwrap();
        h.catch_up(3, &[]).unwrap();
        h.mark_cached();
        h.push_forwarded(&[10, 11, 12]);
        // Nothing accepted, two committed tokens pending (the draft sat out a round).
        let next = h.catch_up(3, &[20, 21]).unwrap();
        assert_eq!(next, CatchUp { keep: 3, feed: vec![20, 21] });
        assert_eq!(h.tokens(), &[1, 2, 3, 20, 21]);
    }

    #[test]
    fn refuses_impossible_rollbacks() {
        let mut h = SessionHistory::new(vec![1, 2]).unwrap();
        assert!(h.catch_up(3, &[]).is_err());
        assert!(h.catch_up(1, &[]).is_err());
        assert!(SessionHistory::new(vec![]).is_err());
    }
}
