//! A session's token history on a node, and how it follows the coordinator's rollback points.
//!
//! The committed sequence C lives in the coordinator. A node holds a copy of a prefix of C
//! followed by the tokens it speculated last round, and a KV cache over a prefix of that. Each
//! request names `rollback_to` (the length of C whose entries stay valid) and the committed
//! tokens after it that the node has not seen (`pending`). Cached work for a rejected suffix
//! is dropped, never reused.
//!
//! A target that scored a tree of candidates holds them in its cache after the committed
//! sequence but not in its history, since a tree is not a sequence: the next request's
//! pending tokens say which path was committed, and [`CatchUp::kept_path`] names the nodes
//! whose cache rows stay (the rest are dropped).

use specd_model::{ModelError, Result, TokenTree};

/// The token history of one session on a node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SessionHistory {
    prompt_len: usize,
    tokens: Vec<u32>,
    cached: usize,
    /// A tree whose rows the cache holds after its first `base` tokens (see the module docs).
    forwarded_tree: Option<ForwardedTree>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
struct ForwardedTree {
    base: usize,
    tree: TokenTree,
}

/// What the model must do to catch up with a request: truncate its cache to `keep` tokens,
/// then forward `feed` (never empty, so the last row scores the next token).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CatchUp {
    pub keep: usize,
    pub feed: Vec<u32>,
    /// Where the cache held a tree after the first `keep` tokens: the nodes of the committed
    /// path whose rows stay ([`specd_model::LanguageModel::keep_tree_path`]), already counted
    /// in `keep`'s place by the history; `None`: truncate the cache to `keep`.
    pub kept_path: Option<KeptTreePath>,
}

/// The committed path through a tree forwarded after `base` tokens: keep these nodes' rows.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeptTreePath {
    pub base: usize,
    pub tree: TokenTree,
    pub path: Vec<usize>,
}

impl CatchUp {
    /// Brings `model`'s cache of `session` to what this catch-up keeps.
    pub fn apply_to_cache(
        &self,
        model: &mut dyn specd_model::LanguageModel,
        session: specd_model::SessionId,
    ) -> Result<()> {
        match &self.kept_path {
            Some(kept) => model.keep_tree_path(session, kept.base, &kept.tree, &kept.path),
            None => model.truncate(session, self.keep),
        }
    }
}

impl SessionHistory {
    pub fn new(prompt: Vec<u32>) -> Result<Self> {
        Self::resumed(prompt, 0)
    }

    /// A history of `tokens` whose first `prompt_len` are the prompt and the rest output
    /// already committed (a session opened again elsewhere); 0: all are the prompt.
    pub fn resumed(tokens: Vec<u32>, prompt_len: usize) -> Result<Self> {
        if tokens.is_empty() {
            return Err(ModelError::InvalidInput("the prompt has no tokens".into()));
        }
        let prompt_len = match prompt_len {
            0 => tokens.len(),
            n if n <= tokens.len() => n,
            n => {
                return Err(ModelError::InvalidInput(format!(
                    "prompt_len {n} is past the {} tokens sent",
                    tokens.len()
                )));
            }
        };
        Ok(Self { prompt_len, tokens, cached: 0, forwarded_tree: None })
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
        let tree = self.forwarded_tree.take();
        self.tokens.truncate(rollback_to);
        self.tokens.extend_from_slice(pending);
        // Cache entries past the rollback point belong to rejected tokens, even when the
        // pending tokens make the history as long again.
        let keep = self.cached.min(rollback_to).min(self.tokens.len() - 1);
        self.cached = keep;
        // A rollback before the tree's base drops its rows with the rest.
        let kept_path = tree.filter(|forwarded| keep == forwarded.base).and_then(|forwarded| {
            // The committed tokens after the tree's base, less the last one, which is fed
            // again so that its row scores the next token.
            let committed = &self.tokens[keep..self.tokens.len() - 1];
            let path = committed_path(&forwarded.tree, committed);
            (!path.is_empty()).then_some(KeptTreePath { base: keep, tree: forwarded.tree, path })
        });
        if let Some(kept) = &kept_path {
            self.cached = keep + kept.path.len();
        }
        Ok(CatchUp { keep: self.cached, feed: self.tokens[self.cached..].to_vec(), kept_path })
    }

    /// Records that `tree` was forwarded after the cached tokens: its rows follow theirs in
    /// the cache until the next catch-up, which keeps the committed path's. The tree's first
    /// nodes may be the history's uncached tokens, as a chain (a target scores the pending
    /// tokens and a drafted tree in one pass); the history's tokens stay what they are.
    pub fn push_forwarded_tree(&mut self, tree: TokenTree) {
        self.forwarded_tree = Some(ForwardedTree { base: self.cached, tree });
    }

    /// Drops the history after its first `len` tokens, and the cache with it: a draft
    /// walking a tree goes back to a node to draft its next child.
    pub fn rewind(&mut self, len: usize) {
        self.tokens.truncate(len.max(self.prompt_len));
        self.cached = self.cached.min(self.tokens.len());
        self.forwarded_tree = None;
    }

    /// Records tokens that were forwarded through the model after the history: speculated
    /// candidates, which the next rollback point keeps or drops.
    pub fn push_forwarded(&mut self, tokens: &[u32]) {
        self.tokens.extend_from_slice(tokens);
        self.cached = self.tokens.len();
        self.forwarded_tree = None;
    }

    /// Records that the cache now covers the whole history (after forwarding a catch-up).
    pub fn mark_cached(&mut self) {
        self.cached = self.tokens.len();
    }

    /// Records that the cache now covers the history's first `len` tokens (after forwarding
    /// part of a catch-up).
    pub fn mark_cached_to(&mut self, len: usize) {
        self.cached = len.min(self.tokens.len());
    }

    /// Forgets what the cache holds, after a failed forward left it in an unknown state: the
    /// next catch-up truncates it to zero and re-feeds the whole history.
    pub fn forget_cache(&mut self) {
        self.cached = 0;
        self.forwarded_tree = None;
    }

    /// Appends a token that is sampled but not forwarded yet (the draft's last candidate).
    pub fn push_unforwarded(&mut self, token: u32) {
        self.tokens.push(token);
    }
}

/// The longest path from a root of `tree` down whose tokens begin `committed`.
fn committed_path(tree: &TokenTree, committed: &[u32]) -> Vec<usize> {
    let mut path: Vec<usize> = Vec::new();
    for &token in committed {
        let parent = path.last().copied();
        match (0..tree.len()).find(|&node| tree.parent(node) == parent && tree.tokens()[node] == token) {
            Some(node) => path.push(node),
            None => break,
        }
    }
    path
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn follows_rollback_points() {
        let mut h = SessionHistory::new(vec![1, 2, 3]).unwrap();
        let first = h.catch_up(3, &[]).unwrap();
        assert_eq!(first, CatchUp { keep: 0, feed: vec![1, 2, 3], kept_path: None });
        h.mark_cached();
        h.push_forwarded(&[10, 11, 12]);
        assert_eq!(h.generated(), &[10, 11, 12]);
        // Two of three candidates accepted, then the corrected token 20.
        let next = h.catch_up(5, &[20]).unwrap();
        assert_eq!(next, CatchUp { keep: 5, feed: vec![20], kept_path: None });
        assert_eq!(h.tokens(), &[1, 2, 3, 10, 11, 20]);
        h.mark_cached();
        // Nothing pending: the last token is re-fed so its row scores the next token.
        let again = h.catch_up(6, &[]).unwrap();
        assert_eq!(again, CatchUp { keep: 5, feed: vec![20], kept_path: None });
    }

    #[test]
    fn never_keeps_cache_of_rejected_tokens() {
        let mut h = SessionHistory::new(vec![1, 2, 3]).unwrap();
        h.catch_up(3, &[]).unwrap();
        h.mark_cached();
        h.push_forwarded(&[10, 11, 12]);
        // Nothing accepted, two committed tokens pending (the draft sat out a round).
        let next = h.catch_up(3, &[20, 21]).unwrap();
        assert_eq!(next, CatchUp { keep: 3, feed: vec![20, 21], kept_path: None });
        assert_eq!(h.tokens(), &[1, 2, 3, 20, 21]);
    }

    /// A tree after [1, 2, 3]: 10 → 11 → 12, 10 → 13, and 14.
    fn tree() -> TokenTree {
        TokenTree::new(vec![10, 14, 11, 13, 12], vec![None, None, Some(0), Some(0), Some(2)]).unwrap()
    }

    #[test]
    fn keeps_the_committed_path_of_a_forwarded_tree() {
        let mut h = SessionHistory::new(vec![1, 2, 3]).unwrap();
        h.catch_up(3, &[]).unwrap();
        h.mark_cached();
        h.push_forwarded_tree(tree());
        assert_eq!(h.tokens(), &[1, 2, 3], "a tree is not a sequence");
        assert_eq!(h.cached(), 3);
        // 10 and 11 accepted, then 7 committed: rows of nodes 0 and 2 stay, 7 is fed.
        let next = h.catch_up(3, &[10, 11, 7]).unwrap();
        let kept = KeptTreePath { base: 3, tree: tree(), path: vec![0, 2] };
        assert_eq!(next, CatchUp { keep: 5, feed: vec![7], kept_path: Some(kept) });
        assert_eq!(h.tokens(), &[1, 2, 3, 10, 11, 7]);
        assert_eq!(h.cached(), 5);
        // The pending 7 and a tree after it in one pass (7's node first): then the whole
        // path 10 → 11 → 12 accepted, and the bonus.
        let with_pending =
            TokenTree::new(vec![7, 10, 14, 11, 13, 12], vec![None, Some(0), Some(0), Some(1), Some(1), Some(3)])
                .unwrap();
        h.push_forwarded_tree(with_pending);
        let next = h.catch_up(6, &[10, 11, 12, 8]).unwrap();
        assert_eq!((next.keep, &next.feed[..]), (9, &[8][..]));
        assert_eq!(next.kept_path.unwrap().path, [0, 1, 3, 5]);
    }

    #[test]
    fn a_tree_keeps_nothing_off_its_paths_or_after_a_rollback_before_it() {
        let mut h = SessionHistory::new(vec![1, 2, 3]).unwrap();
        h.catch_up(3, &[]).unwrap();
        h.mark_cached();
        h.push_forwarded_tree(tree());
        // The first committed token is on no root: nothing kept, the cache truncated to 3.
        assert_eq!(h.catch_up(3, &[11, 5]).unwrap(), CatchUp { keep: 3, feed: vec![11, 5], kept_path: None });
        h.mark_cached();
        h.push_forwarded_tree(tree());
        // A rollback into the history before the tree drops the tree's rows with the rest.
        let next = h.catch_up(4, &[10, 11, 9]).unwrap();
        assert_eq!(next, CatchUp { keep: 4, feed: vec![10, 11, 9], kept_path: None });
        // Only the first catch-up after a tree may keep its rows.
        h.mark_cached();
        h.push_forwarded_tree(tree());
        h.catch_up(7, &[6]).unwrap();
        h.mark_cached();
        assert!(h.catch_up(8, &[10, 4]).unwrap().kept_path.is_none());
    }

    #[test]
    fn rewinding_drops_history_and_cache_but_never_the_prompt() {
        let mut h = SessionHistory::new(vec![1, 2, 3]).unwrap();
        h.catch_up(3, &[]).unwrap();
        h.mark_cached();
        h.push_forwarded(&[10, 11]);
        h.rewind(4);
        assert_eq!((h.tokens(), h.cached()), (&[1, 2, 3, 10][..], 4));
        h.rewind(1);
        assert_eq!((h.tokens(), h.cached()), (&[1, 2, 3][..], 3));
    }

    #[test]
    fn a_resumed_history_keeps_its_output_apart_from_its_prompt() {
        let h = SessionHistory::resumed(vec![1, 2, 3, 10, 11], 3).unwrap();
        assert_eq!((h.prompt(), h.generated()), (&[1, 2, 3][..], &[10, 11][..]));
        let all = SessionHistory::resumed(vec![1, 2, 3], 0).unwrap();
        assert_eq!((all.prompt(), all.generated()), (&[1, 2, 3][..], &[][..]));
        assert!(SessionHistory::resumed(vec![1, 2], 3).is_err());
    }

    #[test]
    fn refuses_impossible_rollbacks() {
        let mut h = SessionHistory::new(vec![1, 2]).unwrap();
        assert!(h.catch_up(3, &[]).is_err());
        assert!(h.catch_up(1, &[]).is_err());
        assert!(SessionHistory::new(vec![]).is_err());
    }
}
