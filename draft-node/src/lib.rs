//! specd-draft-node: the cheap model of speculative decoding, served over gRPC.
//!
//! For each round the coordinator sends a rollback point, the committed tokens the node has
//! not seen, and γ; the node catches its KV cache up, samples γ candidates one step at a
//! time, each from its effective q (truncated to a sparse support unless the dense wire
//! format is asked for), and returns them with exactly the q they were drawn from.
//!
//! - [`node`]: [`DraftNode`] (model worker and sessions) and [`DraftConfig`];
//! - [`propose`]: one block, run on the model thread;
//! - [`service`]: the `specd.v1.DraftService` implementation;
//! - [`error`]: [`DraftError`] and its status codes;
//! - [`run`] / [`serve`]: the server, with health and reflection.

pub mod error;
pub mod node;
pub mod propose;
pub mod service;

use std::future::Future;

use specd_proto::v1::draft_service_server::DraftServiceServer;
use tokio::net::TcpListener;

pub use error::DraftError;
pub use node::{DraftConfig, DraftNode};

/// Loads the model, then serves until `shutdown` resolves.
pub async fn run(
    listener: TcpListener,
    config: DraftConfig,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), ServeError> {
    let node =
        tokio::task::spawn_blocking(move || DraftNode::load(config)).await.map_err(|e| ServeError::join(&e))??;
    serve(listener, node, shutdown).await
}

/// Serves a loaded node: DraftService, grpc.health.v1 and server reflection.
pub async fn serve(
    listener: TcpListener,
    node: DraftNode,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), ServeError> {
    let (health, health_service) = tonic_health::server::health_reporter();
    health.set_serving::<DraftServiceServer<DraftNode>>().await;
    let reflection = tonic_reflection::server::Builder::configure()
        .register_encoded_file_descriptor_set(specd_proto::FILE_DESCRIPTOR_SET)
        .register_encoded_file_descriptor_set(tonic_health::pb::FILE_DESCRIPTOR_SET)
        .build_v1()
        .map_err(|e| ServeError::Transport(e.to_string()))?;
    tracing::info!(addr = ?listener.local_addr().ok(), "draft node serving");
    tonic::transport::Server::builder()
        .add_service(health_service)
        .add_service(reflection)
        .add_service(DraftServiceServer::new(node))
        .serve_with_incoming_shutdown(specd_proto::transport::incoming(listener), shutdown)
        .await
        .map_err(|e| ServeError::Transport(e.to_string()))
}

/// Why a node could not start or stopped serving.
#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    #[error(transparent)]
    Node(#[from] DraftError),
    #[error("transport: {0}")]
    Transport(String),
}

impl ServeError {
    fn join(err: &tokio::task::JoinError) -> Self {
        Self::Transport(format!("model loading task failed: {err}"))
    }
}
