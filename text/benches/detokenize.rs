//! What a generated token's text costs: the incremental detokenizer (a small window per
//! token) against decoding the whole output again each token (what the coordinator asked the
//! target node to do each round). Needs the test tokenizers: run `cargo test --release -p
//! specd-text --test detokenize` once first (it makes target/fixtures/text-v1).

use std::path::Path;
use std::sync::Arc;

use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use specd_text::{IncrementalDetokenizer, TextStream, Tokenizer};

fn tokenizer() -> Arc<Tokenizer> {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../target/fixtures/text-v1/byte_level/tokenizer.json");
    let t = Tokenizer::from_file(&path).unwrap_or_else(|e| {
        panic!("{}: {e}; run `cargo test --release -p specd-text --test detokenize` first", path.display())
    });
    Arc::new(t)
}

/// Text-like ids: encodings of a mixed-script passage, repeated to `len`.
fn output(t: &Tokenizer, len: usize) -> Vec<u32> {
    let text = "speculative decoding 推测解码 는 빠르다 😀 the draft proposes 草稿提出 and the target verifies 🎉 ";
    let ids = t.encode(text, false).unwrap().get_ids().to_vec();
    ids.iter().copied().cycle().take(len).collect()
}

fn detokenize(c: &mut Criterion) {
    let t = tokenizer();
    let prompt = output(&t, 64);
    let mut group = c.benchmark_group("detokenize");
    for len in [256usize, 1024] {
        let ids = output(&t, len);
        group.throughput(Throughput::Elements(len as u64));
        group.bench_with_input(BenchmarkId::new("incremental", len), &ids, |b, ids| {
            b.iter(|| {
                let mut d = IncrementalDetokenizer::new(t.clone(), &prompt);
                let mut n = 0;
                for &id in ids {
                    n += d.push(id).unwrap().len();
                }
                n + d.finish().unwrap().len()
            });
        });
        group.bench_with_input(BenchmarkId::new("stream_with_stop_strings", len), &ids, |b, ids| {
            b.iter(|| {
                let mut s = TextStream::new(t.clone(), &prompt, vec!["\n\n".into(), "</answer>".into()]);
                let mut n = 0;
                for &id in ids {
                    n += s.push(id).unwrap().text.len();
                }
                n + s.finish().unwrap().len()
            });
        });
        group.bench_with_input(BenchmarkId::new("whole_decode_each_token", len), &ids, |b, ids| {
            b.iter(|| (1..=ids.len()).map(|k| t.decode(&ids[..k], true).unwrap().len()).sum::<usize>());
        });
    }
    group.finish();
}

criterion_group!(benches, detokenize);
criterion_main!(benches);
