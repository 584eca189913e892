//! The output constraint of a request, as flags (`specd generate`, `specd bench`): one of a
//! JSON schema, any JSON object, a regular expression, a list of choices or a Lark grammar
//! (docs/rule.md#constrained-decoding). Files are read when the flags are parsed, so a
//! missing one is a usage error before anything starts.

use clap::Args;
use specd_proto::v1::output_constraint::Kind;
use specd_proto::v1::{ChoiceConstraint, JsonObjectConstraint, OutputConstraint};

#[derive(Debug, Clone, Default, Args)]
#[group(multiple = false)]
pub struct ConstraintFlags {
    /// Constrain the output to this JSON schema: a file, or the schema itself when it starts
    /// with `{`.
    #[arg(long, env = "SPECD_JSON_SCHEMA", value_name = "FILE|SCHEMA", value_parser = schema_text)]
    json_schema: Option<String>,
    /// Constrain the output to one JSON object (any).
    #[arg(long, env = "SPECD_JSON_OBJECT")]
    json_object: bool,
    /// Constrain the output to match this regular expression.
    #[arg(long, env = "SPECD_REGEX")]
    regex: Option<String>,
    /// Constrain the output to exactly one of these strings, comma-separated.
    #[arg(long, env = "SPECD_CHOICE", value_delimiter = ',')]
    choice: Option<Vec<String>>,
    /// Constrain the output to the Lark grammar in this file.
    #[arg(long, env = "SPECD_GRAMMAR", value_name = "FILE", value_parser = file_text)]
    grammar: Option<String>,
}

impl ConstraintFlags {
    /// The request's constraint; `None` when no flag asks for one.
    pub fn to_wire(&self) -> Option<OutputConstraint> {
        let kind = if let Some(schema) = &self.json_schema {
            Kind::JsonSchema(schema.clone())
        } else if self.json_object {
            Kind::JsonObject(JsonObjectConstraint {})
        } else if let Some(regex) = &self.regex {
            Kind::Regex(regex.clone())
        } else if let Some(choices) = &self.choice {
            Kind::Choice(ChoiceConstraint { choices: choices.clone() })
        } else {
            Kind::Lark(self.grammar.clone()?)
        };
        Some(OutputConstraint { kind: Some(kind) })
    }
}

/// A schema given inline, or the text of the file it names.
fn schema_text(value: &str) -> Result<String, String> {
    if value.trim_start().starts_with('{') { Ok(value.to_owned()) } else { file_text(value) }
}

fn file_text(path: &str) -> Result<String, String> {
    std::fs::read_to_string(path).map_err(|e| format!("cannot read {path}: {e}"))
}
