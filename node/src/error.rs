//! The node roles' one error type and its gRPC status codes.

use specd_device_sampling::DeviceSamplingError;
use specd_grammar::GrammarError;
use specd_model::{ErrorClass, ModelError};
use specd_proto::ProtoError;
use specd_sampling::SamplingError;
use tonic::{Code, Status};

use crate::node_model::NodeSessionError;
use crate::registry::RegistryError;

#[derive(Debug, thiserror::Error)]
pub enum NodeError {
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
    /// The request's output constraint (a JSON schema, a grammar) or the engine that follows it.
    #[error("output constraint: {0}")]
    Constraint(#[from] GrammarError),
    /// A constrained session on a node that cannot mask (no tokenizer.json, or one the grammar
    /// engine cannot read).
    #[error("this node cannot constrain outputs: {0}")]
    NoConstraints(String),
    #[error("model loading task failed: {0}")]
    Join(String),
    /// The node's own fault, not the request's.
    #[error("internal: {0}")]
    Internal(String),
}

/// The device path's errors are the host's sampling errors or libtorch's, which are the
/// model's (an allocation failure on the device is RESOURCE_EXHAUSTED, as in a pass).
impl From<DeviceSamplingError> for NodeError {
    fn from(err: DeviceSamplingError) -> Self {
        match err {
            DeviceSamplingError::Sampling(err) => Self::Sampling(err),
            DeviceSamplingError::Torch(err) => Self::Model(ModelError::from(err).classify_allocation()),
            DeviceSamplingError::Disagreement(why) => Self::Internal(why),
        }
    }
}

impl NodeError {
    /// The one table from errors to gRPC codes.
    pub fn code(&self) -> Code {
        match self {
            Self::Session(NodeSessionError::Unknown(_)) => Code::NotFound,
            Self::Session(NodeSessionError::Registry(RegistryError::Duplicate(_))) => Code::AlreadyExists,
            Self::Session(NodeSessionError::Registry(RegistryError::Full(_))) => Code::ResourceExhausted,
            Self::Session(NodeSessionError::Registry(RegistryError::EmptyId)) => Code::InvalidArgument,
            Self::Session(NodeSessionError::Model(err)) | Self::Model(err) => model_code(err),
            Self::InvalidRequest(_) | Self::Proto(_) => Code::InvalidArgument,
            // The model produced NaN or +inf: the node's fault, not the request's.
            Self::Sampling(SamplingError::NonFiniteLogit { .. } | SamplingError::NoFiniteLogit) => Code::Internal,
            Self::Sampling(_) => Code::InvalidArgument,
            // An invalid constraint, or one whose matching ran past its budget.
            Self::Constraint(err) if err.is_client_fault() => Code::InvalidArgument,
            Self::Constraint(_) => Code::Internal,
            Self::NoConstraints(_) => Code::FailedPrecondition,
            Self::Join(_) | Self::Internal(_) => Code::Internal,
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

/// Why a node role could not start (loading its model) or stopped serving.
#[derive(Debug, thiserror::Error)]
pub enum NodeServeError {
    #[error(transparent)]
    Node(#[from] NodeError),
    #[error(transparent)]
    Serve(#[from] specd_proto::transport::ServeError),
}

impl From<NodeError> for Status {
    fn from(err: NodeError) -> Self {
        Status::new(err.code(), err.to_string())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_say_whose_fault_it_is() {
        assert_eq!(NodeError::from(NodeSessionError::Unknown("s".into())).code(), Code::NotFound);
        assert_eq!(NodeError::from(NodeSessionError::Registry(RegistryError::Full(3))).code(), Code::ResourceExhausted);
        assert_eq!(NodeError::InvalidRequest("x".into()).code(), Code::InvalidArgument);
        assert_eq!(NodeError::from(SamplingError::NoFiniteLogit).code(), Code::Internal);
        assert_eq!(NodeError::from(SamplingError::EmptyDistribution).code(), Code::InvalidArgument);
        let budget = ModelError::MemoryBudget { requested: 1, in_use: 1, budget: 1, sessions: 1 };
        assert_eq!(NodeError::from(budget).code(), Code::ResourceExhausted);
        let status = Status::from(NodeError::InvalidRequest("gamma 99".into()));
        assert!(status.message().contains("gamma 99"));
    }
}
