//! Round streams to nodes served in the coordinator's own process (`specd up`, `specd bench
//! --embedded`): the `*Stream` RPCs' messages handed over on channels, with no protobuf
//! encoding, HTTP/2 framing or socket between the roles. The messages, their order and the
//! node's handling are the RPC's; the hand-over differs, and so does one limit: gRPC's
//! 4 MiB a message does not apply here (a dense round at a large vocabulary can exceed it,
//! which fails over gRPC). BENCHMARKS.md has what the hand-over saves a round (`cargo bench
//! -p specd-proto --bench round_transport`).

use std::collections::HashMap;
use std::fmt;
use std::pin::Pin;
use std::sync::Arc;

use tokio_stream::Stream;
use tonic::Status;

use crate::v1::{ProposeRequest, ProposeResponse, VerifyRequest, VerifyResponse};

/// One side of a round stream: messages, or the status that ended it.
pub type Rounds<M> = Pin<Box<dyn Stream<Item = Result<M, Status>> + Send>>;

/// A node that answers a session's round stream in this process exactly as its `*Stream`
/// RPC answers one over the network.
pub trait ServesRounds<Q, R>: Send + Sync + fmt::Debug {
    /// Answers `requests` in order on the returned stream, until they end or one fails.
    fn answer_rounds(&self, requests: Rounds<Q>) -> Rounds<R>;
}

/// A target served in this process.
pub type LocalTarget = Arc<dyn ServesRounds<VerifyRequest, VerifyResponse>>;
/// A draft served in this process.
pub type LocalDraft = Arc<dyn ServesRounds<ProposeRequest, ProposeResponse>>;

/// The nodes this process serves, by the URL each also serves on over gRPC: a coordinator
/// that dials one of these URLs sends its round streams through the node's handle instead,
/// and everything else (sessions, releases, health) over gRPC as usual.
#[derive(Debug, Clone, Default)]
pub struct InProcessNodes {
    targets: HashMap<String, LocalTarget>,
    drafts: HashMap<String, LocalDraft>,
}

impl InProcessNodes {
    pub fn with_target(mut self, url: impl Into<String>, node: LocalTarget) -> Self {
        self.targets.insert(url.into(), node);
        self
    }

    pub fn with_draft(mut self, url: impl Into<String>, node: LocalDraft) -> Self {
        self.drafts.insert(url.into(), node);
        self
    }

    pub fn target(&self, url: &str) -> Option<LocalTarget> {
        self.targets.get(url).cloned()
    }

    pub fn draft(&self, url: &str) -> Option<LocalDraft> {
        self.drafts.get(url).cloned()
    }
}
