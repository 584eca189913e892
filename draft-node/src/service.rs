//! The `DraftService` gRPC implementation over a [`DraftNode`].

use specd_proto::convert::{dense_proposal, sparse_proposal};
use specd_proto::v1::draft_service_server::DraftService;
use specd_proto::v1::{
    InfoRequest, NodeInfo, OpenSessionRequest, OpenSessionResponse, ProposeRequest, ProposeResponse, ReleaseRequest,
    ReleaseResponse,
};
use specd_sampling::{MAX_GAMMA, SamplingParams, Truncation};
use tonic::{Request, Response, Status};

use crate::error::DraftError;
use crate::node::DraftNode;
use crate::propose::{ProposalDist, ProposeJob};

#[tonic::async_trait]
impl DraftService for DraftNode {
    async fn info(&self, _: Request<InfoRequest>) -> Result<Response<NodeInfo>, Status> {
        let info = self.model.handle().info();
        Ok(Response::new(NodeInfo {
            role: "draft".into(),
            model_id: info.name.clone(),
            vocab_size: info.vocab_size as u32,
            tokenizer_fingerprint: info.tokenizer_fingerprint.clone(),
            device: self.config.device.to_string(),
            dtype: self.config.dtype.to_string(),
            context_length: info.context_length as u32,
            eos_token_ids: info.eos_token_ids.clone(),
            active_sessions: self.model.active_sessions() as u32,
            kv_cache_bytes: self.model.kv_cache_bytes().await.map_err(DraftError::from)?,
            has_tokenizer: info.has_tokenizer,
        }))
    }

    async fn open_session(
        &self,
        request: Request<OpenSessionRequest>,
    ) -> Result<Response<OpenSessionResponse>, Status> {
        let req = request.into_inner();
        let sampling = req.sampling.ok_or_else(|| DraftError::InvalidRequest("sampling is missing".into()))?;
        let params = SamplingParams::try_from(&sampling).map_err(DraftError::from)?;
        self.open_session(req.session_id, req.prompt_token_ids, params, req.seed).await?;
        Ok(Response::new(OpenSessionResponse {}))
    }

    async fn propose(&self, request: Request<ProposeRequest>) -> Result<Response<ProposeResponse>, Status> {
        let req = request.into_inner();
        if req.gamma > MAX_GAMMA {
            return Err(
                DraftError::InvalidRequest(format!("gamma {} is above the maximum {MAX_GAMMA}", req.gamma)).into()
            );
        }
        let truncation = if req.dense {
            None
        } else {
            let wire = req.truncation.ok_or_else(|| DraftError::InvalidRequest("truncation is missing".into()))?;
            Some(Truncation::try_from(&wire).map_err(DraftError::from)?)
        };
        let job = ProposeJob {
            round: req.round,
            rollback_to: req.rollback_to as usize,
            pending: req.pending_token_ids,
            gamma: req.gamma as usize,
            truncation,
        };
        let proposal = DraftNode::propose(self, &req.session_id, job).await?;
        let positions = proposal
            .candidates
            .iter()
            .map(|(token, dist)| match dist {
                ProposalDist::Sparse(q) => sparse_proposal(*token, q),
                ProposalDist::Dense(q) => dense_proposal(*token, q),
            })
            .collect();
        Ok(Response::new(ProposeResponse { positions, draft_ns: proposal.draft_ns }))
    }

    async fn release(&self, request: Request<ReleaseRequest>) -> Result<Response<ReleaseResponse>, Status> {
        let existed = DraftNode::release(self, &request.into_inner().session_id).await?;
        Ok(Response::new(ReleaseResponse { existed }))
    }
}
