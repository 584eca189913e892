//! specd-target-node: the big model of speculative decoding, served over gRPC.
//!
//! For each round the coordinator sends a rollback point, the committed tokens the node has
//! not seen, and the draft's candidates; the node runs **one** forward pass over all of them
//! and returns, for the sparse wire format, p on each draft support, the complement mass, a
//! sample from the complement, and a bonus sample from p at position γ+1 (DESIGN.md §1);
//! for the dense format, p at every position.
//!
//! - [`node`]: [`TargetNode`] (model worker and sessions) and [`TargetConfig`];
//! - [`verify`]: one block, run on the model thread;
//! - [`service`]: the `specd.v1.TargetService` implementation;
//! - [`error`]: [`TargetError`] and its status codes;
//! - [`run`] / [`serve`]: the server, with health and reflection.

pub mod error;
pub mod node;
pub mod service;
pub mod verify;

use std::future::Future;

use specd_proto::v1::target_service_server::TargetServiceServer;
use tokio::net::TcpListener;

pub use error::TargetError;
pub use node::{TargetConfig, TargetNode};

/// Loads the model, then serves until `shutdown` resolves.
pub async fn run(
    listener: TcpListener,
    config: TargetConfig,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), ServeError> {
    let node =
        tokio::task::spawn_blocking(move || TargetNode::load(config)).await.map_err(|e| ServeError::join(&e))??;
    serve(listener, node, shutdown).await
}

/// Serves a loaded node: DraftService, grpc.health.v1 and server reflection.
pub async fn serve(
    listener: TcpListener,
    node: TargetNode,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), ServeError> {
    let (health, health_service) = tonic_health::server::health_reporter();
    health.set_serving::<TargetServiceServer<TargetNode>>().await;
    let reflection = tonic_reflection::server::Builder::configure()
        .register_encoded_file_descriptor_set(specd_proto::FILE_DESCRIPTOR_SET)
        .register_encoded_file_descriptor_set(tonic_health::pb::FILE_DESCRIPTOR_SET)
        .build_v1()
        .map_err(|e| ServeError::Transport(e.to_string()))?;
    tracing::info!(addr = ?listener.local_addr().ok(), "target node serving");
    tonic::transport::Server::builder()
        .add_service(health_service)
        .add_service(reflection)
        .add_service(TargetServiceServer::new(node))
        .serve_with_incoming_shutdown(specd_proto::transport::incoming(listener), shutdown)
        .await
        .map_err(|e| ServeError::Transport(e.to_string()))
}

/// Why a node could not start or stopped serving.
#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    #[error(transparent)]
    Node(#[from] TargetError),
    #[error("transport: {0}")]
    Transport(String),
}

impl ServeError {
    fn join(err: &tokio::task::JoinError) -> Self {
        Self::Transport(format!("model loading task failed: {err}"))
    }
}
