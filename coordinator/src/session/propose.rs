//! The draft's part of a round: one Propose, and the blocks the draft pushes ahead.
//!
//! With optimistic drafting and a push depth, the draft drafts the next blocks while the
//! target verifies this one, each as if every candidate before it were accepted and the bonus
//! token were its guess, and pushes each block on the round stream as soon as it is complete
//! (`ProposeResponse.pushed`). A round whose request is the one a pushed block was drafted
//! for (round, rollback point, pending = [guess], γ) takes that block at once: the Propose
//! still goes out, so that the draft's history follows the committed sequence as in every
//! round, but its reply is not waited for; it comes later, with the block left out
//! (`elided`), and is checked then. Any other round discards what was pushed for it and
//! waits for its reply as usual.
//!
//! Exact: a pushed block is bit for bit the reply its request gets (draft-node `propose`),
//! and whether it is taken depends only on the committed sequence, never on the candidates.
//! A draft that pushes what it should not (a block that does not parse, a reply that
//! disagrees with the block taken, an elided reply with nothing pushed, a flood) fails the
//! round on the draft's side: the session goes on target-only.

use std::collections::HashMap;

use prost::Message;
use specd_proto::convert::{parse_dense_proposal, parse_sparse_proposal};
use specd_proto::v1::{ProposalSource, ProposeRequest, ProposeResponse};
use specd_sampling::{DenseDist, SparseDist, TreeShape};

use crate::error::CoordinatorError;
use crate::request::{GenerationSpec, Wire};
use crate::session::draft_link::DraftSession;
use crate::session::draft_tree::{draft_tree, node_q};
use crate::session::round_report::BatchSum;

/// Blocks the draft keeps pushed ahead of the last request (ProposeRequest.push_depth). On
/// a hit the next round starts as soon as its verify pass can, so the draft must be this
/// many blocks ahead to cover a round trip: at 20 ms with verify passes of about 10 ms, the
/// block the round after next needs is drafted before that round's request reaches the draft.
pub const PUSH_DEPTH: u32 = 4;

/// Pushed blocks no round took that a session keeps before it calls the draft broken.
const MAX_PUSHED: usize = 4 * PUSH_DEPTH as usize;

/// The candidates with the q they were drawn from.
#[derive(Debug)]
pub enum Proposals {
    Sparse(Vec<(u32, SparseDist)>),
    Dense(Vec<(u32, DenseDist)>),
}

/// What the draft's part of a round gave.
#[derive(Debug)]
pub struct Proposed {
    pub proposals: Proposals,
    /// What drew each candidate.
    pub sources: Vec<ProposalSource>,
    /// Encoded bytes sent to the draft and received from it (pushes and late replies read
    /// during this round included).
    pub sent: u64,
    pub received: u64,
    /// Model time of the reply; 0 for a pushed block (the round did not wait for it).
    pub draft_ns: u64,
    /// The block was drafted ahead: pushed, or drafted ahead and then asked for.
    pub optimistic_hit: bool,
    /// The block was pushed: no reply was waited for.
    pub pushed: bool,
    /// The draft's forward passes for the block and the sessions that shared them.
    pub batches: BatchSum,
    /// For a tree: each candidate's parent (0: the committed sequence, i: candidate i − 1).
    pub parents: Option<Vec<usize>>,
}

/// Sends the round's Propose (for a chain of `gamma`, or for `tree`), then takes a block
/// pushed for it (already here, or arriving before the reply) or else the reply.
pub async fn propose(
    spec: &GenerationSpec,
    draft: &mut DraftSession,
    round: u32,
    gamma: u32,
    tree: Option<&TreeShape>,
    vocab_size: usize,
    trace_context: HashMap<String, String>,
) -> Result<Proposed, CoordinatorError> {
    let (truncation, dense) = match spec.wire {
        Wire::Sparse(t) => (Some(t.into()), false),
        Wire::Dense => (None, true),
    };
    let request = ProposeRequest {
        session_id: draft.session_id.clone(),
        round,
        rollback_to: draft.cursor.valid as u32,
        pending_token_ids: draft.cursor.pending.clone(),
        gamma,
        truncation,
        dense,
        trace_context,
        optimistic: spec.optimistic,
        push_depth: if spec.optimistic { PUSH_DEPTH } else { 0 },
        model_only: !draft.copies.allow_copies(),
        tree_widths: tree.map(|t| t.widths.iter().map(|&w| w as u32).collect()).unwrap_or_default(),
    };
    let sent = request.encoded_len() as u64;
    let mut received = 0;
    // Whatever happens to the call, the draft's lookahead (if any) follows this request now.
    draft.drafting_ahead = false;
    draft.rounds.send(request.clone()).await?;
    loop {
        if let Some(i) = draft.pushed.iter().position(|block| is_for(block, &request)) {
            let block = draft.pushed.remove(i).expect("found above");
            draft.pushed.retain(|b| b.pushed.as_ref().is_some_and(|p| p.round > round));
            draft.unanswered.push_back(block.positions.iter().map(|p| p.token_id).collect());
            draft.drafting_ahead = spec.optimistic;
            let proposals = parse(spec, &block, vocab_size)?;
            let batches = batches_of(&block);
            return Ok(Proposed {
                proposals,
                sources: sources_of(&block),
                sent,
                received,
                draft_ns: 0,
                optimistic_hit: true,
                pushed: true,
                batches,
                parents: None,
            });
        }
        let message = draft.rounds.receive().await?;
        received += message.encoded_len() as u64;
        if message.pushed.is_some() {
            if draft.pushed.len() >= MAX_PUSHED {
                return Err(CoordinatorError::Protocol(format!("the draft pushed over {MAX_PUSHED} blocks unasked")));
            }
            draft.pushed.push_back(message);
            continue;
        }
        if let Some(taken) = draft.unanswered.pop_front() {
            // The late reply to an earlier round that took a pushed block.
            let tokens: Vec<u32> = message.positions.iter().map(|p| p.token_id).collect();
            if !message.elided && tokens != taken {
                return Err(CoordinatorError::Protocol(format!(
                    "the draft pushed {taken:?} for a round, then answered {tokens:?}"
                )));
            }
            continue;
        }
        if message.elided {
            return Err(CoordinatorError::Protocol(format!(
                "the draft left out a block of round {round} it never pushed"
            )));
        }
        // Everything pushed before this reply is stale, later rounds' blocks included: they
        // were drafted on guesses this request did not confirm, and the draft dropped them on
        // reading it (it drafts ahead again after replying; those blocks come after this).
        // Keeping one could take a block drafted on another history of the same length.
        draft.pushed.clear();
        draft.drafting_ahead = spec.optimistic;
        // A deterministic proposer's block ends where its match does: fewer candidates, or
        // none at all (the round then runs target-only). A tree may have fewer nodes than
        // its shape where a q had fewer tokens than children asked for.
        let most = tree.map_or(gamma as usize, TreeShape::candidates);
        if message.positions.len() > most {
            return Err(CoordinatorError::Protocol(format!(
                "asked the draft for {most} candidates, got {}",
                message.positions.len()
            )));
        }
        let proposals = parse(spec, &message, vocab_size)?;
        let parents = tree.map(|_| parents_of(&message)).transpose()?;
        if let Some(parents) = &parents {
            check_draft_tree(&proposals, parents)?;
        }
        let (draft_ns, optimistic_hit, batches) = (message.draft_ns, message.optimistic_hit, batches_of(&message));
        let sources = sources_of(&message);
        return Ok(Proposed {
            proposals,
            sources,
            sent,
            received,
            draft_ns,
            optimistic_hit,
            pushed: false,
            batches,
            parents,
        });
    }
}

/// What drew each candidate of `message`; an unknown value, from a newer draft, counts as
/// the model's.
fn sources_of(message: &ProposeResponse) -> Vec<ProposalSource> {
    message.positions.iter().map(|p| ProposalSource::try_from(p.source).unwrap_or(ProposalSource::Model)).collect()
}

/// Checks the draft's tree ([`crate::session::draft_tree`]) before the target is asked.
fn check_draft_tree(proposals: &Proposals, parents: &[usize]) -> Result<(), CoordinatorError> {
    match proposals {
        Proposals::Sparse(p) => {
            let tree = draft_tree(p.iter().map(|(t, _)| *t), parents, p.len())?;
            node_q(&tree, p.iter().map(|(_, q)| q), |a, b| a == b).map(|_| ())
        }
        Proposals::Dense(p) => {
            let tree = draft_tree(p.iter().map(|(t, _)| *t), parents, p.len())?;
            node_q(&tree, p.iter().map(|(_, q)| q), |a, b| a.probs() == b.probs()).map(|_| ())
        }
    }
}

/// A tree's parents: each candidate's an earlier node. The rest of the tree's shape (siblings
/// drawn from one q) is checked where the tree is verified.
fn parents_of(message: &ProposeResponse) -> Result<Vec<usize>, CoordinatorError> {
    message
        .positions
        .iter()
        .enumerate()
        .map(|(i, position)| match position.parent as usize {
            parent if parent <= i => Ok(parent),
            parent => Err(CoordinatorError::Protocol(format!(
                "the draft's tree has candidate {} under node {parent}, which does not come before it",
                i + 1
            ))),
        })
        .collect()
}

fn batches_of(message: &ProposeResponse) -> BatchSum {
    BatchSum {
        forward_passes: u64::from(message.forward_passes),
        batched_sequences: u64::from(message.batched_sequences),
    }
}

/// Whether `block` was pushed for `request`.
fn is_for(block: &ProposeResponse, request: &ProposeRequest) -> bool {
    block.pushed.as_ref().is_some_and(|p| {
        p.round == request.round
            && p.rollback_to == request.rollback_to
            && request.pending_token_ids == [p.guess_token_id]
            && block.positions.len() == request.gamma as usize
    })
}

/// The block's candidates with their q; a candidate its own q could not have drawn (outside
/// the vocabulary or the support) is the draft's error, caught before the target sees it.
fn parse(spec: &GenerationSpec, reply: &ProposeResponse, vocab_size: usize) -> Result<Proposals, CoordinatorError> {
    let proposals = match spec.wire {
        Wire::Sparse(_) => Proposals::Sparse(
            reply.positions.iter().map(|p| parse_sparse_proposal(p, vocab_size)).collect::<Result<_, _>>()?,
        ),
        Wire::Dense => Proposals::Dense(
            reply.positions.iter().map(|p| parse_dense_proposal(p, vocab_size)).collect::<Result<_, _>>()?,
        ),
    };
    let impossible = match &proposals {
        Proposals::Sparse(p) => p.iter().find(|(t, q)| q.prob(*t) <= 0.0).map(|(t, _)| *t),
        Proposals::Dense(p) => p.iter().find(|(t, q)| q.prob(*t) <= 0.0).map(|(t, _)| *t),
    };
    match impossible {
        Some(token) => {
            Err(CoordinatorError::Protocol(format!("the draft proposed token {token}, which its q gives 0")))
        }
        None => Ok(proposals),
    }
}
