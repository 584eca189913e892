//! Greedy decoding: with temperature 0 on both sides the rule commits exactly the target's
//! argmax chain, whatever the draft proposes.

mod common;

use common::{Rule, generate};
use specd_sampling::law::{PrefixModel, WireFormat};
use specd_sampling::{DenseDist, Purpose, SamplingParams, StreamKey, TokenHistory, Truncation, effective_distribution};

/// Logits that depend on the prefix, with deliberate ties so the lowest-id rule matters.
struct LogitModel {
    vocab_size: usize,
}

impl LogitModel {
    fn logits(&self, prefix: &[u32], salt: u64) -> Vec<f32> {
        let h = prefix.iter().fold(salt, |h, &t| h.wrapping_mul(31).wrapping_add(u64::from(t) + 1));
        let mut rng = StreamKey::new(h, prefix.len() as u32, 0, Purpose::Plain).stream();
        (0..self.vocab_size).map(|_| (rng.next_u32() % 4) as f32).collect()
    }

    fn greedy(&self, prefix: &[u32], salt: u64) -> DenseDist {
        effective_distribution(&self.logits(prefix, salt), &SamplingParams::greedy(), TokenHistory::default()).unwrap()
    }
}

impl PrefixModel for LogitModel {
    fn target(&self, prefix: &[u32]) -> DenseDist {
        self.greedy(prefix, 1)
    }
    fn draft(&self, prefix: &[u32]) -> DenseDist {
        self.greedy(prefix, 2)
    }
}

fn argmax_chain(model: &LogitModel, prompt: &[u32], length: usize) -> Vec<u32> {
    let mut context = prompt.to_vec();
    for _ in 0..length {
        let logits = model.logits(&context, 1);
        let max = logits.iter().copied().fold(f32::MIN, f32::max);
        context.push(logits.iter().position(|&l| l == max).unwrap() as u32);
    }
    context[prompt.len()..].to_vec()
}

#[test]
fn greedy_commits_exactly_the_target_argmax_chain() {
    let model = LogitModel { vocab_size: 7 };
    let expected = argmax_chain(&model, &[3], 40);
    for gamma in [0, 1, 3, 6] {
        for seed in 0..10 {
            for wire in [WireFormat::Dense, WireFormat::Sparse(Truncation::new(0.0, 4).unwrap())] {
                let got = generate(&model, &[3], gamma, 40, wire, seed, Rule::Exact);
                assert_eq!(got, expected, "γ = {gamma}, seed = {seed}, {wire:?}");
            }
        }
    }
}
