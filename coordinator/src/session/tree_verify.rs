//! A tree round's verification (docs/rule.md#trees-of-drafts): the draft's tree and the q
//! each node's children were drawn from, the target's reply for every node, and the exact
//! tree rule (recursive rejection sampling, children drawn without replacement). What it
//! gives is a [`BlockOutcome`] like a chain's, so that committing, the stats and the cursors
//! treat both alike (the cursors read [`crate::session::round::RoundReport::tree`]).

use specd_proto::convert::{parse_dense_rows, parse_scored_tree};
use specd_proto::v1::VerifyResponse;
#[cfg(feature = "testing")]
use specd_sampling::naive::naive_verify_tree_dense;
use specd_sampling::tree_rule::{DraftTree, TreeOutcome, verify_tree_dense, verify_tree_sparse};
use specd_sampling::{BlockOutcome, DenseDist, RoundKey, ScoredNode};

use crate::error::CoordinatorError;
use crate::request::{GenerationSpec, RuleVariant};
use crate::session::draft_tree::{DRAWS, draft_tree, node_q};
use crate::session::propose::Proposals;

/// Verifies the tree of `proposals` under `parents` against the target's `reply`.
pub fn verify_tree_round(
    spec: &GenerationSpec,
    proposals: &Proposals,
    parents: &[usize],
    reply: &VerifyResponse,
    key: RoundKey,
    vocab_size: usize,
) -> Result<BlockOutcome, CoordinatorError> {
    match proposals {
        Proposals::Sparse(p) => {
            let tree = draft_tree(p.iter().map(|(t, _)| *t), parents, p.len())?;
            let q = node_q(&tree, p.iter().map(|(_, q)| q), |a, b| a == b)?;
            let scored = parse_scored_tree(reply, tree.len())?;
            let outcome = match spec.rule {
                RuleVariant::Exact => verify_tree_sparse(&tree, &q, &scored, DRAWS, key)?,
                #[cfg(feature = "testing")]
                _ => return Err(CoordinatorError::InvalidRequest("no wrong tree rule on the sparse wire".into())),
            };
            let overlap = |u: usize| match (&q[u], &scored[u]) {
                (Some(q), ScoredNode::Inner(s)) => {
                    Some(q.probs().iter().zip(&s.p_on_support).map(|(a, b)| a.min(*b)).sum())
                }
                _ => None,
            };
            Ok(block_outcome(&tree, outcome, overlap))
        }
        Proposals::Dense(p) => {
            let tree = draft_tree(p.iter().map(|(t, _)| *t), parents, p.len())?;
            let q = node_q(&tree, p.iter().map(|(_, q)| q), |a, b| a.probs() == b.probs())?;
            let rows = parse_dense_rows(reply, p.len(), vocab_size)?;
            let outcome = match spec.rule {
                RuleVariant::Exact => verify_tree_dense(&tree, &q, &rows, DRAWS, key)?,
                #[cfg(feature = "testing")]
                RuleVariant::NaiveResampleFromTarget => naive_verify_tree_dense(&tree, &q, &rows, DRAWS, key)?,
                #[cfg(feature = "testing")]
                RuleVariant::BlockKeyedByBlockPosition => {
                    return Err(CoordinatorError::InvalidRequest("block keying has no tree rule".into()));
                }
            };
            let overlap = |u: usize| {
                q[u].as_ref().map(|q: &DenseDist| q.probs().iter().zip(rows[u].probs()).map(|(a, b)| a.min(*b)).sum())
            };
            Ok(block_outcome(&tree, outcome, overlap))
        }
    }
}

/// The tree's outcome as a round's: the accepted path's tokens and the emitted one, and
/// Σ min(p, q) at every node of the path that has children (the root, then each accepted
/// node), the overlap a chain through the first children would have shown the policy.
fn block_outcome(tree: &DraftTree, outcome: TreeOutcome, overlap: impl Fn(usize) -> Option<f64>) -> BlockOutcome {
    let expected_acceptance = std::iter::once(0)
        .chain(outcome.path.iter().copied())
        .filter(|&u| !tree.children(u).is_empty())
        .filter_map(overlap)
        .collect();
    BlockOutcome {
        accepted: outcome.accepted(),
        tokens: outcome.tokens,
        acceptance: Vec::new(),
        expected_acceptance,
        emitted_from: outcome.emitted_from,
        in_expectation: Default::default(),
    }
}
