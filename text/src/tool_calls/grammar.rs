//! The Lark grammar (llguidance's dialect) of a turn that is nothing but tool calls in a
//! format's syntax, each call's arguments valid under its tool's JSON schema (`%json`): what
//! makes a model call a tool when a request requires it, as vLLM does with its grammars.
//!
//! The grammar writes each call as the format's templates render one, with Python's
//! `json.dumps` layout (`", "` and `": "`, no other whitespace) unless a schema chooses its
//! own `x-guidance` layout, so that what the model is made to write is what it was shown and
//! what [`super::parse`] reads back.

use serde_json::{Value, json};

use super::ToolCallFormat;

/// How many calls the turn holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CallCount {
    One,
    /// One or more (`parallel_tool_calls`).
    AtLeastOne,
}

/// One tool the grammar lets the model call.
#[derive(Clone, Copy, Debug)]
pub struct GrammarTool<'a> {
    pub name: &'a str,
    /// Its arguments' JSON schema; `None`: a function without parameters (the arguments are
    /// `{}`).
    pub parameters: Option<&'a Value>,
}

/// The grammar of calls to `tools` (at least one). `marker_token`: the id of the format's
/// marker where the tokenizer has it as a special token, which the grammar then names as that
/// token; Mistral's `[TOOL_CALLS]` is one, and the model writes it so. Hermes' tags are always
/// spelled (its reader must see them in the text, and Qwen's are not special); Llama's calls
/// have no marker in the grammar (the whole turn is the call). `layout` gives each tool's
/// schema the JSON layout the arguments are written in where the schema sets none: the grammar
/// engine's own default (`specd_grammar::default_json_layout`), so that calls and
/// `response_format` outputs are laid out alike.
pub fn lark(
    format: ToolCallFormat,
    tools: &[GrammarTool<'_>],
    count: CallCount,
    marker_token: Option<u32>,
    layout: fn(Value) -> Value,
) -> String {
    let mut rules = Vec::new();
    let (item, separator) = match format {
        ToolCallFormat::Hermes => {
            rules.push(format!("call: {} tool {}", literal("<tool_call>\n"), literal("\n</tool_call>")));
            ("call", "\n")
        }
        ToolCallFormat::Llama3 => ("tool", "; "),
        ToolCallFormat::Mistral => ("tool", ", "),
    };
    let calls = match count {
        CallCount::One => item.to_owned(),
        CallCount::AtLeastOne => format!("{item} ({} {item})*", literal(separator)),
    };
    let start = match format {
        ToolCallFormat::Mistral => {
            let marker = marker_token.map_or_else(|| literal(format.marker()), |id| format!("<[{id}]>"));
            format!("start: {marker} {} {calls} {}", literal("["), literal("]"))
        }
        ToolCallFormat::Hermes | ToolCallFormat::Llama3 => format!("start: {calls}"),
    };
    let names: Vec<String> = (0..tools.len()).map(|i| format!("tool_{i}")).collect();
    rules.insert(0, start);
    rules.push(format!("tool: {}", names.join(" | ")));
    // Mistral's templates write each past call with its 9-character id: the model may too.
    let id = if format == ToolCallFormat::Mistral {
        rules.push(r#"MISTRAL_ID: /, "id": "[A-Za-z0-9]{9}"/"#.to_owned());
        " MISTRAL_ID?"
    } else {
        ""
    };
    for (name, tool) in names.iter().zip(tools) {
        let opening = format!("{{\"name\": {}, \"{}\": ", Value::from(tool.name), format.arguments_key());
        let schema = layout(tool.parameters.cloned().unwrap_or_else(no_parameters));
        rules.push(format!("{name}: {} %json {schema}{id} {}", literal(&opening), literal("}")));
    }
    rules.join("\n") + "\n"
}

/// A Lark string literal: llguidance reads one as a JSON string literal.
fn literal(text: &str) -> String {
    Value::from(text).to_string()
}

/// The schema of a function that takes no parameters: `{}` and nothing else.
fn no_parameters() -> Value {
    json!({"type": "object", "properties": {}, "additionalProperties": false})
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Marks a schema, to show the layout is applied to every tool's.
    fn marked(mut schema: Value) -> Value {
        schema["x-layout"] = json!(true);
        schema
    }

    #[test]
    fn each_format_writes_its_calls() {
        let schema = json!({"type": "object", "properties": {"city": {"type": "string"}}});
        let tools =
            [GrammarTool { name: "weather", parameters: Some(&schema) }, GrammarTool { name: "now", parameters: None }];
        let hermes = lark(ToolCallFormat::Hermes, &tools, CallCount::AtLeastOne, None, marked);
        assert!(hermes.starts_with("start: call (\"\\n\" call)*\ncall: \"<tool_call>\\n\" tool \"\\n</tool_call>\"\n"));
        assert!(hermes.contains("tool: tool_0 | tool_1\n"), "{hermes}");
        assert!(hermes.contains(r#"tool_0: "{\"name\": \"weather\", \"arguments\": " %json {"type":"object""#));
        assert_eq!(hermes.matches(r#""x-layout":true"#).count(), 2, "{hermes}");
        assert!(hermes.contains(r#""additionalProperties":false"#), "no parameters: no arguments");
        let llama = lark(ToolCallFormat::Llama3, &tools[..1], CallCount::One, None, marked);
        assert!(llama.starts_with("start: tool\n"), "{llama}");
        assert!(llama.contains(r#"\"parameters\": "#), "{llama}");
        let mistral = lark(ToolCallFormat::Mistral, &tools, CallCount::AtLeastOne, Some(5), marked);
        assert!(mistral.starts_with(r#"start: <[5]> "[" tool (", " tool)* "]""#), "{mistral}");
        assert!(mistral.contains(r#"} MISTRAL_ID? "}""#), "{mistral}");
        let spelled = lark(ToolCallFormat::Mistral, &tools, CallCount::One, None, marked);
        assert!(spelled.starts_with(r#"start: "[TOOL_CALLS]" "[" tool "]""#), "{spelled}");
    }
}
