//! Parity with transformers: f32 logits on CPU within 1e-4 of the reference for every
//! fixture (GQA, tied/untied, Qwen2 biases, Mistral sharded and sliding window, Llama-3 rope
//! scaling), plus tokenizer and generation-config parity.

mod common;

use anyhow::Result;
use common::{FIXTURES, fixture, load, max_abs_diff, reference};
use specd_model::{LanguageModel, TextTokenizer};

const TOL: f32 = 1e-4;

#[test]
fn every_fixture_matches_transformers_logits() -> Result<()> {
    for name in FIXTURES {
        let r = reference(name)?;
        let mut m = load(name)?;
        let s = m.open_session(None)?;
        let logits = m.forward(s, &r.tokens)?;
        assert_eq!(logits.rows(), r.tokens.len(), "{name}: one row per position");
        let diff = max_abs_diff(&logits.to_rows(), &r.logits);
        eprintln!("{name}: max |Δlogit| = {diff:e}");
        assert!(diff <= TOL, "{name}: max |Δlogit| = {diff} > {TOL}");
        // The comparison is not vacuous: logits vary across positions.
        let spread = max_abs_diff(&r.logits[..1], &r.logits[1..2]);
        assert!(spread > 0.1, "{name}: reference rows are too similar ({spread})");
    }
    Ok(())
}

#[test]
fn architectures_and_eos_come_from_the_checkpoint() -> Result<()> {
    let expect = [
        ("llama_gqa_untied", "LlamaForCausalLM"),
        ("llama_tied", "LlamaForCausalLM"),
        ("qwen2", "Qwen2ForCausalLM"),
        ("mistral_sharded", "MistralForCausalLM"),
        ("mistral_window", "MistralForCausalLM"),
    ];
    for (name, arch) in expect {
        let m = load(name)?;
        let r = reference(name)?;
        assert_eq!(m.info().architecture, arch, "{name}");
        assert_eq!(m.info().eos_token_ids, r.eos, "{name}: eos from generation_config.json");
        assert_eq!(m.info().vocab_size, 96);
        assert_eq!(m.info().context_length, 64);
    }
    let m = load("llama_gqa_untied")?;
    assert_eq!(m.info().eos_token_ids, vec![2, 3]);
    assert_eq!(m.config().num_key_value_heads, 2);
    assert!(!m.config().tie_word_embeddings);
    assert!(load("llama_tied")?.config().tie_word_embeddings);
    assert!(load("qwen2")?.config().qkv_bias);
    assert_eq!(load("mistral_window")?.config().sliding_window, Some(5));
    Ok(())
}

#[test]
fn tokenizer_matches_python_and_fingerprints_agree() -> Result<()> {
    let r = reference("qwen2")?;
    let m = load("qwen2")?;
    assert_eq!(m.encode(&r.text)?, r.text_ids);
    let t = TextTokenizer::from_file(&fixture("qwen2").join("tokenizer.json"))?;
    assert_eq!(t.decode(&r.text_ids)?, r.text);
    // Same tokenizer file in two checkpoints: same fingerprint.
    let other = load("mistral_window")?;
    assert_eq!(m.info().tokenizer_fingerprint, other.info().tokenizer_fingerprint);
    assert!(m.info().tokenizer_fingerprint.starts_with("sha256:"));
    Ok(())
}
