//! What the model crate's benches share: the median they report, and the checkpoint,
//! passes, threads and dtype the host-engine benches read from the environment.

#![allow(dead_code)]

use std::path::PathBuf;

use specd_model::DType;

pub fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// `SPECD_BENCH_MODEL_DIR` (default: `models/demo/DEFAULT_MEMBER`), `SPECD_BENCH_SAMPLES`
/// (default `default_samples`), `SPECD_BENCH_THREADS` (one per core) and
/// `SPECD_BENCH_DTYPE` (`auto`).
#[derive(Debug)]
pub struct BenchEnv {
    pub dir: PathBuf,
    pub samples: usize,
    pub threads: usize,
    pub dtype: DType,
}

impl BenchEnv {
    pub fn read(default_member: &str, default_samples: usize) -> Self {
        let parsed = |name: &str| std::env::var(name).ok().filter(|v| !v.is_empty());
        Self {
            dir: std::env::var_os("SPECD_BENCH_MODEL_DIR").map(PathBuf::from).unwrap_or_else(|| {
                PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../models/demo").join(default_member)
            }),
            samples: parsed("SPECD_BENCH_SAMPLES").and_then(|n| n.parse().ok()).unwrap_or(default_samples),
            threads: parsed("SPECD_BENCH_THREADS")
                .and_then(|n| n.parse().ok())
                .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get())),
            dtype: parsed("SPECD_BENCH_DTYPE").and_then(|d| d.parse().ok()).unwrap_or(DType::Auto),
        }
    }
}

/// The comma-separated counts in the environment variable `name`, or `default` when it is
/// unset or empty.
pub fn counts_from_env(name: &str, default: &[usize]) -> Vec<usize> {
    match std::env::var(name).ok().filter(|v| !v.is_empty()) {
        Some(v) => v
            .split(',')
            .map(|n| n.trim().parse().unwrap_or_else(|_| panic!("{name}: comma-separated counts")))
            .collect(),
        None => default.to_vec(),
    }
}
