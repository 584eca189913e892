//! One round of the protocol (docs/architecture.md): Propose to the draft (or a block it pushed
//! ahead, [`crate::session::propose`]), Verify at the target, the exact rule here.

use std::time::Instant;

use prost::Message;
use specd_proto::convert::{parse_dense_rows, parse_scored_block};
use specd_proto::v1::{Support, VerifyRequest};
#[cfg(feature = "testing")]
use specd_sampling::naive::{naive_verify_block_dense, naive_verify_block_sparse};
use specd_sampling::{DenseCandidate, RoundKey, SparseCandidate, TreeShape, verify_dense, verify_sparse};
#[cfg(feature = "testing")]
use specd_sampling::{verify_whole_block_dense, verify_whole_block_sparse};

use specd_telemetry::attributes;
use specd_telemetry::propagation::context_map;
use tracing::Instrument;
use tracing_opentelemetry::OpenTelemetrySpanExt;

pub use crate::session::round_report::{BatchSum, Cursor, RoundReport, WireBytes};

use crate::error::CoordinatorError;
use crate::nodes::TargetRounds;
use crate::request::{GenerationSpec, RuleVariant, Wire};
use crate::session::draft_link::DraftSession;
use crate::session::propose::{Proposals, propose};
use crate::session::tree_verify::verify_tree_round;

/// What a round takes: the generation it belongs to, the target's side and the draft's.
#[derive(Debug)]
pub struct RoundInput<'a> {
    pub spec: &'a GenerationSpec,
    /// The session's id on the target.
    pub session_id: &'a str,
    /// The round's index in the session (with the seed, the key of its random draws).
    pub round: u32,
    pub vocab_size: usize,
    /// The target's round stream.
    pub target: &'a mut TargetRounds,
    /// What the target holds of the committed sequence.
    pub target_cursor: &'a Cursor,
    /// The target scores trees.
    pub target_scores_trees: bool,
    /// The draft's part; `None`: the round runs target-only.
    pub draft: Option<DraftStep<'a>>,
}

/// The draft's part of a round: its session, and how many candidates to ask it for.
#[derive(Debug)]
pub struct DraftStep<'a> {
    pub session: &'a mut DraftSession,
    /// 0: the draft is not asked, and the round runs target-only.
    pub gamma: u32,
    /// The tree the session wants this round, before [`round_tree`] caps it; `None`: a chain.
    pub tree: Option<TreeShape>,
}

/// Runs a round in a span of its own that the nodes' spans of this round are children of.
pub async fn run_round(input: RoundInput<'_>) -> Result<RoundReport, CoordinatorError> {
    let round = input.round;
    let span = tracing::info_span!("round", round);
    let report = run_round_in(input, &span).instrument(span.clone()).await?;
    record(&span, round, &report);
    Ok(report)
}

fn record(span: &tracing::Span, round: u32, report: &RoundReport) {
    let network_ns = report.wall_ns.saturating_sub(report.draft_ns + report.verify_ns);
    for (key, value) in [
        (attributes::ROUND_INDEX, i64::from(round)),
        (attributes::ROUND_GAMMA, report.gamma as i64),
        (attributes::ROUND_ACCEPTED, report.outcome.accepted as i64),
        (attributes::ROUND_EMITTED, report.outcome.tokens.len() as i64),
        (attributes::ROUND_DRAFT_NS, report.draft_ns as i64),
        (attributes::ROUND_VERIFY_NS, report.verify_ns as i64),
        (attributes::ROUND_NETWORK_NS, network_ns as i64),
        (attributes::ROUND_WIRE_BYTES_SENT, report.wire.sent() as i64),
        (attributes::ROUND_WIRE_BYTES_RECEIVED, report.wire.received() as i64),
    ] {
        span.set_attribute(key, value);
    }
    span.set_attribute(attributes::ROUND_OPTIMISTIC_HIT, report.optimistic_hit);
}

async fn run_round_in(input: RoundInput<'_>, span: &tracing::Span) -> Result<RoundReport, CoordinatorError> {
    let RoundInput {
        spec,
        session_id,
        round,
        vocab_size,
        target: target_client,
        target_cursor,
        target_scores_trees,
        draft,
    } = input;
    let started = Instant::now();
    // Both nodes' spans of this round hang under the same round span.
    let trace_context = context_map(span);
    let mut wire = WireBytes::default();
    let (mut optimistic_attempt, mut optimistic_hit, mut optimistic_pushed) = (false, false, false);
    let mut draft_batches = BatchSum::default();
    let (mut drafted, mut sources, mut copies_apart) = (false, Vec::new(), false);
    let mut parents = None;
    let (mut proposals, mut draft_ns) = match spec.wire {
        Wire::Sparse(_) => (Proposals::Sparse(Vec::new()), 0),
        Wire::Dense => (Proposals::Dense(Vec::new()), 0),
    };
    if let Some(DraftStep { session: draft, gamma, tree }) = draft.filter(|d| d.gamma > 0) {
        // Whatever goes wrong on the draft's side ends the round before the target is asked,
        // so the session can go on without the draft.
        optimistic_attempt = draft.drafting_ahead;
        let tree = round_tree(spec, draft, gamma, tree.filter(|_| target_scores_trees));
        let proposed = propose(spec, draft, round, gamma, tree.as_ref(), vocab_size, trace_context.clone())
            .await
            .map_err(|e| CoordinatorError::DraftLost(Box::new(e)))?;
        (optimistic_hit, optimistic_pushed) = (proposed.optimistic_hit, proposed.pushed);
        (wire.to_draft, wire.from_draft) = (proposed.sent, proposed.received);
        draft_ns = proposed.draft_ns;
        draft_batches = proposed.batches;
        proposals = proposed.proposals;
        (drafted, sources, copies_apart) = (true, proposed.sources, draft.copies_besides_model);
        // A tree of no nodes (nothing drawn) runs as the empty chain it is: target-only.
        parents = proposed.parents.filter(|p| !p.is_empty());
    }
    let (candidates, supports): (Vec<u32>, Vec<Support>) = match &proposals {
        Proposals::Sparse(p) => p.iter().map(|(t, q)| (*t, Support { token_ids: q.tokens().to_vec() })).unzip(),
        Proposals::Dense(p) => (p.iter().map(|(t, _)| *t).collect(), Vec::new()),
    };
    let gamma = candidates.len();
    let request = VerifyRequest {
        session_id: session_id.to_owned(),
        round,
        rollback_to: target_cursor.valid as u32,
        pending_token_ids: target_cursor.pending.clone(),
        candidate_token_ids: candidates,
        supports,
        dense: matches!(spec.wire, Wire::Dense),
        trace_context,
        logprobs: spec.logprobs,
        candidate_parents: parents.iter().flatten().map(|&p| p as u32).collect(),
    };
    wire.to_target = request.encoded_len() as u64;
    let reply = target_client.call(request).await.map_err(|e| {
        // Nothing is committed yet: the session may run this round again elsewhere.
        if e.is_node_loss() { CoordinatorError::TargetLost(Box::new(e)) } else { e }
    })?;
    wire.from_target = reply.encoded_len() as u64;
    let tree = parents.is_some();
    if matches!(spec.wire, Wire::Sparse(_)) && !tree && reply.bonus_token_id as usize >= vocab_size {
        return Err(CoordinatorError::Protocol(format!(
            "bonus token {} is outside the vocabulary of {vocab_size}",
            reply.bonus_token_id
        )));
    }
    let key = RoundKey { seed: spec.seed, round };
    let mut dense_rows = None;
    let outcome = match (&proposals, &parents) {
        (_, Some(parents)) => verify_tree_round(spec, &proposals, parents, &reply, key, vocab_size)?,
        (Proposals::Sparse(p), None) => {
            let block: Vec<_> = p.iter().map(|(token, q)| SparseCandidate { token: *token, q }).collect();
            let scored = parse_scored_block(&reply);
            match spec.rule {
                RuleVariant::Exact => verify_sparse(spec.verification, &block, &scored, key)?,
                #[cfg(feature = "testing")]
                RuleVariant::NaiveResampleFromTarget => naive_verify_block_sparse(&block, &scored, key)?,
                #[cfg(feature = "testing")]
                RuleVariant::BlockKeyedByBlockPosition => {
                    verify_whole_block_sparse(&block, &scored, RoundKey { round: 0, ..key })?
                }
            }
        }
        (Proposals::Dense(p), None) => {
            let rows = parse_dense_rows(&reply, gamma, vocab_size)?;
            let block: Vec<_> = p.iter().map(|(token, q)| DenseCandidate { token: *token, q }).collect();
            let outcome = match spec.rule {
                RuleVariant::Exact => verify_dense(spec.verification, &block, &rows, key)?,
                #[cfg(feature = "testing")]
                RuleVariant::NaiveResampleFromTarget => naive_verify_block_dense(&block, &rows, key)?,
                #[cfg(feature = "testing")]
                RuleVariant::BlockKeyedByBlockPosition => {
                    verify_whole_block_dense(&block, &rows, RoundKey { round: 0, ..key })?
                }
            };
            dense_rows = Some(rows);
            outcome
        }
    };
    let logprobs = match spec.logprobs {
        Some(_) => crate::session::logprobs::emitted(&outcome.tokens, &proposals, &reply, dense_rows.as_deref())?,
        None => Vec::new(),
    };
    Ok(RoundReport {
        outcome,
        logprobs,
        gamma,
        draft_ns,
        verify_ns: reply.verify_ns,
        wall_ns: started.elapsed().as_nanos() as u64,
        wire,
        optimistic_attempt,
        optimistic_hit,
        optimistic_pushed,
        // Nodes from before batching send 0: they ran every pass alone.
        target_batch: BatchSum { forward_passes: 1, batched_sequences: u64::from(reply.batch_size.max(1)) },
        draft_batches,
        drafted,
        sources,
        proposal_skipped: false,
        copies_apart,
        tree,
    })
}

/// The tree this round drafts, if any: the session's `wanted` shape with its depth capped by
/// the round's γ, where the draft draws trees and no log-probabilities are asked for (they are
/// computed for chains only). A shape of one child per depth is a chain, and runs as one.
fn round_tree(spec: &GenerationSpec, draft: &DraftSession, gamma: u32, wanted: Option<TreeShape>) -> Option<TreeShape> {
    let shape = wanted.filter(|_| draft.draws_trees && spec.logprobs.is_none())?;
    let widths: Vec<usize> = shape.widths.iter().copied().take(gamma as usize).collect();
    let shape = TreeShape::new(widths).ok()?;
    (!shape.is_chain()).then_some(shape)
}
