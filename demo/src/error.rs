//! The crate's one error type.

use std::path::PathBuf;

use specd_model::ModelError;

/// Everything that can go wrong while building the demo pair.
#[derive(Debug, thiserror::Error)]
pub enum DemoError {
    /// A file or directory cannot be read, written or moved.
    #[error("cannot read {path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },

    /// The tokenizer cannot be trained, saved, loaded or used.
    #[error("tokenizer {path}: {message}")]
    Tokenizer { path: PathBuf, message: String },

    /// The training corpus cannot be found or is too small.
    #[error("corpus: {0}")]
    Corpus(String),

    /// A training checkpoint cannot be used.
    #[error("checkpoint {path}: {message}")]
    Checkpoint { path: PathBuf, message: String },

    /// The spec to build is not one that can be trained.
    #[error("invalid input: {0}")]
    InvalidInput(String),

    /// libtorch reported an error.
    #[error("libtorch: {0}")]
    Torch(#[from] tch::TchError),

    /// The model crate's pieces failed: the device, the rotary tables, a norm.
    #[error(transparent)]
    Model(#[from] ModelError),
}

/// Result alias for this crate.
pub type Result<T> = std::result::Result<T, DemoError>;
