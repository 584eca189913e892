//! The telemetry crate's one error type.

#[derive(Debug, thiserror::Error)]
pub enum TelemetryError {
    #[error("OTLP exporter: {0}")]
    Exporter(String),
    #[error("a global tracing subscriber is already installed")]
    AlreadyInstalled,
}
