//! Any bytes as a client's gRPC message: decoded with prost as a `GenerateRequest` and as a
//! `NextTokenLawRequest`, whatever decodes goes through the coordinator's validation
//! (`request::validate`, `request::validate_law_request`) for a small model. Validation returns
//! a value or an error, never panics, and what it accepts is within the model's bounds (the
//! same bounds `coordinator/tests/hostile_inputs.rs` checks on generated requests).

#![no_main]

use libfuzzer_sys::fuzz_target;
use prost::Message;
use specd_coordinator::nodes::ModelFacts;
use specd_coordinator::request::{Defaults, GammaChoice, RuleVariant, TreeSetting, validate, validate_law_request};
use specd_proto::v1::generate_request::Prompt;
use specd_proto::v1::{GenerateRequest, NextTokenLawRequest, SamplingSettings};
use specd_sampling::{MAX_GAMMA, SamplingParams, Truncation};

const VOCAB: usize = 50;
const CONTEXT: usize = 64;

fn facts(has_tokenizer: bool) -> ModelFacts {
    ModelFacts {
        vocab_size: VOCAB,
        context_length: CONTEXT,
        eos_token_ids: vec![0],
        tokenizer_fingerprint: "f".into(),
        target_model: "t".into(),
        draft_model: Some("d".into()),
        text: None,
        has_tokenizer,
        constraints: Err("no tokenizer".into()),
    }
}

fn defaults() -> Defaults {
    Defaults {
        gamma: GammaChoice::Adaptive { max: 8 },
        max_new_tokens: 16,
        truncation: Truncation::new(1e-4, 8).expect("a valid truncation"),
        rule: RuleVariant::Exact,
        verification: specd_sampling::Verification::Block,
        optimistic: true,
        tree: TreeSetting::Auto,
        generation_config: true,
    }
}

/// The prompt as the gRPC API hands it to `validate`: token ids as sent; a text prompt is
/// tokenised with the model's tokenizer, which this target has not, so its UTF-8 bytes stand
/// in for the tokens (any ids, in or out of the vocabulary, are what validation must handle).
fn prompt(request: &GenerateRequest) -> Option<Vec<u32>> {
    match &request.prompt {
        Some(Prompt::TokenIds(ids)) => Some(ids.ids.clone()),
        Some(Prompt::Text(text)) => Some(text.bytes().map(u32::from).collect()),
        None => None,
    }
}

fn generate(request: &GenerateRequest) {
    let Some(prompt) = prompt(request) else { return };
    for has_tokenizer in [false, true] {
        let Ok(spec) = validate(request, prompt.clone(), &facts(has_tokenizer), &defaults(), || 7) else { continue };
        assert!(!prompt.is_empty() && prompt.iter().all(|&t| (t as usize) < VOCAB));
        assert!(spec.max_new_tokens >= 1 && prompt.len() + spec.max_new_tokens <= CONTEXT);
        assert!(spec.gamma.max() <= MAX_GAMMA);
        assert!(spec.stop_token_ids.iter().all(|&t| (t as usize) < VOCAB));
        assert!(spec.stop_strings.iter().all(|s| !s.is_empty()));
        assert!(has_tokenizer || spec.stop_strings.is_empty());
        // The nodes open the session with these settings (OpenSessionRequest): they must pass.
        let settings = SamplingSettings::from(&spec.params);
        assert_eq!(SamplingParams::try_from(&settings).ok(), Some(spec.params), "settings refused: {settings:?}");
    }
}

fn law(request: &NextTokenLawRequest) {
    let Ok(checked) = validate_law_request(request, &facts(false)) else { return };
    let prefix = checked.prompt_token_ids.iter().chain(&checked.generated_token_ids);
    assert!(!checked.prompt_token_ids.is_empty() && prefix.clone().all(|&t| (t as usize) < VOCAB));
    assert!(prefix.count() <= CONTEXT);
    // What the target node does with the settings the coordinator forwards: they must pass.
    let settings = checked.sampling.expect("the coordinator always forwards settings");
    assert!(SamplingParams::try_from(&settings).is_ok(), "forwarded settings refused: {settings:?}");
}

fuzz_target!(|bytes: &[u8]| {
    if let Ok(request) = GenerateRequest::decode(bytes) {
        generate(&request);
    }
    if let Ok(request) = NextTokenLawRequest::decode(bytes) {
        law(&request);
    }
});
