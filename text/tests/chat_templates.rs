//! The chat templates of Llama 3.1, Qwen2.5 and Mistral v0.3 rendered here equal what
//! transformers' `apply_chat_template` renders from the same template text.
//!
//! The fixture templates (tests/fixtures/chat_templates) were written from the published
//! `tokenizer_config.json` chat templates of meta-llama/Meta-Llama-3.1-8B-Instruct,
//! Qwen/Qwen2.5-7B-Instruct and mistralai/Mistral-7B-Instruct-v0.3 without access to the hub
//! (from public copies of those templates), so they may differ from the published files in
//! details such as a comment; both sides render the same file, so the comparison holds either
//! way. `indented.jinja` is a Zephyr-style template without `-` whitespace control, where
//! trim_blocks and lstrip_blocks decide the output.
//!
//! `tools_hermes.jinja`, `tools_llama3.jinja` and `tools_mistral.jinja` were written for these
//! tests in the tool-call formats of Qwen2.5 / Hermes, Llama 3.1 and Mistral v0.3: conversations
//! with tools offered, assistant turns that call them and the tools' results render here as
//! transformers renders them, and each format's reader gets back the calls from the assistant
//! turn transformers renders.

mod common;

use std::path::PathBuf;

use serde::{Deserialize, Serialize};
use serde_json::json;
use specd_text::tool_calls::parse::ToolCallParser;
use specd_text::{
    ChatMessage, ChatTemplate, ChatTool, FunctionCall, FunctionSpec, ModelText, TextAssets, TextError, ToolCall,
    ToolCallFormat, ToolKind,
};

#[derive(Serialize)]
struct Case {
    template: PathBuf,
    messages: Vec<ChatMessage>,
    tools: Option<Vec<ChatTool>>,
    add_generation_prompt: bool,
    bos_token: String,
    eos_token: String,
    variant: Option<&'static str>,
}

#[derive(Serialize)]
struct Job {
    tokenizer: PathBuf,
    cases: Vec<Case>,
}

#[derive(Debug, Deserialize)]
struct Rendered {
    text: Option<String>,
    ids: Option<Vec<u32>>,
    error: Option<String>,
}

fn template_path(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/chat_templates").join(name)
}

fn msgs(pairs: &[(&str, &str)]) -> Vec<ChatMessage> {
    pairs.iter().map(|(r, c)| ChatMessage::new(*r, *c)).collect()
}

/// Conversations every template is rendered with, each with and without the generation prompt.
fn conversations() -> Vec<Vec<ChatMessage>> {
    vec![
        msgs(&[("system", "You are terse."), ("user", "What is 2+2?")]),
        msgs(&[("user", "  Hello there!  ")]),
        msgs(&[
            ("system", "Answer in French.\n"),
            ("user", "Hi"),
            ("assistant", " Bonjour ! "),
            ("user", "How are you? \"quoted\" <tags> & é😀 日本"),
        ]),
        msgs(&[("user", "a"), ("assistant", "b"), ("user", "c"), ("assistant", "d\n\n")]),
    ]
}

const TEMPLATES: [(&str, &str, &str); 4] = [
    ("llama3.jinja", "<|begin_of_text|>", "<|eot_id|>"),
    ("qwen2_5.jinja", "<|endoftext|>", "<|im_end|>"),
    ("mistral.jinja", "<s>", "</s>"),
    ("indented.jinja", "<s>", "</s>"),
];

fn case(template: &str, bos: &str, eos: &str, messages: Vec<ChatMessage>, generation_prompt: bool) -> Case {
    Case {
        template: template_path(template),
        messages,
        tools: None,
        add_generation_prompt: generation_prompt,
        bos_token: bos.into(),
        eos_token: eos.into(),
        variant: None,
    }
}

fn render_here(c: &Case) -> Result<String, TextError> {
    let source = std::fs::read_to_string(&c.template).unwrap();
    let tools = c.tools.as_deref().unwrap_or_default();
    ChatTemplate::new(&source).unwrap().render(&c.messages, tools, c.add_generation_prompt, &c.bos_token, &c.eos_token)
}

#[test]
fn renders_as_transformers_and_detects_a_different_environment() {
    let mut cases = Vec::new();
    for (template, bos, eos) in TEMPLATES {
        for conversation in conversations() {
            for generation_prompt in [false, true] {
                cases.push(case(template, bos, eos, conversation.clone(), generation_prompt));
            }
        }
    }
    // Mistral refuses a conversation whose roles do not alternate, through raise_exception.
    let wrong_order = msgs(&[("user", "a"), ("user", "b")]);
    cases.push(case("mistral.jinja", "<s>", "</s>", wrong_order, true));
    let raised_at = cases.len() - 1;
    // The same templates rendered by Jinja without trim_blocks/lstrip_blocks: a renderer that
    // got those settings wrong would produce this, and the comparison must tell.
    let variants: Vec<usize> = (0..cases.len()).filter(|&i| i != raised_at).collect();
    for &i in &variants {
        let c = &cases[i];
        let mut v = case("", &c.bos_token, &c.eos_token, c.messages.clone(), c.add_generation_prompt);
        v.template = c.template.clone();
        v.variant = Some("no_block_trimming");
        cases.push(v);
    }
    let job = Job { tokenizer: common::tokenizer_path("fixture_bpe"), cases };
    let reference: Vec<Rendered> = common::reference("chat", &job);
    assert_eq!(reference.len(), job.cases.len());

    let mut differing_variants = 0;
    for (i, (c, want)) in job.cases.iter().zip(&reference).enumerate() {
        let got = render_here(c);
        let name = c.template.file_name().unwrap().to_string_lossy();
        if c.variant.is_some() {
            let got = got.unwrap();
            if Some(&got) != want.text.as_ref() {
                differing_variants += 1;
            }
            continue;
        }
        match (&got, &want.error) {
            (Err(TextError::TemplateRaised(m)), Some(e)) => assert_eq!(m, e, "case {i} ({name})"),
            (Ok(text), None) => {
                assert_eq!(
                    Some(text),
                    want.text.as_ref(),
                    "case {i} ({name}, generation prompt {})",
                    c.add_generation_prompt
                );
            }
            _ => panic!("case {i} ({name}): here {got:?}, transformers {want:?}"),
        }
        if i == raised_at {
            assert!(matches!(got, Err(TextError::TemplateRaised(ref m)) if m.contains("must alternate")), "{got:?}");
        }
    }
    // The whitespace-controlled templates render the same without block trimming; the
    // indented one must not, or this test could not see a wrong environment.
    assert!(differing_variants >= 8, "only {differing_variants} renders changed without block trimming");
}

/// `ModelText` picks the template and bos/eos from the model files, and the prompt ids of a
/// chat are transformers' `apply_chat_template(tokenize=True)` (no special tokens added: the
/// template wrote them).
#[test]
fn chat_prompt_ids_equal_transformers() {
    let tokenizer_json = std::fs::read_to_string(common::tokenizer_path("fixture_bpe")).unwrap();
    let template = std::fs::read_to_string(template_path("indented.jinja")).unwrap();
    let config = serde_json::json!({
        "bos_token": {"content": "<s>", "lstrip": false, "normalized": false, "rstrip": false, "single_word": false, "special": true},
        "eos_token": "</s>",
        "chat_template": template,
    });
    let assets = TextAssets {
        tokenizer_json,
        tokenizer_config_json: Some(config.to_string()),
        chat_template_jinja: None,
        generation_config_json: None,
    };
    let text = ModelText::from_assets(&assets).unwrap();
    assert_eq!((text.bos_token(), text.eos_token()), (Some("<s>"), Some("</s>")));
    let chat = msgs(&[("system", "the draft"), ("user", "the target verifies the quick fox")]);
    let ids = text.chat_prompt_ids(&chat, &[], true).unwrap();
    let job = Job {
        tokenizer: common::tokenizer_path("fixture_bpe"),
        cases: vec![case("indented.jinja", "<s>", "</s>", chat, true)],
    };
    let reference: Vec<Rendered> = common::reference("chat", &job);
    assert_eq!(Some(&ids), reference[0].ids.as_ref());
    assert_eq!(ids.iter().filter(|&&i| i == 1).count(), 1, "one bos: the template's, none added by encoding");

    let no_template = ModelText::from_assets(&TextAssets { tokenizer_config_json: None, ..assets }).unwrap();
    let e = no_template.chat_prompt_ids(&msgs(&[("user", "hi")]), &[], true).unwrap_err();
    assert!(matches!(e, TextError::NoChatTemplate) && e.is_callers_fault());
}

/// The tool templates, each with its bos and eos strings, its format, and what ends an
/// assistant turn that calls tools.
const TOOL_TEMPLATES: [(&str, &str, &str, ToolCallFormat, &str); 3] = [
    ("tools_hermes.jinja", "<|endoftext|>", "<|im_end|>", ToolCallFormat::Hermes, "<|im_end|>\n"),
    ("tools_llama3.jinja", "<|begin_of_text|>", "<|eot_id|>", ToolCallFormat::Llama3, "<|eom_id|>"),
    ("tools_mistral.jinja", "<s>", "</s>", ToolCallFormat::Mistral, "</s>"),
];

fn tools() -> Vec<ChatTool> {
    let function = |name: &str, description: Option<&str>, parameters: Option<serde_json::Value>| ChatTool {
        kind: ToolKind::Function,
        function: FunctionSpec { name: name.into(), description: description.map(str::to_owned), parameters },
    };
    vec![
        function(
            "get_weather",
            Some("The weather in a city, \"now\" or on a day."),
            Some(json!({
                "type": "object",
                "properties": {
                    "city": {"type": "string", "description": "Its name, e.g. Zürich"},
                    "unit": {"enum": ["C", "F"]},
                    "days": {"type": "integer", "minimum": 0}
                },
                "required": ["city"]
            })),
        ),
        function("now", None, None),
    ]
}

/// A call with its 9-character id (Mistral's templates refuse any other).
fn call(id: &str, name: &str, arguments: serde_json::Value) -> ToolCall {
    let serde_json::Value::Object(arguments) = arguments else { panic!("arguments must be an object") };
    ToolCall { id: id.into(), kind: ToolKind::Function, function: FunctionCall { name: name.into(), arguments } }
}

fn calls() -> Vec<ToolCall> {
    vec![
        call("call00001", "get_weather", json!({"city": "Zürich", "unit": "C", "days": 2, "rain": 2.5, "note": null})),
        call("call00002", "now", json!({})),
    ]
}

/// A conversation with tools: the user asks, the assistant calls, the tools answer, the
/// assistant answers, the user asks again.
fn tool_conversation(with_system: bool) -> Vec<ChatMessage> {
    let mut chat = Vec::new();
    if with_system {
        chat.push(ChatMessage::new("system", "Use the tools."));
    }
    chat.extend([
        ChatMessage::new("user", "Weather in Zürich, and the time?"),
        ChatMessage::assistant_calls(None, calls()),
        ChatMessage::tool_result("call00001", r#"{"temperature": 21}"#),
        ChatMessage::tool_result("call00002", "12:00"),
        ChatMessage::new("assistant", "21 °C at noon."),
        ChatMessage::new("user", "And tomorrow?"),
    ]);
    chat
}

#[test]
fn conversations_with_tools_render_as_transformers() {
    let mut cases = Vec::new();
    let templates = TOOL_TEMPLATES.iter().map(|(t, bos, eos, ..)| (*t, *bos, *eos));
    for (template, bos, eos) in templates.chain([("qwen2_5.jinja", "<|endoftext|>", "<|im_end|>")]) {
        for with_system in [false, true] {
            for offered in [false, true] {
                let mut c = case(template, bos, eos, tool_conversation(with_system), true);
                c.tools = offered.then(tools);
                cases.push(c);
            }
        }
        // An assistant turn with text before its call.
        let mut chat = msgs(&[("user", "Weather?")]);
        chat.push(ChatMessage::assistant_calls(Some("Let me look.".into()), calls()[..1].to_vec()));
        let mut c = case(template, bos, eos, chat, false);
        c.tools = Some(tools());
        cases.push(c);
    }
    // Mistral's templates refuse ids that are not 9 characters long.
    let mut bad_id = tool_conversation(false);
    bad_id[1].tool_calls[0].id = "call_1".into();
    cases.push(case("tools_mistral.jinja", "<s>", "</s>", bad_id, true));
    let job = Job { tokenizer: common::tokenizer_path("fixture_bpe"), cases };
    let reference: Vec<Rendered> = common::reference("chat", &job);
    for (i, (c, want)) in job.cases.iter().zip(&reference).enumerate() {
        let name = c.template.file_name().unwrap().to_string_lossy();
        match (render_here(c), &want.error) {
            (Ok(text), None) => {
                assert_eq!(Some(&text), want.text.as_ref(), "case {i} ({name}, tools {})", c.tools.is_some());
                if c.tools.is_some() {
                    assert!(text.contains("get_weather") && text.contains("Its name, e.g. Zürich"), "{text}");
                }
            }
            (Err(TextError::TemplateRaised(m)), Some(e)) => {
                assert_eq!(&m, e, "case {i} ({name})");
                assert!(m.contains("9 letters or digits"), "{m}");
            }
            (got, _) => panic!("case {i} ({name}): here {got:?}, transformers {want:?}"),
        }
    }
}

/// The assistant turn transformers renders for some calls, read back by the template's
/// format, gives those calls; and the format is the one its template text shows.
#[test]
fn each_format_reads_back_the_calls_its_template_renders() {
    let mut cases = Vec::new();
    let mut expected = Vec::new();
    for (template, bos, eos, _, _) in TOOL_TEMPLATES {
        let asked = msgs(&[("system", "Use the tools."), ("user", "Weather in Zürich, and the time?")]);
        for (content, calls) in [(None, calls()[..1].to_vec()), (None, calls()), (Some("Let me look."), calls())] {
            let mut prompt = case(template, bos, eos, asked.clone(), true);
            prompt.tools = Some(tools());
            let mut answered = asked.clone();
            answered.push(ChatMessage::assistant_calls(content.map(str::to_owned), calls.clone()));
            let mut whole = case(template, bos, eos, answered, false);
            whole.tools = Some(tools());
            cases.extend([prompt, whole]);
            expected.push((content, calls));
        }
    }
    let job = Job { tokenizer: common::tokenizer_path("fixture_bpe"), cases };
    let reference: Vec<Rendered> = common::reference("chat", &job);
    let per_template = expected.len() / TOOL_TEMPLATES.len();
    for (i, (pair, (content, calls))) in reference.chunks(2).zip(&expected).enumerate() {
        let (template, _, _, format, turn_end) = TOOL_TEMPLATES[i / per_template];
        let source = std::fs::read_to_string(template_path(template)).unwrap();
        assert_eq!(ToolCallFormat::detect(&source), Some(format), "{template}");
        let (prompt, whole) = (pair[0].text.as_deref().unwrap(), pair[1].text.as_deref().unwrap());
        let turn = whole.strip_prefix(prompt).and_then(|t| t.strip_suffix(turn_end));
        let turn = turn.unwrap_or_else(|| panic!("{template}: no assistant turn in {whole:?} after {prompt:?}"));
        let (text, parsed) = ToolCallParser::parse(format, turn);
        let want: Vec<_> = calls.iter().map(|c| (c.function.name.clone(), c.function.arguments.clone())).collect();
        let got: Vec<_> = parsed.into_iter().map(|c| (c.name, c.arguments)).collect();
        assert_eq!(got, want, "{template}: {turn:?}");
        // Only Hermes' template renders the text before the calls.
        let want_text = if format == ToolCallFormat::Hermes { content.map(|c| format!("{c}\n")) } else { None };
        assert_eq!(text, want_text.unwrap_or_default(), "{template}: {turn:?}");
    }
}
