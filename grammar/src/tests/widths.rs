//! Models whose logit rows are wider than the tokenizer (padding ids), with no EOS, or with
//! several EOS ids.

use super::{WalkEnd, XorShift, bytes_of, ids_from, test_tokenizer, walk};
use crate::{ConstraintSpec, GrammarError, GrammarVocabulary};

const PADDING: usize = 7;

#[test]
fn padding_ids_are_never_allowed_nor_accepted() {
    let t = test_tokenizer();
    let vocabulary = GrammarVocabulary::new(&t.json, t.tokens + PADDING, &[t.eos]).unwrap();
    assert_eq!(vocabulary.vocab_size(), t.tokens + PADDING);
    let mut rng = XorShift::new(11);
    for spec in [ConstraintSpec::JsonObject, ConstraintSpec::Regex(".{0,6}".into())] {
        for _ in 0..20 {
            let mut state = vocabulary.compile(&spec).unwrap();
            loop {
                let mask = state.allowed().unwrap();
                assert_eq!(mask.vocab_size(), t.tokens + PADDING);
                assert!(ids_from(&mask, t.tokens).is_empty(), "padding allowed");
                for pad in t.tokens..t.tokens + PADDING {
                    assert!(matches!(state.advance(pad as u32), Err(GrammarError::Rejected { .. })));
                }
                if state.is_finished() {
                    break;
                }
                let allowed: Vec<u32> = mask.allowed().collect();
                let token = allowed[rng.below(allowed.len())];
                state.advance(token).unwrap();
                if token == t.eos {
                    break;
                }
            }
        }
    }
    // Even a grammar that names a padding id as a token cannot allow it.
    let pad = t.tokens + 2;
    let mut state = vocabulary.compile(&ConstraintSpec::Lark(format!("start: \"a\" | <[{pad}]>\n"))).unwrap();
    let mask = state.allowed().unwrap();
    assert!(mask.allows(u32::from(b'a')) && !mask.allows(pad as u32));
    assert!(state.advance(pad as u32).is_err());
}

#[test]
fn a_model_without_eos_finishes_where_the_language_ends() {
    let t = test_tokenizer();
    let width = t.tokens + PADDING;
    let vocabulary = GrammarVocabulary::new(&t.json, width, &[]).unwrap();
    let choices = ["red", "green", "blue"];
    let spec = ConstraintSpec::Choice(choices.iter().map(|c| c.to_string()).collect());
    let mut rng = XorShift::new(12);
    let mut seen = std::collections::BTreeSet::new();
    for _ in 0..60 {
        let mut state = vocabulary.compile(&spec).unwrap();
        let (tokens, end) = walk(&mut state, &mut rng, &[], 100);
        assert_eq!(end, WalkEnd::Finished);
        let text = String::from_utf8(bytes_of(&tokens)).unwrap();
        assert!(choices.contains(&text.as_str()), "{text:?}");
        seen.insert(text);
        // Nothing may follow, and the engine's own EOS (id `width`) never shows.
        let mask = state.allowed().unwrap();
        assert_eq!((mask.count(), mask.vocab_size()), (0, width));
        assert!(matches!(state.advance(width as u32), Err(GrammarError::Rejected { .. })));
        // One token back, the output is incomplete again.
        state.rollback(1).unwrap();
        assert!(!state.is_finished());
        assert!(ids_from(&state.allowed().unwrap(), t.tokens).is_empty());
    }
    assert_eq!(seen.len(), choices.len());
    // A language that is complete but may go on (a regex `a+`): not finished, no EOS to draw.
    let mut state = vocabulary.compile(&ConstraintSpec::Regex("a{1,3}".into())).unwrap();
    state.advance(u32::from(b'a')).unwrap();
    assert!(!state.is_finished());
    assert_eq!(state.allowed().unwrap().allowed().collect::<Vec<_>>(), vec![u32::from(b'a')]);
    state.advance_all(&[u32::from(b'a'), u32::from(b'a')]).unwrap();
    assert!(state.is_finished());
}

#[test]
fn several_eos_ids_are_all_allowed_at_the_end() {
    let t = test_tokenizer();
    // A second EOS among the padding ids (a model whose end-of-turn id lies past the
    // tokenizer's ids is odd, but an EOS id is allowed wherever it lies in the rows).
    let second = (t.tokens + 3) as u32;
    let vocabulary = GrammarVocabulary::new(&t.json, t.tokens + PADDING, &[second, t.eos]).unwrap();
    assert_eq!(vocabulary.eos_token_ids(), &[t.eos, second]);
    let mut state = vocabulary.compile(&ConstraintSpec::Regex("ab?".into())).unwrap();
    assert!(!state.allowed().unwrap().allows(t.eos));
    state.advance(u32::from(b'a')).unwrap();
    let mask = state.allowed().unwrap();
    assert_eq!(mask.allowed().collect::<Vec<_>>(), vec![u32::from(b'b'), t.eos, second]);
    assert!(!state.is_finished());
    assert_eq!(state.valid_prefix_len(&[second]), 1);
    state.advance(second).unwrap();
    assert!(state.is_finished());
}

#[test]
fn unusable_vocabularies_are_refused() {
    let t = test_tokenizer();
    let refused = |json: &str, width: usize, eos: &[u32]| {
        matches!(GrammarVocabulary::new(json, width, eos), Err(GrammarError::Vocabulary(_)))
    };
    assert!(refused("{", t.tokens, &[t.eos]));
    assert!(refused(r#"{"decoder": null, "added_tokens": [], "model": {"vocab": {}}}"#, 10, &[]));
    assert!(refused(&t.json, t.tokens - 1, &[t.eos]));
    assert!(refused(&t.json, t.tokens, &[t.tokens as u32]));
    // A byte-fallback token named like a byte but not hex: llguidance panics on it.
    let bad_byte = r#"{"decoder": {"type": "Sequence", "decoders": [{"type": "ByteFallback"}]},
        "added_tokens": [], "model": {"type": "BPE", "vocab": {"<0xZZ>": 0, "a": 1}, "merges": []}}"#;
    assert!(refused(bad_byte, 2, &[]));
}

/// A word-level tokenizer without a decoder (specd's table models write one): Hugging Face
/// joins its tokens with spaces, so after a prompt each token's text is a space and its name,
/// and a constraint on the output's text reads it so.
#[test]
fn a_tokenizer_without_a_decoder_spells_each_token_after_a_space() {
    let json = serde_json::json!({
        "version": "1.0", "truncation": null, "padding": null, "added_tokens": [], "normalizer": null,
        "pre_tokenizer": {"type": "WhitespaceSplit"}, "post_processor": null, "decoder": null,
        "model": {"type": "WordLevel", "vocab": {"red": 0, "green": 1, "blue": 2}, "unk_token": "not a token"},
    });
    let vocabulary = GrammarVocabulary::new(&json.to_string(), 3, &[]).unwrap();
    let mut state = vocabulary.compile(&ConstraintSpec::Regex(" red( green| blue)".into())).unwrap();
    assert_eq!(state.allowed().unwrap().allowed().collect::<Vec<_>>(), [0]);
    state.advance(0).unwrap();
    assert_eq!(state.allowed().unwrap().allowed().collect::<Vec<_>>(), [1, 2]);
    state.advance(2).unwrap();
    assert!(state.is_finished());
    // Without the space the words do not spell the output.
    let mut unspaced = vocabulary.compile(&ConstraintSpec::Regex("red".into())).unwrap();
    assert!(matches!(unspaced.allowed(), Err(GrammarError::Invalid(_))));
}
