//! A model's chat template, rendered as transformers' `apply_chat_template(tokenize=False)`
//! renders it.
//!
//! Where the template comes from follows transformers: `chat_template.jinja` if the model has
//! one, else `tokenizer_config.json`'s `chat_template`, a string or a list of `{name,
//! template}` of which the one named `default` is used. What the template sees is what
//! transformers passes: `messages` (with `tool_calls` on an assistant turn that calls tools and
//! `tool_call_id` on a tool's result), `tools` (`none` when there are none), `documents` as
//! `none`, `add_generation_prompt`, `bos_token`, `eos_token`, and the environment of
//! [`crate::template_env`].

use minijinja::{Environment, Value, context};
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value as Json};

use crate::error::TextError;
use crate::template_env;

const NAME: &str = "chat_template";

/// One message of a chat, serialised as the dict transformers hands its template: fields
/// that a message does not have are left out (templates test `'tool_calls' in message` and
/// `message.tool_call_id is defined`), and `content` is `none` where OpenAI's is `null`.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
pub struct ChatMessage {
    pub role: String,
    /// `None` for an assistant turn that only calls tools.
    pub content: Option<String>,
    /// The calls an assistant turn made.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tool_calls: Vec<ToolCall>,
    /// On a tool's result (`role: tool`): the id of the call it answers.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_call_id: Option<String>,
    /// On a tool's result: the name of the function that produced it, where the client sent it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
}

impl ChatMessage {
    pub fn new(role: impl Into<String>, content: impl Into<String>) -> Self {
        Self {
            role: role.into(),
            content: Some(content.into()),
            tool_calls: Vec::new(),
            tool_call_id: None,
            name: None,
        }
    }

    /// An assistant turn that calls tools, with `content` before the calls, if any.
    pub fn assistant_calls(content: Option<String>, tool_calls: Vec<ToolCall>) -> Self {
        Self { role: "assistant".into(), content, tool_calls, tool_call_id: None, name: None }
    }

    /// A tool's result for the call `tool_call_id`.
    pub fn tool_result(tool_call_id: impl Into<String>, content: impl Into<String>) -> Self {
        Self {
            role: "tool".into(),
            content: Some(content.into()),
            tool_calls: Vec::new(),
            tool_call_id: Some(tool_call_id.into()),
            name: None,
        }
    }
}

/// The one kind of tool there is: `"type": "function"`.
#[derive(Clone, Copy, Debug, Default, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum ToolKind {
    #[default]
    Function,
}

/// A call in an assistant turn, as transformers expects it in `messages`:
/// `{"id", "type": "function", "function": {"name", "arguments": {...}}}`.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
pub struct ToolCall {
    pub id: String,
    #[serde(rename = "type", default)]
    pub kind: ToolKind,
    pub function: FunctionCall,
}

/// A function's name and its arguments as a dict: OpenAI sends the arguments as a JSON
/// string, templates index and `tojson` them as a mapping (`tool_call.arguments | tojson`).
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
pub struct FunctionCall {
    pub name: String,
    pub arguments: Map<String, Json>,
}

/// A tool the model may call, as transformers passes `tools` to the template: the list of
/// `{"type": "function", "function": {"name", "description", "parameters"}}` dicts an OpenAI
/// request carries, with the keys it left out left out.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
pub struct ChatTool {
    #[serde(rename = "type", default)]
    pub kind: ToolKind,
    pub function: FunctionSpec,
}

/// A function's name, what it does, and the JSON schema of its arguments.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
pub struct FunctionSpec {
    pub name: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parameters: Option<Json>,
}

/// A compiled chat template.
#[derive(Debug)]
pub struct ChatTemplate {
    env: Environment<'static>,
    source: String,
}

impl ChatTemplate {
    /// Compiles a template's source; a syntax error is the model files' fault.
    pub fn new(source: &str) -> Result<Self, TextError> {
        let mut env = template_env::environment();
        env.add_template_owned(NAME, source.to_owned()).map_err(|e| TextError::TemplateSyntax(describe(&e)))?;
        Ok(Self { env, source: source.to_owned() })
    }

    /// The model's template with transformers' precedence, `None` when it has none.
    pub fn from_files(
        tokenizer_config_json: Option<&str>,
        chat_template_jinja: Option<&str>,
    ) -> Result<Option<ChatTemplate>, TextError> {
        if let Some(source) = chat_template_jinja {
            return Self::new(source).map(Some);
        }
        let Some(config) = tokenizer_config_json else { return Ok(None) };
        let config: serde_json::Value = serde_json::from_str(config)
            .map_err(|e| TextError::Json { file: "tokenizer_config.json", message: e.to_string() })?;
        match config.get("chat_template") {
            None | Some(serde_json::Value::Null) => Ok(None),
            Some(serde_json::Value::String(source)) => Self::new(source).map(Some),
            Some(serde_json::Value::Array(named)) => {
                // A list of named templates: chat requests use the one named "default"; without
                // one, transformers refuses to choose, and so do we (no template).
                let default = named.iter().find(|t| t.get("name").and_then(|n| n.as_str()) == Some("default"));
                match default.and_then(|t| t.get("template")).and_then(|t| t.as_str()) {
                    Some(source) => Self::new(source).map(Some),
                    None => Ok(None),
                }
            }
            Some(other) => Err(TextError::Json {
                file: "tokenizer_config.json",
                message: format!("chat_template must be a string or a list of {{name, template}}, not {other}"),
            }),
        }
    }

    /// The template's source text.
    pub fn source(&self) -> &str {
        &self.source
    }

    /// Renders a chat; `tools` empty is `tools=None`, as transformers renders a chat without
    /// tools. A template's `raise_exception` is [`TextError::TemplateRaised`] (the caller's
    /// fault); any other failure is [`TextError::TemplateRender`]. Never panics.
    pub fn render(
        &self,
        messages: &[ChatMessage],
        tools: &[ChatTool],
        add_generation_prompt: bool,
        bos_token: &str,
        eos_token: &str,
    ) -> Result<String, TextError> {
        let template = self.env.get_template(NAME).map_err(|e| TextError::TemplateRender(describe(&e)))?;
        let ctx = context! {
            messages => Value::from_serialize(messages),
            add_generation_prompt => add_generation_prompt,
            bos_token => bos_token,
            eos_token => eos_token,
            tools => if tools.is_empty() { Value::from(()) } else { Value::from_serialize(tools) },
            documents => Value::from(()),
        };
        template.render(ctx).map_err(|e| match template_env::raised_message(&e) {
            Some(message) => TextError::TemplateRaised(message),
            None => TextError::TemplateRender(describe(&e)),
        })
    }
}

/// A minijinja error on one line; its display names the template and line
/// ("... (in chat_template:3)").
fn describe(e: &minijinja::Error) -> String {
    e.to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn chat(pairs: &[(&str, &str)]) -> Vec<ChatMessage> {
        pairs.iter().map(|(r, c)| ChatMessage::new(*r, *c)).collect()
    }

    #[test]
    fn chat_template_jinja_wins_over_the_config_and_a_list_uses_default() {
        let config = r#"{"chat_template": "config"}"#;
        let t = ChatTemplate::from_files(Some(config), Some("jinja")).unwrap().unwrap();
        assert_eq!(t.source(), "jinja");
        let t = ChatTemplate::from_files(Some(config), None).unwrap().unwrap();
        assert_eq!(t.source(), "config");
        let named = r#"{"chat_template": [{"name": "tool_use", "template": "tools"}, {"name": "default", "template": "plain"}]}"#;
        assert_eq!(ChatTemplate::from_files(Some(named), None).unwrap().unwrap().source(), "plain");
        let no_default = r#"{"chat_template": [{"name": "tool_use", "template": "tools"}]}"#;
        assert!(ChatTemplate::from_files(Some(no_default), None).unwrap().is_none());
        assert!(ChatTemplate::from_files(Some(r#"{"bos_token": "<s>"}"#), None).unwrap().is_none());
        assert!(ChatTemplate::from_files(None, None).unwrap().is_none());
        assert!(matches!(ChatTemplate::from_files(Some(r#"{"chat_template": 3}"#), None), Err(TextError::Json { .. })));
    }

    #[test]
    fn raise_exception_is_the_callers_fault_and_other_failures_are_not() {
        let t = ChatTemplate::new("{% if messages|length > 1 %}{{ raise_exception('one message only') }}{% endif %}ok")
            .unwrap();
        assert_eq!(t.render(&chat(&[("user", "a")]), &[], false, "", "").unwrap(), "ok");
        let e = t.render(&chat(&[("user", "a"), ("user", "b")]), &[], false, "", "").unwrap_err();
        assert!(matches!(&e, TextError::TemplateRaised(m) if m == "one message only"), "{e}");
        assert!(e.is_callers_fault());

        let broken = ChatTemplate::new("{{ messages[0].content.no_such_method() }}").unwrap();
        let e = broken.render(&chat(&[("user", "a")]), &[], false, "", "").unwrap_err();
        assert!(matches!(&e, TextError::TemplateRender(m) if m.contains("chat_template:1")), "{e}");
        assert!(!e.is_callers_fault());
        let e = ChatTemplate::new("{% if %}").unwrap_err();
        assert!(matches!(e, TextError::TemplateSyntax(_)), "{e}");
    }

    #[test]
    fn python_methods_and_transformers_globals_work() {
        let t = ChatTemplate::new(concat!(
            "{% for m in messages %}{% if m.content.startswith('  ') %}{{ m.content.strip() }}{% endif %}",
            "{% for k, v in m.items() %}[{{ k }}={{ v | tojson }}]{% endfor %}{% endfor %}",
            "{{ strftime_now('%Y') | length }}{{ tools is none }}{{ bos_token }}{{ eos_token }}",
        ))
        .unwrap();
        let out = t.render(&chat(&[("user", "  hi ")]), &[], true, "<s>", "</s>").unwrap();
        assert_eq!(out, r#"hi[role="user"][content="  hi "]4True<s></s>"#);
    }

    #[test]
    fn blocks_are_trimmed_and_left_stripped_as_in_transformers() {
        let t = ChatTemplate::new(
            "{% for m in messages %}\n    {% if true %}\n{{ m.content }}\n    {% endif %}\n{% endfor %}",
        )
        .unwrap();
        assert_eq!(t.render(&chat(&[("user", "a"), ("user", "b")]), &[], false, "", "").unwrap(), "a\nb\n");
    }
}
