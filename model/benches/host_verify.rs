//! The host engine's verify pass against its one-token pass at the same depth: the cost
//! ratio that speculation's bound assumes to be 1, and that a served bench reports as
//! `verify_cost_ratio`. Passes of 1, 2, 3, 5 and 8 tokens run in turn, each rolled back, so
//! that a host whose speed drifts moves every length alike.
//!
//! `SPECD_BENCH_MODEL_DIR=$PWD/models/demo/target SPECD_BENCH_THREADS=2 cargo bench -p
//! specd-model --bench host_verify` (`SPECD_BENCH_SAMPLES` rounds, 300 by default;
//! `SPECD_BENCH_LENGTHS`, comma-separated, `1,2,3,5,8` by default, 1 always included).

use std::hint::black_box;
use std::time::Instant;

use specd_model::{Engine, LoadOptions, load_model};

mod common;
use common::{BenchEnv, counts_from_env, median};

/// Tokens in the session's cache before each measured pass.
const DEPTH: usize = 128;

fn main() {
    let BenchEnv { dir, samples, threads, dtype } = BenchEnv::read("target", 300);
    if !dir.join("config.json").is_file() {
        eprintln!("host_verify: no checkpoint at {} (make demo builds models/demo); nothing measured", dir.display());
        return;
    }
    let mut lengths = counts_from_env("SPECD_BENCH_LENGTHS", &[1, 2, 3, 5, 8]);
    lengths.push(1);
    lengths.sort_unstable();
    lengths.dedup();
    let longest = *lengths.last().expect("a length");
    let opts = LoadOptions { dtype, threads: Some(threads), engine: Engine::Host, ..LoadOptions::default() };
    let mut m = load_model(&dir, &opts).expect("checkpoint");
    let vocab = m.info().vocab_size as u32;
    println!("{}: {threads} thread(s), host weights {}, depth {DEPTH}", dir.display(), m.info().dtype);
    // The session's capacity is the model's, as a served session's is.
    let s = m.open_session(None).expect("session");
    let prompt: Vec<u32> = (0..DEPTH as u32).map(|i| (i * 7919 + 3) % vocab).collect();
    m.forward(s, &prompt).expect("prompt");
    let block: Vec<u32> = (0..longest as u32).map(|i| (i * 31 + 5) % vocab).collect();
    let mut times: Vec<Vec<f64>> = vec![Vec::with_capacity(samples); lengths.len()];
    for round in 0..samples + samples / 10 {
        for (i, &len) in lengths.iter().enumerate() {
            let start = Instant::now();
            black_box(m.forward_last(s, &block[..len], len).expect("pass"));
            let t = start.elapsed().as_secs_f64();
            m.truncate(s, DEPTH).expect("truncate");
            if round >= samples / 10 {
                times[i].push(t);
            }
        }
    }
    let medians: Vec<f64> = times.into_iter().map(median).collect();
    for (len, t) in lengths.iter().zip(&medians) {
        println!("{len}-token pass: {:7.1} µs, {:.2}× the one-token pass", t * 1e6, t / medians[0]);
    }
}
