//! The crate's one error type.

use std::path::PathBuf;

/// Everything that can go wrong when loading or running a model.
///
/// Variants name the file and, where there is one, the tensor, so an operator can fix a bad
/// checkpoint without a debugger. [`ModelError::class`] sorts them by who is at fault, for
/// the nodes' table from errors to status codes.
#[derive(Debug, thiserror::Error)]
pub enum ModelError {
    /// A file that the checkpoint needs is not there.
    #[error("missing file {path}: {what}")]
    MissingFile { path: PathBuf, what: String },

    /// A file exists but cannot be read.
    #[error("cannot read {path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },

    /// A JSON file (config, index, table) does not parse or has invalid values.
    #[error("invalid {path}: {message}")]
    InvalidFile { path: PathBuf, message: String },

    /// `config.json` names an architecture this crate does not implement.
    #[error(
        "unsupported architecture in {path}: {found} (supported: LlamaForCausalLM, MistralForCausalLM, Qwen2ForCausalLM, Qwen3ForCausalLM, Gemma3ForCausalLM)"
    )]
    UnsupportedArchitecture { path: PathBuf, found: String },

    /// A tensor the architecture needs is absent from the weights.
    #[error("missing tensor {tensor} in {path}")]
    MissingTensor { path: PathBuf, tensor: String },

    /// A tensor has the wrong shape for the config.
    #[error("tensor {tensor} in {path} has shape {found:?}, expected {expected:?}")]
    TensorShape { path: PathBuf, tensor: String, expected: Vec<i64>, found: Vec<i64> },

    /// A tensor is stored with a dtype this crate cannot convert.
    #[error("tensor {tensor} in {path} has unsupported dtype {dtype}")]
    TensorDtype { path: PathBuf, tensor: String, dtype: String },

    /// The checkpoint holds tensors the model as `config.json` describes it does not use (a
    /// bias the config does not declare, a layer past `num_hidden_layers`): it would compute
    /// something else than the checkpoint's authors meant.
    #[error(
        "{} tensor(s) in {path} are not used by the model config.json describes: {}{} (--allow-unused-weights loads it anyway)",
        tensors.len(),
        tensors.iter().take(8).cloned().collect::<Vec<_>>().join(", "),
        if tensors.len() > 8 { ", ..." } else { "" }
    )]
    UnusedTensors { path: PathBuf, tensors: Vec<String> },

    /// A file's SHA-256 differs from the one the checkpoint's `SHA256SUMS` lists for it.
    #[error("{path} is corrupted or was changed: its SHA-256 is {found}, SHA256SUMS says {expected}")]
    Checksum { path: PathBuf, expected: String, found: String },

    /// The tokenizer file cannot be loaded or used.
    #[error("tokenizer {path}: {message}")]
    Tokenizer { path: PathBuf, message: String },

    /// A device or dtype string does not parse, or the device is not available.
    #[error("device: {0}")]
    Device(String),

    /// A request is malformed (empty input, token id out of range, bad truncation length...).
    #[error("invalid input: {0}")]
    InvalidInput(String),

    /// The session id is not open on this model.
    #[error("unknown session {0}")]
    UnknownSession(u64),

    /// A forward would run past the session's preallocated capacity.
    #[error("session {session} holds {len} tokens; {extra} more exceed its capacity of {capacity}")]
    ContextOverflow { session: u64, len: usize, extra: usize, capacity: usize },

    /// Opening the session, or growing its cache, would exceed the node's budget for KV
    /// caches: for now (RESOURCE_EXHAUSTED), or for good when it needs more than the whole
    /// budget (INVALID_ARGUMENT: no retry can succeed, the request must ask for less).
    #[error(
        "KV cache memory budget exhausted: {requested} bytes needed, {in_use} of the budget of {budget} bytes in use by {sessions} sessions{}",
        if requested > budget { "; that is more than the whole budget: ask for fewer tokens" } else { "" }
    )]
    MemoryBudget { requested: u64, in_use: u64, budget: u64, sessions: usize },

    /// The device (or host) could not allocate memory during a pass: the pass failed, and
    /// nothing it half-wrote may be trusted, but the model is intact and serves others.
    #[error("out of memory: {0}")]
    OutOfMemory(String),

    /// libtorch reported an error.
    #[error("libtorch: {0}")]
    Torch(#[from] tch::TchError),

    /// The forward pass this request shared with others failed (each shares the message).
    #[error("batched forward pass: {0}")]
    BatchFailed(String),

    /// The model worker thread is gone or failed while running the request.
    #[error("model worker: {0}")]
    WorkerGone(String),
}

impl ModelError {
    /// `self`, as [`ModelError::OutOfMemory`] when it is libtorch's report of an allocation
    /// that failed: CUDA's caching allocator ("CUDA out of memory. Tried to allocate ...") or
    /// the CPU's ("DefaultCPUAllocator: can't allocate memory: ...").
    pub fn classify_allocation(self) -> Self {
        match self {
            Self::Torch(err) => {
                let message = err.to_string();
                if is_allocation_failure(&message) {
                    // libtorch appends a C++ backtrace; its first line says it all.
                    Self::OutOfMemory(message.lines().next().unwrap_or_default().to_owned())
                } else {
                    Self::Torch(err)
                }
            }
            Self::BatchFailed(message) if is_allocation_failure(&message) => Self::OutOfMemory(message),
            other => other,
        }
    }
}

fn is_allocation_failure(message: &str) -> bool {
    message.contains("out of memory") || message.contains("can't allocate memory")
}

/// Result alias for this crate.
pub type Result<T> = std::result::Result<T, ModelError>;

/// A transport-neutral class of [`ModelError`], for the nodes' one table from errors to
/// status codes (the class names follow gRPC's codes).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorClass {
    /// The request is malformed or asks past the session's capacity.
    InvalidArgument,
    /// The session is not open.
    NotFound,
    /// The memory budget is exhausted.
    ResourceExhausted,
    /// The model files or the device are not usable as configured.
    FailedPrecondition,
    /// The model thread is gone.
    Unavailable,
    /// libtorch failed.
    Internal,
}

impl ModelError {
    /// The class of this error.
    pub fn class(&self) -> ErrorClass {
        match self {
            Self::InvalidInput(_) | Self::ContextOverflow { .. } => ErrorClass::InvalidArgument,
            Self::UnknownSession(_) => ErrorClass::NotFound,
            Self::MemoryBudget { requested, budget, .. } if requested > budget => ErrorClass::InvalidArgument,
            Self::MemoryBudget { .. } | Self::OutOfMemory(_) => ErrorClass::ResourceExhausted,
            Self::MissingFile { .. }
            | Self::Io { .. }
            | Self::InvalidFile { .. }
            | Self::UnsupportedArchitecture { .. }
            | Self::MissingTensor { .. }
            | Self::TensorShape { .. }
            | Self::TensorDtype { .. }
            | Self::UnusedTensors { .. }
            | Self::Checksum { .. }
            | Self::Tokenizer { .. }
            | Self::Device(_) => ErrorClass::FailedPrecondition,
            Self::WorkerGone(_) => ErrorClass::Unavailable,
            Self::Torch(_) | Self::BatchFailed(_) => ErrorClass::Internal,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn classes_follow_who_is_at_fault() {
        assert_eq!(ModelError::InvalidInput("x".into()).class(), ErrorClass::InvalidArgument);
        let overflow = ModelError::ContextOverflow { session: 1, len: 2, extra: 3, capacity: 4 };
        assert_eq!(overflow.class(), ErrorClass::InvalidArgument);
        assert_eq!(ModelError::UnknownSession(3).class(), ErrorClass::NotFound);
        let budget = ModelError::MemoryBudget { requested: 1, in_use: 2, budget: 2, sessions: 1 };
        assert_eq!(budget.class(), ErrorClass::ResourceExhausted);
        // More than the whole budget: waiting cannot help, and a client that retries on
        // RESOURCE_EXHAUSTED (HTTP 429) would retry for nothing.
        let never = ModelError::MemoryBudget { requested: 3, in_use: 0, budget: 2, sessions: 0 };
        assert_eq!(never.class(), ErrorClass::InvalidArgument);
        assert!(never.to_string().ends_with("more than the whole budget: ask for fewer tokens"), "{never}");
        assert!(!budget.to_string().contains("whole budget"), "{budget}");
        assert_eq!(ModelError::OutOfMemory("x".into()).class(), ErrorClass::ResourceExhausted);
        let missing = ModelError::MissingTensor { path: "m".into(), tensor: "t".into() };
        assert_eq!(missing.class(), ErrorClass::FailedPrecondition);
        assert_eq!(ModelError::WorkerGone("x".into()).class(), ErrorClass::Unavailable);
    }

    #[test]
    fn a_failed_allocation_is_out_of_memory_and_other_torch_errors_are_not() {
        // A real allocation failure: 2^50 f32 is 4 PiB, more than any address space holds.
        let err =
            ModelError::from(tch::Tensor::f_empty([1i64 << 50], (tch::Kind::Float, tch::Device::Cpu)).unwrap_err());
        let err = err.classify_allocation();
        assert!(matches!(err, ModelError::OutOfMemory(_)), "{err}");
        assert!(!err.to_string().contains('\n'), "{err}");
        let shape =
            tch::Tensor::f_zeros([2, 3], (tch::Kind::Float, tch::Device::Cpu)).unwrap().f_view([4]).unwrap_err();
        assert!(matches!(ModelError::from(shape).classify_allocation(), ModelError::Torch(_)));
        let batch = ModelError::BatchFailed("out of memory: x".into()).classify_allocation();
        assert!(matches!(batch, ModelError::OutOfMemory(_)));
    }
}
