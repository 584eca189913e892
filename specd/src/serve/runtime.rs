//! How a role's process runs: a multi-threaded runtime with logs and traces, listeners, and
//! the `listening on` line that says it is ready.

use std::future::Future;
use std::net::SocketAddr;

use anyhow::Context;
use specd_telemetry::TelemetryOptions;
use tokio::net::TcpListener;

/// Runs a role on a multi-threaded runtime with logs on stderr (`RUST_LOG`, default info) and,
/// when configured (`--otlp-endpoint`), traces exported as `service_name`.
pub(super) fn run_role<F>(service_name: &str, otlp_endpoint: Option<String>, role: F) -> anyhow::Result<()>
where
    F: Future<Output = anyhow::Result<()>>,
{
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;
    let options = TelemetryOptions { service_name: service_name.to_owned(), otlp_endpoint };
    // The OTLP client is a tonic channel: it is made inside the runtime.
    let guard = {
        let _entered = runtime.enter();
        specd_telemetry::init(&options)?
    };
    let result = runtime.block_on(role);
    // Flushes the last spans while the runtime still drives the exporter's connection.
    drop(guard);
    result
}

pub(crate) async fn bind(addr: SocketAddr) -> anyhow::Result<TcpListener> {
    TcpListener::bind(addr).await.with_context(|| format!("cannot listen on {addr}"))
}

/// Says how idle libtorch workers wait ([`crate::openmp`]): it moves a CPU verify pass.
pub(super) fn log_openmp_wait() {
    tracing::info!(openmp = %crate::openmp::describe(), "idle OpenMP workers");
}

pub(super) fn announce(listener: &TcpListener) -> anyhow::Result<()> {
    outln!("listening on {}", listener.local_addr()?);
    Ok(())
}
