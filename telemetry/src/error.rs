//! The crate's one error type.

#[derive(Debug, thiserror::Error)]
pub enum TelemetryError {
    #[error("OTLP exporter: {0}")]
    Exporter(String),
    #[error("a global tracing subscriber is already installed")]
    AlreadyInstalled,
    /// The metrics HTTP server failed (accepting on its listener).
    #[error("metrics server: {0}")]
    Serve(#[from] std::io::Error),
    /// The registry could not be written out as text.
    #[error("encoding metrics: {0}")]
    Encode(#[from] std::fmt::Error),
}
