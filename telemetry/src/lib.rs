//! specd-telemetry: what operators see of a running specd.
//!
//! - [`logs`]: one subscriber per process: logs on stderr (`RUST_LOG`), and OpenTelemetry
//!   traces over OTLP/gRPC when an endpoint is configured ([`init`], [`TelemetryOptions`]);
//! - [`propagation`]: W3C trace context in gRPC metadata and in round messages, so that a
//!   request's spans in the coordinator, the draft and the target form one trace;
//! - [`attributes`]: the span attribute names, GenAI-style, in one place;
//! - [`metrics`]: the Prometheus registry, one [`Metrics`] per process; the coordinator
//!   records into [`Metrics::coordinator`] (rounds, tokens, round phases, latencies, requests
//!   by finish reason), each node into [`Metrics::node`] (open sessions and KV-cache bytes,
//!   sampled at scrape time). `specd_active_sessions` and `specd_kv_cache_bytes` carry a
//!   `role` label (`coordinator`, `target`, `draft`), so that `specd up`, which runs all three
//!   roles in one process, serves them from one registry with the same names and labels as
//!   three separate processes;
//! - [`server`]: [`serve_metrics`], the `GET /metrics` endpoint (axum);
//! - [`error`]: the crate's one error type, [`TelemetryError`].

pub mod attributes;
pub mod error;
pub mod logs;
pub mod metrics;
pub mod propagation;
pub mod server;

pub use error::TelemetryError;
pub use logs::{TelemetryGuard, TelemetryOptions, init};
pub use metrics::{
    CoordinatorMetrics, DraftFilings, FinishReason, Metrics, NodeGauges, PrefixCacheSample, PrefixCacheSeries,
    RequestMetrics, RoundSample,
};
pub use server::serve_metrics;
