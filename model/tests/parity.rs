//! Parity with transformers: f32 logits on CPU within 1e-4 of the reference for every
//! fixture (GQA, tied/untied, Qwen2 biases, Mistral sharded and sliding window, Llama-3 rope
//! scaling, Qwen3 tied with YaRN and untied with biases, Gemma 3 with windowed and global
//! layers over more tokens than its window and soft-capped logits, the Gemma 3 text model
//! inside a Gemma3ForConditionalGeneration checkpoint), plus tokenizer and generation-config
//! parity.

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
        ("qwen3_tied_yarn", "Qwen3ForCausalLM"),
        ("qwen3_untied", "Qwen3ForCausalLM"),
        ("gemma3", "Gemma3ForCausalLM"),
        // The text model of a Gemma3ForConditionalGeneration checkpoint.
        ("gemma3_multimodal", "Gemma3ForCausalLM"),
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

/// The fixtures exercise what they are meant to: a parity pass over a config read wrongly
/// (YaRN as plain RoPE, every Gemma layer global) would not be testing the feature.
#[test]
fn new_architectures_are_read_with_their_features() -> Result<()> {
    use specd_model::{Activation, RopeScaling};
    let yarn = load("qwen3_tied_yarn")?;
    let c = yarn.config();
    assert!(c.features.qk_norm && c.tie_word_embeddings);
    assert_eq!(c.head_dim, 12, "head_dim apart from hidden / heads");
    assert!(
        matches!(c.rope_scaling, RopeScaling::Yarn { factor: 4.0, original_max_position_embeddings: 16.0, .. }),
        "{:?}",
        c.rope_scaling
    );
    let untied = load("qwen3_untied")?;
    assert!(!untied.config().tie_word_embeddings && untied.config().qkv_bias && untied.config().o_bias);
    let gemma = load("gemma3")?;
    let c = gemma.config();
    assert_eq!(c.features.sliding_layers, vec![true, false, true]);
    assert_eq!((c.layer_window(0), c.layer_window(1), c.layer_window(2)), (Some(4), None, Some(4)));
    assert!(reference("gemma3")?.tokens.len() > 4, "the reference runs past the window");
    assert_eq!(c.features.activation, Activation::GeluTanh);
    assert_eq!(c.features.query_pre_attn_scalar, Some(24.0));
    assert_eq!(c.features.final_logit_softcapping, Some(5.0));
    assert_eq!(c.rope_scaling, RopeScaling::Linear { factor: 2.0 });
    assert_eq!(c.features.local_rope, Some((10_000.0, RopeScaling::None)));
    assert!(c.features.norm_plus_one && c.features.sandwich_norms && c.features.scale_embeddings);
    assert!(!c.features.multimodal_wrapper);
    let wrapped = load("gemma3_multimodal")?;
    let c = wrapped.config();
    assert!(c.features.multimodal_wrapper, "read from text_config, weights under language_model.model.");
    assert_eq!((c.num_hidden_layers, c.head_dim, c.sliding_window), (2, 16, Some(4)));
    assert_eq!(c.rope_scaling, RopeScaling::Linear { factor: 8.0 });
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
