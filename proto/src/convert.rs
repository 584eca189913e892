//! Conversions between wire messages and the sampling crate's types.
//!
//! Everything that arrives from a peer is validated here, once: a node never trusts a
//! distribution or a block shape it did not compute itself.

use specd_sampling::{DenseDist, SamplingParams, ScoredBlock, ScoredNode, ScoredPosition, SparseDist, Truncation};

use crate::error::ProtoError;
use crate::v1;

impl From<&SamplingParams> for v1::SamplingSettings {
    fn from(p: &SamplingParams) -> Self {
        Self {
            temperature: p.temperature,
            top_k: p.top_k,
            top_p: p.top_p,
            min_p: p.min_p,
            repetition_penalty: p.repetition_penalty,
            presence_penalty: p.presence_penalty,
            frequency_penalty: p.frequency_penalty,
        }
    }
}

impl TryFrom<&v1::SamplingSettings> for SamplingParams {
    type Error = ProtoError;

    fn try_from(s: &v1::SamplingSettings) -> Result<Self, ProtoError> {
        let params = SamplingParams {
            temperature: s.temperature,
            top_k: s.top_k,
            top_p: s.top_p,
            min_p: s.min_p,
            repetition_penalty: s.repetition_penalty,
            presence_penalty: s.presence_penalty,
            frequency_penalty: s.frequency_penalty,
        };
        params.validate()?;
        Ok(params)
    }
}

impl From<Truncation> for v1::Truncation {
    fn from(t: Truncation) -> Self {
        Self { epsilon: t.epsilon, max_entries: t.max_entries as u32 }
    }
}

impl TryFrom<&v1::Truncation> for Truncation {
    type Error = ProtoError;

    fn try_from(t: &v1::Truncation) -> Result<Self, ProtoError> {
        Ok(Truncation::new(t.epsilon, t.max_entries as usize)?)
    }
}

/// A sparse proposal: the candidate and the q on S it was drawn from.
pub fn sparse_proposal(token: u32, q: &SparseDist) -> v1::ProposedPosition {
    v1::ProposedPosition {
        token_id: token,
        support: q.tokens().to_vec(),
        q: q.probs().to_vec(),
        dense_q: Vec::new(),
        source: v1::ProposalSource::Model.into(),
        parent: 0,
    }
}

/// A deterministic proposer's candidate on the sparse wire: q = one-hot, a support of size
/// one with q = 1 (docs/rule.md, deterministic proposers).
pub fn deterministic_proposal(token: u32, source: v1::ProposalSource) -> v1::ProposedPosition {
    v1::ProposedPosition {
        token_id: token,
        support: vec![token],
        q: vec![1.0],
        dense_q: Vec::new(),
        source: source.into(),
        parent: 0,
    }
}

/// [`deterministic_proposal`] on the dense wire: a one-hot q over the vocabulary.
pub fn deterministic_dense_proposal(token: u32, vocab_size: usize, source: v1::ProposalSource) -> v1::ProposedPosition {
    let mut dense_q = vec![0.0; vocab_size];
    if let Some(q) = dense_q.get_mut(token as usize) {
        *q = 1.0;
    }
    v1::ProposedPosition {
        token_id: token,
        support: Vec::new(),
        q: Vec::new(),
        dense_q,
        source: source.into(),
        parent: 0,
    }
}

/// A dense proposal: the candidate and the full q.
pub fn dense_proposal(token: u32, q: &DenseDist) -> v1::ProposedPosition {
    v1::ProposedPosition {
        token_id: token,
        support: Vec::new(),
        q: Vec::new(),
        dense_q: q.probs().to_vec(),
        source: v1::ProposalSource::Model.into(),
        parent: 0,
    }
}

/// The candidate and its sparse q, validated against the vocabulary size.
pub fn parse_sparse_proposal(p: &v1::ProposedPosition, vocab_size: usize) -> Result<(u32, SparseDist), ProtoError> {
    if p.support.is_empty() {
        return Err(ProtoError::MissingField("ProposedPosition.support"));
    }
    let q = SparseDist::new(vocab_size, p.support.clone(), p.q.clone())?;
    Ok((p.token_id, q))
}

/// The candidate and its dense q over the target's `vocab_size` ids. A draft whose
/// vocabulary lacks the target's last (padding) rows sends fewer entries: its q is 0 on the
/// ids it lacks, so it is padded with zeros (the coordinator checked at startup that the
/// tokenizers agree).
pub fn parse_dense_proposal(p: &v1::ProposedPosition, vocab_size: usize) -> Result<(u32, DenseDist), ProtoError> {
    if p.dense_q.is_empty() || p.dense_q.len() > vocab_size {
        return Err(ProtoError::invalid(
            "ProposedPosition.dense_q",
            format!("{} entries for a vocabulary of {vocab_size}", p.dense_q.len()),
        ));
    }
    let mut q = p.dense_q.clone();
    q.resize(vocab_size, 0.0);
    Ok((p.token_id, DenseDist::new(q)?))
}

/// The target's sparse reply as wire positions.
pub fn scored_positions(block: &ScoredBlock) -> Vec<v1::ScoredPosition> {
    block
        .positions
        .iter()
        .map(|p| v1::ScoredPosition {
            p_on_support: p.p_on_support.clone(),
            complement_mass: p.complement_mass,
            complement_sample: p.complement_sample,
        })
        .collect()
}

/// The target's sparse reply from the wire. Shapes and values are checked by the rule
/// itself (`verify_block_sparse`), which knows the supports they refer to.
pub fn parse_scored_block(reply: &v1::VerifyResponse) -> ScoredBlock {
    ScoredBlock {
        positions: reply
            .positions
            .iter()
            .map(|p| ScoredPosition {
                p_on_support: p.p_on_support.clone(),
                complement_mass: p.complement_mass,
                complement_sample: p.complement_sample,
            })
            .collect(),
        bonus: reply.bonus_token_id,
    }
}

/// A scored tree as wire nodes, node 0 first.
pub fn scored_tree_nodes(nodes: &[ScoredNode]) -> Vec<v1::ScoredTreeNode> {
    nodes
        .iter()
        .map(|node| v1::ScoredTreeNode {
            node: Some(match node {
                ScoredNode::Inner(p) => v1::scored_tree_node::Node::Inner(v1::ScoredPosition {
                    p_on_support: p.p_on_support.clone(),
                    complement_mass: p.complement_mass,
                    complement_sample: p.complement_sample,
                }),
                ScoredNode::Leaf { bonus } => v1::scored_tree_node::Node::BonusTokenId(*bonus),
            }),
        })
        .collect()
}

/// The target's sparse reply for a tree of `nodes` nodes (node 0 included). The shape of
/// each node and its values are checked by the rule (`verify_tree_sparse`), which knows the
/// supports; here only that every node is there and says what it is.
pub fn parse_scored_tree(reply: &v1::VerifyResponse, nodes: usize) -> Result<Vec<ScoredNode>, ProtoError> {
    if reply.tree_nodes.len() != nodes {
        return Err(ProtoError::invalid(
            "VerifyResponse.tree_nodes",
            format!("{} scored nodes for a tree of {nodes}", reply.tree_nodes.len()),
        ));
    }
    reply
        .tree_nodes
        .iter()
        .enumerate()
        .map(|(u, node)| match &node.node {
            Some(v1::scored_tree_node::Node::Inner(p)) => Ok(ScoredNode::Inner(ScoredPosition {
                p_on_support: p.p_on_support.clone(),
                complement_mass: p.complement_mass,
                complement_sample: p.complement_sample,
            })),
            Some(v1::scored_tree_node::Node::BonusTokenId(bonus)) => Ok(ScoredNode::Leaf { bonus: *bonus }),
            None => {
                Err(ProtoError::invalid("VerifyResponse.tree_nodes", format!("node {u} is neither scored nor a leaf")))
            }
        })
        .collect()
}

/// The target's dense reply: p at positions 1..γ+1.
pub fn parse_dense_rows(
    reply: &v1::VerifyResponse,
    gamma: usize,
    vocab_size: usize,
) -> Result<Vec<DenseDist>, ProtoError> {
    if reply.dense_p.len() != gamma + 1 {
        return Err(ProtoError::invalid(
            "VerifyResponse.dense_p",
            format!("{} rows for {} positions", reply.dense_p.len(), gamma + 1),
        ));
    }
    reply
        .dense_p
        .iter()
        .map(|row| {
            if row.probs.len() != vocab_size {
                return Err(ProtoError::invalid(
                    "VerifyResponse.dense_p",
                    format!("a row of {} entries for a vocabulary of {vocab_size}", row.probs.len()),
                ));
            }
            Ok(DenseDist::new(row.probs.clone())?)
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sampling_settings_round_trip_and_validate() {
        let params = SamplingParams { temperature: 0.7, top_k: 40, top_p: 0.9, ..Default::default() };
        let wire = v1::SamplingSettings::from(&params);
        assert_eq!(SamplingParams::try_from(&wire).unwrap(), params);
        let bad = v1::SamplingSettings { top_p: 0.0, ..wire };
        let err = SamplingParams::try_from(&bad).unwrap_err();
        assert!(err.to_string().contains("top_p"), "{err}");
        assert_eq!(tonic::Status::from(err).code(), tonic::Code::InvalidArgument);
    }

    #[test]
    fn scored_trees_round_trip_and_refuse_missing_nodes() {
        let nodes = vec![
            ScoredNode::Inner(ScoredPosition {
                p_on_support: vec![0.5, 0.25],
                complement_mass: 0.25,
                complement_sample: Some(4),
            }),
            ScoredNode::Leaf { bonus: 3 },
            ScoredNode::Leaf { bonus: 9 },
        ];
        let mut reply = v1::VerifyResponse { tree_nodes: scored_tree_nodes(&nodes), ..Default::default() };
        assert_eq!(parse_scored_tree(&reply, 3).unwrap(), nodes);
        let err = parse_scored_tree(&reply, 4).unwrap_err();
        assert!(err.to_string().contains("3 scored nodes for a tree of 4"), "{err}");
        reply.tree_nodes[1].node = None;
        let err = parse_scored_tree(&reply, 3).unwrap_err();
        assert!(err.to_string().contains("node 1"), "{err}");
    }

    #[test]
    fn proposals_round_trip_and_refuse_bad_shapes() {
        let q = SparseDist::new(10, vec![3, 7], vec![0.25, 0.75]).unwrap();
        let wire = sparse_proposal(7, &q);
        assert_eq!(parse_sparse_proposal(&wire, 10).unwrap(), (7, q));
        assert!(parse_sparse_proposal(&wire, 5).is_err(), "token 7 outside a vocabulary of 5");
        let empty = v1::ProposedPosition::default();
        assert_eq!(parse_sparse_proposal(&empty, 10), Err(ProtoError::MissingField("ProposedPosition.support")));
        let dense = DenseDist::new(vec![0.5, 0.5]).unwrap();
        assert_eq!(parse_dense_proposal(&dense_proposal(1, &dense), 2).unwrap(), (1, dense.clone()));
        // A draft without the target's last (padding) row: q is 0 there.
        let padded = DenseDist::new(vec![0.5, 0.5, 0.0]).unwrap();
        assert_eq!(parse_dense_proposal(&dense_proposal(1, &dense), 3).unwrap(), (1, padded));
        assert!(parse_dense_proposal(&dense_proposal(1, &dense), 1).is_err(), "more entries than the target has");
        let nothing = v1::ProposedPosition { token_id: 0, ..Default::default() };
        assert!(parse_dense_proposal(&nothing, 3).is_err());
    }

    #[test]
    fn scored_blocks_round_trip() {
        let block = ScoredBlock {
            positions: vec![ScoredPosition {
                p_on_support: vec![0.5, 0.25],
                complement_mass: 0.25,
                complement_sample: Some(4),
            }],
            bonus: 2,
        };
        let reply = v1::VerifyResponse { positions: scored_positions(&block), bonus_token_id: 2, ..Default::default() };
        assert_eq!(parse_scored_block(&reply), block);
        let rows = v1::VerifyResponse {
            dense_p: vec![v1::DenseRow { probs: vec![0.5, 0.5] }, v1::DenseRow { probs: vec![1.0, 0.0] }],
            ..Default::default()
        };
        assert_eq!(parse_dense_rows(&rows, 1, 2).unwrap().len(), 2);
        assert!(parse_dense_rows(&rows, 2, 2).is_err());
        assert!(parse_dense_rows(&rows, 1, 3).is_err());
    }
}
