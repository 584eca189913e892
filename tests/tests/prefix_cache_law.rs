//! The output law with the nodes' prefix caches on, across turns (issue #39): each sample is a
//! conversation of two turns over the whole cluster. Turn one continues a 17-token prompt
//! (one whole block and one token, so that it starts from the prefix earlier conversations
//! left) by up to 3 tokens, ending early at the stop token [`STOP`]; turn two resends the
//! prompt, turn one's output and a user token, and continues by 3 more, starting from the
//! rows turn one (or a conversation with the same output) left in both nodes' caches. Turn
//! two's 3-token law is audited with Pearson's χ² against the exact law, the mixture over turn
//! one's outputs of each one's continuation law (the tables give every history its own rows,
//! so turn two's law depends on each of turn one's tokens).
//!
//! The stop token is what puts a rejected candidate's row inside turn one's committed tokens:
//! a round at γ = 2 that rejects a candidate and draws the stop token in its place ends the
//! generation there, with the rejected row in the target's cache at the stop token's place.
//! A generation that ends by its length never has one: its last round drafts only as many
//! candidates as fit, so a rejection always leaves room for another round.
//!
//! The same check must reject a target whose cache files a rejected candidate's row under the
//! committed token that replaced it ([`specd_node::NodeFaults`]'s
//! `prefix_cache_keeps_rejected_rows`): turn two then reads a history with the rejected
//! token in that place.
//!
//! Both audits draw N / 2 conversations, twice the generations of N / 2 samples (N:
//! `SPECD_LAW_SAMPLES`, default 50 000): at 25 000 the broken store's p-value is 0 in f64
//! against the threshold 1e-3.

use std::sync::Arc;

use specd_coordinator::GammaChoice;
use specd_e2e::law_tables::{EffectiveTarget, VOCAB, cell, conversation_tables};
use specd_e2e::{Cluster, ClusterOptions, continuation_request, scratch_dir, stream_to_end};
use specd_model::PrefixCacheOptions;
use specd_proto::v1::SamplingParams as WireSampling;
use specd_sampling::SamplingParams;
use specd_sampling::chi2::chi_square_test;
use specd_sampling::law::{PrefixModel, target_sequence_law};

use crate::law_through_cluster::{FALSE_FAILURE, samples};

const LENGTH: usize = 3;
const CLIENTS: u64 = 8;
/// The user's token between the turns.
const USER: u32 = 2;
/// Turn one stops after this token.
const STOP: u32 = 0;

fn prompt() -> Vec<u32> {
    (0..17).map(|i| (i * 5 % 7 % VOCAB) as u32).collect()
}

fn conversations() -> u64 {
    samples() / 2
}

/// What one audit measured.
struct Audit {
    p_value: f64,
    /// Prompt tokens turn two found in the target's cache, over all conversations.
    target_reused: u64,
}

/// Runs `n` two-turn conversations through a cluster with `options` and audits turn two's law.
async fn audit(options: ClusterOptions, n: u64) -> Audit {
    let dir = scratch_dir(&format!("prefix-cache-law-{}", options.target_prefix_cache_keeps_rejected_rows));
    let prompt = prompt();
    let pair = conversation_tables(&prompt, USER, LENGTH);
    let files = pair.write(&dir).unwrap();
    let cluster = Cluster::start(&files.target, &files.draft, &options).await.unwrap();
    let client = cluster.client().await.unwrap();
    let prompt = Arc::new(prompt);
    let mut lanes = Vec::new();
    for c in 0..CLIENTS {
        let (mut client, prompt) = (client.clone(), Arc::clone(&prompt));
        lanes.push(tokio::spawn(async move {
            let mut counts = vec![0u64; VOCAB.pow(LENGTH as u32)];
            let mut reused = 0;
            let sampling = |seed| WireSampling { temperature: Some(1.0), seed: Some(seed), ..Default::default() };
            for conversation in (c..n).step_by(CLIENTS as usize) {
                let mut request = continuation_request(&prompt, LENGTH, sampling(2 * conversation), false);
                request.stopping.as_mut().expect("stopping criteria").stop_token_ids = vec![STOP];
                let (first, _) = stream_to_end(&mut client, request).await.unwrap();
                assert!((1..=LENGTH).contains(&first.len()), "{first:?}");
                let next = [prompt.as_slice(), &first, &[USER]].concat();
                let request = continuation_request(&next, LENGTH, sampling(2 * conversation + 1), false);
                let (second, stats) = stream_to_end(&mut client, request).await.unwrap();
                assert_eq!(second.len(), LENGTH);
                counts[cell(&second)] += 1;
                reused += u64::from(stats.target_cached_tokens);
            }
            (counts, reused)
        }));
    }
    let mut counts = vec![0u64; VOCAB.pow(LENGTH as u32)];
    let mut target_reused = 0;
    for lane in lanes {
        let (lane, reused) = lane.await.unwrap();
        target_reused += reused;
        for (total, c) in counts.iter_mut().zip(lane) {
            *total += c;
        }
    }
    cluster.shutdown().await;
    // Turn two's law: over turn one's outputs, each one's continuation law.
    let params = SamplingParams::default();
    let first_law = EffectiveTarget { table: pair.target.clone(), params }.after(prompt.len());
    let mut expected = vec![0.0; counts.len()];
    for FirstTurn { output: first, probability: weight } in first_turn_law(&first_law, &prompt) {
        let next = [prompt.as_slice(), &first, &[USER]].concat();
        let second_law = EffectiveTarget { table: pair.target.clone(), params }.after(next.len());
        for (seq, p) in target_sequence_law(&second_law, &next, LENGTH) {
            expected[cell(&seq)] += weight * p;
        }
    }
    let p_value = chi_square_test(&counts, &expected).unwrap().p_value;
    eprintln!(
        "prefix-cache law check: {n} conversations, store keeps rejected rows: {}, {target_reused} prompt tokens \
         reused by turn two on the target: χ² p-value {p_value:.4e}",
        options.target_prefix_cache_keeps_rejected_rows
    );
    Audit { p_value, target_reused }
}

/// One output of turn one (up to [`LENGTH`] tokens, ending at [`STOP`]) and its probability.
struct FirstTurn {
    output: Vec<u32>,
    probability: f64,
}

/// Every output of turn one with its probability.
fn first_turn_law(model: &dyn PrefixModel, prompt: &[u32]) -> Vec<FirstTurn> {
    let mut outputs = Vec::new();
    let mut open = vec![(Vec::new(), 1.0)];
    while let Some((output, probability)) = open.pop() {
        if output.len() == LENGTH || output.last() == Some(&STOP) {
            outputs.push(FirstTurn { output, probability });
            continue;
        }
        let next = model.target(&[prompt, &output].concat());
        for (token, &q) in next.probs().iter().enumerate().filter(|&(_, &q)| q > 0.0) {
            open.push(([output.as_slice(), &[token as u32]].concat(), probability * q));
        }
    }
    outputs
}

/// γ = 2, so that three tokens take rounds with rejections; the caches keep prefixes of one
/// block (the prompt is 17 tokens).
fn with_caches(keeps_rejected_rows: bool) -> ClusterOptions {
    ClusterOptions {
        gamma: GammaChoice::Fixed(2),
        prefix_cache: PrefixCacheOptions { enabled: true, min_tokens: 16 },
        target_prefix_cache_keeps_rejected_rows: keeps_rejected_rows,
        ..ClusterOptions::default()
    }
}

#[tokio::test(flavor = "current_thread")]
async fn law_across_turns_with_the_prefix_caches_on() {
    let n = conversations();
    let audit = audit(with_caches(false), n).await;
    // Turn two starts from at least the 17-token prompt and turn one's committed tokens but
    // the last on most conversations.
    assert!(audit.target_reused >= 17 * n, "turn two reused {} tokens in {n} conversations", audit.target_reused);
    assert!(audit.p_value > FALSE_FAILURE, "χ² p-value {}", audit.p_value);
}

#[tokio::test(flavor = "current_thread")]
async fn a_store_that_keeps_a_rejected_candidates_row_is_caught() {
    let audit = audit(with_caches(true), conversations()).await;
    assert!(audit.p_value < FALSE_FAILURE, "the broken store passed: p = {}", audit.p_value);
}
