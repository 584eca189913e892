//! [`ConstraintSpec`]: what a client asked the output to be, as it arrives in
//! `specd.v1.OutputConstraint`, and the llguidance grammar that says it.

use llguidance::api::TopLevelGrammar;
use serde_json::{Value, json};
use specd_proto::v1::{ChoiceConstraint, JsonObjectConstraint, OutputConstraint, output_constraint::Kind};

use crate::error::GrammarError;

/// The language an output must belong to.
#[derive(Debug, Clone, PartialEq)]
pub enum ConstraintSpec {
    /// Any JSON object.
    JsonObject,
    /// A value valid under this JSON schema.
    JsonSchema(Value),
    /// A string the regular expression matches as a whole (Rust `regex` syntax).
    Regex(String),
    /// Exactly one of these strings.
    Choice(Vec<String>),
    /// A grammar in llguidance's Lark dialect.
    Lark(String),
}

impl ConstraintSpec {
    /// The spec a request carries; `None` when it sets no kind (unconstrained). A JSON schema
    /// that is not JSON is [`GrammarError::Invalid`], saying where the text breaks.
    pub fn from_proto(constraint: &OutputConstraint) -> Result<Option<Self>, GrammarError> {
        let Some(kind) = &constraint.kind else {
            return Ok(None);
        };
        Ok(Some(match kind {
            Kind::JsonObject(JsonObjectConstraint {}) => Self::JsonObject,
            Kind::JsonSchema(text) => Self::JsonSchema(
                serde_json::from_str(text)
                    .map_err(|e| GrammarError::Invalid(format!("json_schema is not valid JSON: {e}")))?,
            ),
            Kind::Regex(regex) => Self::Regex(regex.clone()),
            Kind::Choice(ChoiceConstraint { choices }) => Self::Choice(choices.clone()),
            Kind::Lark(grammar) => Self::Lark(grammar.clone()),
        }))
    }

    pub fn to_proto(&self) -> OutputConstraint {
        let kind = match self {
            Self::JsonObject => Kind::JsonObject(JsonObjectConstraint {}),
            Self::JsonSchema(schema) => Kind::JsonSchema(schema.to_string()),
            Self::Regex(regex) => Kind::Regex(regex.clone()),
            Self::Choice(choices) => Kind::Choice(ChoiceConstraint { choices: choices.clone() }),
            Self::Lark(grammar) => Kind::Lark(grammar.clone()),
        };
        OutputConstraint { kind: Some(kind) }
    }

    /// The constraint's kind and text, which decide what it compiles to.
    pub(crate) fn cache_key(&self) -> String {
        let text = match self {
            Self::JsonObject => String::new(),
            Self::JsonSchema(schema) => schema.to_string(),
            Self::Regex(regex) => regex.clone(),
            // JSON strings: no two lists of choices write the same text.
            Self::Choice(choices) => Value::from(choices.clone()).to_string(),
            Self::Lark(grammar) => grammar.clone(),
        };
        format!("{}:{text}", self.describe())
    }

    /// The kind's name, for logs and metric labels.
    pub fn describe(&self) -> &'static str {
        match self {
            Self::JsonObject => "json_object",
            Self::JsonSchema(_) => "json_schema",
            Self::Regex(_) => "regex",
            Self::Choice(_) => "choice",
            Self::Lark(_) => "lark",
        }
    }

    /// The grammar llguidance compiles. Refusals that llguidance would not make itself happen
    /// here: an empty choice, and a schema asking llguidance to be lenient.
    pub(crate) fn to_grammar(&self) -> Result<TopLevelGrammar, GrammarError> {
        Ok(match self {
            Self::JsonObject => TopLevelGrammar::from_json_schema(default_json_layout(json!({"type": "object"}))),
            Self::JsonSchema(schema) => {
                refuse_lenient(schema)?;
                TopLevelGrammar::from_json_schema(default_json_layout(schema.clone()))
            }
            Self::Regex(regex) => TopLevelGrammar::from_regex(regex),
            Self::Choice(choices) => TopLevelGrammar::from_lark(choice_grammar(choices)?),
            Self::Lark(grammar) => TopLevelGrammar::from_lark(grammar.clone()),
        })
    }
}

/// The JSON layout when a schema chooses none (no `x-guidance` object): one line, with
/// Python's `json.dumps` separators (`", "` and `": "`). llguidance's own default lets any
/// whitespace stand between tokens, and a model that favours whitespace then spends its every
/// token on it and never finishes (a random checkpoint did so on every prompt). A schema that
/// sets `x-guidance` (`whitespace_flexible`, `whitespace_pattern`, separators) keeps its own.
pub fn default_json_layout(mut schema: Value) -> Value {
    if let Some(object) = schema.as_object_mut()
        && !object.contains_key("x-guidance")
    {
        object.insert(
            "x-guidance".into(),
            json!({"whitespace_flexible": false, "item_separator": ", ", "key_separator": ": "}),
        );
    }
    schema
}

/// A schema's `x-guidance` object overrides llguidance's compile options, and `lenient: true`
/// turns a keyword it does not implement into a warning, so the output would silently not be
/// checked against it. Such keywords must be refused by name instead.
fn refuse_lenient(schema: &Value) -> Result<(), GrammarError> {
    if schema.get("x-guidance").and_then(|options| options.get("lenient")).and_then(Value::as_bool) == Some(true) {
        return Err(GrammarError::Invalid(
            "x-guidance.lenient is not accepted: a schema keyword the engine does not implement is refused, \
             never ignored"
                .into(),
        ));
    }
    Ok(())
}

/// One Lark terminal that is the alternation of the choices: a single lexeme, so the lexer's
/// automaton (not the parser) tells choices that share a prefix apart. Each choice is written
/// as a JSON string literal, which is how llguidance's Lark reads string literals, so quotes,
/// backslashes and control characters in a choice need no escaping rules of our own.
fn choice_grammar(choices: &[String]) -> Result<String, GrammarError> {
    if choices.is_empty() {
        return Err(GrammarError::Invalid("choice has no choices: at least one string is needed".into()));
    }
    let literals: Vec<String> = choices.iter().map(|choice| Value::from(choice.as_str()).to_string()).collect();
    Ok(format!("start: CHOICE\nCHOICE: {}\n", literals.join(" | ")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn proto_round_trips_and_bad_schema_text_is_named() {
        let specs = [
            ConstraintSpec::JsonObject,
            ConstraintSpec::JsonSchema(json!({"type": "integer"})),
            ConstraintSpec::Regex("a+".into()),
            ConstraintSpec::Choice(vec!["yes".into(), "no".into()]),
            ConstraintSpec::Lark("start: \"x\"".into()),
        ];
        let names: Vec<_> = specs.iter().map(ConstraintSpec::describe).collect();
        assert_eq!(names, ["json_object", "json_schema", "regex", "choice", "lark"]);
        for spec in specs {
            assert_eq!(ConstraintSpec::from_proto(&spec.to_proto()).unwrap(), Some(spec));
        }
        assert_eq!(ConstraintSpec::from_proto(&OutputConstraint { kind: None }).unwrap(), None);
        let bad = OutputConstraint { kind: Some(Kind::JsonSchema("{\"type\": ".into())) };
        match ConstraintSpec::from_proto(&bad) {
            Err(GrammarError::Invalid(message)) => assert!(message.contains("json_schema"), "{message}"),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn a_schema_gets_the_default_layout_unless_it_sets_its_own() {
        let laid_out = default_json_layout(json!({"type": "object"}));
        assert_eq!(laid_out["x-guidance"]["whitespace_flexible"], false);
        assert_eq!(laid_out["x-guidance"]["item_separator"], ", ");
        let own = json!({"type": "object", "x-guidance": {"whitespace_flexible": true}});
        assert_eq!(default_json_layout(own.clone()), own);
    }

    #[test]
    fn choices_are_json_literals_in_one_terminal() {
        let grammar = choice_grammar(&["a\"b".into(), "c\\d\n".into()]).unwrap();
        assert_eq!(grammar, "start: CHOICE\nCHOICE: \"a\\\"b\" | \"c\\\\d\\n\"\n");
    }
}
