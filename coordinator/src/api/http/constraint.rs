//! The output constraint of an OpenAI body, as the gRPC API's [`OutputConstraint`]: OpenAI's
//! `response_format` (`json_object`, `json_schema`), vLLM's `structured_outputs` (`json`,
//! `regex`, `choice`, `grammar`, `json_object`) and its older `guided_json`, `guided_regex`,
//! `guided_choice` and `guided_grammar`. One constraint a request: two are refused, naming
//! both fields. Whether the schema or grammar is valid is the coordinator's check, which names
//! what is wrong in it.

use serde::Deserialize;
use serde_json::Value;
use specd_proto::v1::output_constraint::Kind;
use specd_proto::v1::{ChoiceConstraint, JsonObjectConstraint, OutputConstraint};

use super::body::Body;
use super::error::ApiError;

/// The body's constraint and the field that set it; `None` when it asks for none (no field,
/// or `response_format` text).
pub fn constraint(body: &Body) -> Result<Option<(&'static str, OutputConstraint)>, ApiError> {
    let mut found: Vec<(&'static str, Kind)> = Vec::new();
    if let Some(format) = body.get::<ResponseFormat>("response_format")? {
        found.extend(format.kind()?.map(|kind| ("response_format", kind)));
    }
    if let Some(outputs) = body.get::<StructuredOutputs>("structured_outputs")? {
        found.extend(outputs.kind()?.map(|kind| ("structured_outputs", kind)));
    }
    if let Some(schema) = body.get::<Value>("guided_json")? {
        found.push(("guided_json", Kind::JsonSchema(schema_text(schema, "guided_json")?)));
    }
    if let Some(regex) = body.get::<String>("guided_regex")? {
        found.push(("guided_regex", Kind::Regex(regex)));
    }
    if let Some(choices) = body.get::<Vec<String>>("guided_choice")? {
        found.push(("guided_choice", Kind::Choice(ChoiceConstraint { choices })));
    }
    if let Some(grammar) = body.get::<String>("guided_grammar")? {
        found.push(("guided_grammar", Kind::Lark(grammar)));
    }
    match found.len() {
        0 => Ok(None),
        1 => Ok(found.pop().map(|(name, kind)| (name, OutputConstraint { kind: Some(kind) }))),
        _ => {
            let names: Vec<&str> = found.iter().map(|(name, _)| *name).collect();
            Err(ApiError::invalid(
                format!("{} each constrain the output: send one", names.join(" and ")),
                Some(names[1]),
            ))
        }
    }
}

/// A schema sent as a JSON object, or as its text (vLLM takes both).
fn schema_text(schema: Value, field: &str) -> Result<String, ApiError> {
    match schema {
        Value::String(text) => Ok(text),
        Value::Object(_) | Value::Bool(_) => Ok(schema.to_string()),
        _ => Err(ApiError::invalid(format!("`{field}` must be a JSON schema (an object)"), Some(field))),
    }
}

/// OpenAI's `response_format`.
#[derive(Debug, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case", deny_unknown_fields)]
enum ResponseFormat {
    Text,
    JsonObject,
    JsonSchema { json_schema: JsonSchemaFormat },
}

/// `response_format.json_schema`. `strict` asks OpenAI to follow the schema exactly, which
/// specd always does; `name` and `description` label it.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct JsonSchemaFormat {
    #[serde(rename = "name")]
    _name: Option<String>,
    #[serde(rename = "description")]
    _description: Option<String>,
    schema: Option<Value>,
    #[serde(rename = "strict")]
    _strict: Option<bool>,
}

impl ResponseFormat {
    fn kind(self) -> Result<Option<Kind>, ApiError> {
        Ok(match self {
            Self::Text => None,
            Self::JsonObject => Some(Kind::JsonObject(JsonObjectConstraint {})),
            Self::JsonSchema { json_schema } => {
                let schema = json_schema.schema.ok_or_else(|| {
                    ApiError::invalid("response_format.json_schema.schema is required", Some("response_format"))
                })?;
                Some(Kind::JsonSchema(schema_text(schema, "response_format")?))
            }
        })
    }
}

/// vLLM's `structured_outputs`: exactly one of its constraints. Its options that change the
/// language (`disable_any_whitespace`, `whitespace_pattern`, ...) are refused by name: they
/// would be ignored otherwise.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct StructuredOutputs {
    json: Option<Value>,
    regex: Option<String>,
    choice: Option<Vec<String>>,
    grammar: Option<String>,
    json_object: Option<bool>,
}

impl StructuredOutputs {
    fn kind(self) -> Result<Option<Kind>, ApiError> {
        let mut kinds = Vec::new();
        if let Some(schema) = self.json {
            kinds.push(Kind::JsonSchema(schema_text(schema, "structured_outputs")?));
        }
        kinds.extend(self.regex.map(Kind::Regex));
        kinds.extend(self.choice.map(|choices| Kind::Choice(ChoiceConstraint { choices })));
        kinds.extend(self.grammar.map(Kind::Lark));
        if self.json_object == Some(true) {
            kinds.push(Kind::JsonObject(JsonObjectConstraint {}));
        }
        if kinds.len() > 1 {
            return Err(ApiError::invalid(
                "structured_outputs holds more than one of json, regex, choice, grammar, json_object: send one",
                Some("structured_outputs"),
            ));
        }
        Ok(kinds.pop())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::http::body::Endpoint;

    fn of(json: &str) -> Result<Option<OutputConstraint>, ApiError> {
        constraint(&Body::parse(json.as_bytes(), Endpoint::Chat).unwrap()).map(|c| c.map(|(_, c)| c))
    }

    fn kind(json: &str) -> Kind {
        of(json).unwrap().unwrap().kind.unwrap()
    }

    #[test]
    fn each_field_names_its_constraint() {
        let schema = r#"{"type":"object","properties":{"a":{"type":"integer"}}}"#;
        assert_eq!(of(r#"{"model":"m","messages":[]}"#).unwrap(), None);
        assert_eq!(of(r#"{"model":"m","messages":[],"response_format":{"type":"text"}}"#).unwrap(), None);
        assert_eq!(
            kind(r#"{"model":"m","messages":[],"response_format":{"type":"json_object"}}"#),
            Kind::JsonObject(JsonObjectConstraint {})
        );
        let format = format!(
            r#"{{"model":"m","messages":[],"response_format":{{"type":"json_schema","json_schema":{{"name":"n","schema":{schema},"strict":true}}}}}}"#
        );
        let Kind::JsonSchema(text) = kind(&format) else { panic!("not a schema") };
        assert_eq!(serde_json::from_str::<Value>(&text).unwrap(), serde_json::from_str::<Value>(schema).unwrap());
        let Kind::JsonSchema(text) = kind(&format!(r#"{{"model":"m","messages":[],"guided_json":{schema:?}}}"#)) else {
            panic!("not a schema")
        };
        assert_eq!(text, schema);
        assert_eq!(kind(r#"{"model":"m","messages":[],"guided_regex":"a+"}"#), Kind::Regex("a+".into()));
        assert_eq!(
            kind(r#"{"model":"m","messages":[],"structured_outputs":{"choice":["yes","no"]}}"#),
            Kind::Choice(ChoiceConstraint { choices: vec!["yes".into(), "no".into()] })
        );
        assert_eq!(
            kind(r#"{"model":"m","messages":[],"structured_outputs":{"grammar":"start: \"a\""}}"#),
            Kind::Lark("start: \"a\"".into())
        );
    }

    #[test]
    fn two_constraints_or_an_unknown_option_are_refused_by_name() {
        let two = of(r#"{"model":"m","messages":[],"response_format":{"type":"json_object"},"guided_regex":"a"}"#);
        let err = two.unwrap_err();
        assert!(err.message.contains("response_format and guided_regex"), "{}", err.message);
        let both = of(r#"{"model":"m","messages":[],"structured_outputs":{"regex":"a","choice":["a"]}}"#);
        assert_eq!(both.unwrap_err().param.as_deref(), Some("structured_outputs"));
        let option = of(r#"{"model":"m","messages":[],"structured_outputs":{"json":{},"whitespace_pattern":" "}}"#);
        assert!(option.unwrap_err().message.contains("whitespace_pattern"));
        let no_schema =
            of(r#"{"model":"m","messages":[],"response_format":{"type":"json_schema","json_schema":{"name":"n"}}}"#);
        assert!(no_schema.unwrap_err().message.contains("schema is required"));
        let kind = of(r#"{"model":"m","messages":[],"response_format":{"type":"xml"}}"#);
        assert_eq!(kind.unwrap_err().param.as_deref(), Some("response_format"));
    }
}
