//! Constrained decoding for specd (docs/rule.md#constrained-decoding): the output must belong
//! to a language (any JSON object, a JSON schema, a regular expression, one of some strings, a
//! Lark grammar), so at every position only the tokens that keep it there may be drawn. The
//! grammar engine is llguidance; this crate gives each position's allowed tokens as a
//! [`specd_sampling::TokenMask`] and follows the tokens drawn, with rollback for rejected
//! speculative candidates.
//!
//! Modules:
//! - [`spec`]: [`ConstraintSpec`], what a client asked for, to and from the protobuf, and the
//!   llguidance grammar for each kind.
//! - [`vocabulary`]: [`GrammarVocabulary`], one model's tokens as the engine sees them (from
//!   tokenizer.json), shared by its sessions, which compiles constraints.
//! - [`state`]: [`ConstraintState`], one session's matcher: masks, advance, rollback, the end.
//! - `tokenizer_env` (private): the model's trie and tokenizer as llguidance's `TokenizerEnv`.
//! - `compiled` (private): the fresh matchers of constraints compiled before, reused.
//! - `model_tokens` (private): the model's ids as a matcher needs them (row width, padding,
//!   EOS), shared by a vocabulary and its matchers.
//! - `limits` (private): the work and memory one request's matcher may spend.
//! - [`error`]: [`GrammarError`], with whose fault each error is.

mod compiled;
pub mod error;
mod limits;
mod model_tokens;
pub mod spec;
pub mod state;
mod tokenizer_env;
pub mod vocabulary;

pub use error::GrammarError;
pub use spec::{ConstraintSpec, default_json_layout};
pub use state::ConstraintState;
pub use vocabulary::GrammarVocabulary;

#[cfg(test)]
mod tests;
