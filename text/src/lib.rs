//! Text for specd: what turns a chat or a string into prompt ids and generated ids back into
//! streamed text, with no model code (no libtorch, no tokio), so the coordinator can link it.
//!
//! Modules:
//! - [`assets`]: the model directory's text files ([`TextAssets`]), read once and shippable.
//! - [`model_text`]: [`ModelText`], the tokenizer, chat template, bos/eos strings and
//!   generation defaults of one model, built from [`TextAssets`].
//! - [`chat_template`]: [`ChatTemplate`], a Hugging Face chat template rendered with minijinja
//!   the way transformers' `apply_chat_template` renders it, and the typed chat it renders
//!   ([`ChatMessage`] with its [`ToolCall`]s, the [`ChatTool`]s offered).
//! - [`tool_calls`]: [`ToolCallFormat`], the syntax a model writes tool calls in (Hermes,
//!   Llama 3.1, Mistral), read back from its output and enforced by a Lark grammar.
//! - `template_env` (private): the Jinja environment transformers gives templates
//!   (`raise_exception`, `strftime_now`, Python's `tojson`, trim/lstrip blocks, Python methods).
//! - `python_json` (private): `json.dumps` as Python writes it, for `tojson`.
//! - `strftime` (private): the subset of C `strftime` that `strftime_now` supports.
//! - [`detokenizer`]: [`IncrementalDetokenizer`], generated ids to text at O(a small window) per
//!   token, exact against a whole decode.
//! - [`stop`]: [`TextStream`], the detokenizer plus stop strings held back and cut.
//! - [`generation_config`]: [`GenerationDefaults`] from `generation_config.json`.
//! - [`error`]: [`TextError`], with whose fault each error is.
//! - `test_tokenizer` (the `testing` feature, for other crates' unit tests): a byte-level
//!   tokenizer built in Rust.

pub mod assets;
pub mod chat_template;
pub mod detokenizer;
pub mod error;
pub mod generation_config;
pub mod model_text;
mod python_json;
pub mod stop;
mod strftime;
mod template_env;
#[cfg(any(test, feature = "testing"))]
pub mod test_tokenizer;
pub mod tool_calls;

pub use assets::TextAssets;
pub use chat_template::{ChatMessage, ChatTemplate, ChatTool, FunctionCall, FunctionSpec, ToolCall, ToolKind};
pub use detokenizer::IncrementalDetokenizer;
pub use error::TextError;
pub use generation_config::GenerationDefaults;
pub use model_text::ModelText;
pub use stop::{Pushed, TextStream};
pub use tokenizers::Tokenizer;
pub use tool_calls::{ParsedCall, ToolCallFormat};

#[cfg(test)]
mod tests {
    /// The coordinator shares a model's text across requests and moves streams between tasks.
    #[test]
    fn shared_types_are_send_and_sync() {
        fn send_sync<T: Send + Sync>() {}
        send_sync::<super::ModelText>();
        send_sync::<super::ChatTemplate>();
        send_sync::<super::TextStream>();
        send_sync::<super::IncrementalDetokenizer>();
        send_sync::<super::TextError>();
    }
}
