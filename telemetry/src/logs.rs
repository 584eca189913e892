//! The process's tracing subscriber: logs on stderr, filtered by `RUST_LOG` (default info),
//! plus an OpenTelemetry layer exporting specd's own spans over OTLP/gRPC when an endpoint
//! is given (`--otlp-endpoint`) or set in the standard `OTEL_EXPORTER_OTLP_ENDPOINT` /
//! `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT` variables. Batching follows the standard `OTEL_BSP_*`
//! variables; `OTEL_SERVICE_NAME` overrides the role's service name.

use opentelemetry::trace::TracerProvider as _;
use opentelemetry_otlp::WithExportConfig as _;
use opentelemetry_sdk::Resource;
use opentelemetry_sdk::propagation::TraceContextPropagator;
use opentelemetry_sdk::trace::SdkTracerProvider;
use tracing_subscriber::Layer as _;
use tracing_subscriber::layer::SubscriberExt as _;
use tracing_subscriber::util::SubscriberInitExt as _;

use crate::error::TelemetryError;

/// What a role exports.
#[derive(Debug, Clone, Default)]
pub struct TelemetryOptions {
    /// `specd-coordinator`, `specd-draft`, `specd-target` (or `specd` for `specd up`).
    pub service_name: String,
    /// An OTLP/gRPC collector, e.g. `http://127.0.0.1:4317`; `None`: the `OTEL_*` variables
    /// decide, and without them no traces are exported.
    pub otlp_endpoint: Option<String>,
}

/// Flushes and stops the exporter when dropped: keep it alive as long as the process serves.
#[derive(Debug)]
pub struct TelemetryGuard {
    provider: Option<SdkTracerProvider>,
}

impl TelemetryGuard {
    /// Whether traces are exported.
    pub fn exporting(&self) -> bool {
        self.provider.is_some()
    }
}

impl Drop for TelemetryGuard {
    fn drop(&mut self) {
        if let Some(provider) = self.provider.take()
            && let Err(err) = provider.shutdown()
        {
            eprintln!("warning: could not flush traces: {err}");
        }
    }
}

fn env_endpoint() -> Option<String> {
    ["OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "OTEL_EXPORTER_OTLP_ENDPOINT"]
        .iter()
        .find_map(|name| std::env::var(name).ok().filter(|v| !v.trim().is_empty()))
}

/// Only specd's spans are exported, not those of the libraries under it (h2, tonic, hyper).
fn is_specd(target: &str) -> bool {
    target.starts_with("specd")
}

/// Installs the global subscriber. Must run inside a tokio runtime when traces are exported
/// (the OTLP client is a tonic channel). Fails if a subscriber is already installed.
pub fn init(options: &TelemetryOptions) -> Result<TelemetryGuard, TelemetryError> {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let logs = tracing_subscriber::fmt::layer().with_writer(std::io::stderr).with_filter(filter);
    let endpoint = options.otlp_endpoint.clone().or_else(env_endpoint);
    let Some(endpoint) = endpoint else {
        tracing_subscriber::registry().with(logs).try_init().map_err(|_| TelemetryError::AlreadyInstalled)?;
        return Ok(TelemetryGuard { provider: None });
    };
    let exporter = opentelemetry_otlp::SpanExporter::builder()
        .with_tonic()
        .with_endpoint(endpoint.clone())
        .build()
        .map_err(|e| TelemetryError::Exporter(format!("{endpoint}: {e}")))?;
    let service_name = std::env::var("OTEL_SERVICE_NAME").unwrap_or_else(|_| options.service_name.clone());
    let resource = Resource::builder().with_service_name(service_name.clone()).build();
    let provider = SdkTracerProvider::builder().with_batch_exporter(exporter).with_resource(resource).build();
    let tracer = provider.tracer(service_name);
    opentelemetry::global::set_text_map_propagator(TraceContextPropagator::new());
    let spans = tracing_opentelemetry::layer()
        .with_tracer(tracer)
        .with_filter(tracing_subscriber::filter::filter_fn(|meta| is_specd(meta.target())));
    tracing_subscriber::registry().with(logs).with(spans).try_init().map_err(|_| TelemetryError::AlreadyInstalled)?;
    tracing::info!(%endpoint, "exporting traces over OTLP");
    Ok(TelemetryGuard { provider: Some(provider) })
}
