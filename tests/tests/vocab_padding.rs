//! A pair whose tokenizers agree but whose embedding tables differ in padding rows, as real
//! pairs do (Qwen2.5-0.5B: 151 936 rows; Qwen2.5-72B: 152 064; one tokenizer): the
//! coordinator accepts it and the output law is still the target's.
//!
//! The target is `law_tables`' target with one row more, id 3, that no token name maps to;
//! unlike a trained model's padding rows (p ≈ 0) it carries real mass in some rows (10% after
//! the prompt and after every 2-token prefix starting with 1), so the law covers tokens the
//! draft lacks: its q is 0 there, and when the target samples one the draft cannot read it
//! and the session goes on target-only (counted as fallbacks). The draft is `law_tables`'
//! draft, 3 rows.
//!
//! The reverse pair, a draft with a padding row the target lacks, puts 30% of the draft's
//! mass on that row: the draft must draw from the target's ids only (`vocab_limit`), or it
//! would propose the padding id and be dropped, which the check counts.
//!
//! Each check draws N continuations of 3 tokens (seeds 0..N) and applies Pearson's χ² to the
//! 64 cells against the exact target law (a correct system fails one check with probability
//! 1e-3 over the seeds, which are fixed). The last check runs the naive rule (resample from
//! p on rejection) on the same pair and asserts the check rejects it. N is half of
//! `SPECD_LAW_SAMPLES` (default 25 000: each check takes a few seconds; with 10 000 the naive
//! rule already gave p < 1e-300).

use std::path::{Path, PathBuf};
use std::sync::Arc;

use specd_coordinator::RuleVariant;
use specd_e2e::law_tables::{EffectiveTarget, PROMPT, TablePair, tables};
use specd_e2e::{Cluster, ClusterOptions, Table, continuation_request, scratch_dir, stream_to_end};
use specd_node::Distributions;
use specd_proto::v1::SamplingParams as WireSampling;
use specd_sampling::chi2::chi_square_test;
use specd_sampling::law::target_sequence_law;
use specd_sampling::{SamplingParams, Truncation};

const FALSE_FAILURE: f64 = 1e-3;
const LENGTH: usize = 3;
const CLIENTS: u64 = 8;
/// The target's rows: the draft's 3 and one padding row.
const TARGET_VOCAB: usize = 4;
const NAMES: [&str; 3] = ["A", "B", "C"];

fn samples() -> u64 {
    crate::law_through_cluster::samples() / 2
}

/// `law_tables`' pair with a padding row added to the target.
fn padded_tables() -> TablePair {
    let TablePair { target, draft } = tables(LENGTH);
    let pad = |probs: &[f64], mass: f64| -> Vec<f64> {
        probs.iter().map(|p| p * (1.0 - mass)).chain(std::iter::once(mass)).collect()
    };
    let padded = Table {
        vocab_size: TARGET_VOCAB,
        default: pad(&target.default, 0.0),
        rules: target
            .rules
            .iter()
            .map(|(prefix, probs)| {
                let mass = if prefix.as_slice() == PROMPT || prefix.get(1) == Some(&1) { 0.1 } else { 0.0 };
                (prefix.clone(), pad(probs, mass))
            })
            .collect(),
    };
    TablePair { target: padded, draft }
}

/// Writes `table` as a table-model file whose token names are [`NAMES`]: the ids past them
/// are padding rows.
fn write(table: &Table, path: &Path, names: &[&str]) -> PathBuf {
    let rules: Vec<_> =
        table.rules.iter().map(|(prefix, probs)| serde_json::json!({"prefix": prefix, "probs": probs})).collect();
    let file = serde_json::json!({
        "vocab_size": table.vocab_size, "tokens": names, "default": table.default, "rules": rules,
    });
    std::fs::write(path, serde_json::to_vec_pretty(&file).unwrap()).unwrap();
    path.to_owned()
}

fn cell(seq: &[u32]) -> usize {
    seq.iter().fold(0, |acc, &t| acc * TARGET_VOCAB + t as usize)
}

/// The reverse of [`padded_tables`]: `law_tables`' target (3 rows) and its draft with a
/// padding row that takes 30% of q everywhere.
fn larger_draft_tables() -> TablePair {
    let TablePair { target, draft } = tables(LENGTH);
    let pad = |probs: &[f64]| -> Vec<f64> { probs.iter().map(|p| p * 0.7).chain(std::iter::once(0.3)).collect() };
    let padded = Table {
        vocab_size: TARGET_VOCAB,
        default: pad(&draft.default),
        rules: draft.rules.iter().map(|(prefix, probs)| (prefix.clone(), pad(probs))).collect(),
    };
    TablePair { target, draft: padded }
}

/// What a law check saw: the χ² p-value of N continuations through the cluster against the
/// target's exact law, how many times generations lost their draft, and the draft tokens
/// accepted.
struct LawCheck {
    p_value: f64,
    fallbacks: u64,
    accepted: u64,
}

async fn law_check(name: &str, options: ClusterOptions, dense: bool, n: u64) -> LawCheck {
    law_check_of(name, padded_tables(), options, dense, n).await
}

async fn law_check_of(
    name: &str,
    TablePair { target: target_table, draft: draft_table }: TablePair,
    options: ClusterOptions,
    dense: bool,
    n: u64,
) -> LawCheck {
    let dir = scratch_dir(&format!("vocab-padding-{name}"));
    let target = write(&target_table, &dir.join("target.json"), &NAMES);
    let draft = write(&draft_table, &dir.join("draft.json"), &NAMES);
    let cluster = Cluster::start(&target, &draft, &options).await.unwrap();
    assert_eq!(cluster.target_info().await.unwrap().vocab_size as usize, target_table.vocab_size);
    assert_eq!(cluster.draft_info().await.unwrap().vocab_size as usize, draft_table.vocab_size);
    let client = cluster.client().await.unwrap();
    let params = Arc::new(SamplingParams::default());
    let mut tasks = Vec::new();
    for c in 0..CLIENTS {
        let mut client = client.clone();
        tasks.push(tokio::spawn(async move {
            let mut counts = vec![0u64; TARGET_VOCAB.pow(LENGTH as u32)];
            let (mut fallbacks, mut accepted) = (0, 0);
            for seed in (c..n).step_by(CLIENTS as usize) {
                let request = continuation_request(
                    &PROMPT,
                    LENGTH,
                    WireSampling { temperature: Some(1.0), seed: Some(seed), ..Default::default() },
                    dense,
                );
                let (tokens, stats) = stream_to_end(&mut client, request).await.unwrap();
                fallbacks += stats.draft_fallbacks;
                accepted += stats.accepted_tokens;
                assert_eq!(tokens.len(), LENGTH);
                counts[cell(&tokens)] += 1;
            }
            (counts, fallbacks, accepted)
        }));
    }
    let mut counts = vec![0u64; TARGET_VOCAB.pow(LENGTH as u32)];
    let (mut fallbacks, mut accepted) = (0, 0);
    for task in tasks {
        let (lane, lost, taken) = task.await.unwrap();
        fallbacks += lost;
        accepted += taken;
        for (total, c) in counts.iter_mut().zip(lane) {
            *total += c;
        }
    }
    cluster.shutdown().await;
    let target_vocab = target_table.vocab_size;
    let model = EffectiveTarget { table: target_table, params: *params };
    let mut expected = vec![0.0; counts.len()];
    for (seq, p) in target_sequence_law(&model, &PROMPT, LENGTH) {
        expected[cell(&seq)] = p;
    }
    if target_vocab == TARGET_VOCAB {
        let padding_mass: f64 = expected.iter().enumerate().filter(|(i, _)| has_padding(*i)).map(|(_, p)| p).sum();
        assert!(padding_mass > 0.05, "the law gives the padding id real mass: {padding_mass}");
    }
    let p_value = chi_square_test(&counts, &expected).unwrap().p_value;
    eprintln!(
        "vocab padding, {name}: {n} samples, {fallbacks} draft losses, {accepted} accepted: χ² p-value {p_value:.4e}"
    );
    LawCheck { p_value, fallbacks, accepted }
}

/// Whether cell `i`'s continuation holds the padding id.
fn has_padding(mut i: usize) -> bool {
    (0..LENGTH).any(|_| {
        let t = i % TARGET_VOCAB;
        i /= TARGET_VOCAB;
        t == TARGET_VOCAB - 1
    })
}

fn small_truncation() -> ClusterOptions {
    ClusterOptions { truncation: Truncation::new(0.05, 2).unwrap(), ..ClusterOptions::default() }
}

#[tokio::test(flavor = "current_thread")]
async fn a_draft_without_the_targets_padding_row_keeps_the_law_sparse() {
    let check = law_check("sparse", small_truncation(), false, samples()).await;
    assert!(check.fallbacks > 0, "the target sampled the padding id and the draft could not follow");
    assert!(check.p_value > FALSE_FAILURE, "sparse: p = {}", check.p_value);
}

#[tokio::test(flavor = "current_thread")]
async fn a_draft_without_the_targets_padding_row_keeps_the_law_dense() {
    let p = law_check("dense", ClusterOptions::default(), true, samples()).await.p_value;
    assert!(p > FALSE_FAILURE, "dense (q padded with zeros): p = {p}");
}

#[tokio::test(flavor = "current_thread")]
async fn the_check_rejects_the_naive_rule_on_the_padded_pair() {
    let options = ClusterOptions { rule: RuleVariant::NaiveResampleFromTarget, ..ClusterOptions::default() };
    let p = law_check("naive", options, true, samples()).await.p_value;
    assert!(p < FALSE_FAILURE, "the naive rule passed: p = {p}");
}

/// A draft with a padding row its target lacks draws from the target's ids only: it keeps
/// the law, drafts, and is never dropped for proposing the padding id (which it would be,
/// 30% of its draws, without the limit), on both wires, and with its q built on the device
/// (where the row is cut to the target's ids before the distribution).
#[tokio::test(flavor = "current_thread")]
async fn a_draft_with_a_padding_row_the_target_lacks_keeps_the_law() {
    let on_the_device = ClusterOptions { distributions: Distributions::Device, ..small_truncation() };
    for (name, options, dense) in [
        ("larger-sparse", small_truncation(), false),
        ("larger-dense", ClusterOptions::default(), true),
        ("larger-sparse-device", on_the_device, false),
    ] {
        let check = law_check_of(name, larger_draft_tables(), options, dense, samples() / 2).await;
        assert_eq!(check.fallbacks, 0, "{name}: the draft proposed an id the target lacks");
        assert!(check.accepted > 0, "{name}: the draft drafted nothing");
        assert!(check.p_value > FALSE_FAILURE, "{name}: p = {}", check.p_value);
    }
}

/// A real tokenizer difference (one id names another string) is refused, naming both
/// fingerprints.
#[tokio::test(flavor = "current_thread")]
async fn a_real_tokenizer_difference_is_refused_by_name() {
    let dir = scratch_dir("vocab-padding-refused");
    let TablePair { target: target_table, draft: draft_table } = padded_tables();
    let target = write(&target_table, &dir.join("target.json"), &NAMES);
    let renamed = write(&draft_table, &dir.join("renamed.json"), &["A", "B", "Z"]);
    let err = Cluster::start(&target, &renamed, &ClusterOptions::default()).await.unwrap_err().to_string();
    assert!(err.contains("tokenizers differ") && err.contains("renamed.json") && err.contains("sha256:"), "{err}");
}
