//! The `DraftService` gRPC implementation over a [`DraftNode`].

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use specd_node::spans::{round_span, rpc_span};
use specd_node::{NodeError, ReplyStream, serve_rounds};
use specd_proto::v1::draft_service_server::DraftService;
use specd_proto::v1::{
    InfoRequest, NodeInfo, OpenSessionRequest, OpenSessionResponse, ProposeRequest, ProposeResponse, ReleaseRequest,
    ReleaseResponse,
};
use specd_sampling::{MAX_GAMMA, Truncation};
use specd_telemetry::attributes;
use tonic::{Request, Response, Status, Streaming};
use tracing::Instrument;
use tracing_opentelemetry::OpenTelemetrySpanExt;

use crate::DraftNode;
use crate::propose::{Proposal, ProposeJob, draft_ahead, propose};

#[tonic::async_trait]
impl DraftService for DraftNode {
    async fn info(&self, _: Request<InfoRequest>) -> Result<Response<NodeInfo>, Status> {
        Ok(Response::new(self.node.info().await?))
    }

    async fn open_session(
        &self,
        request: Request<OpenSessionRequest>,
    ) -> Result<Response<OpenSessionResponse>, Status> {
        let span = rpc_span("open_session", request.metadata());
        self.node.open(request.into_inner()).instrument(span).await?;
        Ok(Response::new(OpenSessionResponse {}))
    }

    async fn propose(&self, request: Request<ProposeRequest>) -> Result<Response<ProposeResponse>, Status> {
        Ok(Response::new(self.propose_one(request.into_inner()).await?))
    }

    type ProposeStreamStream = ReplyStream<ProposeResponse>;

    async fn propose_stream(
        &self,
        request: Request<Streaming<ProposeRequest>>,
    ) -> Result<Response<Self::ProposeStreamStream>, Status> {
        let node = self.clone();
        let handle = move |req| {
            let node = node.clone();
            async move { node.propose_one(req).await.map_err(Status::from) }
        };
        Ok(Response::new(serve_rounds(request.into_inner(), handle)))
    }

    async fn release(&self, request: Request<ReleaseRequest>) -> Result<Response<ReleaseResponse>, Status> {
        let span = rpc_span("release", request.metadata());
        let existed = self.node.release(&request.into_inner().session_id).instrument(span).await?;
        Ok(Response::new(ReleaseResponse { existed }))
    }
}

impl DraftNode {
    /// One Propose, for the unary call and the stream alike.
    async fn propose_one(&self, req: ProposeRequest) -> Result<ProposeResponse, NodeError> {
        let span = round_span("propose", &req.session_id, req.round, &req.trace_context);
        let reply = self.propose_in_span(req).instrument(span.clone()).await?;
        span.set_attribute(attributes::NODE_MODEL_NS, reply.draft_ns as i64);
        span.set_attribute(attributes::NODE_TOKENS, reply.positions.len() as i64);
        Ok(reply)
    }

    async fn propose_in_span(&self, req: ProposeRequest) -> Result<ProposeResponse, NodeError> {
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
        let job = ProposeJob {
            round: req.round,
            rollback_to: req.rollback_to as usize,
            pending: req.pending_token_ids,
            gamma: req.gamma as usize,
            truncation,
            optimistic: req.optimistic,
        };
        let round = job.round;
        let proposal = self.node.run(&req.session_id, move |m, state| propose(m, state, &job)).await?;
        if proposal.draft_ahead {
            self.draft_ahead(req.session_id, round.wrapping_add(1));
        }
        let Proposal { positions, draft_ns, optimistic_hit, passes, .. } = proposal;
        Ok(ProposeResponse {
            positions,
            draft_ns,
            optimistic_hit,
            forward_passes: passes.forward_passes,
            batched_sequences: passes.batched_sequences,
        })
    }

    /// Drafts the block of round `round` ahead in one model job, in the background. Its stop
    /// flag is registered before the reply goes out, so the next Propose of the session
    /// always finds it: that Propose waits for one forward pass at most, then takes or drops
    /// what is done.
    fn draft_ahead(&self, session_id: String, round: u32) {
        let (node, purpose, interrupts) = (self.node.clone(), self.lookahead_purpose, self.interrupts.clone());
        let stop = Arc::new(AtomicBool::new(false));
        interrupts.lock().expect("interrupts lock").insert(session_id.clone(), Arc::clone(&stop));
        let span = tracing::debug_span!("draft_ahead", session = %session_id, round);
        let work = async move {
            let flag = Arc::clone(&stop);
            let result = node.run(&session_id, move |m, state| draft_ahead(m, state, round, purpose, &flag)).await;
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
        tokio::spawn(work.instrument(span));
    }

    /// Stops the session's drafting ahead before its next forward pass, if it is running.
    fn interrupt(&self, session_id: &str) {
        if let Some(stop) = self.interrupts.lock().expect("interrupts lock").get(session_id) {
            stop.store(true, Ordering::Release);
        }
    }
}
