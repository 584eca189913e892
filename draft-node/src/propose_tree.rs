//! One Propose of a tree (`ProposeRequest.tree_widths`, docs/rule.md#trees-of-drafts): catch
//! up with the rollback point, then walk the tree depth first. At each node with children the
//! model scores the node's path once, and the node's children are drawn from that q without
//! replacement ([`draw_children`], keyed by each child's node index), so every child goes out
//! with the distribution the rule needs: its parent's q.
//!
//! The walk costs one forward pass of one token per node with children, as a chain costs
//! per candidate. Going back up to draft a sibling truncates the cache (O(1)); when the walk
//! is done the history is the committed sequence again, so the next request re-feeds the
//! accepted path with its corrected token in the pass that scores the next round's root.
//! A tree is never drafted ahead.

use std::time::Instant;

use specd_device_sampling::draw_truncated;
use specd_model::LanguageModel;
use specd_node::{NodeError, SessionState};
use specd_proto::convert::{dense_proposal, sparse_proposal};
use specd_proto::v1::ProposedPosition;
use specd_sampling::tree_rule::ChildDraws;
use specd_sampling::{
    ChildSource, DenseDist, RoundKey, SparseDist, TokenHistory, TreeShape, Truncation, draw_children,
};

use crate::propose::{BatchTally, Proposal, effective_q, forward_rest, last_row};

/// What a tree's Propose asks for.
#[derive(Debug, Clone)]
pub struct TreeJob {
    pub round: u32,
    pub rollback_to: usize,
    pub pending: Vec<u32>,
    pub shape: TreeShape,
    /// `None`: dense wire format.
    pub truncation: Option<Truncation>,
}

/// The q a node's children are drawn from, as the wire will carry it.
enum NodeQ {
    Sparse(SparseDist),
    Dense(DenseDist),
}

impl NodeQ {
    fn source(&self) -> ChildSource<'_> {
        match self {
            Self::Sparse(q) => ChildSource::Sparse(q),
            Self::Dense(q) => ChildSource::Dense(q),
        }
    }

    fn wire(&self, token: u32, parent: usize) -> ProposedPosition {
        let position = match self {
            Self::Sparse(q) => sparse_proposal(token, q),
            Self::Dense(q) => dense_proposal(token, q),
        };
        ProposedPosition { parent: parent as u32, ..position }
    }
}

/// Runs on the model thread, through [`specd_node::Node::run`]: if it fails half-way, the
/// session keeps the state it had before, with its cache forgotten.
pub fn propose_tree(
    model: &mut dyn LanguageModel,
    state: &mut SessionState,
    job: &TreeJob,
) -> Result<Proposal, NodeError> {
    let started = Instant::now();
    if state.constraint.is_some() {
        return Err(NodeError::InvalidRequest("a constrained session is drafted in chains, not trees".into()));
    }
    state.lookahead.clear();
    state.history.catch_up(job.rollback_to, &job.pending)?;
    let committed = state.history.len();
    let mut walk = Walk {
        job,
        key: RoundKey { seed: state.seed, round: job.round },
        positions: Vec::new(),
        passes: BatchTally::default(),
    };
    let result = walk.expand(model, state, 0, 0);
    state.history.rewind(committed);
    result?;
    Ok(Proposal {
        positions: walk.positions,
        draft_ns: started.elapsed().as_nanos() as u64,
        optimistic_hit: false,
        elided: false,
        draft_ahead: false,
        passes: walk.passes,
    })
}

/// The tree drafted so far: node i ≥ 1 is `positions[i − 1]`.
struct Walk<'a> {
    job: &'a TreeJob,
    key: RoundKey,
    positions: Vec<ProposedPosition>,
    passes: BatchTally,
}

impl Walk<'_> {
    /// Drafts the children of `node` at `depth`, whose path the history ends with, and the
    /// subtrees below them; leaves the history as it found it.
    fn expand(
        &mut self,
        model: &mut dyn LanguageModel,
        state: &mut SessionState,
        node: usize,
        depth: usize,
    ) -> Result<(), NodeError> {
        let Some(&width) = self.job.shape.widths.get(depth) else { return Ok(()) };
        let next = forward_rest(model, state)?;
        self.passes.record(model);
        let q = match self.job.truncation {
            Some(t) if !next.logits.on_host() => {
                let row = last_row(&next, state)?;
                let history = &state.history;
                let history = TokenHistory { prompt: history.prompt(), generated: history.generated() };
                // Only q matters here; the children are drawn from it below, by node.
                NodeQ::Sparse(draw_truncated(&row, &state.params, history, t, 0.0)?.q)
            }
            Some(t) => NodeQ::Sparse(effective_q(&next.logits.into_host()?, next.mask.as_ref(), state)?.truncate(t)),
            None => NodeQ::Dense(effective_q(&next.logits.into_host()?, next.mask.as_ref(), state)?),
        };
        let first_child = self.positions.len() + 1;
        let children = draw_children(q.source(), width, ChildDraws::WithoutReplacement, self.key, first_child)?;
        self.positions.extend(children.iter().map(|&token| q.wire(token, node)));
        if depth + 1 < self.job.shape.depth() {
            let here = state.history.len();
            for (k, &token) in children.iter().enumerate() {
                state.history.push_unforwarded(token);
                self.expand(model, state, first_child + k, depth + 1)?;
                state.history.rewind(here);
            }
        }
        Ok(())
    }
}
