//! The target node's one error type and its gRPC status codes.

use specd_model::{ErrorClass, ModelError, NodeSessionError, RegistryError};
use specd_proto::ProtoError;
use specd_sampling::SamplingError;
use tonic::{Code, Status};

#[derive(Debug, thiserror::Error)]
pub enum TargetError {
    #[error(transparent)]
    Session(#[from] NodeSessionError),
    #[error("invalid request: {0}")]
    InvalidRequest(String),
    #[error(transparent)]
    Model(#[from] ModelError),
    #[error(transparent)]
    Sampling(#[from] SamplingError),
    #[error(transparent)]
    Proto(#[from] ProtoError),
}

impl TargetError {
    /// The one table from errors to gRPC codes.
    pub fn code(&self) -> Code {
        match self {
            Self::Session(NodeSessionError::Unknown(_)) => Code::NotFound,
            Self::Session(NodeSessionError::Registry(RegistryError::Duplicate(_))) => Code::AlreadyExists,
            Self::Session(NodeSessionError::Registry(RegistryError::Full(_))) => Code::ResourceExhausted,
            Self::Session(NodeSessionError::Registry(RegistryError::EmptyId)) => Code::InvalidArgument,
            Self::Session(NodeSessionError::Model(err)) => model_code(err),
            Self::InvalidRequest(_) | Self::Proto(_) => Code::InvalidArgument,
            Self::Sampling(SamplingError::NonFiniteLogit { .. } | SamplingError::NoFiniteLogit) => Code::Internal,
            Self::Sampling(_) => Code::InvalidArgument,
            Self::Model(err) => model_code(err),
        }
    }
}

/// Status codes of model errors, by the model crate's own classification of who is at fault.
fn model_code(err: &ModelError) -> Code {
    match err.class() {
        ErrorClass::InvalidArgument => Code::InvalidArgument,
        ErrorClass::NotFound => Code::NotFound,
        ErrorClass::ResourceExhausted => Code::ResourceExhausted,
        ErrorClass::FailedPrecondition => Code::FailedPrecondition,
        ErrorClass::Unavailable => Code::Unavailable,
        ErrorClass::Internal => Code::Internal,
    }
}

impl From<TargetError> for Status {
    fn from(err: TargetError) -> Self {
        Status::new(err.code(), err.to_string())
    }
}
