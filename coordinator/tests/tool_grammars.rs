//! The grammar that makes a model call tools (`tool_choice` required or named) admits exactly
//! the calls its chat template renders: each format's grammar, compiled by the grammar engine
//! over a byte-level vocabulary, takes the assistant turn that the format's test template
//! (text/tests/fixtures/chat_templates, checked against transformers there) renders for those
//! calls, to the end; refuses text before the calls, a second call where one is allowed, a
//! function not offered, and arguments against the schema.

use std::sync::Arc;

use serde_json::{Value, json};
use specd_grammar::{ConstraintSpec, GrammarVocabulary, default_json_layout};
use specd_text::test_tokenizer::{byte_ids, byte_tokenizer};
use specd_text::tool_calls::grammar::{CallCount, GrammarTool, lark};
use specd_text::{ChatMessage, ChatTemplate, FunctionCall, ToolCall, ToolCallFormat, ToolKind};

/// The byte tokenizer with `[TOOL_CALLS]` as a special token (as Mistral's): (vocabulary, eos
/// id, the marker's id).
fn vocabulary() -> (Arc<GrammarVocabulary>, u32, u32) {
    let (tokenizer, eos) = byte_tokenizer(&[]);
    let mut json: Value = serde_json::from_str(&tokenizer.to_string(false).unwrap()).unwrap();
    let marker = eos + 1;
    json["added_tokens"].as_array_mut().unwrap().push(json!({"id": marker, "content": "[TOOL_CALLS]",
        "single_word": false, "lstrip": false, "rstrip": false, "normalized": false, "special": true}));
    let vocabulary = GrammarVocabulary::new(&json.to_string(), marker as usize + 1, &[eos]).unwrap();
    (vocabulary, eos, marker)
}

fn weather_schema() -> Value {
    json!({"type": "object", "properties": {"city": {"type": "string"}, "unit": {"enum": ["C", "F"]}},
           "required": ["city", "unit"], "additionalProperties": false})
}

fn call(id: &str, name: &str, arguments: Value) -> ToolCall {
    let Value::Object(arguments) = arguments else { panic!("an object") };
    ToolCall { id: id.into(), kind: ToolKind::Function, function: FunctionCall { name: name.into(), arguments } }
}

/// The assistant turn the format's template renders for `calls`.
fn rendered_turn(format: ToolCallFormat, calls: Vec<ToolCall>) -> String {
    let (file, end) = match format {
        ToolCallFormat::Hermes => ("tools_hermes.jinja", "<|im_end|>\n"),
        ToolCallFormat::Llama3 => ("tools_llama3.jinja", "<|eom_id|>"),
        ToolCallFormat::Mistral => ("tools_mistral.jinja", "</s>"),
    };
    let path =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../text/tests/fixtures/chat_templates").join(file);
    let template = ChatTemplate::new(&std::fs::read_to_string(path).unwrap()).unwrap();
    let mut chat = vec![ChatMessage::new("user", "Weather in Zürich?")];
    let prompt = template.render(&chat, &[], true, "<s>", "</s>").unwrap();
    chat.push(ChatMessage::assistant_calls(None, calls));
    let whole = template.render(&chat, &[], false, "<s>", "</s>").unwrap();
    whole.strip_prefix(&prompt).and_then(|t| t.strip_suffix(end)).unwrap().to_owned()
}

/// The turn's ids: bytes, and Mistral's marker as its special token.
fn ids(turn: &str, marker: u32) -> Vec<u32> {
    match turn.strip_prefix("[TOOL_CALLS]") {
        Some(rest) => [vec![marker], byte_ids(rest.as_bytes())].concat(),
        None => byte_ids(turn.as_bytes()),
    }
}

#[test]
fn each_formats_grammar_admits_the_calls_its_template_renders_and_nothing_else() {
    let (vocabulary, eos, marker) = vocabulary();
    let schema = weather_schema();
    let tools =
        [GrammarTool { name: "get_weather", parameters: Some(&schema) }, GrammarTool { name: "now", parameters: None }];
    let paris = || call("call00001", "get_weather", json!({"city": "Zürich", "unit": "C"}));
    let now = || call("call00002", "now", json!({}));
    for format in ToolCallFormat::ALL {
        let compile = |count| {
            let grammar =
                lark(format, &tools, count, (format == ToolCallFormat::Mistral).then_some(marker), default_json_layout);
            vocabulary.compile(&ConstraintSpec::Lark(grammar.clone())).unwrap_or_else(|e| panic!("{grammar}: {e}"))
        };
        // One call: the output is complete after it, and nothing else may follow.
        let one = ids(&rendered_turn(format, vec![paris()]), marker);
        let mut state = compile(CallCount::One);
        state.advance_all(&one).unwrap_or_else(|e| panic!("{format}: {e}"));
        assert!(state.is_finished(), "{format}: one call is the whole output");
        // Two calls, where several are allowed; EOS may end the output after them.
        let two = ids(&rendered_turn(format, vec![paris(), now()]), marker);
        let mut state = compile(CallCount::AtLeastOne);
        state.advance_all(&two).unwrap_or_else(|e| panic!("{format}: {e}"));
        assert!(state.allowed().unwrap().allowed().any(|t| t == eos), "{format}: EOS after the calls");
        // Where one call is allowed, the second is refused where it begins.
        let mut single = compile(CallCount::One);
        assert!(single.valid_prefix_len(&two) < two.len(), "{format}: a second call passed");
        // Text before the calls, an unknown function, arguments against the schema.
        for bad in [
            format!("Sure. {}", rendered_turn(format, vec![paris()])),
            rendered_turn(format, vec![call("call00003", "delete_all", json!({}))]),
            rendered_turn(format, vec![call("call00004", "get_weather", json!({"city": "Paris", "unit": "K"}))]),
        ] {
            let tokens = ids(&bad, marker);
            let mut state = compile(CallCount::AtLeastOne);
            assert!(state.valid_prefix_len(&tokens) < tokens.len(), "{format}: {bad:?} passed");
        }
    }
}
