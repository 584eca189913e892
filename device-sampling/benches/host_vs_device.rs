//! The target's distributions for one verify at V = 128 256 and γ = 5, built on the host
//! (the logits copied out of their tensor, then `specd-sampling` on 2 threads) against built
//! with libtorch on the tensor's device (`specd-device-sampling`). On a CPU both run here;
//! `SPECD_BENCH_DEVICE=cuda:0` puts the logits on a GPU.
//!
//! cargo bench -p specd-device-sampling --bench host_vs_device

use criterion::{Criterion, criterion_group, criterion_main};
use specd_device_sampling::{BlockHistory, score_block};
use specd_sampling::{RoundKey, SamplingParams, block_distributions};
use tch::{Device, Kind, Tensor};

const VOCAB: i64 = 128_256;
const GAMMA: usize = 5;

fn device() -> Device {
    match std::env::var("SPECD_BENCH_DEVICE").ok().as_deref() {
        Some(cuda) if cuda.starts_with("cuda") => Device::Cuda(cuda.trim_start_matches("cuda:").parse().unwrap_or(0)),
        _ => Device::Cpu,
    }
}

fn bench(c: &mut Criterion) {
    tch::manual_seed(7);
    let logits = (Tensor::randn([GAMMA as i64 + 1, VOCAB], (Kind::Float, Device::Cpu)) * 3.0).to_device(device());
    let supports: Vec<Vec<u32>> = (0..GAMMA as u32).map(|i| (0..8).map(|k| i * 977 + k * 13).collect()).collect();
    let supports: Vec<&[u32]> = supports.iter().map(Vec::as_slice).collect();
    let block = [11u32, 12, 13, 14, 15];
    let prompt: Vec<u32> = (0..512).map(|i| (i * 37) % VOCAB as u32).collect();
    let generated: Vec<u32> = (0..256).map(|i| (i * 53) % VOCAB as u32).collect();
    let key = RoundKey { seed: 3, round: 9 };
    let settings = [
        ("t1", SamplingParams::default()),
        ("greedy", SamplingParams::greedy()),
        ("t0.8_top_p0.95", SamplingParams { temperature: 0.8, top_p: 0.95, ..Default::default() }),
        (
            "t0.8_top_k50_penalties",
            SamplingParams {
                temperature: 0.8,
                top_k: 50,
                repetition_penalty: 1.1,
                presence_penalty: 0.3,
                ..Default::default()
            },
        ),
    ];
    let mut group = c.benchmark_group("verify_distributions");
    group.sample_size(20);
    for (name, params) in settings {
        group.bench_function(format!("host/{name}"), |b| {
            b.iter(|| {
                let host = logits.to_device(Device::Cpu).contiguous();
                let mut data = vec![0f32; host.numel()];
                let len = data.len();
                host.copy_data(&mut data, len);
                let rows: Vec<&[f32]> = data.chunks_exact(VOCAB as usize).collect();
                let p = block_distributions(&rows, &params, &prompt, &generated, &block, 2).unwrap();
                specd_sampling::score_block(&p, &supports, key, 2).unwrap()
            });
        });
        group.bench_function(format!("device/{name}"), |b| {
            b.iter(|| {
                let history = BlockHistory { prompt: &prompt, generated: &generated, block: &block };
                score_block(&logits, &params, history, &supports, key).unwrap()
            });
        });
    }
    group.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
