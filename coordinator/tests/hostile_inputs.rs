//! Hostile input, generated at random: whatever a client sends or a node answers, the
//! coordinator's validation and the rule return a value or an error, never panic, and what
//! they accept is within bounds. (proptest, 2 000 cases per target, in every `cargo test`; the
//! cargo-fuzz targets in fuzz/ search the same inputs, and the wire bytes, much longer.)

use proptest::prelude::*;
use specd_coordinator::nodes::ModelFacts;
use specd_coordinator::request::{Defaults, GammaChoice, RuleVariant, validate};
use specd_proto::convert::{parse_scored_block, parse_sparse_proposal};
use specd_proto::v1::{
    GenerateRequest, ProposedPosition, SamplingParams, ScoredPosition, Speculation, StoppingCriteria, VerifyResponse,
};
use specd_sampling::{MAX_GAMMA, RoundKey, SparseCandidate, Truncation, Verification, verify_sparse};

const VOCAB: usize = 50;
const CONTEXT: usize = 64;

fn facts() -> ModelFacts {
    ModelFacts {
        vocab_size: VOCAB,
        context_length: CONTEXT,
        eos_token_ids: vec![0],
        tokenizer_fingerprint: "f".into(),
        target_model: "t".into(),
        draft_model: Some("d".into()),
        text: None,
        has_tokenizer: false,
        constraints: Err("no tokenizer".into()),
    }
}

/// Any f64, NaN and infinities included, and often the edges that matter.
fn float() -> impl Strategy<Value = f64> {
    prop_oneof![any::<f64>(), Just(0.0), Just(1.0), Just(-0.0), Just(f64::NAN), Just(f64::INFINITY), 0.0..2.0f64]
}

fn token() -> impl Strategy<Value = u32> {
    prop_oneof![0..(VOCAB as u32 * 2), any::<u32>()]
}

prop_compose! {
    fn sampling()(
        temperature in proptest::option::of(float()), top_k in proptest::option::of(any::<i32>()),
        top_p in proptest::option::of(float()), min_p in proptest::option::of(float()),
        repetition_penalty in proptest::option::of(float()), presence_penalty in proptest::option::of(float()),
        frequency_penalty in proptest::option::of(float()), seed in proptest::option::of(any::<u64>()),
    ) -> SamplingParams {
        SamplingParams { temperature, top_k, top_p, min_p, repetition_penalty, presence_penalty, frequency_penalty, seed }
    }
}

prop_compose! {
    fn request()(
        sampling in proptest::option::of(sampling()),
        max_new_tokens in proptest::option::of(prop_oneof![0..100u32, any::<u32>()]),
        stop_strings in proptest::collection::vec(".{0,4}", 0..3),
        stop_token_ids in proptest::collection::vec(token(), 0..3),
        ignore_eos in any::<bool>(),
        gamma in proptest::option::of(prop_oneof![0..40u32, any::<u32>()]),
        dense in any::<bool>(),
    ) -> GenerateRequest {
        GenerateRequest {
            sampling,
            stopping: Some(StoppingCriteria { max_new_tokens, stop_strings, stop_token_ids, ignore_eos }),
            speculation: Some(Speculation { gamma, dense }),
            ..Default::default()
        }
    }
}

prop_compose! {
    fn proposed()(token_id in token(), n in 0..6usize)(
        token_id in Just(token_id),
        support in proptest::collection::vec(token(), n..=n + 1),
        q in proptest::collection::vec(float(), n..=n + 1),
    ) -> ProposedPosition {
        ProposedPosition { token_id, support, q, dense_q: Vec::new(), ..Default::default() }
    }
}

prop_compose! {
    /// A well-formed proposal (distinct in-vocabulary support, q summing to 1), so that the
    /// rule itself gets hostile target replies, not only parse errors.
    fn well_formed()(support in proptest::sample::subsequence((0..VOCAB as u32).collect::<Vec<_>>(), 1..6))(
        weights in proptest::collection::vec(0.01..1.0f64, support.len()),
        pick in 0..support.len(),
        support in Just(support),
    ) -> ProposedPosition {
        let total: f64 = weights.iter().sum();
        ProposedPosition { token_id: support[pick], q: weights.iter().map(|w| w / total).collect(), support, dense_q: Vec::new(), ..Default::default() }
    }
}

prop_compose! {
    fn scored()(
        p_on_support in proptest::collection::vec(prop_oneof![float(), 0.0..0.3f64, 0.0..0.3f64], 0..7),
        complement_mass in prop_oneof![float(), 0.0..1.0f64],
        complement_sample in proptest::option::of(token()),
    ) -> ScoredPosition {
        ScoredPosition { p_on_support, complement_mass, complement_sample }
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2000))]

    #[test]
    fn validation_refuses_or_accepts_within_bounds(
        request in request(),
        prompt in proptest::collection::vec(token(), 0..80),
    ) {
        let defaults = Defaults {
            gamma: GammaChoice::Adaptive { max: 8 },
            max_new_tokens: 16,
            truncation: Truncation::new(1e-4, 8).unwrap(),
            rule: RuleVariant::Exact,
            verification: Verification::Block,
            optimistic: true,
            tree: Default::default(),
            generation_config: true,
        };
        if let Ok(spec) = validate(&request, prompt.clone(), &facts(), &defaults, || 7) {
            prop_assert!(!prompt.is_empty() && prompt.iter().all(|t| (*t as usize) < VOCAB));
            prop_assert!(spec.max_new_tokens >= 1 && prompt.len() + spec.max_new_tokens <= CONTEXT);
            prop_assert!(spec.gamma.max() <= MAX_GAMMA);
            let p = spec.params;
            prop_assert!(p.temperature.is_finite() && p.temperature >= 0.0);
            prop_assert!(p.top_p > 0.0 && p.top_p <= 1.0);
            prop_assert!(p.min_p.is_finite() && (0.0..=1.0).contains(&p.min_p));
            prop_assert!(p.repetition_penalty.is_finite() && p.repetition_penalty > 0.0);
        }
    }

    #[test]
    fn the_rule_survives_any_node_reply(
        positions in proptest::collection::vec(prop_oneof![proposed(), well_formed(), well_formed()], 0..5),
        scored in proptest::collection::vec(scored(), 0..6),
        bonus in token(),
        seed in any::<u64>(),
        round in any::<u32>(),
    ) {
        // What the coordinator does with a Propose reply and a Verify reply (coordinator/src/session/round.rs).
        let parsed: Result<Vec<_>, _> = positions.iter().map(|p| parse_sparse_proposal(p, VOCAB)).collect();
        let Ok(parsed) = parsed else { return Ok(()) };
        for (_, q) in &parsed {
            let total: f64 = q.probs().iter().sum();
            prop_assert!(q.probs().iter().all(|p| p.is_finite() && *p >= 0.0) && total.is_finite());
        }
        let reply = VerifyResponse { positions: scored, bonus_token_id: bonus, batch_size: 1, ..Default::default() };
        let block: Vec<_> = parsed.iter().map(|(token, q)| SparseCandidate { token: *token, q }).collect();
        let pieces = parse_scored_block(&reply);
        for verification in Verification::ALL {
            if let Ok(outcome) = verify_sparse(verification, &block, &pieces, RoundKey { seed, round }) {
                prop_assert!(outcome.accepted <= block.len());
                prop_assert_eq!(outcome.tokens.len(), outcome.accepted + 1);
                // Neither rule commits a candidate the target gives no probability.
                for (candidate, scored) in block.iter().zip(&pieces.positions).take(outcome.accepted) {
                    let j = candidate.q.tokens().iter().position(|&t| t == candidate.token).unwrap();
                    prop_assert!(scored.p_on_support[j] > 0.0, "{verification} committed a token of p = 0");
                }
            }
        }
    }
}
