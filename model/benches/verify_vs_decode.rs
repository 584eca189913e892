//! Verify-6 against decode-1 on a random-weight Llama of about 100M parameters (f32, CPU),
//! and single-token decode time against the memory-bandwidth bound
//! (weight bytes / measured copy bandwidth).
//!
//! `cargo bench -p specd-model --bench verify_vs_decode`. Each measured forward starts from
//! a session holding 256 tokens and is rolled back afterwards (O(1)), so every sample runs
//! at context 256. Set `SPECD_BENCH_DEVICE=cuda:0` to run it on a GPU and
//! `SPECD_BENCH_DTYPE=bf16|f16` for another dtype (the recorded numbers are f32). The group
//! is named for f32 whatever the dtype; the summary line states the real one.
//! `SPECD_BENCH_MODEL_DIR=/abs/path/models/demo/target` measures a checkpoint instead of the random
//! model (the ratio of a verify pass to a decode step is what speculation's bound assumes
//! to be 1).

use std::hint::black_box;
use std::time::{Duration, Instant};

use criterion::{Criterion, criterion_group};
use specd_model::{DType, DeviceSpec, LanguageModel, LlamaConfig, LlamaModel, LlamaShape, LoadOptions, SessionId};

const CONTEXT: usize = 256;

fn config() -> LlamaConfig {
    LlamaConfig::llama(LlamaShape {
        vocab_size: 32_000,
        hidden_size: 768,
        intermediate_size: 2048,
        layers: 12,
        heads: 12,
        kv_heads: 4,
        head_dim: 64,
        context: 2048,
    })
}

fn device() -> DeviceSpec {
    std::env::var("SPECD_BENCH_DEVICE").ok().and_then(|d| d.parse().ok()).unwrap_or_default()
}

fn setup() -> (LlamaModel, SessionId) {
    let device = device();
    let dtype: DType = std::env::var("SPECD_BENCH_DTYPE").ok().and_then(|d| d.parse().ok()).unwrap_or_default();
    let opts = LoadOptions { device, dtype, ..LoadOptions::default() };
    let mut m = match std::env::var_os("SPECD_BENCH_MODEL_DIR") {
        Some(dir) => LlamaModel::load(dir.as_ref(), &opts).expect("checkpoint"),
        None => LlamaModel::random(config(), 7, &opts).expect("random model"),
    };
    m.warm_up(9).expect("warm-up");
    let s = m.open_session(Some(1024.min(m.config().max_position_embeddings))).expect("session");
    let vocab = m.config().vocab_size as u32;
    let prompt: Vec<u32> = (0..CONTEXT as u32).map(|i| (i * 7919) % vocab).collect();
    m.forward(s, &prompt).expect("prefill");
    (m, s)
}

fn step(m: &mut LlamaModel, s: SessionId, tokens: &[u32]) {
    black_box(m.forward(s, tokens).expect("forward"));
    m.truncate(s, CONTEXT).expect("truncate");
}

/// Medians of decode-1 and verify-k seconds, measured alternately `n` times each.
fn alternating_medians(n: usize, m: &mut LlamaModel, s: SessionId, block: &[u32]) -> (f64, f64) {
    let mut timed = |tokens: &[u32]| {
        let start = Instant::now();
        step(m, s, tokens);
        start.elapsed().as_secs_f64()
    };
    for _ in 0..3 {
        timed(&block[..1]);
        timed(block);
    }
    let (mut t1, mut tk): (Vec<f64>, Vec<f64>) = (0..n).map(|_| (timed(&block[..1]), timed(block))).unzip();
    t1.sort_by(f64::total_cmp);
    tk.sort_by(f64::total_cmp);
    (t1[n / 2], tk[n / 2])
}

/// Copy bandwidth of the model's device in bytes/s, read + write each counted: a libtorch
/// copy between two 256 MiB tensors (the same threads and kernels the model uses). The best
/// of 15 copies: background load only ever lowers it.
fn copy_bandwidth(device: tch::Device) -> f64 {
    let n: i64 = 64 << 20;
    let src = tch::Tensor::ones([n], (tch::Kind::Float, device));
    let mut dst = tch::Tensor::zeros([n], (tch::Kind::Float, device));
    let mut best = f64::INFINITY;
    for _ in 0..15 {
        let start = Instant::now();
        dst.copy_(&src);
        if let tch::Device::Cuda(i) = device {
            tch::Cuda::synchronize(i as i64);
        }
        best = best.min(start.elapsed().as_secs_f64());
    }
    2.0 * (n * 4) as f64 / best
}

fn bench(c: &mut Criterion) {
    let _guard = tch::no_grad_guard();
    let (mut m, s) = setup();
    let verify: Vec<u32> = vec![11, 22, 33, 44, 55, 66];
    let mut g = c.benchmark_group("llama100m_f32_ctx256");
    g.sample_size(20).measurement_time(Duration::from_secs(5));
    g.bench_function("decode_1", |b| b.iter(|| step(&mut m, s, &verify[..1])));
    g.bench_function("verify_6", |b| b.iter(|| step(&mut m, s, &verify)));
    g.finish();

    // One summary line with the ratios (criterion prints the absolute times above). The two
    // passes alternate so that background load hits both alike.
    let (t1, t6) = alternating_medians(41, &mut m, s, &verify);
    let block: Vec<u32> = (1..=8).map(|i| i * 11).collect();
    let sweep: Vec<String> = [2, 3, 4, 8]
        .iter()
        .map(|&k| {
            let (a, b) = alternating_medians(21, &mut m, s, &block[..k]);
            format!("verify_{k}/decode_1 {:.2}", b / a)
        })
        .collect();
    let bw = copy_bandwidth(device().to_device().expect("device"));
    let bytes = m.weight_bytes() as f64;
    let bound = bytes / bw;
    println!(
        "summary: device {}, dtype {}, params {:.1}M, threads {}, decode_1 {:.2} ms, verify_6 {:.2} ms, ratio {:.3} (goal <= 1.5); \
         weights {:.0} MB, copy bandwidth {:.2} GB/s, bandwidth bound {:.2} ms, decode/bound {:.2}",
        device(),
        m.dtype(),
        m.config().num_parameters() as f64 / 1e6,
        tch::get_num_threads(),
        t1 * 1e3,
        t6 * 1e3,
        t6 / t1,
        bytes / 1e6,
        bw / 1e9,
        bound * 1e3,
        t1 / bound,
    );
    println!("summary: {}", sweep.join(", "));
}

criterion_group!(benches, bench);

fn main() {
    benches();
    Criterion::default().configure_from_args().final_summary();
}
