//! Any bytes as the round protocol's messages, decoded with prost, through what each side does
//! with them. The first byte says which:
//!
//! - 0: a `ProposeResponse` (length-delimited) and a `VerifyResponse` (the rest) as the
//!   coordinator receives them: the draft's block parsed and checked as `propose.rs` does, the
//!   target's reply checked and the rule run as `round.rs` does, on both wire formats;
//! - 1: a `ProposeRequest` as the draft node takes it (γ cap, truncation): what its truncation
//!   makes of a few fixed q, sent back, the coordinator must accept;
//! - 2: a `VerifyRequest` as the target node takes it (γ cap, one support per candidate): the
//!   block's distributions from fixed logits and the sparse pieces (`score_block`), which the
//!   coordinator must then accept.
//!
//! Nothing panics; errors are fine. The nodes' model work (the history's catch-up, the forward
//! pass) needs libtorch and is left out: fixed logits stand in for the model's.

#![no_main]

use libfuzzer_sys::fuzz_target;
use prost::Message;
use specd_proto::convert::{
    dense_proposal, parse_dense_proposal, parse_dense_rows, parse_scored_block, parse_sparse_proposal,
    scored_positions, sparse_proposal,
};
use specd_proto::v1::{DenseRow, ProposeRequest, ProposeResponse, VerifyRequest, VerifyResponse};
use specd_sampling::{
    BlockOutcome, DenseCandidate, DenseDist, MAX_GAMMA, RoundKey, SamplingParams, SparseCandidate, Truncation,
    Verification, block_distributions, score_block, verify_dense, verify_sparse,
};

const VOCAB: usize = 50;
const PROMPT: &[u32] = &[1, 2, 3];

/// What the coordinator keeps of an outcome must be within the block and the vocabulary.
fn check_outcome(outcome: &BlockOutcome, gamma: usize) {
    assert!(outcome.accepted <= gamma, "{} accepted of {gamma}", outcome.accepted);
    assert_eq!(outcome.tokens.len(), outcome.accepted + 1);
    assert!(outcome.tokens.iter().all(|&t| (t as usize) < VOCAB), "emitted {:?}", outcome.tokens);
}

/// The coordinator's side of a round, given both nodes' replies.
fn coordinator_round(proposed: &ProposeResponse, reply: &VerifyResponse) {
    // The coordinator asks for at most MAX_GAMMA candidates and refuses any other count.
    let gamma = proposed.positions.len();
    if gamma > MAX_GAMMA as usize {
        return;
    }
    let key = RoundKey { seed: reply.verify_ns, round: reply.batch_size };
    let sparse: Result<Vec<_>, _> = proposed.positions.iter().map(|p| parse_sparse_proposal(p, VOCAB)).collect();
    if let Ok(parsed) = sparse {
        for (_, q) in &parsed {
            let total: f64 = q.probs().iter().sum();
            assert!(q.probs().iter().all(|p| p.is_finite() && *p >= 0.0) && total.is_finite());
            assert!(q.tokens().iter().all(|&t| (t as usize) < VOCAB));
        }
        let possible = parsed.iter().all(|(t, q)| q.prob(*t) > 0.0);
        if possible && (reply.bonus_token_id as usize) < VOCAB {
            let block: Vec<_> = parsed.iter().map(|(token, q)| SparseCandidate { token: *token, q }).collect();
            let pieces = parse_scored_block(reply);
            for verification in Verification::ALL {
                if let Ok(outcome) = verify_sparse(verification, &block, &pieces, key) {
                    check_outcome(&outcome, gamma);
                }
            }
        }
    }
    let dense: Result<Vec<_>, _> = proposed.positions.iter().map(|p| parse_dense_proposal(p, VOCAB)).collect();
    if let Ok(parsed) = dense {
        let possible = parsed.iter().all(|(t, q)| q.prob(*t) > 0.0);
        if possible && let Ok(rows) = parse_dense_rows(reply, gamma, VOCAB) {
            let block: Vec<_> = parsed.iter().map(|(token, q)| DenseCandidate { token: *token, q }).collect();
            for verification in Verification::ALL {
                if let Ok(outcome) = verify_dense(verification, &block, &rows, key) {
                    check_outcome(&outcome, gamma);
                }
            }
        }
    }
}

/// A few draft distributions: peaked, flat, one-hot, and one with tiny tails.
fn draft_qs() -> Vec<DenseDist> {
    let peaked = DenseDist::from_weights((0..VOCAB).map(|i| 0.5f64.powi(i as i32)).collect());
    let flat = DenseDist::from_weights(vec![1.0; VOCAB]);
    let one_hot = DenseDist::one_hot(VOCAB, 7);
    let tails = DenseDist::from_weights((0..VOCAB).map(|i| if i == 3 { 1.0 } else { 1e-300 }).collect());
    [peaked, flat, one_hot, tails].into_iter().map(|q| q.expect("a valid fixed q")).collect()
}

/// The draft node's side of a Propose: what it would send, the coordinator must accept.
fn draft_side(request: &ProposeRequest) {
    if request.gamma > MAX_GAMMA {
        return;
    }
    let u = f64::from(request.round) / (f64::from(u32::MAX) + 1.0);
    for q in draft_qs() {
        let (token, sent) = if request.dense {
            let token = q.sample(u);
            (token, dense_proposal(token, &q))
        } else {
            let Some(wire) = request.truncation else { return };
            let Ok(truncation) = Truncation::try_from(&wire) else { return };
            let q = q.truncate(truncation);
            let token = q.sample(u);
            (token, sparse_proposal(token, &q))
        };
        let accepted = if request.dense {
            parse_dense_proposal(&sent, VOCAB).map(|(t, q)| (t, q.prob(t)))
        } else {
            parse_sparse_proposal(&sent, VOCAB).map(|(t, q)| (t, q.prob(t)))
        };
        match accepted {
            Ok((t, prob)) => assert!(t == token && prob > 0.0, "token {token} sent with q {prob}"),
            Err(err) => {
                panic!("the coordinator refuses what the draft sends ({wire:?}): {err}", wire = request.truncation)
            }
        }
    }
}

/// Fixed logits standing in for the target model's rows.
fn logits(rows: usize) -> Vec<Vec<f32>> {
    (0..rows).map(|r| (0..VOCAB).map(|i| ((i * 7 + r * 3) % 13) as f32 / 3.0 - 2.0).collect()).collect()
}

/// The target node's side of a Verify: what it would reply, the coordinator must accept.
fn target_side(request: &VerifyRequest) {
    let gamma = request.candidate_token_ids.len();
    if gamma > MAX_GAMMA as usize || (!request.dense && request.supports.len() != gamma) {
        return;
    }
    let params = SamplingParams { temperature: 0.8, top_p: 0.95, repetition_penalty: 1.1, ..Default::default() };
    let logits = logits(gamma + 1);
    let rows: Vec<&[f32]> = logits.iter().map(Vec::as_slice).collect();
    let history = &request.pending_token_ids;
    let Ok(p) = block_distributions(&rows, &params, PROMPT, history, &request.candidate_token_ids, 1) else { return };
    assert_eq!(p.len(), gamma + 1);
    if request.dense {
        let reply = VerifyResponse {
            dense_p: p.iter().map(|p| DenseRow { probs: p.probs().to_vec() }).collect(),
            ..Default::default()
        };
        if let Err(err) = parse_dense_rows(&reply, gamma, VOCAB) {
            panic!("the coordinator refuses the target's dense rows: {err}");
        }
        return;
    }
    let supports: Vec<&[u32]> = request.supports.iter().map(|s| s.token_ids.as_slice()).collect();
    let key = RoundKey { seed: u64::from(request.rollback_to), round: request.round };
    let Ok(block) = score_block(&p, &supports, key, 1) else { return };
    assert_eq!(block.positions.len(), gamma);
    assert!((block.bonus as usize) < VOCAB);
    for (position, support) in block.positions.iter().zip(&supports) {
        assert_eq!(position.p_on_support.len(), support.len());
        assert!(position.complement_mass.is_finite() && position.complement_mass >= 0.0);
        assert!(position.complement_sample.is_none_or(|c| (c as usize) < VOCAB && !support.contains(&c)));
    }
    let reply =
        VerifyResponse { positions: scored_positions(&block), bonus_token_id: block.bonus, ..Default::default() };
    assert_eq!(parse_scored_block(&reply), block);
}

fuzz_target!(|bytes: &[u8]| {
    let Some((&which, mut rest)) = bytes.split_first() else { return };
    match which % 3 {
        0 => {
            let Ok(proposed) = ProposeResponse::decode_length_delimited(&mut rest) else { return };
            if let Ok(reply) = VerifyResponse::decode(rest) {
                coordinator_round(&proposed, &reply);
            }
        }
        1 => {
            if let Ok(request) = ProposeRequest::decode(rest) {
                draft_side(&request);
            }
        }
        _ => {
            if let Ok(request) = VerifyRequest::decode(rest) {
                target_side(&request);
            }
        }
    }
});
