//! specd-target-node: the big model of speculative decoding, served over gRPC.
//!
//! For each round the coordinator sends a rollback point, the committed tokens the node has
//! not seen, and the draft's candidates; the node runs **one** forward pass over all of them
//! and returns, for the sparse wire format, p on each draft support, the complement mass, a
//! sample from the complement, and a bonus sample from p at position γ+1 (docs/rule.md);
//! for the dense format, p at every position. It sends the coordinator the model's text files
//! (`text_assets`), so that text work happens there and never on the model's thread.
//!
//! - [`verify`]: one block, run on the model thread;
//! - [`law`]: the exact next-token law after a prefix, for audits;
//! - [`service`]: the `specd.v1.TargetService` implementation;
//! - `text_assets`: the tokenizer, chat template and generation defaults, read for the coordinator;
//! - [`run`] / [`serve`]: the server; sessions, errors and configuration come from
//!   `specd-node`.

pub mod law;
pub mod service;
mod text_assets;
pub mod verify;

use std::future::Future;

use specd_node::{Node, NodeConfig, NodeError, NodeServeError};
use specd_proto::transport::ServeError;
use specd_proto::v1::target_service_server::TargetServiceServer;
use tokio::net::TcpListener;
use tonic::server::NamedService;
use tonic::service::Routes;

/// A loaded target model and its sessions. Cheap to clone.
#[derive(Debug, Clone)]
pub struct TargetNode {
    node: Node,
}

impl TargetNode {
    /// Loads the model on its own worker thread.
    pub async fn load(config: NodeConfig) -> Result<Self, NodeError> {
        Ok(Self { node: Node::load_async("target", config).await? })
    }

    /// The node its services run on (to set its KV budget where a process starts two nodes).
    pub fn node(&self) -> &Node {
        &self.node
    }
}

/// Loads the model, then serves until `shutdown` resolves.
pub async fn run(
    listener: TcpListener,
    config: NodeConfig,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), NodeServeError> {
    let node = TargetNode::load(config).await?;
    Ok(serve(listener, node, shutdown).await?)
}

/// Serves a loaded node: TargetService, grpc.health.v1 and server reflection.
pub async fn serve(
    listener: TcpListener,
    node: TargetNode,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), ServeError> {
    let name = <TargetServiceServer<TargetNode> as NamedService>::NAME;
    let tls = node.node.config().tls.clone();
    specd_proto::transport::serve(listener, Routes::new(TargetServiceServer::new(node)), name, &tls, shutdown).await
}
