//! The crate's one error type.

/// Why a device's memory could not be read from the CUDA runtime.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CudaMemoryError {
    /// None of the runtime's sonames could be opened: libtorch was built without CUDA, or
    /// the runtime is not where the dynamic loader looks.
    #[error("no CUDA runtime library could be opened ({tried})")]
    RuntimeMissing {
        /// Each name tried, with the loader's reason.
        tried: String,
    },
    /// The library opened but lacks a function this crate calls.
    #[error("{library} has no {function} ({reason})")]
    MissingFunction { library: String, function: &'static str, reason: String },
    /// The runtime sees no device of this index (no GPU, no driver, or fewer devices than
    /// the index, as `CUDA_VISIBLE_DEVICES` leaves them).
    #[error("no cuda:{index} is visible to the CUDA runtime: {reason}")]
    NoDevice { index: usize, reason: String },
    /// A runtime call failed.
    #[error("{call} failed with CUDA error {code}: {message}")]
    CallFailed { call: &'static str, code: i32, message: String },
}
