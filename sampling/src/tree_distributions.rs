//! The target's effective distributions over a drafted tree: after every node, with the
//! penalties looking at that node's own path (the committed output, then the tokens from the
//! root down to it), never at its siblings' or cousins' tokens, which that continuation does
//! not contain. A chain gives what [`crate::block_distributions`] gives.

use crate::dist::DenseDist;
use crate::effective::{TokenHistory, effective_distribution};
use crate::error::{Result, SamplingError};
use crate::params::SamplingParams;
use crate::rows::map_positions;
use crate::tree_rule::{ChildDraws, DraftTree};

/// `rows[u]` holds the logits after node `u` of `tree` (row 0: after the committed tokens);
/// returns p after every node, in node order, on at most `threads` threads.
pub fn tree_distributions(
    rows: &[&[f32]],
    params: &SamplingParams,
    prompt: &[u32],
    generated: &[u32],
    tree: &DraftTree,
    threads: usize,
) -> Result<Vec<DenseDist>> {
    // The tree's own shape check; repeated sibling tokens do not matter to the distributions.
    tree.validate(ChildDraws::WithReplacement)?;
    if rows.len() != tree.len() {
        return Err(SamplingError::ShapeMismatch(format!(
            "{} logit rows for a tree of {} nodes (root included)",
            rows.len(),
            tree.len()
        )));
    }
    let vocab_size = rows.iter().map(|row| row.len()).max().unwrap_or(0);
    map_positions(rows.len(), vocab_size, threads, Vec::new, |history: &mut Vec<u32>, u| {
        history.clear();
        history.extend_from_slice(generated);
        history.extend(path_tokens(tree, u));
        effective_distribution(rows[u], params, TokenHistory { prompt, generated: history })
    })
    .into_iter()
    .collect()
}

/// The tokens from the root's child down to `node` (none for the root).
fn path_tokens(tree: &DraftTree, node: usize) -> Vec<u32> {
    let mut tokens = Vec::new();
    let mut at = node;
    while at > 0 {
        tokens.push(tree.token(at));
        at = tree.parents[at - 1];
    }
    tokens.reverse();
    tokens
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::effective::block_distributions;

    /// Penalties that make every row depend on its history.
    fn penalised() -> SamplingParams {
        SamplingParams { repetition_penalty: 1.7, presence_penalty: 0.6, frequency_penalty: 0.4, ..Default::default() }
    }

    /// Logits of row `u` over a vocabulary of 6, different per row.
    fn logits(nodes: usize) -> Vec<Vec<f32>> {
        (0..nodes).map(|u| (0..6).map(|t| ((u * 7 + t * 3) % 5) as f32 * 0.4 - 0.3).collect()).collect()
    }

    #[test]
    fn a_chain_gives_the_blocks_distributions() {
        let tree = DraftTree::chain(vec![2, 4, 2]);
        let rows = logits(tree.len());
        let rows: Vec<&[f32]> = rows.iter().map(Vec::as_slice).collect();
        let (prompt, generated) = ([1, 5], [3, 2]);
        let ours = tree_distributions(&rows, &penalised(), &prompt, &generated, &tree, 1).unwrap();
        let block = block_distributions(&rows, &penalised(), &prompt, &generated, &tree.tokens, 1).unwrap();
        assert_eq!(ours, block);
    }

    #[test]
    fn each_node_sees_its_own_path_only() {
        // Root 0; 1 (token 4) and 2 (token 5) its children; 3 (token 4) under 2.
        let tree = DraftTree { parents: vec![0, 0, 2], tokens: vec![4, 5, 4] };
        let rows = logits(tree.len());
        let rows: Vec<&[f32]> = rows.iter().map(Vec::as_slice).collect();
        let (prompt, generated) = ([1], [3]);
        let ours = tree_distributions(&rows, &penalised(), &prompt, &generated, &tree, 1).unwrap();
        // Node 3's path is 5, 4: the block of those two tokens scores it the same.
        let path =
            block_distributions(&[rows[0], rows[2], rows[3]], &penalised(), &prompt, &generated, &[5, 4], 1).unwrap();
        assert_eq!(ours[3], path[2]);
        assert_eq!(ours[2], path[1]);
        // The slots' order (4, 5, 4 as if a chain) would penalise node 3 by its cousin's 4
        // too: the history matters, so the comparison above can fail.
        let as_chain = block_distributions(&rows, &penalised(), &prompt, &generated, &tree.tokens, 1).unwrap();
        assert_ne!(ours[3], as_chain[3]);
    }

    #[test]
    fn rows_and_nodes_must_agree() {
        let tree = DraftTree::chain(vec![1, 2]);
        let rows = logits(2);
        let rows: Vec<&[f32]> = rows.iter().map(Vec::as_slice).collect();
        assert!(tree_distributions(&rows, &penalised(), &[], &[], &tree, 1).is_err());
        let bad = DraftTree { parents: vec![0, 2], tokens: vec![1, 2] };
        let rows = logits(3);
        let rows: Vec<&[f32]> = rows.iter().map(Vec::as_slice).collect();
        assert!(tree_distributions(&rows, &penalised(), &[], &[], &bad, 1).is_err());
    }
}
