//! The host engine against transformers: the same f32 logits (within 1e-4) for every
//! fixture of the families it runs (GQA with Llama-3 RoPE scaling and an untied head, tied
//! embeddings, Qwen2's biases, Mistral sharded and with a sliding window shorter than the
//! sequence, Qwen3's q/k norms with YaRN, Gemma 3's norms, scaling, soft-capping and
//! interleaved windowed layers with their own RoPE, its multimodal checkpoint's text model),
//! on one thread and on several, whether the tokens come in one pass, one at a time, in
//! blocks rolled back and scored again, or batched with other sessions' tokens; with bf16
//! weights within a stated bound; what it cannot run is refused with the reason.

mod common;

use anyhow::Result;
use common::{FIXTURES, cpu_f32, fixture, max_abs_diff, reference, rows};
use specd_model::engine_choice::{EngineDecision, PassTimes, time_passes};
use specd_model::{
    BoxedModel, DType, DeviceSpec, Engine, ForwardItem, HostLlama, LanguageModel, LlamaConfig, LoadOptions, load_model,
};

const TOL: f32 = 1e-4;

fn host_options() -> LoadOptions {
    LoadOptions { engine: Engine::Host, threads: Some(1), ..cpu_f32() }
}

#[test]
fn every_fixture_it_runs_matches_transformers_in_one_pass_and_token_by_token() -> Result<()> {
    for (name, threads) in FIXTURES.iter().flat_map(|name| [(*name, 1), (*name, 3)]) {
        let r = reference(name)?;
        let mut m = load_model(&fixture(name), &LoadOptions { threads: Some(threads), ..host_options() })?;
        assert_eq!(m.info().engine, "host", "{name}");
        let s = m.open_session(None)?;
        let whole = m.forward(s, &r.tokens)?;
        let diff = max_abs_diff(&whole.to_rows(), &r.logits);
        eprintln!("{name} on {threads} thread(s): one pass, max |Δlogit| = {diff:e}");
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

/// The references are 14 tokens long, and the host cache keeps keys in panels of 32
/// positions with the rest in a tail: a sequence of 60 crosses both, and the sessions below
/// grow across the panel's edge. The oracle is the libtorch engine, which matches
/// transformers on the references (`parity.rs`); each engine is within 1e-4 of
/// transformers there, so they are held within twice that of each other here.
#[test]
fn past_a_panel_of_keys_it_matches_the_libtorch_engine_in_one_pass_in_blocks_and_batched() -> Result<()> {
    const LONG: usize = 60;
    for (name, threads) in FIXTURES.iter().flat_map(|name| [(*name, 1), (*name, 3)]) {
        let tokens: Vec<u32> = (0..LONG as u32).map(|i| (i * 37 + 11) % 96).collect();
        let oracle = {
            let mut m = common::load(name)?;
            let s = m.open_session(None)?;
            m.forward(s, &tokens)?.to_rows()
        };
        let mut m = load_model(&fixture(name), &LoadOptions { threads: Some(threads), ..host_options() })?;
        let check = |what: &str, got: &[Vec<f32>], want: &[Vec<f32>]| {
            let diff = max_abs_diff(got, want);
            assert!(diff <= 2.0 * TOL, "{name} on {threads} thread(s): {what}, max |Δlogit| = {diff}");
        };
        let s = m.open_session(None)?;
        check("one pass", &m.forward(s, &tokens)?.to_rows(), &oracle);
        passes_past_a_panel(&mut m, &tokens, &oracle, check)?;
    }
    Ok(())
}

/// Checks with `check` (what, got, want) against `want`, the logits of one pass over
/// `tokens`: blocks of five from a cache of 8 (grown across the panel's edge), each block
/// first scored wrong and rolled back, as a speculative round does; then two sessions in one
/// pass, one decoding past the panel, one prefilling past it.
fn passes_past_a_panel(
    m: &mut BoxedModel,
    tokens: &[u32],
    want: &[Vec<f32>],
    check: impl Fn(&str, &[Vec<f32>], &[Vec<f32>]),
) -> Result<()> {
    let t = m.open_session(Some(8))?;
    let mut got = Vec::new();
    for (i, block) in tokens.chunks(5).enumerate() {
        let wrong: Vec<u32> = block.iter().map(|&x| (x + 1) % 96).collect();
        m.forward(t, &wrong)?;
        m.truncate(t, i * 5)?;
        got.extend(m.forward(t, block)?.to_rows());
    }
    check("blocks after rollbacks", &got, want);
    let (a, b) = (m.open_session(None)?, m.open_session(None)?);
    let last = tokens.len() - 1;
    m.forward(a, &tokens[..last])?;
    let both = m.forward_batch(&[
        ForwardItem { session: a, tokens: &tokens[last..], rows: 1 },
        ForwardItem { session: b, tokens, rows: tokens.len() },
    ]);
    let both: Vec<_> = both.into_iter().collect::<Result<_, _>>()?;
    check("batched decode", &both[0].to_rows(), &want[last..]);
    check("batched prefill", &both[1].to_rows(), want);
    Ok(())
}

/// The same sequences in bf16 (keys and values stored in bf16 where the CPU multiplies bf16
/// pairs): the blocks after rollbacks and the batched passes read the cache a one-token or a
/// five-token pass at a time, across the panel's edge, and must give what one pass gives
/// (the same rounded values, summed in other orders: within 1e-4).
#[test]
fn in_bf16_past_a_panel_of_keys_blocks_and_batches_give_what_one_pass_gives() -> Result<()> {
    const LONG: usize = 60;
    for (name, threads) in FIXTURES.iter().flat_map(|name| [(*name, 1), (*name, 3)]) {
        let tokens: Vec<u32> = (0..LONG as u32).map(|i| (i * 37 + 11) % 96).collect();
        let opts = LoadOptions { threads: Some(threads), dtype: DType::Bf16, ..host_options() };
        let mut m = load_model(&fixture(name), &opts)?;
        let s = m.open_session(None)?;
        let one_pass = m.forward(s, &tokens)?.to_rows();
        let check = |what: &str, got: &[Vec<f32>], want: &[Vec<f32>]| {
            let diff = max_abs_diff(got, want);
            assert!(diff <= 1e-4, "{name} in bf16 on {threads} thread(s): {what}, max |Δlogit| = {diff}");
        };
        passes_past_a_panel(&mut m, &tokens, &one_pass, check)?;
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
fn a_batch_of_sessions_gives_each_the_logits_it_gets_alone() -> Result<()> {
    // Sessions at different lengths, one of them twice as long as the window, with
    // different numbers of rows asked for; and a bad item that fails alone.
    for name in ["gemma3", "llama_gqa_untied"] {
        let r = reference(name)?;
        let mut m = load_model(&fixture(name), &LoadOptions { threads: Some(2), ..host_options() })?;
        let (a, b, c) = (m.open_session(None)?, m.open_session(None)?, m.open_session(None)?);
        let cut = r.tokens.len() / 3;
        m.forward(a, &r.tokens[..cut])?;
        let items = [
            ForwardItem { session: a, tokens: &r.tokens[cut..], rows: 2 },
            ForwardItem { session: b, tokens: &r.tokens, rows: r.tokens.len() },
            ForwardItem { session: c, tokens: &[u32::MAX], rows: 1 },
        ];
        let mut out = m.forward_batch(&items).into_iter();
        let first = out.next().expect("a")?;
        let diff = max_abs_diff(&first.to_rows(), &r.logits[r.tokens.len() - 2..]);
        assert!(diff <= TOL, "{name}: the continued session, max |Δlogit| = {diff} > {TOL}");
        let second = out.next().expect("b")?;
        let diff = max_abs_diff(&second.to_rows(), &r.logits);
        assert!(diff <= TOL, "{name}: the whole prompt, max |Δlogit| = {diff} > {TOL}");
        assert!(out.next().expect("c").is_err(), "{name}: a token outside the vocabulary fails its item");
        assert_eq!((m.session_len(a)?, m.session_len(b)?, m.session_len(c)?), (r.tokens.len(), r.tokens.len(), 0));
    }
    Ok(())
}

/// A copy of fixture `name` whose weights are rounded to bf16 values, still stored as f32.
fn rounded_copy(name: &str) -> Result<tempfile::TempDir> {
    let dir = tempfile::tempdir()?;
    for entry in std::fs::read_dir(fixture(name))? {
        let path = entry?.path();
        let to = dir.path().join(path.file_name().expect("a file"));
        if path.extension().is_some_and(|e| e == "safetensors") {
            let bytes = std::fs::read(&path)?;
            let tensors = safetensors::SafeTensors::deserialize(&bytes)?;
            let rounded: Vec<(String, Vec<u8>, Vec<usize>)> = tensors
                .tensors()
                .into_iter()
                .map(|(name, view)| {
                    assert_eq!(view.dtype(), safetensors::Dtype::F32, "{name}");
                    let data = view
                        .data()
                        .chunks_exact(4)
                        .flat_map(|b| {
                            let v = f32::from_le_bytes(b.try_into().expect("4 bytes"));
                            specd_host_kernels::bf16_value(v).to_le_bytes()
                        })
                        .collect();
                    (name, data, view.shape().to_vec())
                })
                .collect();
            let views: Vec<(String, safetensors::tensor::TensorView<'_>)> = rounded
                .iter()
                .map(|(n, d, shape)| {
                    Ok((n.clone(), safetensors::tensor::TensorView::new(safetensors::Dtype::F32, shape.clone(), d)?))
                })
                .collect::<Result<_>>()?;
            std::fs::write(&to, safetensors::serialize(views, None)?)?;
        } else {
            std::fs::copy(&path, &to)?;
        }
    }
    Ok(dir)
}

#[test]
fn bf16_weights_compute_what_f32_computes_on_the_rounded_weights_or_nearer_it_than_transformers_bf16() -> Result<()> {
    // `--dtype bf16` rounds each weight once. Where the CPU has no bf16 instructions it
    // computes in f32, so it must equal the f32 engine (checked against transformers above)
    // on a checkpoint of the rounded weights. Where it has them, each linear layer rounds its
    // inputs to bf16 too, as torch's bf16 products do, and keeps the keys and values in bf16
    // as torch does: then it must stay nearer that f32 computation than transformers' own
    // bf16 forward of the checkpoint is (the stated bound), and differ from it (the rounding
    // is there). Either way `auto` on that checkpoint,
    // whose weights are bf16 values, stores them in bf16 and computes the same.
    let pairs = specd_host_kernels::Isa::detect().multiplies_bf16_pairs();
    for name in ["llama_gqa_untied", "qwen3_tied_yarn", "gemma3"] {
        let r = reference(name)?;
        let rounded = rounded_copy(name)?;
        let logits = |dir: &std::path::Path, dtype| -> Result<(Vec<Vec<f32>>, DType)> {
            let mut m = load_model(dir, &LoadOptions { dtype, ..host_options() })?;
            let s = m.open_session(None)?;
            Ok((m.forward(s, &r.tokens)?.to_rows(), m.info().dtype))
        };
        let (bf16, stored) = logits(&fixture(name), DType::Bf16)?;
        assert_eq!(stored, DType::Bf16, "{name}");
        // Its caches are f32 like the f32 engine's, or bf16 where the products round their
        // inputs to bf16, and the KV budget counts them so.
        let kv_bytes = |dtype| -> Result<u64> {
            Ok(load_model(&fixture(name), &LoadOptions { dtype, ..host_options() })?.info().kv_bytes_per_token)
        };
        let cfg = LlamaConfig::from_dir(&fixture(name))?;
        let f32_rows = (cfg.num_hidden_layers * 2 * cfg.num_key_value_heads * cfg.head_dim * 4) as u64;
        let bf16_rows = if pairs { f32_rows / 2 } else { f32_rows };
        assert_eq!((kv_bytes(DType::Bf16)?, kv_bytes(DType::F32)?), (bf16_rows, f32_rows), "{name}");
        let (f32_on_rounded, stored) = logits(rounded.path(), DType::F32)?;
        assert_eq!(stored, DType::F32, "{name}");
        let diff = max_abs_diff(&bf16, &f32_on_rounded);
        let transformers_bf16 = max_abs_diff(&r.bf16_logits, &f32_on_rounded);
        eprintln!(
            "{name}: from f32 on the rounded weights, max |Δlogit|: bf16 weights {diff:e} (inputs rounded: \
             {pairs}), transformers in bf16 {transformers_bf16:e}"
        );
        if pairs {
            assert!(
                diff > 1e-5 && diff < transformers_bf16,
                "{name}: bf16 products against f32 on the rounded copy, max |Δlogit| = {diff}, not in (1e-5, \
                 {transformers_bf16}) (transformers' bf16 forward)"
            );
        } else {
            assert!(diff <= 1e-5, "{name}: bf16 weights against f32 on the rounded copy, max |Δlogit| = {diff}");
        }
        let (auto_on_rounded, stored) = logits(rounded.path(), DType::Auto)?;
        assert_eq!(stored, DType::Bf16, "{name}: a checkpoint of bf16 values is stored in bf16 by auto");
        assert_eq!(auto_on_rounded, bf16, "{name}");
        // How far rounding the weights moves these random fixtures' logits, for the record.
        eprintln!(
            "{name}: bf16 weights against transformers in f32, max |Δlogit| = {:e}",
            max_abs_diff(&bf16, &r.logits)
        );
    }
    // The f32 fixtures' weights are not bf16 values, so auto keeps them in f32.
    let m = load_model(&fixture("llama_tied"), &LoadOptions { dtype: DType::Auto, ..host_options() })?;
    assert_eq!(m.info().dtype, DType::F32);
    Ok(())
}

#[test]
fn what_the_host_engine_cannot_run_is_refused_with_the_reason() -> Result<()> {
    let f16 = LoadOptions { engine: Engine::Host, dtype: DType::F16, ..cpu_f32() };
    let err = HostLlama::load(&fixture("llama_tied"), &f16).unwrap_err().to_string();
    assert!(err.contains("f32") && err.contains("bf16"), "{err}");
    let gpu = LoadOptions { engine: Engine::Host, device: DeviceSpec::Cuda(0), ..cpu_f32() };
    let err = load_model(&fixture("llama_tied"), &gpu).map(|_| ()).unwrap_err().to_string();
    assert!(err.contains("CPU") && err.contains("--engine libtorch"), "{err}");
    Ok(())
}

#[test]
fn auto_measures_where_both_engines_run_and_takes_libtorch_elsewhere() -> Result<()> {
    let cfg = LlamaConfig::from_dir(&fixture("llama_tied"))?;
    let cpu = |dtype| LoadOptions { dtype, ..LoadOptions::default() };
    for dtype in [DType::Auto, DType::F32, DType::Bf16] {
        assert_eq!(Engine::Auto.decide(&cfg, &cpu(dtype))?, EngineDecision::Measure, "{dtype}");
    }
    assert_eq!(Engine::Auto.decide(&cfg, &cpu(DType::F16))?, EngineDecision::Use(Engine::Libtorch));
    let gpu = LoadOptions { device: DeviceSpec::Cuda(0), ..cpu(DType::F32) };
    assert_eq!(Engine::Auto.decide(&cfg, &gpu)?, EngineDecision::Use(Engine::Libtorch));
    assert!(Engine::Host.decide(&cfg, &gpu).is_err());
    assert_eq!(Engine::Libtorch.decide(&cfg, &cpu(DType::F32))?, EngineDecision::Use(Engine::Libtorch));
    assert_eq!(Engine::Host.decide(&cfg, &cpu(DType::F32))?, EngineDecision::Use(Engine::Host));
    Ok(())
}

#[test]
fn auto_keeps_the_engine_that_ran_the_timed_passes_faster() -> Result<()> {
    // On a fixture this small libtorch's cost per operation is nearly all of a pass: the
    // host engine is many times faster, far past any noise, so auto must keep it.
    let dir = fixture("llama_tied");
    let one = |engine| LoadOptions { engine, threads: Some(1), ..cpu_f32() };
    let mut host = load_model(&dir, &one(Engine::Host))?;
    let mut torch = load_model(&dir, &one(Engine::Libtorch))?;
    let times = PassTimes { host: time_passes(host.as_mut())?, libtorch: time_passes(torch.as_mut())? };
    eprintln!("llama_tied: host {:?}, libtorch {:?}", times.host, times.libtorch);
    assert!(times.host * 3 < times.libtorch, "{times:?}");
    assert_eq!(times.faster(), Engine::Host);
    let auto = load_model(&dir, &one(Engine::Auto))?;
    assert_eq!(auto.info().engine, "host");
    Ok(())
}
