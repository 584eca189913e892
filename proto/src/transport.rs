//! The serving side every specd role shares: accepted connections without Nagle's delay, and
//! a server with grpc.health.v1 and server reflection next to the role's own service.

use std::future::Future;

use tokio::net::{TcpListener, TcpStream};
use tokio_stream::wrappers::TcpListenerStream;
use tokio_stream::{Stream, StreamExt};
use tonic::service::Routes;
use tonic_health::ServingStatus;

use crate::tls::ServerTls;

/// Accepted connections with Nagle's algorithm off. A round is a few small request/response
/// messages; with Nagle on, each can wait for the peer's delayed ACK (tens of milliseconds),
/// which would dwarf the model's work.
pub fn incoming(listener: TcpListener) -> impl Stream<Item = std::io::Result<TcpStream>> {
    TcpListenerStream::new(listener).map(|accepted| {
        if let Ok(stream) = &accepted {
            let _ = stream.set_nodelay(true);
        }
        accepted
    })
}

/// Why a server could not start or stopped.
#[derive(Debug, thiserror::Error)]
#[error("gRPC server: {0}")]
pub struct ServeError(String);

/// Serves `routes` (the role's service, registered in health as `service_name`), health and
/// reflection on `listener`, over TLS when `tls` has a certificate, until `shutdown` resolves. Then health says NOT_SERVING, no new
/// connection or request is taken, and the future returns once the requests in flight have
/// finished (the caller bounds that wait: see `specd`'s `--shutdown-grace-s`).
pub async fn serve(
    listener: TcpListener,
    routes: Routes,
    service_name: &'static str,
    tls: &ServerTls,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), ServeError> {
    let mut builder = tonic::transport::Server::builder();
    if let Some(config) = tls.config().map_err(|e| ServeError(e.to_string()))? {
        builder = builder.tls_config(config).map_err(|e| ServeError(format!("TLS: {e}")))?;
    }
    let (health, health_service) = tonic_health::server::health_reporter();
    health.set_service_status(service_name, ServingStatus::Serving).await;
    health.set_service_status("", ServingStatus::Serving).await;
    // Both reflection versions: grpcurl and newer tools speak v1, while grpcio's own
    // reflection client and other tools of its age speak only v1alpha.
    let descriptors = || {
        tonic_reflection::server::Builder::configure()
            .register_encoded_file_descriptor_set(crate::FILE_DESCRIPTOR_SET)
            .register_encoded_file_descriptor_set(tonic_health::pb::FILE_DESCRIPTOR_SET)
    };
    let reflection = descriptors().build_v1().map_err(|e| ServeError(e.to_string()))?;
    let reflection_v1alpha = descriptors().build_v1alpha().map_err(|e| ServeError(e.to_string()))?;
    tracing::info!(addr = ?listener.local_addr().ok(), service = service_name, tls = tls.cert.is_some(), mutual_tls = tls.client_ca.is_some(), "serving");
    let shutdown = async move {
        shutdown.await;
        health.set_service_status(service_name, ServingStatus::NotServing).await;
        health.set_service_status("", ServingStatus::NotServing).await;
        tracing::info!(service = service_name, "draining: no new requests, waiting for those in flight");
    };
    builder
        .add_routes(routes)
        .add_service(health_service)
        .add_service(reflection)
        .add_service(reflection_v1alpha)
        .serve_with_incoming_shutdown(incoming(listener), shutdown)
        .await
        .map_err(|e| ServeError(e.to_string()))
}
