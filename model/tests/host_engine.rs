//! The host engine against transformers: the same f32 logits (within 1e-4) for every
//! fixture of the families it runs (GQA with Llama-3 RoPE scaling and an untied head, tied
//! embeddings, Qwen2's biases, Mistral sharded and with a sliding window shorter than the
//! sequence), whether the tokens come in one pass, one at a time, or in blocks rolled back
//! and scored again; what it cannot run is refused with the reason, and `auto` goes to
//! libtorch for it.

mod common;

use anyhow::Result;
use common::{cpu_f32, fixture, max_abs_diff, reference, rows};
use specd_model::config::LlamaShape;
use specd_model::{DType, DeviceSpec, Engine, HostLlama, LanguageModel, LlamaConfig, LoadOptions, load_model};

const TOL: f32 = 1e-4;

const HOST_FIXTURES: [&str; 5] = ["llama_gqa_untied", "llama_tied", "qwen2", "mistral_sharded", "mistral_window"];

fn host_options() -> LoadOptions {
    LoadOptions { engine: Engine::Host, ..cpu_f32() }
}

#[test]
fn every_fixture_it_runs_matches_transformers_in_one_pass_and_token_by_token() -> Result<()> {
    for name in HOST_FIXTURES {
        let r = reference(name)?;
        let mut m = load_model(&fixture(name), &host_options())?;
        assert_eq!(m.info().engine, "host", "{name}");
        let s = m.open_session(None)?;
        let whole = m.forward(s, &r.tokens)?;
        let diff = max_abs_diff(&whole.to_rows(), &r.logits);
        eprintln!("{name}: one pass, max |Δlogit| = {diff:e}");
        assert!(diff <= TOL, "{name}: one pass, max |Δlogit| = {diff} > {TOL}");

        // One token a pass, each attending to the cache the earlier passes wrote.
        let t = m.open_session(Some(8))?;
        let steps = r.tokens.iter().map(|&tok| m.forward(t, &[tok])).collect::<Result<Vec<_>, _>>()?;
        let diff = max_abs_diff(&rows(&steps), &r.logits);
        assert!(diff <= TOL, "{name}: token by token (the cache grown past 8), max |Δlogit| = {diff} > {TOL}");
        assert_eq!(m.session_len(t)?, r.tokens.len());

        // A speculative round: a block of wrong tokens scored, rolled back, the right ones
        // scored again over the stale tail.
        let u = m.open_session(None)?;
        let half = r.tokens.len() / 2;
        let head = m.forward(u, &r.tokens[..half])?;
        let wrong: Vec<u32> = r.tokens[half..].iter().map(|&x| (x + 1) % 96).collect();
        m.forward(u, &wrong)?;
        m.truncate(u, half)?;
        let tail = m.forward(u, &r.tokens[half..])?;
        let diff = max_abs_diff(&rows(&[head, tail]), &r.logits);
        assert!(diff <= TOL, "{name}: after a rollback, max |Δlogit| = {diff} > {TOL}");

        // The last rows only, as a node asks for them.
        let v = m.open_session(None)?;
        let last = m.forward_last(v, &r.tokens, 2)?;
        assert_eq!(last.rows(), 2);
        let diff = max_abs_diff(&last.to_rows(), &r.logits[r.tokens.len() - 2..]);
        assert!(diff <= TOL, "{name}: last rows, max |Δlogit| = {diff} > {TOL}");
    }
    Ok(())
}

#[test]
fn the_window_fixture_runs_past_its_window_so_the_window_is_tested() -> Result<()> {
    let window = LlamaConfig::from_dir(&fixture("mistral_window"))?.sliding_window.expect("a window");
    assert!(reference("mistral_window")?.tokens.len() > window + 1);
    Ok(())
}

#[test]
fn what_the_host_engine_cannot_run_is_refused_with_the_reason_and_auto_takes_libtorch() -> Result<()> {
    for (name, reason) in [("qwen3_tied_yarn", "q/k norms"), ("gemma3", "Gemma's norms")] {
        let err = load_model(&fixture(name), &host_options()).map(|_| ()).unwrap_err().to_string();
        assert!(err.contains(reason) && err.contains("--engine libtorch"), "{name}: {err}");
        let m = load_model(&fixture(name), &LoadOptions { engine: Engine::Auto, ..cpu_f32() })?;
        assert_eq!(m.info().engine, "libtorch", "{name}");
    }
    let bf16 = LoadOptions { engine: Engine::Host, dtype: DType::Bf16, ..cpu_f32() };
    let err = HostLlama::load(&fixture("llama_tied"), &bf16).unwrap_err().to_string();
    assert!(err.contains("f32"), "{err}");
    Ok(())
}

#[test]
fn auto_takes_the_host_engine_for_a_small_cpu_f32_model_only() -> Result<()> {
    let shape = |hidden, layers| LlamaShape {
        vocab_size: 4096,
        hidden_size: hidden,
        intermediate_size: 3 * hidden,
        layers,
        heads: 2,
        kv_heads: 2,
        head_dim: hidden / 2,
        context: 512,
    };
    let draft = LlamaConfig::llama(shape(128, 2));
    let target = LlamaConfig::llama(shape(384, 6));
    assert!(draft.num_parameters() < specd_model::engine_choice::HOST_ENGINE_MAX_PARAMETERS);
    let cpu = |dtype| LoadOptions { dtype, ..LoadOptions::default() };
    assert_eq!(Engine::Auto.resolve(&draft, &cpu(DType::F32))?, Engine::Host);
    assert_eq!(Engine::Auto.resolve(&draft, &cpu(DType::Auto))?, Engine::Host);
    assert_eq!(Engine::Auto.resolve(&draft, &cpu(DType::Bf16))?, Engine::Libtorch);
    assert_eq!(Engine::Auto.resolve(&target, &cpu(DType::F32))?, Engine::Libtorch);
    let gpu = LoadOptions { device: DeviceSpec::Cuda(0), ..cpu(DType::F32) };
    assert_eq!(Engine::Auto.resolve(&draft, &gpu)?, Engine::Libtorch);
    assert!(Engine::Host.resolve(&draft, &gpu).is_err());
    assert_eq!(Engine::Libtorch.resolve(&draft, &cpu(DType::F32))?, Engine::Libtorch);
    Ok(())
}
