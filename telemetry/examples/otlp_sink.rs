//! A minimal OTLP/gRPC trace receiver that only counts what it gets, for measuring the cost
//! of exporting traces (`scripts/measure_overhead.sh --otlp`). Prints `listening on ADDR`,
//! then the running span count every second on stderr.
//!
//! `cargo run --release -p specd-telemetry --example otlp_sink -- 127.0.0.1:4317`

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use opentelemetry_proto::tonic::collector::trace::v1::trace_service_server::{TraceService, TraceServiceServer};
use opentelemetry_proto::tonic::collector::trace::v1::{ExportTraceServiceRequest, ExportTraceServiceResponse};
use tonic::{Request, Response, Status};

#[derive(Default, Clone)]
struct Counter(Arc<AtomicU64>);

#[tonic::async_trait]
impl TraceService for Counter {
    async fn export(
        &self,
        request: Request<ExportTraceServiceRequest>,
    ) -> Result<Response<ExportTraceServiceResponse>, Status> {
        let spans: usize =
            request.get_ref().resource_spans.iter().flat_map(|r| &r.scope_spans).map(|s| s.spans.len()).sum();
        self.0.fetch_add(spans as u64, Ordering::Relaxed);
        Ok(Response::new(ExportTraceServiceResponse { partial_success: None }))
    }
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let addr = std::env::args().nth(1).unwrap_or_else(|| "127.0.0.1:4317".into());
    let listener = tokio::net::TcpListener::bind(&addr).await?;
    println!("listening on {}", listener.local_addr()?);
    let counter = Counter::default();
    let seen = Arc::clone(&counter.0);
    tokio::spawn(async move {
        loop {
            tokio::time::sleep(Duration::from_secs(1)).await;
            eprintln!("spans received: {}", seen.load(Ordering::Relaxed));
        }
    });
    tonic::transport::Server::builder()
        .add_service(TraceServiceServer::new(counter))
        .serve_with_incoming(tokio_stream::wrappers::TcpListenerStream::new(listener))
        .await?;
    Ok(())
}
