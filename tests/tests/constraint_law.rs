//! The output law under a constraint through the whole cluster: a regular expression over the
//! table models' token names that forbids the token the target favours after the prompt, and
//! whose allowed tokens at a position depend on the tokens before it. Each check draws 3-token
//! continuations and applies Pearson's χ² to the 27 cells against the exact constrained law,
//! computed by hand from the tables (the forbidden tokens' logits set to −∞ before the
//! sampling settings; [`ConstrainedTarget`]), never by the grammar engine under test. A
//! correct system fails a check with probability [`FALSE_FAILURE`] over the seeds.
//!
//! The settings put top-k after the mask (top_k = 2 of 3 tokens): a node that truncated
//! before masking would leave one token where the law leaves two. At γ = 2 a block holds
//! every position of the output, so the first round's rows 2 and 3 are masked with states
//! reached through the block's candidates; later rounds start at position 2 or 3.
//!
//! Power: the last check runs a target that masks every row of a block with the state of its
//! first row ([`BlockMasks::FirstStateEverywhere`]) and asserts the same check rejects it, at
//! N / 25 samples (2 000 at the default N): there its p-value was 0 in f64.
//! The grammar is chosen so that under that bug every output is still in the language (the
//! first row's allowed set is a subset of every later row's), so only the law shows it.

use std::sync::Arc;

use specd_coordinator::GammaChoice;
use specd_draft_node::proposer::{MatchSpan, ProposerConfig, ProposerKind};
use specd_e2e::law_tables::{ConstrainedTarget, EffectiveTarget, VOCAB, cell, positive_tables_after};
use specd_e2e::{Cluster, ClusterOptions, continuation_request, scratch_dir, stream_to_end};
use specd_node::{BlockMasks, Distributions};
use specd_proto::v1::output_constraint::Kind;
use specd_proto::v1::{OutputConstraint, SamplingParams as WireSampling};
use specd_sampling::SamplingParams;
use specd_sampling::chi2::chi_square_test;
use specd_sampling::law::target_sequence_law;

use crate::law_through_cluster::{FALSE_FAILURE, device_samples, samples};

const LENGTH: usize = 3;
/// Ends with `t0`, which the prompt holds earlier with `t1` after it: the n-gram proposer's
/// first copy is `t1`, allowed; later ones may not be.
const PROMPT: [u32; 3] = [0, 1, 0];
const LANES: u64 = 8;

/// Over the output's text, the tables' token names `t0`, `t1`, `t2` each after a space (a
/// tokenizer without a decoder joins its tokens with spaces): the first token is never `t0`
/// (the target's favourite after the prompt); after `t2`, neither is the second; after
/// `t2 t2`, neither is the third. Every allowed set holds the first position's, {t1, t2}.
const REGEX: &str = " t1( t0| t1| t2)( t0| t1| t2)| t2( t1( t0| t1| t2)| t2( t1| t2))";

/// [`REGEX`]'s allowed tokens after an output, written out by hand.
fn allowed(output: &[u32]) -> [bool; VOCAB] {
    match output {
        [] | [2] | [2, 2] => [false, true, true],
        _ => [true, true, true],
    }
}

fn params() -> SamplingParams {
    SamplingParams { temperature: 0.9, top_k: 2, ..SamplingParams::default() }
}

fn sampling(seed: u64) -> WireSampling {
    let params = params();
    WireSampling {
        temperature: Some(params.temperature),
        top_k: Some(params.top_k as i32),
        seed: Some(seed),
        ..WireSampling::default()
    }
}

/// Draws `n` constrained continuations through a cluster with `options` and returns the χ²
/// p-value against the exact constrained law.
async fn constrained_law_p_value(name: &str, options: ClusterOptions, n: u64) -> f64 {
    let dir = scratch_dir(&format!("constraint-law-{name}"));
    let pair = positive_tables_after(&PROMPT, LENGTH);
    let files = pair.write(&dir).unwrap();
    let cluster = Cluster::start(&files.target, &files.draft, &options).await.unwrap();
    let client = cluster.client().await.unwrap();
    let constraint = Arc::new(OutputConstraint { kind: Some(Kind::Regex(REGEX.into())) });
    let mut lanes = Vec::new();
    for lane in 0..LANES {
        let (mut client, constraint) = (client.clone(), Arc::clone(&constraint));
        lanes.push(tokio::spawn(async move {
            let mut counts = vec![0u64; VOCAB.pow(LENGTH as u32)];
            for seed in (lane..n).step_by(LANES as usize) {
                let mut request = continuation_request(&PROMPT, LENGTH, sampling(seed), false);
                request.constraint = Some((*constraint).clone());
                let (tokens, _) = stream_to_end(&mut client, request).await.unwrap();
                assert_eq!(tokens.len(), LENGTH, "seed {seed}: {tokens:?}");
                counts[cell(&tokens)] += 1;
            }
            counts
        }));
    }
    let mut counts = vec![0u64; VOCAB.pow(LENGTH as u32)];
    for lane in lanes {
        for (total, c) in counts.iter_mut().zip(lane.await.unwrap()) {
            *total += c;
        }
    }
    cluster.shutdown().await;
    let model = ConstrainedTarget {
        target: EffectiveTarget { table: pair.target, params: params() },
        prompt_len: PROMPT.len(),
        allowed,
    };
    let mut expected = vec![0.0; counts.len()];
    for (seq, p) in target_sequence_law(&model, &PROMPT, LENGTH) {
        expected[cell(&seq)] = p;
    }
    let p_value = chi_square_test(&counts, &expected).unwrap().p_value;
    eprintln!("constrained law check {name}: {n} samples: χ² p-value {p_value:.4e}");
    p_value
}

fn options() -> ClusterOptions {
    ClusterOptions { gamma: GammaChoice::Fixed(2), ..ClusterOptions::default() }
}

#[tokio::test(flavor = "current_thread")]
async fn the_law_under_a_constraint_is_the_masked_target_law() {
    let p = constrained_law_p_value("host", options(), samples()).await;
    assert!(p > FALSE_FAILURE, "χ² p-value {p:.3e}");
}

/// Both nodes mask on the device path (`--distributions device`, CPU tensors here).
#[tokio::test(flavor = "current_thread")]
async fn the_law_under_a_constraint_holds_on_the_device_path() {
    let on_device = ClusterOptions { distributions: Distributions::Device, ..options() };
    let p = constrained_law_p_value("device", on_device, device_samples()).await;
    assert!(p > FALSE_FAILURE, "χ² p-value {p:.3e}");
}

/// A draft that cannot mask (an n-gram proposer has no model and no tokenizer): its copies
/// that the constraint forbids are rejected by the target's masks, and the law holds.
#[tokio::test(flavor = "current_thread")]
async fn the_law_under_a_constraint_holds_with_a_draft_that_does_not_mask() {
    let proposer =
        ProposerConfig { kind: ProposerKind::Ngram, span: MatchSpan::new(1, 2).unwrap(), ..ProposerConfig::default() };
    let ngram = ClusterOptions { proposer, ..options() };
    let p = constrained_law_p_value("ngram", ngram, device_samples()).await;
    assert!(p > FALSE_FAILURE, "χ² p-value {p:.3e}");
}

/// The check's power: a target that masks a block's every row with its first row's state.
#[tokio::test(flavor = "current_thread")]
async fn the_constrained_law_check_rejects_masks_of_the_block_s_first_state() {
    let broken = ClusterOptions { target_block_masks: BlockMasks::FirstStateEverywhere, ..options() };
    let p = constrained_law_p_value("first-state", broken, samples() / 25).await;
    assert!(p < FALSE_FAILURE, "the broken masks passed: χ² p-value {p:.3e}");
}
