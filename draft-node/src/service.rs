//! The `DraftService` gRPC implementation over a [`DraftNode`].

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use specd_model::LanguageModel;
use specd_node::spans::{round_span, rpc_span};
use specd_node::{Lookahead, NodeError, ReplySender, ReplyStream, SessionState, serve_rounds_lending};
use specd_proto::in_process::{Rounds, ServesRounds};
use specd_proto::v1::draft_service_server::DraftService;
use specd_proto::v1::{
    InfoRequest, NgramSpan, NodeInfo, OpenSessionRequest, OpenSessionResponse, ProposeRequest, ProposeResponse,
    PushedBlock, ReleaseRequest, ReleaseResponse,
};
use specd_sampling::{MAX_GAMMA, TreeShape, Truncation};
use specd_telemetry::attributes;
use tokio_stream::Stream;
use tonic::{Request, Response, Status, Streaming};
use tracing::Instrument;
use tracing_opentelemetry::OpenTelemetrySpanExt;

use crate::propose::{Ahead, Proposal, ProposeJob, draft_ahead, propose};
use crate::propose_tree::{TreeJob, propose_tree};
use crate::{DraftNode, Proposer};

/// Replies and pushed blocks queued on one stream: the blocks a session keeps ahead, the
/// elided replies to their requests, and room to spare.
const PUSH_QUEUE: usize = 2 * MAX_PUSH_DEPTH + 4;

/// The deepest drafting ahead a request gets (ProposeRequest.push_depth).
pub const MAX_PUSH_DEPTH: usize = 16;

/// The sending side of a session's ProposeStream.
type Replies = ReplySender<ProposeResponse>;

/// A Propose's reply, and the drafting ahead it made ready, which is started once the reply
/// is on its way: on a stream, the blocks it pushes must come after the reply.
struct Answered {
    reply: ProposeResponse,
    ahead: Option<DraftingAhead>,
}

/// Drafting ahead that is registered (the session's next Propose can stop it) and not yet
/// running.
struct DraftingAhead(Pin<Box<dyn Future<Output = ()> + Send>>);

impl DraftingAhead {
    fn start(self) {
        tokio::spawn(self.0);
    }
}

/// A complete block drafted ahead, as the unsolicited message that pushes it.
fn pushed_reply(block: &Lookahead) -> ProposeResponse {
    ProposeResponse {
        positions: block.positions.clone(),
        draft_ns: 0,
        optimistic_hit: true,
        pushed: Some(PushedBlock {
            round: block.round,
            rollback_to: block.rollback_to as u32,
            guess_token_id: block.guess.unwrap_or_default(),
        }),
        elided: false,
        // Drafted in the background, between requests: counted with no request.
        forward_passes: 0,
        batched_sequences: 0,
    }
}

#[tonic::async_trait]
impl DraftService for DraftNode {
    async fn info(&self, _: Request<InfoRequest>) -> Result<Response<NodeInfo>, Status> {
        let info = match &self.proposer {
            Proposer::Model { node, ngram } => {
                let proposer = if ngram.is_some() { "model+ngram" } else { "model" };
                NodeInfo { proposer: proposer.into(), ..node.info().await? }
            }
            Proposer::Lookup(node) => node.info(),
        };
        Ok(Response::new(info))
    }

    async fn open_session(
        &self,
        request: Request<OpenSessionRequest>,
    ) -> Result<Response<OpenSessionResponse>, Status> {
        let span = rpc_span("open_session", request.metadata());
        let (only_after_match, copies_besides_model, draws_trees, cached_tokens) = match &self.proposer {
            Proposer::Model { node, ngram } => {
                let cached = node.open(request.into_inner()).instrument(span).await?;
                (None, ngram.is_some(), true, cached)
            }
            Proposer::Lookup(node) => {
                span.in_scope(|| node.open(request.into_inner()))?;
                (node.proposes_only_after_match(), false, false, 0)
            }
        };
        let proposes_only_after_match =
            only_after_match.map(|span| NgramSpan { min: span.min as u32, max: span.max as u32 });
        let reply = OpenSessionResponse {
            proposes_only_after_match,
            copies_besides_model,
            draws_trees,
            cached_tokens: cached_tokens as u32,
            ..Default::default()
        };
        Ok(Response::new(reply))
    }

    async fn propose(&self, request: Request<ProposeRequest>) -> Result<Response<ProposeResponse>, Status> {
        let Answered { reply, ahead } = self.propose_one(request.into_inner(), None).await?;
        // Nothing is pushed without a stream: the drafting ahead only fills the lookahead
        // that the session's next Propose reads.
        if let Some(ahead) = ahead {
            ahead.start();
        }
        Ok(Response::new(reply))
    }

    type ProposeStreamStream = ReplyStream<ProposeResponse>;

    async fn propose_stream(
        &self,
        request: Request<Streaming<ProposeRequest>>,
    ) -> Result<Response<Self::ProposeStreamStream>, Status> {
        Ok(Response::new(self.propose_rounds(request.into_inner())))
    }

    async fn release(&self, request: Request<ReleaseRequest>) -> Result<Response<ReleaseResponse>, Status> {
        let span = rpc_span("release", request.metadata());
        let request = request.into_inner();
        let id = request.session_id;
        let last = request.rollback_to.map(|valid| (valid as usize, request.pending_token_ids.as_slice()));
        let existed = match &self.proposer {
            Proposer::Model { node, .. } => node.release(&id, last).instrument(span).await?,
            Proposer::Lookup(node) => node.release(&id, last).instrument(span).await,
        };
        Ok(Response::new(ReleaseResponse { existed }))
    }
}

impl ServesRounds<ProposeRequest, ProposeResponse> for DraftNode {
    fn answer_rounds(&self, requests: Rounds<ProposeRequest>) -> Rounds<ProposeResponse> {
        Box::pin(self.propose_rounds(requests))
    }
}

impl DraftNode {
    /// A session's Propose stream, over gRPC or in process, with the stream's sender lent to
    /// the drafting ahead so that it can push blocks between the replies.
    fn propose_rounds(
        &self,
        requests: impl Stream<Item = Result<ProposeRequest, Status>> + Send + Unpin + 'static,
    ) -> ReplyStream<ProposeResponse> {
        let node = self.clone();
        serve_rounds_lending(requests, PUSH_QUEUE, move |request, replies| {
            let node = node.clone();
            async move {
                let Answered { reply, ahead } = node.propose_one(request, Some(&replies)).await?;
                // The reply goes out before any block drafted ahead of it: the coordinator
                // drops every block that arrives before a round's reply as stale. Where the
                // caller has gone, the drafting ahead still runs, and unregisters itself.
                let _ = replies.send(Ok(reply)).await;
                if let Some(ahead) = ahead {
                    ahead.start();
                }
                Ok(None)
            }
        })
    }

    /// One Propose, for the unary call and the stream alike; `stream`: where the stream's
    /// replies go, for blocks pushed ahead.
    async fn propose_one(&self, req: ProposeRequest, stream: Option<&Replies>) -> Result<Answered, NodeError> {
        let span = round_span("propose", &req.session_id, req.round, &req.trace_context);
        let answered = self.propose_in_span(req, stream).instrument(span.clone()).await?;
        span.set_attribute(attributes::NODE_MODEL_NS, answered.reply.draft_ns as i64);
        span.set_attribute(attributes::NODE_TOKENS, answered.reply.positions.len() as i64);
        Ok(answered)
    }

    async fn propose_in_span(&self, req: ProposeRequest, stream: Option<&Replies>) -> Result<Answered, NodeError> {
        self.interrupt(&req.session_id);
        if req.gamma > MAX_GAMMA {
            let message = format!("gamma {} is above the maximum {MAX_GAMMA}", req.gamma);
            return Err(NodeError::InvalidRequest(message));
        }
        let truncation = if req.dense {
            None
        } else {
            let wire = req.truncation.ok_or_else(|| NodeError::InvalidRequest("truncation is missing".into()))?;
            Some(Truncation::try_from(&wire)?)
        };
        if !req.tree_widths.is_empty() {
            return Ok(Answered { reply: self.propose_tree(req, truncation).await?, ahead: None });
        }
        let job = ProposeJob {
            round: req.round,
            rollback_to: req.rollback_to as usize,
            pending: req.pending_token_ids,
            gamma: req.gamma as usize,
            truncation,
            optimistic: req.optimistic,
            ngram: None,
        };
        let round = job.round;
        let proposal = match &self.proposer {
            Proposer::Model { node, ngram } => {
                let job = ProposeJob { ngram: ngram.filter(|_| !req.model_only), ..job };
                node.run(&req.session_id, move |m, state| propose(m, state, &job)).await?
            }
            Proposer::Lookup(node) => node.propose(&req.session_id, &job).await?,
        };
        let ahead = if proposal.draft_ahead {
            // Pushing needs a stream to push on; a depth above the cap is capped, not refused.
            let push = stream.filter(|_| req.push_depth > 0).cloned();
            let depth = (req.push_depth as usize).clamp(1, MAX_PUSH_DEPTH);
            self.draft_ahead(req.session_id, round, depth, push, req.model_only)
        } else {
            None
        };
        let Proposal { positions, draft_ns, optimistic_hit, elided, passes, .. } = proposal;
        let reply = ProposeResponse {
            positions,
            draft_ns,
            optimistic_hit,
            pushed: None,
            elided,
            forward_passes: passes.forward_passes,
            batched_sequences: passes.batched_sequences,
        };
        Ok(Answered { reply, ahead })
    }

    /// A tree's Propose: from the model only (an n-gram or suffix proposer has one
    /// continuation per match, not a distribution to draw several children from).
    async fn propose_tree(
        &self,
        req: ProposeRequest,
        truncation: Option<Truncation>,
    ) -> Result<ProposeResponse, NodeError> {
        let Proposer::Model { node, .. } = &self.proposer else {
            return Err(NodeError::InvalidRequest("a draft with no model proposes chains, not trees".into()));
        };
        let widths = req.tree_widths.iter().map(|&w| w as usize).collect();
        let shape = TreeShape::new(widths).map_err(NodeError::InvalidRequest)?;
        let job = TreeJob {
            round: req.round,
            rollback_to: req.rollback_to as usize,
            pending: req.pending_token_ids,
            shape,
            truncation,
        };
        let proposal = node.run(&req.session_id, move |m, state| propose_tree(m, state, &job)).await?;
        Ok(ProposeResponse {
            positions: proposal.positions,
            draft_ns: proposal.draft_ns,
            forward_passes: proposal.passes.forward_passes,
            batched_sequences: proposal.passes.batched_sequences,
            ..Default::default()
        })
    }

    /// Makes ready the drafting of the blocks after round `round` ahead, in one model job,
    /// pushing each on `push` when there is one; it runs once started, after the reply.
    /// Its stop flag is registered now, before the reply goes out, so the next Propose of the
    /// session always finds it: that Propose waits for one forward pass at most, then takes
    /// or drops what is done. `model_only`: as the request that started it
    /// (`ProposeRequest.model_only`).
    fn draft_ahead(
        &self,
        session_id: String,
        round: u32,
        depth: usize,
        push: Option<Replies>,
        model_only: bool,
    ) -> Option<DraftingAhead> {
        let Proposer::Model { node, ngram } = &self.proposer else { return None };
        let (node, ngram) = (node.clone(), ngram.filter(|_| !model_only));
        let (purpose, interrupts) = (self.lookahead_purpose, self.interrupts.clone());
        let corrupt = self.corrupt_pushes;
        let stop = Arc::new(AtomicBool::new(false));
        interrupts.lock().expect("interrupts lock").insert(session_id.clone(), Arc::clone(&stop));
        let span = tracing::debug_span!("draft_ahead", session = %session_id, round);
        let work = async move {
            let flag = Arc::clone(&stop);
            let job = move |m: &mut dyn LanguageModel, state: &mut SessionState| {
                // Sent from the model thread, inside the job: a pushed block is on the stream
                // before the reply to any later request, which is what lets that reply leave
                // it out. A full queue (a coordinator that stopped reading) pushes nothing.
                let mut send = |block: &Lookahead| {
                    let mut reply = pushed_reply(block);
                    if let Some(first) = reply.positions.first_mut().filter(|_| corrupt) {
                        first.token_id = u32::MAX;
                    }
                    push.as_ref().is_some_and(|replies| replies.try_send(Ok(reply)).is_ok())
                };
                let push: Option<&mut dyn FnMut(&Lookahead) -> bool> =
                    if push.is_some() { Some(&mut send) } else { None };
                let mut ahead = Ahead { after_round: round, depth, purpose, push, ngram };
                draft_ahead(m, state, &mut ahead, &flag)
            };
            let result = node.run(&session_id, job).await;
            let mut interrupts = interrupts.lock().expect("interrupts lock");
            if interrupts.get(&session_id).is_some_and(|f| Arc::ptr_eq(f, &stop)) {
                interrupts.remove(&session_id);
            }
            // The session is gone, or the job failed and the session dropped its lookahead:
            // the next Propose drafts as if there had been none.
            if let Err(err) = result {
                tracing::debug!(%err, "drafting ahead stopped");
            }
        };
        Some(DraftingAhead(Box::pin(work.instrument(span))))
    }

    /// Stops the session's drafting ahead before its next forward pass, if it is running.
    fn interrupt(&self, session_id: &str) {
        if let Some(stop) = self.interrupts.lock().expect("interrupts lock").get(session_id) {
            stop.store(true, Ordering::Release);
        }
    }
}
