//! The crate's one error type.

use std::path::PathBuf;

/// Everything that can go wrong turning text into ids and back.
///
/// Whose fault it is decides the status a service answers with:
/// - the caller's (HTTP 400, gRPC `INVALID_ARGUMENT`): [`TextError::TemplateRaised`],
///   [`TextError::NoChatTemplate`], [`TextError::Encode`];
/// - the model files' (gRPC `FAILED_PRECONDITION`, HTTP 500): every other variant.
///
/// [`TextError::is_callers_fault`] says which.
#[derive(Debug, thiserror::Error)]
pub enum TextError {
    /// The chat template refused the conversation with `raise_exception(message)` (e.g.
    /// Mistral's "conversation roles must alternate").
    #[error("the chat template refused the conversation: {0}")]
    TemplateRaised(String),
    /// A chat request for a model whose files carry no chat template.
    #[error(
        "this model has no chat template (no chat_template.jinja and no chat_template in tokenizer_config.json); send a prompt instead of messages"
    )]
    NoChatTemplate,
    /// The tokenizer could not encode the caller's text.
    #[error("cannot tokenize the text: {0}")]
    Encode(String),
    /// A model file could not be read.
    #[error("cannot read {path}: {source}")]
    Io { path: PathBuf, source: std::io::Error },
    /// `tokenizer.json` is not a tokenizer, or the tokenizer failed to decode.
    #[error("tokenizer: {0}")]
    Tokenizer(String),
    /// A JSON model file (`tokenizer_config.json`, `generation_config.json`) is malformed.
    #[error("{file}: {message}")]
    Json { file: &'static str, message: String },
    /// The chat template does not compile.
    #[error("the chat template does not compile: {0}")]
    TemplateSyntax(String),
    /// The chat template failed while rendering for a reason of its own (not `raise_exception`).
    #[error("the chat template failed: {0}")]
    TemplateRender(String),
}

impl TextError {
    /// True when the request is at fault (map to 400 / `INVALID_ARGUMENT`); false when the
    /// model files are (map to `FAILED_PRECONDITION`).
    pub fn is_callers_fault(&self) -> bool {
        matches!(self, Self::TemplateRaised(_) | Self::NoChatTemplate | Self::Encode(_))
    }
}
