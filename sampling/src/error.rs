//! The one error type of the sampling crate.

/// Everything that can go wrong while building distributions or applying the rule.
///
/// The crate knows nothing of gRPC; services map these to status codes in their own error
/// tables (all of them are caller errors except [`SamplingError::ImpossibleProposal`] and
/// [`SamplingError::MissingComplementSample`], which mean a node broke the protocol).
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum SamplingError {
    #[error("distribution is empty")]
    EmptyDistribution,
    #[error("probability {value} at index {index} is not a finite non-negative number")]
    InvalidProbability { index: usize, value: f64 },
    #[error("probabilities sum to {sum}, not 1 (tolerance {tolerance})")]
    NotNormalised { sum: f64, tolerance: f64 },
    #[error("logit {value} at index {index} is NaN or +inf")]
    NonFiniteLogit { index: usize, value: f32 },
    #[error("every logit is -inf: no token can be sampled")]
    NoFiniteLogit,
    #[error("token {token} is outside the vocabulary of size {vocab_size}")]
    TokenOutOfRange { token: u32, vocab_size: usize },
    #[error("token {token} appears twice in a sparse distribution")]
    DuplicateToken { token: u32 },
    #[error("vocabularies differ: target has {target} tokens, draft has {draft}")]
    VocabMismatch { target: usize, draft: usize },
    #[error("invalid {name} = {value}: {expected}")]
    InvalidParameter { name: &'static str, value: f64, expected: &'static str },
    #[error("block shape mismatch: {0}")]
    ShapeMismatch(String),
    #[error(
        "draft proposed token {token} at position {position} with probability 0 under its own q: impossible proposal"
    )]
    ImpossibleProposal { position: usize, token: u32 },
    #[error("position {position}: complement mass {mass} > 0 but the target sent no complement sample")]
    MissingComplementSample { position: usize, mass: f64 },
    #[error("invalid target reply: {0}")]
    InvalidTargetReply(String),
    #[error("chi-square test needs observations, got none")]
    NoObservations,
}

pub type Result<T> = std::result::Result<T, SamplingError>;
