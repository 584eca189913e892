//! The one error type of the crate.

use specd_sampling::SamplingError;

/// Why the device path could not score a block or draw a candidate.
#[derive(Debug, thiserror::Error)]
pub enum DeviceSamplingError {
    /// What the host path says of the same input (bad logits, tokens out of range, shapes).
    #[error(transparent)]
    Sampling(#[from] SamplingError),
    /// libtorch failed (out of device memory, a device error).
    #[error("libtorch: {0}")]
    Torch(#[from] tch::TchError),
    /// The device found a row it cannot use that the host finds fine: the node's fault (its
    /// rounding at an edge), never the request's.
    #[error("device and host disagree: {0}")]
    Disagreement(String),
}

pub type Result<T> = std::result::Result<T, DeviceSamplingError>;
