//! Constraints that must be refused, each with a message naming what is wrong, and the limits
//! that stop a constraint too costly to follow.

use llguidance::api::ParserLimits;
use serde_json::json;

use super::{test_tokenizer, vocabulary};
use crate::limits::request_limits;
use crate::{ConstraintSpec, GrammarError, GrammarVocabulary};

fn refusal(spec: &ConstraintSpec) -> String {
    let (vocabulary, _) = vocabulary();
    match vocabulary.compile(spec) {
        Err(error @ GrammarError::Invalid(_)) => {
            assert!(error.is_client_fault());
            error.to_string()
        }
        Err(other) => panic!("{spec:?}: expected Invalid, got {other:?}"),
        Ok(_) => panic!("{spec:?} compiled"),
    }
}

#[test]
fn malformed_constraints_are_invalid_and_named() {
    let cases = [
        (ConstraintSpec::JsonSchema(json!({"type": 5})), "type"),
        (ConstraintSpec::JsonSchema(json!({"type": "strin"})), "strin"),
        (ConstraintSpec::Regex("(a".into()), "(a"),
        (ConstraintSpec::Lark("start: foo\n".into()), "foo"),
        (ConstraintSpec::Lark("start: (\"a\" \"b\"\n".into()), "')'"),
        (ConstraintSpec::Choice(vec![]), "choice"),
    ];
    for (spec, named) in cases {
        let message = refusal(&spec);
        assert!(message.contains(named), "{spec:?}: {message:?} does not name {named:?}");
    }
}

/// `uniqueItems` and `not` are JSON Schema keywords llguidance does not implement: a schema
/// using them is refused by name, not compiled as if they were absent. The same holds when the
/// schema asks llguidance itself to be lenient.
#[test]
fn unsupported_schema_keywords_are_refused_by_name() {
    let unique = json!({"type": "array", "items": {"type": "integer"}, "uniqueItems": true});
    assert!(refusal(&ConstraintSpec::JsonSchema(unique.clone())).contains("uniqueItems"));
    let not = json!({"type": "object", "properties": {"a": {"not": {"type": "string"}}}});
    assert!(refusal(&ConstraintSpec::JsonSchema(not)).contains("\"not\""));
    let mut lenient = unique;
    lenient["x-guidance"] = json!({"lenient": true});
    assert!(refusal(&ConstraintSpec::JsonSchema(lenient)).contains("lenient"));
}

#[test]
fn exceeding_the_limits_is_budget() {
    let t = test_tokenizer();
    let tight = |limits: ParserLimits| GrammarVocabulary::with_limits(&t.json, t.tokens, &[t.eos], limits).unwrap();
    let schema = ConstraintSpec::JsonSchema(json!({
        "type": "object",
        "properties": {"a": {"type": "string"}, "b": {"type": "integer"}, "c": {"type": "boolean"}}
    }));
    let small_grammar = tight(ParserLimits { max_grammar_size: 10, ..request_limits() });
    match small_grammar.compile(&schema) {
        Err(error @ GrammarError::Budget(_)) => assert!(error.is_client_fault() && error.to_string().contains("limit")),
        other => panic!("{other:?}"),
    }
    // A lexer allowed a handful of states runs out of them while following an output.
    let few_states = tight(ParserLimits { max_lexer_states: 40, ..request_limits() });
    let mut state = few_states.compile(&ConstraintSpec::Regex("[a-z]{0,30}[0-9]{0,30}".into())).unwrap();
    let mut result = Ok(());
    for &b in b"abcdefghijklmnopqrstuvwxyz0123456789" {
        result = state.allowed().and_then(|_| state.advance(u32::from(b)));
        if result.is_err() {
            break;
        }
    }
    assert!(matches!(result, Err(GrammarError::Budget(_))), "{result:?}");
}
