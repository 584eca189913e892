//! specd-telemetry: what operators see of a running specd.
//!
//! - [`logs`]: one subscriber per process: logs on stderr (`RUST_LOG`), and OpenTelemetry
//!   traces over OTLP/gRPC when an endpoint is configured ([`init`], [`TelemetryOptions`]);
//! - [`propagation`]: W3C trace context in gRPC metadata and in round messages, so that a
//!   request's spans in the coordinator, the draft and the target form one trace;
//! - [`attributes`]: the span attribute names, GenAI-style, in one place;
//! - [`error`]: the crate's error type, [`TelemetryError`].

pub mod attributes;
pub mod error;
pub mod logs;
pub mod propagation;

pub use error::TelemetryError;
pub use logs::{TelemetryGuard, TelemetryOptions, init};
