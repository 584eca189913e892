//! The draft's tree as the coordinator reads it: the [`DraftTree`] of a reply's candidates and
//! parents, and the q each node's children were drawn from, with the shape checks both need
//! (parents before children, no sibling repeating a token, siblings with one q). The round
//! checks them as the draft's reply arrives ([`crate::session::propose`]), so that a draft
//! that breaks them fails its own part of the round, not the generation.

use specd_sampling::tree_rule::{ChildDraws, DraftTree};

use crate::error::CoordinatorError;

/// The rule's draws: the draft draws a node's children without replacement.
pub const DRAWS: ChildDraws = ChildDraws::WithoutReplacement;

/// The tree of a reply's candidates (`tokens`) under `parents`, checked.
pub fn draft_tree(
    tokens: impl Iterator<Item = u32>,
    parents: &[usize],
    candidates: usize,
) -> Result<DraftTree, CoordinatorError> {
    if parents.len() != candidates {
        return Err(CoordinatorError::Protocol(format!("{} parents for {candidates} tree candidates", parents.len())));
    }
    let tree = DraftTree { parents: parents.to_vec(), tokens: tokens.collect() };
    tree.validate(DRAWS).map_err(|e| CoordinatorError::Protocol(format!("the draft's tree: {e}")))?;
    Ok(tree)
}

/// The q each node's children were drawn from (`None` at a leaf): every child carries its
/// parent's, and siblings must carry the same.
pub fn node_q<'a, D: Clone + 'a>(
    tree: &DraftTree,
    child_q: impl Iterator<Item = &'a D>,
    same: impl Fn(&D, &D) -> bool,
) -> Result<Vec<Option<D>>, CoordinatorError> {
    let mut q: Vec<Option<D>> = vec![None; tree.len()];
    for (i, (&parent, child_q)) in tree.parents.iter().zip(child_q).enumerate() {
        match &q[parent] {
            Some(first) if !same(first, child_q) => {
                return Err(CoordinatorError::Protocol(format!(
                    "the draft's candidate {} carries another q than its siblings under node {parent}",
                    i + 1
                )));
            }
            Some(_) => {}
            None => q[parent] = Some(child_q.clone()),
        }
    }
    Ok(q)
}
