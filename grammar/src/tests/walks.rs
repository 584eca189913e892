//! Random walks: 200 outputs drawn uniformly among each position's allowed tokens, every one
//! checked to belong to the language by a checker that does not use llguidance.

use std::collections::BTreeSet;

use serde::Deserialize;
use serde_json::{Value, json};

use super::walk_outputs;
use crate::ConstraintSpec;

const WALKS: usize = 200;

fn chars(value: &Value) -> Option<usize> {
    value.as_str().map(|s| s.chars().count())
}

#[test]
fn schema_walks_give_json_the_schema_accepts() {
    let schema = json!({
        "type": "object",
        "properties": {
            "name": {"type": "string", "maxLength": 8},
            "age": {"type": "integer", "minimum": 0, "maximum": 150},
            "color": {"enum": ["red", "green", "blue"]},
            "tags": {"type": "array", "items": {"type": "string", "maxLength": 4}, "minItems": 1, "maxItems": 3}
        },
        "required": ["name", "age", "color"],
        "additionalProperties": false
    });
    let mut with_tags = 0;
    for text in walk_outputs(&ConstraintSpec::JsonSchema(schema), WALKS, 1) {
        let value: Value = serde_json::from_str(&text).unwrap_or_else(|e| panic!("{text:?}: {e}"));
        let object = value.as_object().unwrap_or_else(|| panic!("not an object: {text:?}"));
        for key in object.keys() {
            assert!(["name", "age", "color", "tags"].contains(&key.as_str()), "{text:?}");
        }
        assert!(chars(&object["name"]).is_some_and(|n| n <= 8), "{text:?}");
        assert!(object["age"].as_u64().is_some_and(|age| age <= 150), "{text:?}");
        assert!(["red", "green", "blue"].iter().any(|c| object["color"] == *c), "{text:?}");
        if let Some(tags) = object.get("tags") {
            with_tags += 1;
            let tags = tags.as_array().unwrap_or_else(|| panic!("{text:?}"));
            assert!((1..=3).contains(&tags.len()), "{text:?}");
            assert!(tags.iter().all(|tag| chars(tag).is_some_and(|n| n <= 4)), "{text:?}");
        }
    }
    // The optional field is both taken and left out: the walk explores the language.
    assert!(with_tags > 0 && with_tags < WALKS, "{with_tags} of {WALKS} with tags");
}

/// Whether `text` is one JSON value, by serde_json's syntax check alone: parsing to a
/// [`Value`] would refuse numbers past f64's range (`1E999`), which are valid JSON.
fn is_json(text: &str) -> bool {
    let mut deserializer = serde_json::Deserializer::from_str(text);
    serde::de::IgnoredAny::deserialize(&mut deserializer).is_ok() && deserializer.end().is_ok()
}

#[test]
fn json_object_walks_give_objects() {
    for text in walk_outputs(&ConstraintSpec::JsonObject, WALKS, 2) {
        assert!(is_json(&text), "{text:?}");
        assert!(text.trim_start().starts_with('{'), "{text:?}");
    }
    assert!(!is_json("{\"a\": 1,}") && is_json("{\"a\": 1E999}"));
}

#[test]
fn regex_walks_match_the_whole_expression() {
    let pattern = r"[a-c]{1,4}(-[0-9]{2})?@(x|yz)\.(é|ü)";
    let anchored = regex::Regex::new(&format!("^(?:{pattern})$")).expect("regex");
    let mut seen = BTreeSet::new();
    for text in walk_outputs(&ConstraintSpec::Regex(pattern.into()), WALKS, 3) {
        assert!(anchored.is_match(&text), "{text:?}");
        seen.insert(text);
    }
    assert!(seen.len() > 50, "only {} distinct outputs", seen.len());
}

#[test]
fn choice_walks_give_exactly_one_choice() {
    let choices: Vec<String> =
        ["yes", "yesterday", "no", "n/a \"quoted\"\\", "é"].iter().map(|c| c.to_string()).collect();
    let mut seen = BTreeSet::new();
    for text in walk_outputs(&ConstraintSpec::Choice(choices.clone()), WALKS, 4) {
        assert!(choices.contains(&text), "{text:?}");
        seen.insert(text);
    }
    assert_eq!(seen.len(), choices.len(), "every choice is reachable: {seen:?}");
}

/// `expr: term (("+" | "-") term)*`, `term: NUMBER | "(" expr ")"`, `NUMBER: [0-9]{1,3}`.
fn parse_expr(bytes: &[u8], at: &mut usize) -> bool {
    if !parse_term(bytes, at) {
        return false;
    }
    while *at < bytes.len() && (bytes[*at] == b'+' || bytes[*at] == b'-') {
        *at += 1;
        if !parse_term(bytes, at) {
            return false;
        }
    }
    true
}

fn parse_term(bytes: &[u8], at: &mut usize) -> bool {
    if bytes.get(*at) == Some(&b'(') {
        *at += 1;
        let inner = parse_expr(bytes, at);
        let closed = bytes.get(*at) == Some(&b')');
        *at += 1;
        return inner && closed;
    }
    let digits = bytes[*at..].iter().take_while(|b| b.is_ascii_digit()).count();
    *at += digits;
    (1..=3).contains(&digits)
}

#[test]
fn lark_walks_give_sentences_of_the_grammar() {
    let grammar =
        "start: expr\nexpr: term ((\"+\" | \"-\") term)*\nterm: NUMBER | \"(\" expr \")\"\nNUMBER: /[0-9]{1,3}/\n";
    let mut nested = 0;
    for text in walk_outputs(&ConstraintSpec::Lark(grammar.into()), WALKS, 5) {
        let mut at = 0;
        assert!(parse_expr(text.as_bytes(), &mut at) && at == text.len(), "{text:?}");
        nested += usize::from(text.contains('('));
    }
    assert!(nested > 0, "no walk used the recursion");
}
