//! A random-weight Llama of Llama-3.2-1B's dimensions (vocabulary 128 256, hidden 2048, 16
//! layers, 32 query heads and 8 KV heads of 64, MLP 8192, tied embeddings, 131 072
//! positions): what the GPU check (`scripts/gpu-check.sh run`) records about a real-sized
//! target, printed as one JSON object on stdout.
//!
//! - the verify/decode cost ratio: a pass over a block of k = 2, 4, 6, 8 tokens against a
//!   one-token pass, alternated (median of `SPECD_BENCH_SAMPLES` pairs, default 21), each
//!   from a session holding `SPECD_BENCH_CONTEXT` tokens (default 512) and rolled back after;
//! - KV bytes per session: per token, for a request's reach (the context + 256 new tokens +
//!   γmax 8 + 1, reserved and read back from the model's accounting) and for the whole
//!   context (what a session reserved before reservations by the request);
//! - tokens/s of decoding at 1 and 8 sessions, each decode step one batched pass over every
//!   session (`SPECD_BENCH_DECODE_STEPS` steps, default 64);
//! - one session's decode at a repeated key length (each step rolled back) against a growing
//!   one (each step kept, as serving does; `SPECD_BENCH_LENGTH_STEPS` steps of each, default
//!   64): the gap is what a new key length costs a step. The other measurements roll back to
//!   one length and cannot show it; on a GPU it is where attention plans built per shape
//!   (cuDNN's) would appear, and bucketed key lengths should close it.
//!
//! `SPECD_BENCH_ATTENTION_KEYS` (`auto`, `exact` or a bucket in tokens) and
//! `SPECD_BENCH_ATTENTION_KERNEL` (`auto`, `sdpa` or `efficient`) set the model's attention as
//! the nodes' `--attention-keys` and `--attention-kernel` do; the JSON names both, as given
//! and as resolved on the device. A value that does not parse stops the bench rather than
//! measuring the default under another name.
//!
//! Every pass returns its logits on the host, as a node with `--distributions host` does (on
//! a GPU, `auto` leaves them on the device: these ratios include a copy of the rows it avoids).
//!
//! `SPECD_BENCH_DEVICE=cuda:0 SPECD_BENCH_DTYPE=bf16 cargo bench -p specd-model --bench
//! llama1b_shape`. `SPECD_BENCH_SHAPE=small` runs a model of the same head layout at a tenth
//! of the width and depth, for a dry run on a CPU (the JSON names the shape it ran).

use std::time::Instant;

use serde_json::json;
use specd_model::{
    AttentionKernel, AttentionOptions, DType, DeviceSpec, ForwardItem, KeyLengths, LanguageModel, LlamaConfig,
    LlamaModel, LlamaShape, LoadOptions, SessionId,
};

mod common;
use common::median;

/// Llama-3.2-1B's sizes (its config.json), with random weights.
const LLAMA_3_2_1B: LlamaShape = LlamaShape {
    vocab_size: 128_256,
    hidden_size: 2048,
    intermediate_size: 8192,
    layers: 16,
    heads: 32,
    kv_heads: 8,
    head_dim: 64,
    context: 131_072,
};

/// The dry run's stand-in: the same head layout and context, small enough for 2 CPU cores.
const SMALL: LlamaShape = LlamaShape {
    vocab_size: 32_000,
    hidden_size: 256,
    intermediate_size: 1024,
    layers: 2,
    heads: 4,
    kv_heads: 1,
    head_dim: 64,
    context: 131_072,
};

const BLOCKS: [usize; 4] = [2, 4, 6, 8];
const NEW_TOKENS: usize = 256;
const GAMMA_MAX: usize = 8;

fn env<T: std::str::FromStr>(name: &str, default: T) -> T {
    std::env::var(name).ok().and_then(|v| v.parse().ok()).unwrap_or(default)
}

/// `name` parsed strictly: unset is the default, anything else must parse.
fn env_strict<T: std::str::FromStr + Default>(name: &str) -> T
where
    T::Err: std::fmt::Display,
{
    match std::env::var(name) {
        Ok(v) => v.parse().unwrap_or_else(|e| panic!("{name}={v:?}: {e}")),
        Err(_) => T::default(),
    }
}

fn mean(v: &[f64]) -> f64 {
    v.iter().sum::<f64>() / v.len().max(1) as f64
}

/// A prompt of `n` ids spread over the vocabulary.
fn tokens(n: usize, vocab: usize, salt: usize) -> Vec<u32> {
    (0..n).map(|i| ((i * 7919 + salt * 104_729) % vocab) as u32).collect()
}

/// Medians of one-token and k-token passes, alternated `n` times after 3 unmeasured pairs.
fn verify_and_decode(m: &mut LlamaModel, s: SessionId, context: usize, block: &[u32], n: usize) -> (f64, f64) {
    let mut timed = |tokens: &[u32]| {
        let start = Instant::now();
        m.forward(s, tokens).expect("forward");
        let elapsed = start.elapsed().as_secs_f64();
        m.truncate(s, context).expect("truncate");
        elapsed
    };
    for _ in 0..3 {
        timed(&block[..1]);
        timed(block);
    }
    let (t1, tk): (Vec<f64>, Vec<f64>) = (0..n).map(|_| (timed(&block[..1]), timed(block))).unzip();
    (median(t1), median(tk))
}

/// Tokens per second of `steps` decode steps over `sessions` sessions, one batched pass each.
fn decode_rate(m: &mut LlamaModel, sessions: usize, context: usize, steps: usize) -> f64 {
    let vocab = m.config().vocab_size;
    let ids: Vec<SessionId> = (0..sessions)
        .map(|i| {
            let s = m.open_session(Some(context + steps + 1)).expect("session");
            m.forward_last(s, &tokens(context, vocab, i), 1).expect("prefill");
            s
        })
        .collect();
    let next: Vec<Vec<u32>> = (0..steps).map(|t| tokens(sessions, vocab, t + 1)).collect();
    let step = |m: &mut LlamaModel, t: usize| {
        let items: Vec<ForwardItem<'_>> = ids
            .iter()
            .enumerate()
            .map(|(i, &s)| ForwardItem { session: s, tokens: &next[t][i..=i], rows: 1 })
            .collect();
        for r in m.forward_batch(&items) {
            r.expect("decode step");
        }
    };
    step(m, 0);
    for &s in &ids {
        m.truncate(s, context).expect("truncate");
    }
    let start = Instant::now();
    for t in 0..steps {
        step(m, t);
    }
    let elapsed = start.elapsed().as_secs_f64();
    for s in ids {
        m.release(s).expect("release");
    }
    (sessions * steps) as f64 / elapsed
}

/// Per-step seconds of one session's decode from `context` tokens: `steps` steps each rolled
/// back to `context` (one key length throughout), then `steps` steps each kept (a new key
/// length every step), after 3 unmeasured steps.
fn repeated_and_growing(m: &mut LlamaModel, context: usize, steps: usize) -> (Vec<f64>, Vec<f64>) {
    let vocab = m.config().vocab_size;
    let s = m.open_session(Some(context + steps + 1)).expect("session");
    m.forward_last(s, &tokens(context, vocab, 3), 1).expect("prefill");
    let next = tokens(steps, vocab, 5);
    let step = |m: &mut LlamaModel, t: usize| {
        let start = Instant::now();
        m.forward(s, &next[t..=t]).expect("decode step");
        start.elapsed().as_secs_f64()
    };
    let mut repeated = Vec::with_capacity(steps);
    for t in 0..steps + 3 {
        let elapsed = step(m, t % steps);
        m.truncate(s, context).expect("truncate");
        if t >= 3 {
            repeated.push(elapsed);
        }
    }
    let growing: Vec<f64> = (0..steps).map(|t| step(m, t)).collect();
    m.release(s).expect("release");
    (repeated, growing)
}

/// The JSON of [`repeated_and_growing`]'s times, in ms.
fn key_length_report(context: usize, repeated: &[f64], growing: &[f64]) -> serde_json::Value {
    let ms = |v: &[f64]| v.iter().map(|t| t * 1e3).collect::<Vec<f64>>();
    let (repeated, growing) = (ms(repeated), ms(growing));
    let summary = |v: &[f64]| {
        json!({
            "median_ms": median(v.to_vec()),
            "mean_ms": mean(v),
            "max_ms": v.iter().copied().fold(0.0, f64::max),
        })
    };
    let typical = median(repeated.clone());
    // A plan build (public traces: 23-37 ms) dwarfs a decode step; steps that took twice the
    // repeated median are where one probably happened. The mean gap counts them all, slow
    // steps or not.
    let slow = growing.iter().filter(|&&t| t > 2.0 * typical).count();
    json!({
        "from_tokens": context,
        "steps": growing.len(),
        "repeated": summary(&repeated),
        "growing": summary(&growing),
        "gap_mean_ms": mean(&growing) - mean(&repeated),
        "gap_median_ms": median(growing.clone()) - typical,
        "gap_total_ms": growing.iter().sum::<f64>() - mean(&repeated) * growing.len() as f64,
        "growing_steps_over_twice_the_repeated_median": slow,
    })
}

fn main() {
    let _guard = tch::no_grad_guard();
    let device: DeviceSpec = env("SPECD_BENCH_DEVICE", DeviceSpec::Cpu);
    let dtype: DType = env("SPECD_BENCH_DTYPE", DType::Auto);
    let shape_name: String = env("SPECD_BENCH_SHAPE", "1b".to_owned());
    let shape = match shape_name.as_str() {
        "1b" => LLAMA_3_2_1B,
        "small" => SMALL,
        other => panic!("SPECD_BENCH_SHAPE={other}: expected 1b or small"),
    };
    let context: usize = env("SPECD_BENCH_CONTEXT", 512);
    let samples: usize = env("SPECD_BENCH_SAMPLES", 21);
    let steps: usize = env("SPECD_BENCH_DECODE_STEPS", 64);
    let length_steps: usize = env("SPECD_BENCH_LENGTH_STEPS", 64);
    let keys: KeyLengths = env_strict("SPECD_BENCH_ATTENTION_KEYS");
    let kernel: AttentionKernel = env_strict("SPECD_BENCH_ATTENTION_KERNEL");

    let started = Instant::now();
    let attention = AttentionOptions { keys, kernel, ..AttentionOptions::default() };
    let opts = LoadOptions { device, dtype, attention, ..LoadOptions::default() };
    let mut m = LlamaModel::random(LlamaConfig::llama(shape), 7, &opts).expect("random model");
    let built_s = started.elapsed().as_secs_f64();
    m.warm_up(GAMMA_MAX + 1).expect("warm-up");
    let vocab = m.config().vocab_size;

    // KV bytes: what a session of a request's reach reserves, read back from the accounting.
    let per_token = m.info().kv_bytes_per_token;
    let reach = context + NEW_TOKENS + GAMMA_MAX + 1;
    let before = m.memory_in_use().0;
    let s = m.open_session(Some(reach)).expect("session");
    let reserved = m.memory_in_use().0 - before;

    m.forward_last(s, &tokens(context, vocab, 0), 1).expect("prefill");
    let block = tokens(*BLOCKS.iter().max().unwrap_or(&8), vocab, 99);
    let mut ratios = serde_json::Map::new();
    let mut decode_ms = Vec::new();
    for k in BLOCKS {
        let (t1, tk) = verify_and_decode(&mut m, s, context, &block[..k], samples);
        decode_ms.push(t1 * 1e3);
        ratios.insert(format!("verify_{k}"), json!({"verify_ms": tk * 1e3, "decode_1_ms": t1 * 1e3, "ratio": tk / t1}));
    }
    m.release(s).expect("release");
    let one = decode_rate(&mut m, 1, context, steps);
    let eight = decode_rate(&mut m, 8, context, steps);
    let (repeated, growing) = repeated_and_growing(&mut m, context, length_steps.max(1));
    let report = json!({
        "shape": shape_name,
        "config": {
            "vocab_size": shape.vocab_size, "hidden_size": shape.hidden_size,
            "intermediate_size": shape.intermediate_size, "layers": shape.layers, "heads": shape.heads,
            "kv_heads": shape.kv_heads, "head_dim": shape.head_dim, "context": shape.context,
        },
        "device": device.to_string(),
        "dtype": m.dtype().to_string(),
        "attention": {
            "keys": keys.to_string(),
            "kernel": kernel.to_string(),
            "bucket_tokens": keys.bucket(device),
            "kernel_resolved": kernel.resolve(device).map(|k| k.to_string()).unwrap_or_else(|e| e.to_string()),
        },
        "parameters": m.config().num_parameters(),
        "weight_bytes": m.weight_bytes(),
        "build_s": built_s,
        "session_context": context,
        "samples": samples,
        "verify_over_decode": ratios,
        "decode_1_ms_median": median(decode_ms),
        "kv_bytes_per_token": per_token,
        "kv_session": {
            "reach_tokens": reach,
            "reserved_bytes": reserved,
            "reach_times_per_token": reach as u64 * per_token,
            "whole_context_bytes": shape.context as u64 * per_token,
        },
        "decode_tokens_per_s": {"sessions_1": one, "sessions_8": eight, "steps": steps},
        "decode_key_lengths": key_length_report(context, &repeated, &growing),
        "seconds": started.elapsed().as_secs_f64(),
    });
    println!("{report}");
}
