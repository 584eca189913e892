//! One attention call per layer for a batched pass, against one call per session (what
//! `LlamaModel::forward_segments` does), on the attention alone, at Llama-3.2-1B's attention
//! shape (32 heads, 8 KV heads of 64, 16 layers), f32, CPU, one libtorch thread.
//!
//! A pass over n sessions, each with `past` tokens cached and `rows` new ones (1: decode; 6: a
//! verify block), runs the attention of 16 layers either as n calls per layer, each with its
//! session's own float mask (none for a single row), or as one call per layer over the
//! sessions padded to the longest, with one padded mask built once per pass (the pads of
//! queries, keys and values, and the unpadding of the output, counted in), and the padded
//! call alone on inputs already padded (the least a padded pass could cost, were the caches
//! kept padded). Median of 15 alternated passes.
//!
//! `cargo bench -p specd-model --bench batched_attention`; `SPECD_BENCH_DEVICE=cuda:0` runs it on
//! a GPU (timed after a synchronize).

use std::time::Instant;

use tch::{Device, Kind, Tensor};

mod common;
use common::median;

const HEADS: i64 = 32;
const KV_HEADS: i64 = 8;
const HEAD_DIM: i64 = 64;
const LAYERS: usize = 16;

/// `SPECD_BENCH_DEVICE` (default: the CPU), read once.
fn device() -> Device {
    static DEVICE: std::sync::OnceLock<Device> = std::sync::OnceLock::new();
    *DEVICE.get_or_init(|| {
        match std::env::var("SPECD_BENCH_DEVICE").ok().and_then(|d| d.strip_prefix("cuda:").map(str::to_owned)) {
            Some(index) => Device::Cuda(index.parse().expect("cuda:N")),
            None => Device::Cpu,
        }
    })
}

/// Waits for the device's queued work (a GPU's kernels run after their calls return).
fn sync() {
    if let Device::Cuda(index) = device() {
        tch::Cuda::synchronize(index as i64);
    }
}

struct Session {
    q: Tensor,
    k: Tensor,
    v: Tensor,
    mask: Option<Tensor>,
}

fn causal_mask(past: i64, n: i64) -> Option<Tensor> {
    if n == 1 {
        return None;
    }
    let q = Tensor::arange_start(past, past + n, (Kind::Int64, device())).unsqueeze(1);
    let k = Tensor::arange(past + n, (Kind::Int64, device())).unsqueeze(0);
    let open = Tensor::zeros([n, past + n], (Kind::Float, device()));
    Some(open.masked_fill(&k.le_tensor(&q).logical_not(), f64::NEG_INFINITY))
}

fn sessions(n: usize, past: i64, rows: i64) -> Vec<Session> {
    (0..n)
        .map(|i| {
            // Contexts of different lengths, as a batch has.
            let past = past + 7 * i as i64;
            let opts = (Kind::Float, device());
            Session {
                q: Tensor::randn([1, HEADS, rows, HEAD_DIM], opts),
                k: Tensor::randn([1, KV_HEADS, past + rows, HEAD_DIM], opts),
                v: Tensor::randn([1, KV_HEADS, past + rows, HEAD_DIM], opts),
                mask: causal_mask(past, rows),
            }
        })
        .collect()
}

fn per_session(batch: &[Session]) -> Vec<Tensor> {
    let mut out = Vec::new();
    for _ in 0..LAYERS {
        out = batch
            .iter()
            .map(|s| Tensor::scaled_dot_product_attention(&s.q, &s.k, &s.v, s.mask.as_ref(), 0.0, false, None, true))
            .collect();
    }
    out
}

/// The padded mask `[n, 1, Lq, Lk]`: each session's own causal mask, -inf over its padded
/// keys; a padded query row sees key 0 only (its output is thrown away, but must not be NaN).
fn padded_mask(batch: &[Session], lq: i64, lk: i64) -> Tensor {
    let masks: Vec<Tensor> = batch
        .iter()
        .map(|s| {
            let (rows, keys) = (s.q.size()[2], s.k.size()[2]);
            let own = s
                .mask
                .as_ref()
                .map_or_else(|| Tensor::zeros([rows, keys], (Kind::Float, device())), |m| m.shallow_clone());
            let full = Tensor::full([lq, lk], f64::NEG_INFINITY, (Kind::Float, device()));
            full.narrow(0, 0, rows).narrow(1, 0, keys).copy_(&own);
            if rows < lq {
                let _ = full.narrow(0, rows, lq - rows).narrow(1, 0, 1).fill_(0.0);
            }
            full.unsqueeze(0)
        })
        .collect();
    Tensor::stack(&masks, 0)
}

fn pad_to(t: &Tensor, len: i64) -> Tensor {
    let missing = len - t.size()[2];
    if missing == 0 { t.shallow_clone() } else { t.constant_pad_nd([0, 0, 0, missing]) }
}

fn padded(batch: &[Session]) -> Vec<Tensor> {
    let lq = batch.iter().map(|s| s.q.size()[2]).max().unwrap_or(1);
    let lk = batch.iter().map(|s| s.k.size()[2]).max().unwrap_or(1);
    let mask = padded_mask(batch, lq, lk);
    let mut out = Vec::new();
    for _ in 0..LAYERS {
        let q = Tensor::cat(&batch.iter().map(|s| pad_to(&s.q, lq)).collect::<Vec<_>>(), 0);
        let k = Tensor::cat(&batch.iter().map(|s| pad_to(&s.k, lk)).collect::<Vec<_>>(), 0);
        let v = Tensor::cat(&batch.iter().map(|s| pad_to(&s.v, lk)).collect::<Vec<_>>(), 0);
        let attn = Tensor::scaled_dot_product_attention(&q, &k, &v, Some(&mask), 0.0, false, None, true);
        out = batch.iter().enumerate().map(|(i, s)| attn.narrow(0, i as i64, 1).narrow(2, 0, s.q.size()[2])).collect();
    }
    out
}

/// The padded call alone, its inputs already padded and stacked (as if the caches were kept
/// that way): the least a padded pass could cost.
fn padded_call_only(batch: &[Session]) -> impl FnMut() {
    let lq = batch.iter().map(|s| s.q.size()[2]).max().unwrap_or(1);
    let lk = batch.iter().map(|s| s.k.size()[2]).max().unwrap_or(1);
    let mask = padded_mask(batch, lq, lk);
    let q = Tensor::cat(&batch.iter().map(|s| pad_to(&s.q, lq)).collect::<Vec<_>>(), 0);
    let k = Tensor::cat(&batch.iter().map(|s| pad_to(&s.k, lk)).collect::<Vec<_>>(), 0);
    let v = Tensor::cat(&batch.iter().map(|s| pad_to(&s.v, lk)).collect::<Vec<_>>(), 0);
    move || {
        for _ in 0..LAYERS {
            let _ = Tensor::scaled_dot_product_attention(&q, &k, &v, Some(&mask), 0.0, false, None, true);
        }
    }
}

fn main() {
    tch::set_num_threads(1);
    tch::manual_seed(1);
    for past in [256i64, 1024] {
        for rows in [1i64, 6] {
            for n in [1usize, 4, 8] {
                let batch = sessions(n, past, rows);
                // Same results (the test of the bench itself), then the timing.
                let (a, b) = (per_session(&batch), padded(&batch));
                let diff = a.iter().zip(&b).map(|(x, y)| (x - y).abs().max().double_value(&[])).fold(0.0, f64::max);
                assert!(diff < 1e-5, "padded attention differs by {diff}");
                let (mut loop_s, mut pad_s, mut call_s) = (Vec::new(), Vec::new(), Vec::new());
                let mut call_only = padded_call_only(&batch);
                for _ in 0..15 {
                    sync();
                    let t = Instant::now();
                    call_only();
                    sync();
                    call_s.push(t.elapsed().as_secs_f64());
                    let t = Instant::now();
                    per_session(&batch);
                    sync();
                    loop_s.push(t.elapsed().as_secs_f64());
                    let t = Instant::now();
                    padded(&batch);
                    sync();
                    pad_s.push(t.elapsed().as_secs_f64());
                }
                let (l, p, c) = (median(loop_s) * 1e3, median(pad_s) * 1e3, median(call_s) * 1e3);
                println!(
                    "past {past:>4}, rows {rows}, sessions {n}: one call per session {l:7.3} ms, one padded call {p:7.3} ms per pass of {LAYERS} layers ({:+.0}%), the padded call alone {c:7.3} ms ({:+.0}%)",
                    (p / l - 1.0) * 100.0,
                    (c / l - 1.0) * 100.0
                );
            }
        }
    }
}
