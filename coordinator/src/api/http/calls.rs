//! The tool calls of an output in OpenAI's shapes: a whole message's `tool_calls`, and the
//! deltas of a stream. The model's text is read in its format by
//! [`specd_text::tool_calls::parse`], which gives out text as soon as it cannot be part of a
//! call and each call once it is complete; here each call gets its id and its arguments
//! become the JSON string OpenAI sends.

use std::collections::hash_map::RandomState;
use std::hash::BuildHasher;

use serde_json::{Value, json};
use specd_text::ParsedCall;
use specd_text::ToolCallFormat;
use specd_text::tool_calls::parse::{Piece, ToolCallParser};

/// One output's calls, read as the text arrives.
#[derive(Debug)]
pub struct CallReader {
    format: ToolCallFormat,
    parser: ToolCallParser,
    /// At most this many calls are returned (`parallel_tool_calls: false`: one).
    max_calls: Option<usize>,
    calls: Vec<Value>,
}

/// What a piece of output adds: text to send, and calls, each as OpenAI's
/// `{"id", "type", "function": {"name", "arguments"}}`.
#[derive(Debug, Default, PartialEq)]
pub struct Read {
    pub text: String,
    pub calls: Vec<Value>,
}

impl CallReader {
    pub fn new(format: ToolCallFormat, max_calls: Option<usize>) -> Self {
        Self { format, parser: ToolCallParser::new(format), max_calls, calls: Vec::new() }
    }

    pub fn push(&mut self, text: &str) -> Read {
        let pieces = self.parser.push(text);
        self.take(pieces)
    }

    /// The end of the output.
    pub fn finish(&mut self) -> Read {
        let pieces = self.parser.finish();
        self.take(pieces)
    }

    /// Every call returned so far.
    pub fn calls(&self) -> &[Value] {
        &self.calls
    }

    fn take(&mut self, pieces: Vec<Piece>) -> Read {
        let mut read = Read::default();
        for piece in pieces {
            match piece {
                Piece::Text(text) => read.text.push_str(&text),
                Piece::Call(call) if self.max_calls.is_none_or(|max| self.calls.len() < max) => {
                    let call = self.openai(call);
                    self.calls.push(call.clone());
                    read.calls.push(call);
                }
                // A call past the one the client allows: left out, as it asked for no more.
                Piece::Call(_) => {}
            }
        }
        read
    }

    fn openai(&self, call: ParsedCall) -> Value {
        json!({
            "id": call_id(self.format),
            "type": "function",
            "function": {"name": call.name, "arguments": Value::Object(call.arguments).to_string()},
        })
    }
}

/// A new call's id: `call_` and 24 random letters and digits, as OpenAI's look; for Mistral 9
/// letters and digits, since Mistral's chat templates refuse any other id when the call comes
/// back in the conversation's history.
fn call_id(format: ToolCallFormat) -> String {
    match format {
        ToolCallFormat::Mistral => random_alphanumeric(9),
        ToolCallFormat::Hermes | ToolCallFormat::Llama3 => format!("call_{}", random_alphanumeric(24)),
    }
}

/// Random letters and digits. An id only needs to differ from the others of its conversation;
/// std's randomly keyed hasher (fresh keys for every `RandomState`) gives that without another
/// dependency.
fn random_alphanumeric(len: usize) -> String {
    const ALPHABET: &[u8; 62] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789";
    let state = RandomState::new();
    let mut out = String::with_capacity(len);
    for block in 0u64.. {
        // 64 bits give 10 characters of 62.
        let mut bits = state.hash_one(block);
        for _ in 0..10 {
            if out.len() == len {
                return out;
            }
            out.push(char::from(ALPHABET[(bits % 62) as usize]));
            bits /= 62;
        }
    }
    out
}

/// A whole output's message: its text (`null` when only whitespace is left beside calls) and
/// its calls.
pub fn message(text: String, calls: &[Value]) -> Value {
    if calls.is_empty() {
        return json!({"role": "assistant", "content": text});
    }
    let content = if text.trim().is_empty() { Value::Null } else { Value::String(text) };
    json!({"role": "assistant", "content": content, "tool_calls": calls})
}

/// The two deltas of a streamed call: its id, type and name (with empty arguments), then its
/// arguments, as OpenAI streams them.
pub fn deltas(index: usize, call: &Value) -> [Value; 2] {
    [
        json!({"tool_calls": [{
            "index": index,
            "id": call["id"],
            "type": "function",
            "function": {"name": call["function"]["name"], "arguments": ""},
        }]}),
        json!({"tool_calls": [{"index": index, "function": {"arguments": call["function"]["arguments"]}}]}),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn calls_get_ids_and_string_arguments() {
        let mut reader = CallReader::new(ToolCallFormat::Hermes, None);
        let first = reader
            .push("Let me look.\n<tool_call>\n{\"name\": \"weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool");
        assert_eq!((first.text.as_str(), first.calls.len()), ("Let me look.\n", 0));
        let second = reader.push("_call>\n<tool_call>\n{\"name\": \"now\", \"arguments\": {}}\n</tool_call>");
        assert_eq!(second.calls.len(), 2);
        assert_eq!(reader.finish(), Read::default());
        let call = &reader.calls()[0];
        assert_eq!(call["function"], json!({"name": "weather", "arguments": "{\"city\":\"Paris\"}"}));
        let id = call["id"].as_str().unwrap();
        assert!(id.starts_with("call_") && id.len() == 29 && id[5..].bytes().all(|b| b.is_ascii_alphanumeric()));
        assert_ne!(reader.calls()[1]["id"], call["id"]);
        let whole = message("\n".into(), reader.calls());
        assert!(whole["content"].is_null() && whole["tool_calls"].as_array().unwrap().len() == 2);
        assert_eq!(message("hi".into(), &[]), json!({"role": "assistant", "content": "hi"}));
        let [head, arguments] = deltas(1, call);
        assert_eq!(head["tool_calls"][0]["function"], json!({"name": "weather", "arguments": ""}));
        assert_eq!(arguments["tool_calls"][0], json!({"index": 1, "function": {"arguments": "{\"city\":\"Paris\"}"}}));
    }

    #[test]
    fn one_call_when_parallel_calls_are_off_and_mistral_ids() {
        let mut reader = CallReader::new(ToolCallFormat::Mistral, Some(1));
        let read =
            reader.push("[TOOL_CALLS][{\"name\": \"a\", \"arguments\": {}}, {\"name\": \"b\", \"arguments\": {}}]");
        assert_eq!(read.calls.len(), 1);
        assert_eq!(read.calls[0]["function"]["name"], "a");
        let id = read.calls[0]["id"].as_str().unwrap();
        assert!(id.len() == 9 && id.bytes().all(|b| b.is_ascii_alphanumeric()), "{id}");
    }
}
