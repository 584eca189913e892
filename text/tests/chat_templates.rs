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

mod common;

use std::path::PathBuf;

use serde::{Deserialize, Serialize};
use specd_text::{ChatMessage, ChatTemplate, ModelText, TextAssets, TextError};

#[derive(Serialize)]
struct Case {
    template: PathBuf,
    messages: Vec<ChatMessage>,
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
        add_generation_prompt: generation_prompt,
        bos_token: bos.into(),
        eos_token: eos.into(),
        variant: None,
    }
}

fn render_here(c: &Case) -> Result<String, TextError> {
    let source = std::fs::read_to_string(&c.template).unwrap();
    ChatTemplate::new(&source).unwrap().render(&c.messages, c.add_generation_prompt, &c.bos_token, &c.eos_token)
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
    let ids = text.chat_prompt_ids(&chat, true).unwrap();
    let job = Job {
        tokenizer: common::tokenizer_path("fixture_bpe"),
        cases: vec![case("indented.jinja", "<s>", "</s>", chat, true)],
    };
    let reference: Vec<Rendered> = common::reference("chat", &job);
    assert_eq!(Some(&ids), reference[0].ids.as_ref());
    assert_eq!(ids.iter().filter(|&&i| i == 1).count(), 1, "one bos: the template's, none added by encoding");

    let no_template = ModelText::from_assets(&TextAssets { tokenizer_config_json: None, ..assets }).unwrap();
    let e = no_template.chat_prompt_ids(&msgs(&[("user", "hi")]), true).unwrap_err();
    assert!(matches!(e, TextError::NoChatTemplate) && e.is_callers_fault());
}
