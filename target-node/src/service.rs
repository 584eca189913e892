//! The `TargetService` gRPC implementation over a [`TargetNode`].

use specd_node::spans::{round_span, rpc_span};
use specd_node::{NodeError, ReplyStream, serve_rounds};
use specd_proto::convert::{scored_positions, scored_tree_nodes};
use specd_proto::in_process::{Rounds, ServesRounds};
use specd_proto::v1::target_service_server::TargetService;
use specd_proto::v1::{
    DenseRow, DetokenizeRequest, DetokenizeResponse, InfoRequest, NodeInfo, OpenSessionRequest, OpenSessionResponse,
    ReleaseRequest, ReleaseResponse, TargetLawRequest, TargetLawResponse, TextAssetsRequest, TextAssetsResponse,
    TokenizeRequest, TokenizeResponse, VerifyRequest, VerifyResponse,
};
use specd_sampling::logprobs::MAX_TOP_LOGPROBS;
use specd_sampling::{MAX_GAMMA, MAX_TREE_CANDIDATES, SamplingParams};
use specd_telemetry::attributes;
use tokio_stream::Stream;
use tonic::{Request, Response, Status, Streaming};
use tracing::Instrument;
use tracing_opentelemetry::OpenTelemetrySpanExt;

use crate::TargetNode;
use crate::law::{LawJob, next_token_law};
use crate::verify::{Verdict, VerifyJob, verify};

#[tonic::async_trait]
impl TargetService for TargetNode {
    async fn info(&self, _: Request<InfoRequest>) -> Result<Response<NodeInfo>, Status> {
        Ok(Response::new(self.node.info().await?))
    }

    async fn open_session(
        &self,
        request: Request<OpenSessionRequest>,
    ) -> Result<Response<OpenSessionResponse>, Status> {
        let span = rpc_span("open_session", request.metadata());
        let cached = self.node.open(request.into_inner()).instrument(span).await?;
        let reply = OpenSessionResponse { scores_trees: true, cached_tokens: cached as u32, ..Default::default() };
        Ok(Response::new(reply))
    }

    async fn verify(&self, request: Request<VerifyRequest>) -> Result<Response<VerifyResponse>, Status> {
        Ok(Response::new(self.verify_one(request.into_inner()).await?))
    }

    type VerifyStreamStream = ReplyStream<VerifyResponse>;

    async fn verify_stream(
        &self,
        request: Request<Streaming<VerifyRequest>>,
    ) -> Result<Response<Self::VerifyStreamStream>, Status> {
        Ok(Response::new(self.verify_rounds(request.into_inner())))
    }
    async fn target_law(&self, request: Request<TargetLawRequest>) -> Result<Response<TargetLawResponse>, Status> {
        let req = request.into_inner();
        let sampling = req.sampling.ok_or_else(|| NodeError::InvalidRequest("sampling is missing".into()))?;
        let params = SamplingParams::try_from(&sampling).map_err(NodeError::from)?;
        let job = LawJob { prompt: req.prompt_token_ids, generated: req.generated_token_ids, params };
        let law =
            self.node.model().handle().call(move |m| Ok(next_token_law(m, &job))).await.map_err(NodeError::from)??;
        let (token_ids, probs) =
            law.probs().iter().enumerate().filter(|(_, p)| **p > 0.0).map(|(id, p)| (id as u32, *p)).unzip();
        Ok(Response::new(TargetLawResponse { token_ids, probs }))
    }

    async fn release(&self, request: Request<ReleaseRequest>) -> Result<Response<ReleaseResponse>, Status> {
        let span = rpc_span("release", request.metadata());
        let request = request.into_inner();
        let last = request.rollback_to.map(|valid| (valid as usize, request.pending_token_ids.as_slice()));
        let existed = self.node.release(&request.session_id, last).instrument(span).await?;
        Ok(Response::new(ReleaseResponse { existed }))
    }

    async fn tokenize(&self, request: Request<TokenizeRequest>) -> Result<Response<TokenizeResponse>, Status> {
        let text = request.into_inner().text;
        let token_ids = self.node.model().handle().encode(text).await.map_err(NodeError::from)?;
        Ok(Response::new(TokenizeResponse { token_ids }))
    }

    async fn detokenize(&self, request: Request<DetokenizeRequest>) -> Result<Response<DetokenizeResponse>, Status> {
        let ids = request.into_inner().token_ids;
        let text = self.node.model().handle().call(move |m| m.decode(&ids)).await.map_err(NodeError::from)?;
        Ok(Response::new(DetokenizeResponse { text }))
    }

    async fn text_assets(&self, _: Request<TextAssetsRequest>) -> Result<Response<TextAssetsResponse>, Status> {
        let dir = self.node.config().model.clone();
        let assets = tokio::task::spawn_blocking(move || crate::text_assets::read(&dir))
            .await
            .map_err(|e| Status::internal(format!("reading the text files failed: {e}")))??;
        Ok(Response::new(assets))
    }
}

impl ServesRounds<VerifyRequest, VerifyResponse> for TargetNode {
    fn answer_rounds(&self, requests: Rounds<VerifyRequest>) -> Rounds<VerifyResponse> {
        Box::pin(self.verify_rounds(requests))
    }
}

impl TargetNode {
    /// A session's Verify stream, over gRPC or in process.
    fn verify_rounds(
        &self,
        requests: impl Stream<Item = Result<VerifyRequest, Status>> + Send + Unpin + 'static,
    ) -> ReplyStream<VerifyResponse> {
        let node = self.clone();
        let handle = move |req| {
            let node = node.clone();
            async move { node.verify_one(req).await.map_err(Status::from) }
        };
        serve_rounds(requests, handle)
    }

    /// One Verify, for the unary call and the stream alike.
    async fn verify_one(&self, req: VerifyRequest) -> Result<VerifyResponse, NodeError> {
        let span = round_span("verify", &req.session_id, req.round, &req.trace_context);
        let tokens = req.pending_token_ids.len() + req.candidate_token_ids.len();
        let reply = self.verify_in_span(req).instrument(span.clone()).await?;
        span.set_attribute(attributes::NODE_MODEL_NS, reply.verify_ns as i64);
        span.set_attribute(attributes::NODE_TOKENS, tokens as i64);
        Ok(reply)
    }

    async fn verify_in_span(&self, req: VerifyRequest) -> Result<VerifyResponse, NodeError> {
        let tree = !req.candidate_parents.is_empty();
        let most = if tree { MAX_TREE_CANDIDATES } else { MAX_GAMMA as usize };
        if req.candidate_token_ids.len() > most {
            return Err(NodeError::InvalidRequest(format!(
                "{} candidates, above the maximum {most}{}",
                req.candidate_token_ids.len(),
                if tree { " of a tree" } else { "" }
            )));
        }
        if tree && req.candidate_parents.len() != req.candidate_token_ids.len() {
            return Err(NodeError::InvalidRequest(format!(
                "{} parents for {} candidates",
                req.candidate_parents.len(),
                req.candidate_token_ids.len()
            )));
        }
        let supports = (!req.dense).then(|| req.supports.into_iter().map(|s| s.token_ids).collect());
        let job = VerifyJob {
            round: req.round,
            rollback_to: req.rollback_to as usize,
            pending: req.pending_token_ids,
            candidates: req.candidate_token_ids,
            supports,
            sampling_threads: self.node.sampling_threads(),
            logprobs: req.logprobs.map(|n| n.min(MAX_TOP_LOGPROBS) as usize),
            device_rule: self.node.config().faults.device_rule(),
            block_masks: self.node.config().faults.block_masks(),
            parents: tree.then(|| req.candidate_parents.iter().map(|&p| p as usize).collect()),
        };
        let verified = self.node.run(&req.session_id, move |m, state| verify(m, state, &job)).await?;
        let reply = match verified.verdict {
            Verdict::Sparse(block) => VerifyResponse {
                positions: scored_positions(&block),
                bonus_token_id: block.bonus,
                dense_p: Vec::new(),
                verify_ns: verified.verify_ns,
                batch_size: verified.batch_size as u32,
                logprobs: verified.logprobs,
                tree_nodes: Vec::new(),
            },
            Verdict::Dense(rows) => VerifyResponse {
                positions: Vec::new(),
                bonus_token_id: 0,
                dense_p: rows.iter().map(|p| DenseRow { probs: p.probs().to_vec() }).collect(),
                verify_ns: verified.verify_ns,
                batch_size: verified.batch_size as u32,
                logprobs: verified.logprobs,
                tree_nodes: Vec::new(),
            },
            Verdict::SparseTree(nodes) => VerifyResponse {
                tree_nodes: scored_tree_nodes(&nodes),
                verify_ns: verified.verify_ns,
                batch_size: verified.batch_size as u32,
                ..Default::default()
            },
            Verdict::DenseTree(rows) => VerifyResponse {
                dense_p: rows.iter().map(|p| DenseRow { probs: p.probs().to_vec() }).collect(),
                verify_ns: verified.verify_ns,
                batch_size: verified.batch_size as u32,
                ..Default::default()
            },
        };
        Ok(reply)
    }
}
