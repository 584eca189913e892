//! specd-draft-node: the cheap model of speculative decoding, served over gRPC.
//!
//! For each round the coordinator sends a rollback point, the committed tokens the node has
//! not seen, and γ; the node catches its KV cache up, samples γ candidates one step at a
//! time, each from its effective q (truncated to a sparse support unless the dense wire
//! format is asked for), and returns them with exactly the q they were drawn from. Asked to
//! (optimistic drafting), it then drafts the next block ahead while the coordinator verifies
//! this one, and answers the next round at once when its guess was right.
//!
//! The proposer need not be a model (`--proposer`, docs/rule.md, deterministic proposers):
//! `ngram` and `suffix` copy tokens with q = one-hot and run no model at all; `model+ngram`
//! copies where the history has a match and samples from the model elsewhere.
//!
//! - [`proposer`]: the proposers' pure logic (n-gram lookup, the suffix index) and
//!   `--proposer`'s values;
//! - [`propose`]: one block, run on the model thread, and the block drafted ahead;
//! - [`propose_tree`]: one tree of candidates (`ProposeRequest.tree_widths`), from the model;
//! - [`lookup`]: a draft node with no model: sessions, proposals, the suffix index;
//! - [`service`]: the `specd.v1.DraftService` implementation;
//! - [`run`] / [`serve`]: the server; sessions, errors and configuration come from
//!   `specd-node`.

pub mod lookup;
pub mod propose;
pub mod propose_tree;
pub mod proposer;
pub mod service;

use std::collections::HashMap;
use std::future::Future;
use std::sync::atomic::AtomicBool;
use std::sync::{Arc, Mutex};

use lookup::LookupNode;
use proposer::{MatchSpan, ProposerConfig, ProposerKind};
use specd_node::{Node, NodeConfig, NodeError, NodeServeError};
use specd_proto::transport::ServeError;
use specd_proto::v1::draft_service_server::DraftServiceServer;
use specd_sampling::Purpose;
use tokio::net::TcpListener;
use tonic::server::NamedService;
use tonic::service::Routes;

/// A draft node's proposer: a loaded model (with n-gram lookup first for `model+ngram`), or
/// no model at all.
#[derive(Debug, Clone)]
pub(crate) enum Proposer {
    Model { node: Node, ngram: Option<MatchSpan> },
    Lookup(LookupNode),
}

/// A draft node: its proposer and its sessions. Cheap to clone.
#[derive(Debug, Clone)]
pub struct DraftNode {
    proposer: Proposer,
    tls: specd_proto::tls::ServerTls,
    /// Randomness of the blocks drafted ahead: always [`Purpose::Draft`] in service.
    lookahead_purpose: Purpose,
    /// The stop flag of each session's drafting ahead while it runs.
    interrupts: Interrupts,
    /// Push blocks with a token outside the vocabulary: false in service.
    corrupt_pushes: bool,
}

type Interrupts = Arc<Mutex<HashMap<String, Arc<AtomicBool>>>>;

impl DraftNode {
    /// Loads the model on its own worker thread (`--proposer model`).
    pub async fn load(config: NodeConfig) -> Result<Self, NodeError> {
        Self::start(config, ProposerConfig::default()).await
    }

    /// Starts a draft node with `proposer`: a model loaded on its own worker thread, or, for
    /// a proposer that needs none, no model (`config.model` is not read then).
    pub async fn start(config: NodeConfig, proposer: ProposerConfig) -> Result<Self, NodeError> {
        let tls = config.tls.clone();
        let proposer = if proposer.kind.needs_model() {
            let ngram = (proposer.kind == ProposerKind::ModelNgram).then_some(proposer.span);
            Proposer::Model { node: Node::load_async("draft", config).await?, ngram }
        } else {
            let node = LookupNode::new(proposer, config.max_sessions);
            if let Some(ttl) = config.session_ttl {
                node.spawn_reaper(ttl);
            }
            Proposer::Lookup(node)
        };
        Ok(Self {
            proposer,
            tls,
            lookahead_purpose: Purpose::Draft,
            interrupts: Interrupts::default(),
            corrupt_pushes: false,
        })
    }

    /// The node of its model (to set its KV budget where a process starts two nodes); `None`
    /// for a proposer without one.
    pub fn model_node(&self) -> Option<&Node> {
        match &self.proposer {
            Proposer::Model { node, .. } => Some(node),
            Proposer::Lookup(_) => None,
        }
    }

    /// The node with no model behind a `ngram` or `suffix` proposer; `None` for a model.
    pub fn lookup(&self) -> Option<&LookupNode> {
        match &self.proposer {
            Proposer::Lookup(node) => Some(node),
            Proposer::Model { .. } => None,
        }
    }

    /// Pushes every block drafted ahead with its first candidate replaced by a token outside
    /// the vocabulary (the reply to a request stays right). Wrong: it exists so that tests can
    /// show a coordinator takes such a draft for a failed one and goes on without it.
    #[cfg(feature = "testing")]
    pub fn with_corrupt_pushes(mut self) -> Self {
        self.corrupt_pushes = true;
        self
    }

    /// Draws the candidates of blocks drafted ahead from the streams of `purpose` instead of
    /// [`Purpose::Draft`]. Wrong for anything but [`Purpose::Draft`] (with
    /// [`Purpose::Accept`] a candidate and the coordinator's uniform for accepting it are
    /// one draw): it exists so that the law tests can show they catch such a draft.
    #[cfg(feature = "testing")]
    pub fn with_lookahead_purpose(mut self, purpose: Purpose) -> Self {
        self.lookahead_purpose = purpose;
        self
    }
}

/// Loads the model, then serves until `shutdown` resolves.
pub async fn run(
    listener: TcpListener,
    config: NodeConfig,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), NodeServeError> {
    let node = DraftNode::load(config).await?;
    Ok(serve(listener, node, shutdown).await?)
}

/// Serves a loaded node: DraftService, grpc.health.v1 and server reflection.
pub async fn serve(
    listener: TcpListener,
    node: DraftNode,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), ServeError> {
    let name = <DraftServiceServer<DraftNode> as NamedService>::NAME;
    let tls = node.tls.clone();
    specd_proto::transport::serve(listener, Routes::new(DraftServiceServer::new(node)), name, &tls, shutdown).await
}
