//! The tool fields of a chat body: `tools`, `tool_choice` and `parallel_tool_calls`, checked
//! and turned into what the request does with them.
//!
//! - `none` (the default without tools): the template is not offered the tools and the output
//!   is text; nothing is read as a call.
//! - `auto` (the default with tools): the template is offered the tools, the output is free,
//!   and the calls the model writes in its format are read back (`super::calls`). As vLLM,
//!   the output is not constrained, so `strict` does not make the arguments follow their
//!   schema here; with `parallel_tool_calls: false` only the first call is returned.
//! - `required`, or one named function: the output is constrained to calls in the model's
//!   format (a Lark grammar whose arguments are each tool's schema, `%json`; one call where
//!   `parallel_tool_calls` is false or a function is named), so it is calls and nothing else.
//!   Such a request cannot also carry another constraint (`response_format`, ...).

use serde::Deserialize;
use serde_json::Value;
use specd_grammar::default_json_layout;
use specd_proto::v1::OutputConstraint;
use specd_proto::v1::output_constraint::Kind;
use specd_text::tool_calls::grammar::{CallCount, GrammarTool, lark};
use specd_text::{ChatTool, FunctionSpec, ToolCallFormat, ToolKind};

use super::body::Body;
use super::error::ApiError;

/// What the request asked of tools.
#[derive(Debug, Clone, PartialEq)]
pub struct Tools {
    /// Every tool of `tools`, in order.
    tools: Vec<ChatTool>,
    pub choice: ToolChoice,
    pub parallel: bool,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ToolChoice {
    None,
    Auto,
    Required,
    /// This function must be called, once.
    Named(String),
}

/// One entry of `tools`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct ToolField {
    #[serde(rename = "type")]
    _kind: ToolKind,
    function: FunctionField,
}

/// `strict` asks that the arguments follow the schema exactly, which a constrained request
/// always does (see the module's notes for `auto`).
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct FunctionField {
    name: String,
    description: Option<String>,
    parameters: Option<Value>,
    #[serde(rename = "strict")]
    _strict: Option<bool>,
}

/// `tool_choice`: a mode, or `{"type": "function", "function": {"name": ...}}`.
#[derive(Debug, Deserialize)]
#[serde(untagged)]
enum ChoiceField {
    Mode(String),
    Function {
        #[serde(rename = "type")]
        _kind: ToolKind,
        function: NamedFunction,
    },
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct NamedFunction {
    name: String,
}

/// The body's tool fields; `None` when it offers no tools and chooses none.
/// `other_constraint`: the field of another output constraint the body carries, if any.
pub fn tools(body: &Body, other_constraint: Option<&str>) -> Result<Option<Tools>, ApiError> {
    let tools = match body.get::<Vec<Value>>("tools")? {
        Some(items) => items.into_iter().enumerate().map(|(i, item)| tool(i, item)).collect::<Result<Vec<_>, _>>()?,
        None => Vec::new(),
    };
    for (i, tool) in tools.iter().enumerate() {
        let name = &tool.function.name;
        if let Some(first) = tools[..i].iter().position(|t| t.function.name == *name) {
            return Err(ApiError::invalid(
                format!("tools[{i}].function.name {name:?} is also tools[{first}]'s: tool names must be unique"),
                Some("tools"),
            ));
        }
    }
    let choice = match body.get::<ChoiceField>("tool_choice")? {
        None if tools.is_empty() => ToolChoice::None,
        None => ToolChoice::Auto,
        Some(ChoiceField::Mode(mode)) => match mode.as_str() {
            "none" => ToolChoice::None,
            "auto" => ToolChoice::Auto,
            "required" => ToolChoice::Required,
            _ => {
                return Err(ApiError::invalid(
                    format!(
                        "tool_choice {mode:?}: expected none, auto, required or {{\"type\": \"function\", \"function\": {{\"name\": ...}}}}"
                    ),
                    Some("tool_choice"),
                ));
            }
        },
        Some(ChoiceField::Function { function, .. }) => {
            if !tools.iter().any(|t| t.function.name == function.name) {
                return Err(ApiError::invalid(
                    format!("tool_choice names the function {:?}, which is not in tools", function.name),
                    Some("tool_choice"),
                ));
            }
            ToolChoice::Named(function.name)
        }
    };
    let parallel = body.get::<bool>("parallel_tool_calls")?.unwrap_or(true);
    let constrained = matches!(choice, ToolChoice::Required | ToolChoice::Named(_));
    if choice == ToolChoice::Required && tools.is_empty() {
        return Err(ApiError::invalid("tool_choice required needs tools to call", Some("tool_choice")));
    }
    if let (true, Some(other)) = (constrained, other_constraint) {
        return Err(ApiError::invalid(
            format!("tool_choice (a required call) and {other} each constrain the output: send one"),
            Some("tool_choice"),
        ));
    }
    if tools.is_empty() && choice != ToolChoice::Required {
        return Ok(None);
    }
    Ok(Some(Tools { tools, choice, parallel }))
}

/// Entry `i` of `tools`, checked.
fn tool(i: usize, item: Value) -> Result<ChatTool, ApiError> {
    let invalid = |what: String| ApiError::invalid(format!("tools[{i}]{what}"), Some("tools"));
    let ToolField { function, .. } = serde_json::from_value(item).map_err(|e| invalid(format!(": {e}")))?;
    let name_ok = (1..=64).contains(&function.name.len())
        && function.name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-');
    if !name_ok {
        return Err(invalid(format!(
            ".function.name {:?}: 1 to 64 letters, digits, underscores or dashes",
            function.name
        )));
    }
    if let Some(schema) = &function.parameters {
        object_schema(schema).map_err(|why| invalid(format!(".function.parameters {why}")))?;
    }
    Ok(ChatTool {
        kind: ToolKind::Function,
        function: FunctionSpec {
            name: function.name,
            description: function.description,
            parameters: function.parameters,
        },
    })
}

/// A function's parameters are an object: a schema that says another type would make every
/// call's arguments impossible. Whether the rest of it is a valid schema is the constraint
/// compiler's check, when a call is required. llguidance's `lenient` option would let a
/// keyword it does not implement go unchecked, so it is refused here as for `response_format`.
fn object_schema(schema: &Value) -> Result<(), String> {
    let Value::Object(fields) = schema else {
        return Err(format!("must be a JSON schema object, not {schema}"));
    };
    match fields.get("type") {
        None => {}
        Some(Value::String(kind)) if kind == "object" => {}
        Some(other) => return Err(format!("must describe an object (\"type\": \"object\"), not {other}")),
    }
    if fields.get("x-guidance").and_then(|g| g.get("lenient")).and_then(Value::as_bool) == Some(true) {
        return Err("may not set x-guidance.lenient: a keyword the engine does not implement is refused".into());
    }
    Ok(())
}

impl Tools {
    /// The tools offered to the chat template: none when the model may not call them.
    pub fn offered(&self) -> Vec<ChatTool> {
        if self.choice == ToolChoice::None { Vec::new() } else { self.tools.clone() }
    }

    /// Whether the output is read for calls: the model may call tools.
    pub fn reads_calls(&self) -> bool {
        self.choice != ToolChoice::None
    }

    /// The most calls returned: one where the client allows no parallel calls.
    pub fn max_calls(&self) -> Option<usize> {
        (!self.parallel).then_some(1)
    }

    /// The constraint that makes the output calls in `format`, for `required` and a named
    /// function; `marker_token`: the format's marker as a special token of the tokenizer.
    pub fn constraint(&self, format: ToolCallFormat, marker_token: Option<u32>) -> Option<OutputConstraint> {
        let (callable, count): (Vec<&ChatTool>, CallCount) = match &self.choice {
            ToolChoice::None | ToolChoice::Auto => return None,
            ToolChoice::Required => {
                (self.tools.iter().collect(), if self.parallel { CallCount::AtLeastOne } else { CallCount::One })
            }
            ToolChoice::Named(name) => {
                (self.tools.iter().filter(|t| t.function.name == *name).collect(), CallCount::One)
            }
        };
        let grammar_tools: Vec<GrammarTool<'_>> = callable
            .iter()
            .map(|t| GrammarTool { name: &t.function.name, parameters: t.function.parameters.as_ref() })
            .collect();
        Some(OutputConstraint {
            kind: Some(Kind::Lark(lark(format, &grammar_tools, count, marker_token, default_json_layout))),
        })
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::api::http::body::Endpoint;

    const WEATHER: &str = r#"{"type":"function","function":{"name":"weather","description":"d","strict":true,
        "parameters":{"type":"object","properties":{"city":{"type":"string"}},"required":["city"]}}}"#;
    const NOW: &str = r#"{"type":"function","function":{"name":"now"}}"#;

    fn of(fields: &str, other: Option<&str>) -> Result<Option<Tools>, ApiError> {
        let body = format!(r#"{{"model":"m","messages":[{{"role":"user","content":"x"}}]{fields}}}"#);
        tools(&Body::parse(body.as_bytes(), Endpoint::Chat).unwrap(), other)
    }

    #[test]
    fn choices_default_as_openais_and_offer_the_tools_unless_none() {
        assert_eq!(of("", None).unwrap(), None);
        assert_eq!(of(r#","tools":[],"tool_choice":"none""#, None).unwrap(), None);
        let auto = of(&format!(r#","tools":[{WEATHER},{NOW}]"#), None).unwrap().unwrap();
        assert_eq!((auto.choice.clone(), auto.parallel, auto.reads_calls()), (ToolChoice::Auto, true, true));
        assert_eq!(auto.offered().len(), 2);
        assert_eq!(auto.offered()[0].function.parameters.as_ref().unwrap()["required"], json!(["city"]));
        assert_eq!(auto.constraint(ToolCallFormat::Hermes, None), None, "auto leaves the output free");
        let none = of(&format!(r#","tools":[{WEATHER}],"tool_choice":"none""#), None).unwrap().unwrap();
        assert!(none.offered().is_empty() && !none.reads_calls());
        let single = of(&format!(r#","tools":[{WEATHER}],"parallel_tool_calls":false"#), None).unwrap().unwrap();
        assert_eq!(single.max_calls(), Some(1));
        // Auto beside response_format: the output is the format's; no conflict.
        assert!(of(&format!(r#","tools":[{WEATHER}],"tool_choice":"auto""#), Some("response_format")).is_ok());
    }

    #[test]
    fn required_and_named_choices_constrain_the_output_to_calls() {
        let required = of(&format!(r#","tools":[{WEATHER},{NOW}],"tool_choice":"required""#), None).unwrap().unwrap();
        let Some(Kind::Lark(grammar)) = required.constraint(ToolCallFormat::Hermes, None).unwrap().kind else {
            panic!("not a grammar")
        };
        assert!(grammar.starts_with("start: call (\"\\n\" call)*"), "{grammar}");
        assert!(grammar.contains("tool: tool_0 | tool_1"), "{grammar}");
        let named = of(
            &format!(r#","tools":[{WEATHER},{NOW}],"tool_choice":{{"type":"function","function":{{"name":"now"}}}}"#),
            None,
        )
        .unwrap()
        .unwrap();
        assert_eq!(named.choice, ToolChoice::Named("now".into()));
        let Some(Kind::Lark(grammar)) = named.constraint(ToolCallFormat::Mistral, Some(5)).unwrap().kind else {
            panic!("not a grammar")
        };
        assert!(grammar.starts_with("start: <[5]> \"[\" tool \"]\""), "{grammar}");
        assert!(grammar.contains(r#"\"name\": \"now\""#) && !grammar.contains("weather"), "{grammar}");
    }

    #[test]
    fn bad_tools_and_choices_are_refused_naming_the_field() {
        let refused = [
            (format!(r#","tools":[{WEATHER},{WEATHER}]"#), "tools", "tools[1].function.name \"weather\" is also tools[0]'s"),
            (r#","tools":[{"type":"function","function":{"description":"d"}}]"#.into(), "tools", "missing field `name`"),
            (r#","tools":[{"type":"function","function":{"name":"a b"}}]"#.into(), "tools", "tools[0].function.name"),
            (r#","tools":[{"type":"retrieval","function":{"name":"a"}}]"#.into(), "tools", "tools[0]"),
            (
                r#","tools":[{"type":"function","function":{"name":"a","parameters":{"type":"string"}}}]"#.into(),
                "tools",
                "tools[0].function.parameters must describe an object",
            ),
            (
                r#","tools":[{"type":"function","function":{"name":"a","parameters":[1]}}]"#.into(),
                "tools",
                "must be a JSON schema object",
            ),
            (
                r#","tools":[{"type":"function","function":{"name":"a","parameters":{"x-guidance":{"lenient":true}}}}]"#
                    .into(),
                "tools",
                "x-guidance.lenient",
            ),
            (
                format!(r#","tools":[{WEATHER}],"tool_choice":{{"type":"function","function":{{"name":"other"}}}}"#),
                "tool_choice",
                "\"other\", which is not in tools",
            ),
            (format!(r#","tools":[{WEATHER}],"tool_choice":"always""#), "tool_choice", "tool_choice \"always\""),
            (r#","tool_choice":"required""#.into(), "tool_choice", "needs tools"),
            (format!(r#","tools":[{WEATHER}],"parallel_tool_calls":"no""#), "parallel_tool_calls", "invalid type"),
        ];
        for (fields, param, message) in refused {
            let err = of(&fields, None).unwrap_err();
            assert_eq!(err.param.as_deref(), Some(param), "{fields}: {}", err.message);
            assert!(err.message.contains(message), "{fields}: {}", err.message);
        }
        let both = of(&format!(r#","tools":[{WEATHER}],"tool_choice":"required""#), Some("response_format"));
        let err = both.unwrap_err();
        assert!(err.message.contains("tool_choice (a required call) and response_format"), "{}", err.message);
    }
}
