//! KV memory by the request, measured on a model of Llama-3.2-1B's cache shape (16 layers, 8
//! KV heads of 64, 131 072 positions; a tiny width elsewhere, random weights, CPU):
//!
//! 1. Admission: under a budget B (`SPECD_BENCH_KV_BUDGET_MIB`, default 1024), sessions of a
//!    request's reach (prompt 19 + max_new_tokens 64 + γmax 8 + 1) are opened until one is
//!    refused: the bytes each reserves, ⌊B / per-session⌋ and how many were admitted, and the
//!    refusal. Also the issue's own case (4 layers, 8 KiB a token).
//! 2. Reserve-all against grow-in-chunks: one session decodes `SPECD_BENCH_KV_TOKENS` (default
//!    512) tokens one at a time, having reserved them all at open, or having reserved the
//!    prompt + 1 and grown by 256-token chunks; the time of the whole decode (median of 3,
//!    alternated) and what the growth copies cost.
//!
//! `cargo bench -p specd-model --bench kv_reservation`

use std::time::Instant;

use specd_model::{DType, DeviceSpec, KvBudget, LanguageModel, LlamaConfig, LlamaModel, LlamaShape, LoadOptions};

mod common;
use common::median;

const PROMPT: usize = 19;
const MAX_NEW: usize = 64;
const GAMMA_MAX: usize = 8;

fn config(layers: usize, kv_heads: usize, head_dim: usize) -> LlamaConfig {
    LlamaConfig::llama(LlamaShape {
        vocab_size: 256,
        hidden_size: 64,
        intermediate_size: 128,
        layers,
        heads: 32,
        kv_heads,
        head_dim,
        context: 131_072,
    })
}

fn model(cfg: LlamaConfig, budget: KvBudget, dtype: DType) -> LlamaModel {
    let opts =
        LoadOptions { device: DeviceSpec::Cpu, dtype, kv_budget: budget, threads: Some(1), ..Default::default() };
    LlamaModel::random(cfg, 3, &opts).expect("random model")
}

fn env(name: &str, default: usize) -> usize {
    std::env::var(name).ok().and_then(|v| v.parse().ok()).unwrap_or(default)
}

fn admission(name: &str, cfg: LlamaConfig, budget: u64, dtype: DType) {
    let mut m = model(cfg, KvBudget::Bytes(budget), dtype);
    let reach = PROMPT + MAX_NEW + GAMMA_MAX + 1;
    let per_token = m.info().kv_bytes_per_token;
    let mut admitted = 0u64;
    let refusal = loop {
        match m.open_session(Some(reach)) {
            Ok(_) => admitted += 1,
            Err(err) => break err,
        }
    };
    let per_session = m.memory_in_use().0 / admitted.max(1);
    println!(
        "{name} {dtype}: {per_token} B/token, reach {reach} tokens, reserved per session {per_session} B (reach × B/token = {}), budget {budget} B: ⌊B / per-session⌋ = {}, admitted {admitted}, next refused: {refusal}",
        reach as u64 * per_token,
        budget / (reach as u64 * per_token),
    );
    let mut whole = model(m.config().clone(), KvBudget::Bytes(budget), dtype);
    match whole.open_session(None) {
        Ok(_) => println!("{name} {dtype}: a whole-context session (the old reservation) fits"),
        Err(err) => println!("{name} {dtype}: a whole-context session (the old reservation): {err}"),
    }
}

/// Decodes `tokens` after a prompt in a session that reserved `reserve`; seconds.
fn decode(m: &mut LlamaModel, reserve: usize, tokens: usize) -> f64 {
    let s = m.open_session(Some(reserve)).expect("session");
    let prompt: Vec<u32> = (0..PROMPT as u32).map(|i| i * 7 % 256).collect();
    let started = Instant::now();
    m.forward(s, &prompt).expect("prefill");
    for i in 0..tokens {
        m.forward(s, &[(i * 13 % 256) as u32]).expect("decode");
    }
    let elapsed = started.elapsed().as_secs_f64();
    m.release(s).expect("release");
    elapsed
}

fn strategies(dtype: DType) {
    let tokens = env("SPECD_BENCH_KV_TOKENS", 512);
    let mut m = model(config(16, 8, 64), KvBudget::Unbounded, dtype);
    let total = PROMPT + tokens;
    decode(&mut m, total, 16);
    let (mut all, mut chunks) = (Vec::new(), Vec::new());
    for _ in 0..3 {
        all.push(decode(&mut m, total, tokens));
        chunks.push(decode(&mut m, PROMPT + 1, tokens));
    }
    let (all, chunks) = (median(all), median(chunks));
    println!(
        "1B cache shape {dtype}, {tokens} tokens decoded one at a time: reserve-all {:.1} ms ({:.3} ms/token), grow-in-chunks {:.1} ms ({:.3} ms/token), growth costs {:+.1} ms",
        all * 1e3,
        all * 1e3 / tokens as f64,
        chunks * 1e3,
        chunks * 1e3 / tokens as f64,
        (chunks - all) * 1e3
    );
    // What growing costs by itself: reallocating and copying a session's cache at each chunk.
    let per_token = m.info().kv_bytes_per_token;
    let s = m.open_session(Some(PROMPT + 1)).expect("session");
    let prompt: Vec<u32> = (0..PROMPT as u32).collect();
    m.forward(s, &prompt).expect("prefill");
    let mut len = PROMPT;
    let mut growths = Vec::new();
    while len + 256 <= total {
        // Fill to the reservation, then time the pass that grows it.
        let fill = m.memory_in_use().0 / per_token - len as u64;
        if fill > 0 {
            m.forward(s, &vec![1; fill as usize]).expect("fill");
            len += fill as usize;
        }
        let started = Instant::now();
        m.forward(s, &[1]).expect("growing pass");
        growths.push((len, started.elapsed().as_secs_f64()));
        len += 1;
    }
    let shown: Vec<String> = growths.iter().map(|(len, t)| format!("{len}: {:.2} ms", t * 1e3)).collect();
    println!("1B cache shape {dtype}, a pass that grows the cache, by tokens held: {}", shown.join(", "));
}

fn main() {
    // One libtorch thread: a small model's operations are too short to split.
    tch::set_num_threads(1);
    let budget = env("SPECD_BENCH_KV_BUDGET_MIB", 1024) as u64 * 1024 * 1024;
    admission("Llama-3.2-1B cache shape", config(16, 8, 64), budget, DType::F32);
    admission("Llama-3.2-1B cache shape", config(16, 8, 64), budget, DType::Bf16);
    admission("the issue's 4-layer Llama (8 KiB/token f32)", config(4, 4, 64), budget, DType::F32);
    strategies(DType::F32);
}
