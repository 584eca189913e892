//! A tree of candidate tokens that one pass scores at once: each node is a token that
//! follows its parent (or, for a root, the session's committed tokens). A target scores
//! every node of a drafted tree in one pass, each node attending to the committed tokens and
//! its own ancestors only, at the position its depth gives it; afterwards the session keeps
//! the one path the rule accepted ([`crate::LanguageModel::keep_tree_path`]).

use crate::error::{ModelError, Result};

/// Nodes in topological order: a node's parent comes before it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TokenTree {
    tokens: Vec<u32>,
    parents: Vec<Option<usize>>,
    depths: Vec<usize>,
}

impl TokenTree {
    /// A tree of `tokens`, node `i`'s parent `parents[i]` (an earlier node), `None` for a
    /// root. Refused when empty, when the lengths differ, or when a parent is not earlier.
    pub fn new(tokens: Vec<u32>, parents: Vec<Option<usize>>) -> Result<Self> {
        if tokens.is_empty() {
            return Err(ModelError::InvalidInput("a token tree needs at least one node".into()));
        }
        if tokens.len() != parents.len() {
            return Err(ModelError::InvalidInput(format!(
                "a token tree of {} tokens has {} parents",
                tokens.len(),
                parents.len()
            )));
        }
        let mut depths = Vec::with_capacity(tokens.len());
        for (i, parent) in parents.iter().enumerate() {
            let depth = match *parent {
                None => 0,
                Some(p) if p < i => depths[p] + 1,
                Some(p) => {
                    return Err(ModelError::InvalidInput(format!(
                        "node {i} of a token tree has parent {p}, which does not come before it"
                    )));
                }
            };
            depths.push(depth);
        }
        Ok(Self { tokens, parents, depths })
    }

    /// A chain: each token the child of the one before (what a non-tree block is).
    pub fn chain(tokens: &[u32]) -> Result<Self> {
        Self::new(tokens.to_vec(), (0..tokens.len()).map(|i| i.checked_sub(1)).collect())
    }

    pub fn len(&self) -> usize {
        self.tokens.len()
    }

    pub fn is_empty(&self) -> bool {
        self.tokens.is_empty()
    }

    pub fn tokens(&self) -> &[u32] {
        &self.tokens
    }

    pub fn parent(&self, node: usize) -> Option<usize> {
        self.parents[node]
    }

    /// 0 for a root: the node sits at position `committed + depth`.
    pub fn depth(&self, node: usize) -> usize {
        self.depths[node]
    }

    /// `node`, then its parent, and so on up to its root.
    pub fn ancestors(&self, node: usize) -> impl Iterator<Item = usize> + '_ {
        std::iter::successors(Some(node), |&n| self.parents[n])
    }

    /// The nodes from a root down to `node`, both included.
    pub fn path_to(&self, node: usize) -> Vec<usize> {
        let mut path: Vec<usize> = self.ancestors(node).collect();
        path.reverse();
        path
    }

    /// Whether `ancestor` is `node` or lies on its path from a root. A parent's index is
    /// below its child's, so the walk stops once it has passed `ancestor`.
    pub fn is_ancestor_or_self(&self, ancestor: usize, node: usize) -> bool {
        self.ancestors(node).take_while(|&n| n >= ancestor).any(|n| n == ancestor)
    }

    /// Checks that `path` starts at a root and that each node is the child of the one
    /// before; an empty path (nothing accepted) is one.
    pub fn check_path(&self, path: &[usize]) -> Result<()> {
        let mut parent = None;
        for (j, &node) in path.iter().enumerate() {
            if node >= self.len() || self.parents[node] != parent {
                return Err(ModelError::InvalidInput(format!(
                    "{path:?} is not a path from a root of the token tree (step {j}: node {node})"
                )));
            }
            parent = Some(node);
        }
        Ok(())
    }

    /// The tokens along `path`.
    pub fn path_tokens(&self, path: &[usize]) -> Vec<u32> {
        path.iter().map(|&n| self.tokens[n]).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Roots 0 and 1; 2 and 3 under 0; 4 under 2.
    fn tree() -> TokenTree {
        TokenTree::new(vec![10, 11, 12, 13, 14], vec![None, None, Some(0), Some(0), Some(2)]).unwrap()
    }

    #[test]
    fn depths_paths_and_ancestors_follow_the_parents() {
        let t = tree();
        assert_eq!((0..5).map(|n| t.depth(n)).collect::<Vec<_>>(), [0, 0, 1, 1, 2]);
        assert_eq!(t.path_to(4), [0, 2, 4]);
        assert_eq!(t.path_to(1), [1]);
        assert_eq!(t.path_tokens(&t.path_to(4)), [10, 12, 14]);
        assert!(t.is_ancestor_or_self(0, 4) && t.is_ancestor_or_self(4, 4));
        assert!(!t.is_ancestor_or_self(3, 4) && !t.is_ancestor_or_self(1, 2) && !t.is_ancestor_or_self(2, 0));
        assert_eq!(TokenTree::chain(&[5, 6, 7]).unwrap().path_to(2), [0, 1, 2]);
    }

    #[test]
    fn paths_must_descend_from_a_root() {
        let t = tree();
        for ok in [&[][..], &[0], &[0, 2, 4], &[1], &[0, 3]] {
            assert!(t.check_path(ok).is_ok(), "{ok:?}");
        }
        for bad in [&[2][..], &[0, 4], &[0, 1], &[1, 2], &[0, 2, 4, 5], &[9]] {
            assert!(t.check_path(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn malformed_trees_are_refused() {
        assert!(TokenTree::new(vec![], vec![]).is_err());
        assert!(TokenTree::new(vec![1, 2], vec![None]).is_err());
        assert!(TokenTree::new(vec![1, 2], vec![Some(1), None]).is_err(), "a parent after its child");
        assert!(TokenTree::new(vec![1], vec![Some(0)]).is_err(), "its own parent");
    }
}
