//! The coordinator's one error type and its gRPC status codes.

use specd_grammar::GrammarError;
use specd_proto::ProtoError;
use specd_sampling::SamplingError;
use tonic::{Code, Status};

#[derive(Debug, thiserror::Error)]
pub enum CoordinatorError {
    /// The client's request is malformed.
    #[error("{0}")]
    InvalidRequest(String),
    /// A node could not be reached.
    #[error("cannot reach the {role} node at {address}: {message}")]
    Unreachable { role: &'static str, address: String, message: String },
    /// A node answered with an error.
    #[error("the {role} node at {address} failed: {status}")]
    Node { role: &'static str, address: String, status: Status },
    /// The nodes cannot work together (different vocabularies or tokenizers).
    #[error("{0}")]
    Incompatible(String),
    /// A node sent something the rule cannot use: a protocol violation.
    #[error("protocol: {0}")]
    Protocol(String),
    /// No replica of this role is configured, or none is left behind its `dns:///` name.
    #[error("no {0} node is available")]
    NoNode(&'static str),
    /// The coordinator's own configuration cannot work (a TLS file missing, say).
    #[error("{0}")]
    InvalidConfig(String),
    #[error(transparent)]
    Serve(#[from] specd_proto::transport::ServeError),
    /// The draft's part of a round failed; the session goes on without it.
    #[error("{0}")]
    DraftLost(Box<CoordinatorError>),
    /// The target stopped answering in a round; the session moves to another target replica
    /// when there is one.
    #[error("{0}")]
    TargetLost(Box<CoordinatorError>),
    /// Text work: the caller's (a chat the template refuses, text that cannot be encoded)
    /// or the model files' (a tokenizer or template that does not load).
    #[error("{0}")]
    Text(#[from] specd_text::TextError),
    /// A node ended a session's round stream.
    #[error("the {role} node at {address} closed the round stream")]
    StreamClosed { role: &'static str, address: String },
    /// The request's output constraint is invalid, or its engine failed or ran past its
    /// budget.
    #[error("{0}")]
    Constraint(#[from] GrammarError),
    /// The coordinator's own work failed (a task that panicked).
    #[error("{0}")]
    Internal(String),
}

impl From<SamplingError> for CoordinatorError {
    fn from(err: SamplingError) -> Self {
        Self::Protocol(err.to_string())
    }
}

impl From<ProtoError> for CoordinatorError {
    fn from(err: ProtoError) -> Self {
        Self::Protocol(err.to_string())
    }
}

impl CoordinatorError {
    /// The one table from errors to gRPC codes.
    pub fn code(&self) -> Code {
        match self {
            Self::InvalidRequest(_) => Code::InvalidArgument,
            Self::Unreachable { .. } | Self::NoNode(_) => Code::Unavailable,
            Self::Node { status, .. } => match status.code() {
                // The node's own verdict on the client's input, or its capacity, passes through.
                code
                @ (Code::InvalidArgument | Code::ResourceExhausted | Code::OutOfRange | Code::DeadlineExceeded) => code,
                Code::Unavailable => Code::Unavailable,
                _ => Code::Internal,
            },
            Self::Incompatible(_) | Self::InvalidConfig(_) => Code::FailedPrecondition,
            Self::Protocol(_) | Self::Serve(_) | Self::Internal(_) => Code::Internal,
            // Only made for a node that is gone or not answering: worth a retry elsewhere.
            Self::DraftLost(_) | Self::TargetLost(_) => Code::Unavailable,
            Self::StreamClosed { .. } => Code::Unavailable,
            Self::Text(err) if err.is_callers_fault() => Code::InvalidArgument,
            Self::Text(_) => Code::FailedPrecondition,
            // An invalid constraint, or one whose matching ran past its budget.
            Self::Constraint(err) if err.is_client_fault() => Code::InvalidArgument,
            Self::Constraint(_) => Code::Internal,
        }
    }
}

impl CoordinatorError {
    /// The node is gone or not answering (as opposed to refusing the request): another
    /// replica may do.
    pub fn is_node_loss(&self) -> bool {
        match self {
            Self::Unreachable { .. } | Self::StreamClosed { .. } => true,
            Self::Node { status, .. } => {
                matches!(status.code(), Code::Unavailable | Code::DeadlineExceeded | Code::Cancelled | Code::Unknown)
            }
            _ => false,
        }
    }
}

impl From<CoordinatorError> for Status {
    fn from(err: CoordinatorError) -> Self {
        Status::new(err.code(), err.to_string())
    }
}
