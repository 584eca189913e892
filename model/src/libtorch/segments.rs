//! What one libtorch pass runs on: each session's run of tokens, and the rotary tables and
//! masks of their positions.

use tch::Tensor;

use crate::language_model::SessionId;

/// One session's run of tokens in a forward pass, at positions `past..past + tokens.len()`.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Segment<'a> {
    pub(crate) session: SessionId,
    pub(crate) past: usize,
    pub(crate) tokens: &'a [u32],
    /// The head runs on the last `rows` tokens (1 ≤ rows ≤ tokens.len()).
    pub(crate) rows: usize,
}

/// The rotary tables and masks of one kind of layer for one pass.
#[derive(Debug)]
pub(crate) struct PositionTables {
    /// `[Σ n, head_dim]` each.
    pub(crate) cos: Tensor,
    pub(crate) sin: Tensor,
    /// One per segment (`None` where every key is visible).
    pub(crate) masks: Vec<Option<Tensor>>,
}
