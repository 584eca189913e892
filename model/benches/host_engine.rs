//! The host engine against libtorch on one checkpoint: the median one-token pass and
//! five-token pass of each, at context 256, measured alternately in one run (so the ratio
//! holds whatever the host's load does meanwhile), libtorch in f32 on one thread as the
//! draft runs it.
//!
//! `SPECD_BENCH_MODEL_DIR=$PWD/models/demo/draft cargo bench -p specd-model --bench host_engine`
//! (`models/demo/draft` is the default; `make demo` builds it). The choice of
//! `HOST_ENGINE_MAX_PARAMETERS` rests on this run for the demo draft and target.

use std::hint::black_box;
use std::path::{Path, PathBuf};
use std::time::Instant;

use specd_model::{BoxedModel, DType, Engine, LanguageModel, LoadOptions, SessionId, load_model};

const CONTEXT: usize = 256;
const SAMPLES: usize = 300;

fn open(dir: &Path, engine: Engine) -> (BoxedModel, SessionId) {
    let opts = LoadOptions { dtype: DType::F32, threads: Some(1), engine, ..LoadOptions::default() };
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

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn main() {
    let dir = std::env::var_os("SPECD_BENCH_MODEL_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../models/demo/draft"));
    if !dir.join("config.json").is_file() {
        eprintln!("host_engine: no checkpoint at {} (make demo builds models/demo); nothing measured", dir.display());
        return;
    }
    let (mut host, hs) = open(&dir, Engine::Host);
    let (mut torch, ts) = open(&dir, Engine::Libtorch);
    let block = [11u32, 12, 13, 14, 15];
    for tokens in [&block[..1], &block[..]] {
        for _ in 0..20 {
            timed(&mut host, hs, tokens);
            timed(&mut torch, ts, tokens);
        }
        let (h, t): (Vec<f64>, Vec<f64>) =
            (0..SAMPLES).map(|_| (timed(&mut host, hs, tokens), timed(&mut torch, ts, tokens))).unzip();
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
}
