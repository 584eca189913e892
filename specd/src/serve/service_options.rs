//! The flags every server role has (traces, draining, its TLS identity, metrics) and what
//! they set up.

use std::net::SocketAddr;
use std::path::PathBuf;

use clap::Args;
use specd_proto::tls::ServerTls;
use specd_telemetry::Metrics;

use super::runtime::bind;
use super::shutdown::DrainArgs;
use crate::cli_error::invalid;

/// What every server role has: traces, draining, its TLS identity, metrics.
#[derive(Debug, Args)]
pub struct ServiceArgs {
    #[command(flatten)]
    pub(super) telemetry: TelemetryArgs,
    #[command(flatten)]
    pub(super) drain: DrainArgs,
    #[command(flatten)]
    pub(super) tls: ServerTlsArgs,
    #[command(flatten)]
    pub(super) metrics: MetricsOptions,
}

/// The TLS identity a role serves with, and whom it lets in.
#[derive(Debug, Clone, Args)]
pub struct ServerTlsArgs {
    /// PEM certificate (chain) to serve TLS with; with --tls-key.
    #[arg(long, env = "SPECD_TLS_CERT")]
    pub(super) tls_cert: Option<PathBuf>,
    /// PEM private key of --tls-cert.
    #[arg(long, env = "SPECD_TLS_KEY")]
    pub(super) tls_key: Option<PathBuf>,
    /// PEM CA: only clients with a certificate it signed get in (mutual TLS).
    #[arg(long, env = "SPECD_TLS_CLIENT_CA")]
    pub(super) tls_client_ca: Option<PathBuf>,
}

impl ServerTlsArgs {
    pub(super) fn tls(&self) -> anyhow::Result<ServerTls> {
        let tls =
            ServerTls { cert: self.tls_cert.clone(), key: self.tls_key.clone(), client_ca: self.tls_client_ca.clone() };
        // Read now: a missing file is a startup error, not a failed handshake later.
        tls.config().map_err(|e| invalid(e.to_string()))?;
        Ok(tls)
    }
}

/// Where traces go; every role has these.
#[derive(Debug, Clone, Args)]
pub struct TelemetryArgs {
    /// OTLP/gRPC collector to export traces to, e.g. http://127.0.0.1:4317. Unset or empty: the
    /// standard OTEL_EXPORTER_OTLP_ENDPOINT decides, and without it no traces are exported.
    #[arg(long, env = "SPECD_OTLP_ENDPOINT")]
    otlp_endpoint: Option<String>,
}

impl TelemetryArgs {
    /// `--otlp-endpoint`; empty is the same as unset (a ConfigMap can carry it switched off).
    pub(super) fn endpoint(&self) -> Option<String> {
        self.otlp_endpoint.clone().filter(|e| !e.is_empty())
    }
}

/// Where to serve Prometheus metrics (off by default).
#[derive(Debug, Clone, Args)]
pub struct MetricsOptions {
    /// Serve Prometheus metrics at http://HOST:PORT/metrics (all roles of `specd up` on one).
    #[arg(long, env = "SPECD_METRICS_LISTEN")]
    pub(super) metrics_listen: Option<SocketAddr>,
}

impl MetricsOptions {
    /// With `--metrics-listen`: binds it, serves `GET /metrics` in the background for as
    /// long as the runtime runs, and returns the registry the roles record into.
    pub(super) async fn start(&self) -> anyhow::Result<Option<Metrics>> {
        let Some(addr) = self.metrics_listen else { return Ok(None) };
        let listener = bind(addr).await?;
        tracing::info!("metrics on http://{}/metrics", listener.local_addr()?);
        let metrics = Metrics::new();
        let serve = specd_telemetry::serve_metrics(listener, metrics.clone(), std::future::pending());
        tokio::spawn(async move {
            if let Err(err) = serve.await {
                tracing::error!(%err, "metrics server stopped");
            }
        });
        Ok(Some(metrics))
    }
}
