//! What one libtorch pass runs on: each session's run of tokens, and the rotary tables and
//! masks of their positions.

use tch::Tensor;

use crate::language_model::SessionId;
use crate::token_tree::TokenTree;

/// One session's run of tokens in a forward pass, at positions `past..past + tokens.len()`.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Segment<'a> {
    pub(crate) session: SessionId,
    pub(crate) past: usize,
    pub(crate) tokens: &'a [u32],
    /// The head runs on the last `rows` tokens (1 ≤ rows ≤ tokens.len()).
    pub(crate) rows: usize,
    /// How many of the session's cached positions the run's queries are given: its length
    /// after the run, or that length rounded up to a bucket (`--attention-keys`), the
    /// positions past the length masked out.
    pub(crate) keys: usize,
    /// The tokens are the nodes of this tree: each at position `past + depth`, attending to
    /// the cache before `past` and to its own ancestors only. `None`: a run, each token at
    /// `past + i` attending to everything before it.
    pub(crate) tree: Option<&'a TokenTree>,
}

/// The rotary tables and masks of one kind of layer for one pass.
#[derive(Debug)]
pub(crate) struct PositionTables {
    /// `[Σ n, 1, head_dim]` each, broadcast over the heads of `[1, Σ n, heads, head_dim]`.
    pub(crate) cos: Tensor,
    pub(crate) sin: Tensor,
    /// One per segment, `[n, keys]` (`None` where every key is visible).
    pub(crate) masks: Vec<Option<Tensor>>,
}
