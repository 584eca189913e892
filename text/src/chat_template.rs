//! A model's chat template, rendered as transformers' `apply_chat_template(tokenize=False)`
//! renders it.
//!
//! Where the template comes from follows transformers: `chat_template.jinja` if the model has
//! one, else `tokenizer_config.json`'s `chat_template`, a string or a list of `{name,
//! template}` of which the one named `default` is used. What the template sees is what
//! transformers passes: `messages`, `add_generation_prompt`, `bos_token`, `eos_token`,
//! `tools` and `documents` as `none`, and the environment of [`crate::template_env`].

use minijinja::{Environment, Value, context};
use serde::{Deserialize, Serialize};

use crate::error::TextError;
use crate::template_env;

const NAME: &str = "chat_template";

/// One message of a chat.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
pub struct ChatMessage {
    pub role: String,
    pub content: String,
}

impl ChatMessage {
    pub fn new(role: impl Into<String>, content: impl Into<String>) -> Self {
        Self { role: role.into(), content: content.into() }
    }
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

    /// Renders a chat. A template's `raise_exception` is [`TextError::TemplateRaised`] (the
    /// caller's fault); any other failure is [`TextError::TemplateRender`]. Never panics.
    pub fn render(
        &self,
        messages: &[ChatMessage],
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
            tools => Value::from(()),
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
        assert_eq!(t.render(&chat(&[("user", "a")]), false, "", "").unwrap(), "ok");
        let e = t.render(&chat(&[("user", "a"), ("user", "b")]), false, "", "").unwrap_err();
        assert!(matches!(&e, TextError::TemplateRaised(m) if m == "one message only"), "{e}");
        assert!(e.is_callers_fault());

        let broken = ChatTemplate::new("{{ messages[0].content.no_such_method() }}").unwrap();
        let e = broken.render(&chat(&[("user", "a")]), false, "", "").unwrap_err();
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
        let out = t.render(&chat(&[("user", "  hi ")]), true, "<s>", "</s>").unwrap();
        assert_eq!(out, r#"hi[role="user"][content="  hi "]4True<s></s>"#);
    }

    #[test]
    fn blocks_are_trimmed_and_left_stripped_as_in_transformers() {
        let t = ChatTemplate::new(
            "{% for m in messages %}\n    {% if true %}\n{{ m.content }}\n    {% endif %}\n{% endfor %}",
        )
        .unwrap();
        assert_eq!(t.render(&chat(&[("user", "a"), ("user", "b")]), false, "", "").unwrap(), "a\nb\n");
    }
}
