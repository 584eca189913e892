//! Moving along an output: rollback, checking a run of tokens without consuming it, and the
//! refusal of a token the constraint forbids.

use serde_json::json;

use super::{XorShift, vocabulary, walk};
use crate::{ConstraintSpec, GrammarError};

fn schema() -> ConstraintSpec {
    ConstraintSpec::JsonSchema(json!({
        "type": "object",
        "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
        "required": ["name", "age"]
    }))
}

/// A valid output of `spec` of at least `len` tokens (a seeded walk, retried until long enough).
fn valid_path(spec: &ConstraintSpec, len: usize) -> Vec<u32> {
    let (vocabulary, t) = vocabulary();
    let mut rng = XorShift::new(7);
    loop {
        let mut state = vocabulary.compile(spec).unwrap();
        let (tokens, _) = walk(&mut state, &mut rng, &[t.eos], 10_000);
        if tokens.len() >= len {
            return tokens;
        }
    }
}

#[test]
fn rollback_returns_to_the_masks_of_the_shorter_output() {
    let (vocabulary, _) = vocabulary();
    let spec = schema();
    let path = valid_path(&spec, 8);
    let (a, b, c) = (path[0], path[1], path[2]);

    let mut fresh = vocabulary.compile(&spec).unwrap();
    fresh.advance(a).unwrap();
    let after_a = fresh.allowed().unwrap();
    fresh.advance(b).unwrap();
    let after_ab = fresh.allowed().unwrap();

    let mut state = vocabulary.compile(&spec).unwrap();
    state.advance_all(&[a, b, c]).unwrap();
    assert_eq!(state.consumed(), 3);
    let after_abc = state.allowed().unwrap();
    state.rollback(2).unwrap();
    assert_eq!(state.consumed(), 1);
    assert_eq!(state.allowed().unwrap(), after_a);
    // And forward again along the same tokens, to the same masks.
    state.advance(b).unwrap();
    assert_eq!(state.allowed().unwrap(), after_ab);
    state.advance(c).unwrap();
    assert_eq!(state.allowed().unwrap(), after_abc);
    // A whole output and back to the start.
    let mut whole = vocabulary.compile(&spec).unwrap();
    let start = whole.allowed().unwrap();
    whole.advance_all(&path).unwrap();
    whole.rollback(path.len()).unwrap();
    assert_eq!((whole.consumed(), whole.allowed().unwrap()), (0, start));
    assert!(matches!(whole.rollback(1), Err(GrammarError::Internal(_))));
}

#[test]
fn rollback_undoes_eos_and_the_end_of_the_language() {
    let (vocabulary, t) = vocabulary();
    let mut state = vocabulary.compile(&ConstraintSpec::Choice(vec!["red".into(), "blue".into()])).unwrap();
    let red = [u32::from(b'r'), u32::from(b'e'), u32::from(b'd')];
    state.advance_all(&red[..2]).unwrap();
    let after_re = state.allowed().unwrap();
    state.advance(red[2]).unwrap();
    // "red" admits no continuation: finished, with EOS (and only EOS) allowed, and accepted.
    assert!(state.is_finished());
    assert_eq!(state.allowed().unwrap().allowed().collect::<Vec<_>>(), vec![t.eos]);
    state.advance(t.eos).unwrap();
    assert!(matches!(state.advance(u32::from(b'x')), Err(GrammarError::Rejected { .. })));
    assert_eq!(state.consumed(), 4);
    state.rollback(1).unwrap();
    assert!(state.is_finished());
    state.rollback(1).unwrap();
    assert!(!state.is_finished());
    assert_eq!(state.allowed().unwrap(), after_re);
    assert_eq!(state.consumed(), 2);
}

#[test]
fn valid_prefix_len_counts_the_accepted_run_and_changes_nothing() {
    let (vocabulary, t) = vocabulary();
    let spec = schema();
    let path = valid_path(&spec, 6);
    let mut state = vocabulary.compile(&spec).unwrap();
    state.advance(path[0]).unwrap();
    let before = state.allowed().unwrap();
    let forbidden_in =
        |mask: &specd_sampling::TokenMask| (0..mask.vocab_size() as u32).find(|&id| !mask.allows(id)).unwrap();
    let mut probe = vocabulary.compile(&spec).unwrap();
    probe.advance_all(&path[..5]).unwrap();
    let forbidden_after_5 = forbidden_in(&probe.allowed().unwrap());

    assert_eq!(state.valid_prefix_len(&path[1..]), path.len() - 1);
    let mut mixed = path[1..5].to_vec();
    mixed.push(forbidden_after_5);
    mixed.extend_from_slice(&path[5..]);
    assert_eq!(state.valid_prefix_len(&mixed), 4);
    assert_eq!(state.valid_prefix_len(&[forbidden_in(&before), path[1]]), 0);
    assert_eq!(state.valid_prefix_len(&[]), 0);
    // The whole output and then EOS: all accepted.
    let mut complete = path[1..].to_vec();
    complete.push(t.eos);
    assert_eq!(state.valid_prefix_len(&complete), complete.len());
    assert_eq!(state.consumed(), 1);
    assert_eq!(state.allowed().unwrap(), before);
}

#[test]
fn a_forbidden_token_is_rejected_and_the_state_survives() {
    let (vocabulary, t) = vocabulary();
    let mut state = vocabulary.compile(&schema()).unwrap();
    let start = state.allowed().unwrap();
    for token in [u32::from(b'x'), u32::from(b'"'), t.eos, vocabulary.vocab_size() as u32, u32::MAX] {
        assert!(!start.allows(token));
        assert_eq!(state.advance(token), Err(GrammarError::Rejected { token }));
    }
    assert!(matches!(state.advance_all(&[u32::from(b'{'), u32::from(b'}')]), Err(GrammarError::Rejected { .. })));
    // `{` went in before `}` (required fields missing) was refused.
    assert_eq!(state.consumed(), 1);
    state.advance(u32::from(b'"')).unwrap();
    assert!(!state.is_finished());
}
