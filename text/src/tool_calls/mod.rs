//! Tool calls in a model's own syntax: which syntax a model writes, its output read back as
//! calls ([`parse`]), and the Lark grammar that makes a model write calls ([`grammar`]).
//!
//! Three families, each as its chat templates render an assistant turn that calls tools:
//! - [`ToolCallFormat::Hermes`] (Qwen2.5, Hermes 2 Pro): each call is
//!   `<tool_call>\n{"name": ..., "arguments": {...}}\n</tool_call>`, several one after another,
//!   possibly after some text.
//! - [`ToolCallFormat::Llama3`] (Llama 3.1, 3.2, 3.3 with custom tools): the whole turn is
//!   `{"name": ..., "parameters": {...}}`, optionally after `<|python_tag|>`; several calls
//!   are separated by `;`.
//! - [`ToolCallFormat::Mistral`] (Mistral v0.3, Mixtral 8x22B): `[TOOL_CALLS]` then a JSON
//!   array of `{"name": ..., "arguments": {...}}`, possibly after some text.

pub mod grammar;
pub mod parse;

use std::fmt;
use std::str::FromStr;

use serde_json::{Map, Value};

/// The syntax a model writes its tool calls in.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ToolCallFormat {
    Hermes,
    Llama3,
    Mistral,
}

impl ToolCallFormat {
    pub const ALL: [Self; 3] = [Self::Hermes, Self::Llama3, Self::Mistral];

    /// The format a chat template writes tool calls in, read from the template's text: the
    /// template renders past calls in the syntax the model was trained to write them, so the
    /// syntax's marker appears in it. `[TOOL_CALLS]` is Mistral's; `<tool_call>` Hermes' (and
    /// Qwen's); `<|python_tag|>` or a `"parameters"` key written beside a `"name"` is Llama
    /// 3.1's. Mistral's marker is looked for first, then Hermes', then Llama's, since a
    /// template of one family has no reason to mention another's marker. `None`: the template
    /// shows none of them (it may not know tools at all).
    pub fn detect(template: &str) -> Option<Self> {
        if template.contains("[TOOL_CALLS]") {
            Some(Self::Mistral)
        } else if template.contains("<tool_call>") {
            Some(Self::Hermes)
        } else if template.contains("<|python_tag|>")
            || (template.contains("\"parameters\"") && template.contains("\"name\""))
        {
            Some(Self::Llama3)
        } else {
            None
        }
    }

    /// The text that opens a model's calls.
    pub fn marker(self) -> &'static str {
        match self {
            Self::Hermes => "<tool_call>",
            Self::Llama3 => "<|python_tag|>",
            Self::Mistral => "[TOOL_CALLS]",
        }
    }

    /// The key of a call object that holds its arguments.
    pub fn arguments_key(self) -> &'static str {
        match self {
            Self::Llama3 => "parameters",
            Self::Hermes | Self::Mistral => "arguments",
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Self::Hermes => "hermes",
            Self::Llama3 => "llama3",
            Self::Mistral => "mistral",
        }
    }
}

impl fmt::Display for ToolCallFormat {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for ToolCallFormat {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Self::ALL.into_iter().find(|f| f.name() == s).ok_or_else(|| {
            let names: Vec<&str> = Self::ALL.iter().map(|f| f.name()).collect();
            format!("unknown tool-call format {s:?}: expected one of {}", names.join(", "))
        })
    }
}

/// A call read from a model's output: the function's name and its arguments (a JSON object).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ParsedCall {
    pub name: String,
    pub arguments: Map<String, Value>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn formats_are_detected_from_their_markers_and_named() {
        assert_eq!(ToolCallFormat::detect("{{ '[TOOL_CALLS][' }}<tool_call>"), Some(ToolCallFormat::Mistral));
        assert_eq!(ToolCallFormat::detect("{{- '<tool_call>\\n' }}"), Some(ToolCallFormat::Hermes));
        assert_eq!(ToolCallFormat::detect("{{ '<|python_tag|>' }}"), Some(ToolCallFormat::Llama3));
        assert_eq!(
            ToolCallFormat::detect(r#"{{- '{"name": "' + call.name + '", "parameters": ' }}"#),
            Some(ToolCallFormat::Llama3)
        );
        assert_eq!(ToolCallFormat::detect("{% for m in messages %}{{ m.content }}{% endfor %}"), None);
        for format in ToolCallFormat::ALL {
            assert_eq!(format.to_string().parse::<ToolCallFormat>(), Ok(format));
        }
        assert!("xml".parse::<ToolCallFormat>().unwrap_err().contains("hermes, llama3, mistral"));
    }
}
