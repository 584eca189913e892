//! The host engine's one-token pass against the session's depth (the tokens already in its
//! cache), as llama.cpp's `llama-bench -d` measures decoding after a prompt: how much of a
//! served pass goes to attention over the cache rather than to the weights.
//!
//! `SPECD_BENCH_MODEL_DIR=$PWD/models/demo/target SPECD_BENCH_THREADS=2 cargo bench -p
//! specd-model --bench host_depth` (`SPECD_BENCH_SAMPLES` passes at each depth, 300 by
//! default; `SPECD_BENCH_DEPTHS`, comma-separated, `0,64,128,256,448` by default).

use std::hint::black_box;
use std::time::Instant;

use specd_model::{Engine, LoadOptions, load_model};

mod common;
use common::{BenchEnv, counts_from_env, median};

fn main() {
    let BenchEnv { dir, samples, threads, dtype } = BenchEnv::read("target", 300);
    if !dir.join("config.json").is_file() {
        eprintln!("host_depth: no checkpoint at {} (make demo builds models/demo); nothing measured", dir.display());
        return;
    }
    let depths = counts_from_env("SPECD_BENCH_DEPTHS", &[0, 64, 128, 256, 448]);
    let opts = LoadOptions { dtype, threads: Some(threads), engine: Engine::Host, ..LoadOptions::default() };
    let mut m = load_model(&dir, &opts).expect("checkpoint");
    let vocab = m.info().vocab_size as u32;
    let deepest = depths.iter().copied().max().unwrap_or(0);
    println!("{}: {threads} thread(s), host weights {}", dir.display(), m.info().dtype);
    let s = m.open_session(Some(deepest + 1)).expect("session");
    let prompt: Vec<u32> = (0..deepest as u32).map(|i| (i * 7919 + 3) % vocab).collect();
    let mut at_zero = None;
    for &depth in &depths {
        m.truncate(s, 0).expect("truncate");
        if depth > 0 {
            m.forward(s, &prompt[..depth]).expect("prompt");
        }
        let mut times = Vec::with_capacity(samples);
        for i in 0..samples + samples / 10 {
            let start = Instant::now();
            black_box(m.forward_last(s, &[(i as u32 * 31 + 5) % vocab], 1).expect("pass"));
            let t = start.elapsed().as_secs_f64();
            m.truncate(s, depth).expect("truncate");
            if i >= samples / 10 {
                times.push(t);
            }
        }
        let t = median(times);
        let base = *at_zero.get_or_insert(t);
        println!("depth {depth:>5}: one-token pass {:>8.1} µs, {:.2}× depth {}", t * 1e6, t / base, depths[0]);
    }
}
