//! specd-telemetry: the Prometheus metrics of every role, served as text at `GET /metrics`.
//!
//! One [`Metrics`] registry per process. Each role takes its part of it: the coordinator
//! [`Metrics::coordinator`] (rounds, tokens, round phases, latencies, requests by finish
//! reason), each node [`Metrics::node`] (open sessions and KV-cache bytes, sampled at scrape
//! time). `specd_active_sessions` and `specd_kv_cache_bytes` carry a `role` label
//! (`coordinator`, `target`, `draft`), so that `specd up`, which runs all three roles in one
//! process, serves them from one registry and one address with the same names and labels
//! as three separate processes.
//!
//! - [`metrics`]: [`Metrics`], [`CoordinatorMetrics`], the per-generation [`RequestMetrics`],
//!   [`RoundSample`], [`FinishReason`] and the nodes' [`NodeGauges`];
//! - [`server`]: [`serve_metrics`], the HTTP endpoint (axum);
//! - [`error`]: [`TelemetryError`], the crate's one error type.

pub mod error;
pub mod metrics;
pub mod server;

pub use error::TelemetryError;
pub use metrics::{CoordinatorMetrics, FinishReason, Metrics, NodeGauges, RequestMetrics, RoundSample};
pub use server::serve_metrics;
