//! `GET /metrics`: the registry in the OpenMetrics text format, which Prometheus scrapes.

use std::future::Future;

use axum::Router;
use axum::extract::State;
use axum::http::StatusCode;
use axum::http::header::CONTENT_TYPE;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use tokio::net::TcpListener;

use crate::error::TelemetryError;
use crate::metrics::Metrics;

/// The content type of [`prometheus_client::encoding::text::encode`]'s output.
pub const CONTENT_TYPE_OPENMETRICS: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// Serves `GET /metrics` on `listener` until `shutdown` resolves. Every scrape first runs
/// the registry's scrape hooks (the nodes' gauges), then encodes.
pub async fn serve_metrics(
    listener: TcpListener,
    metrics: Metrics,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), TelemetryError> {
    let app = Router::new().route("/metrics", get(scrape)).with_state(metrics);
    axum::serve(listener, app).with_graceful_shutdown(shutdown).await?;
    Ok(())
}

async fn scrape(State(metrics): State<Metrics>) -> Response {
    match metrics.encode().await {
        Ok(body) => ([(CONTENT_TYPE, CONTENT_TYPE_OPENMETRICS)], body).into_response(),
        Err(err) => (StatusCode::INTERNAL_SERVER_ERROR, err.to_string()).into_response(),
    }
}

#[cfg(test)]
mod tests {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    use super::*;

    #[tokio::test]
    async fn serves_the_registry_as_text() {
        let metrics = Metrics::new();
        let node = metrics.node("target");
        metrics.on_scrape(move || {
            let node = node.clone();
            async move {
                node.set(3, 1024);
                node.set_kv_budget(Some(4096));
            }
        });
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let server = tokio::spawn(serve_metrics(listener, metrics, async move {
            let _ = stopped.await;
        }));
        let mut stream = tokio::net::TcpStream::connect(addr).await.unwrap();
        stream.write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").await.unwrap();
        let mut response = String::new();
        stream.read_to_string(&mut response).await.unwrap();
        assert!(response.starts_with("HTTP/1.1 200"), "{response}");
        assert!(response.contains("specd_active_sessions{role=\"target\"} 3\n"), "{response}");
        assert!(response.contains("specd_kv_cache_bytes{role=\"target\"} 1024\n"), "{response}");
        assert!(response.contains("specd_kv_budget_bytes{role=\"target\"} 4096\n"), "{response}");
        let _ = stop.send(());
        server.await.unwrap().unwrap();
    }
}
