//! The host engine against libtorch on one checkpoint: the median one-token pass and
//! five-token pass of each, at context 256, measured alternately in one run (so the ratio
//! holds whatever the host's load does meanwhile), both with the same threads and dtype.
//!
//! `SPECD_BENCH_MODEL_DIR=$PWD/models/demo/target SPECD_BENCH_THREADS=2 SPECD_BENCH_DTYPE=auto
//! cargo bench -p specd-model --bench host_engine` (the defaults: the shipped demo draft, one
//! thread per core, `auto`; `SPECD_BENCH_SAMPLES`, 300 passes of each kind).
//!
//! Then, as llama.cpp's `llama-bench` measures (`tg128`, `pp256`), each engine alone: 128
//! one-token passes from an empty session, and one 256-token prompt, in tokens/s (the best
//! of five runs), for `scripts/llama_cpp_bench.sh`'s figures to compare with.

use std::hint::black_box;
use std::path::Path;
use std::time::Instant;

use specd_model::{BoxedModel, DType, Engine, LanguageModel, LoadOptions, SessionId, load_model};

mod common;
use common::{BenchEnv, median};

const CONTEXT: usize = 256;

fn open(dir: &Path, engine: Engine, threads: usize, dtype: DType) -> (BoxedModel, SessionId) {
    let opts = LoadOptions { dtype, threads: Some(threads), engine, ..LoadOptions::default() };
    let mut m = load_model(dir, &opts).expect("checkpoint");
    let s = m.open_session(Some(CONTEXT + 8)).expect("session");
    let vocab = m.info().vocab_size as u32;
    let prompt: Vec<u32> = (0..CONTEXT as u32).map(|i| (i * 7919) % vocab).collect();
    m.forward(s, &prompt).expect("prefill");
    (m, s)
}

fn timed(m: &mut BoxedModel, s: SessionId, tokens: &[u32]) -> f64 {
    let start = Instant::now();
    black_box(m.forward_last(s, tokens, tokens.len()).expect("forward"));
    let t = start.elapsed().as_secs_f64();
    m.truncate(s, CONTEXT).expect("truncate");
    t
}

/// Tokens/s of 128 one-token passes from an empty session, and of one 256-token pass: the
/// best of five runs each.
fn llama_bench_shapes(m: &mut BoxedModel) -> (f64, f64) {
    let vocab = m.info().vocab_size as u32;
    let tokens: Vec<u32> = (0..256u32).map(|i| (i * 7919 + 1) % vocab).collect();
    let (mut decode, mut prefill) = (0f64, 0f64);
    for _ in 0..5 {
        let s = m.open_session(Some(256)).expect("session");
        let start = Instant::now();
        for t in &tokens[..128] {
            black_box(m.forward_last(s, std::slice::from_ref(t), 1).expect("decode"));
        }
        decode = decode.max(128.0 / start.elapsed().as_secs_f64());
        m.truncate(s, 0).expect("truncate");
        let start = Instant::now();
        black_box(m.forward_last(s, &tokens, 1).expect("prefill"));
        prefill = prefill.max(256.0 / start.elapsed().as_secs_f64());
        m.release(s).expect("release");
    }
    (decode, prefill)
}

fn main() {
    let BenchEnv { dir, samples, threads, dtype } = BenchEnv::read("draft", 300);
    if !dir.join("config.json").is_file() {
        eprintln!("host_engine: no checkpoint at {} (make demo builds models/demo); nothing measured", dir.display());
        return;
    }
    let (mut host, hs) = open(&dir, Engine::Host, threads, dtype);
    let (mut torch, ts) = open(&dir, Engine::Libtorch, threads, dtype);
    println!(
        "{threads} thread(s), --dtype {dtype}: host weights {}, libtorch {}",
        host.info().dtype,
        torch.info().dtype
    );
    let block = [11u32, 12, 13, 14, 15];
    // Each engine alone first: alternating, each pass follows the other engine's, whose
    // threads (libtorch's OpenMP ones spin after a parallel region) may still hold the cores.
    for tokens in [&block[..1], &block[..]] {
        let h = median((0..samples).map(|_| timed(&mut host, hs, tokens)).collect());
        let t = median((0..samples).map(|_| timed(&mut torch, ts, tokens)).collect());
        println!(
            "{}: {} token(s) at context {CONTEXT}, each engine alone: host {:.1} µs, libtorch {:.1} µs, host/libtorch {:.2}",
            dir.display(),
            tokens.len(),
            h * 1e6,
            t * 1e6,
            h / t
        );
    }
    for tokens in [&block[..1], &block[..]] {
        for _ in 0..20 {
            timed(&mut host, hs, tokens);
            timed(&mut torch, ts, tokens);
        }
        let (h, t): (Vec<f64>, Vec<f64>) =
            (0..samples).map(|_| (timed(&mut host, hs, tokens), timed(&mut torch, ts, tokens))).unzip();
        let (h, t) = (median(h), median(t));
        println!(
            "{}: {} token(s) at context {CONTEXT}: host {:.1} µs, libtorch {:.1} µs, host/libtorch {:.2}",
            dir.display(),
            tokens.len(),
            h * 1e6,
            t * 1e6,
            h / t
        );
    }
    for (name, m) in [("host", &mut host), ("libtorch", &mut torch)] {
        m.release(if name == "host" { hs } else { ts }).expect("release");
        let (decode, prefill) = llama_bench_shapes(m);
        println!("{}: {name} alone: tg128 {decode:.1} tokens/s, pp256 {prefill:.1} tokens/s", dir.display());
    }
}
