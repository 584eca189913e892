//! The crate's one error type.

/// What can go wrong serving metrics.
#[derive(Debug, thiserror::Error)]
pub enum TelemetryError {
    /// The HTTP server failed (accepting on its listener).
    #[error("metrics server: {0}")]
    Serve(#[from] std::io::Error),
    /// The registry could not be written out as text.
    #[error("encoding metrics: {0}")]
    Encode(#[from] std::fmt::Error),
}
