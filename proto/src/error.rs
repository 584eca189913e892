//! The one error type of the proto crate and its gRPC status codes.

use specd_sampling::SamplingError;

/// A message that cannot be turned into what it claims to be.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum ProtoError {
    /// A required field is absent.
    #[error("missing field {0}")]
    MissingField(&'static str),
    /// A field's value is out of range or inconsistent with another field.
    #[error("invalid {field}: {reason}")]
    InvalidField { field: &'static str, reason: String },
    /// The values do not form a valid distribution or block.
    #[error(transparent)]
    Sampling(#[from] SamplingError),
}

impl ProtoError {
    pub fn invalid(field: &'static str, reason: impl Into<String>) -> Self {
        Self::InvalidField { field, reason: reason.into() }
    }
}

/// Every conversion error means the sender sent something malformed: INVALID_ARGUMENT.
impl From<ProtoError> for tonic::Status {
    fn from(err: ProtoError) -> Self {
        tonic::Status::invalid_argument(err.to_string())
    }
}
