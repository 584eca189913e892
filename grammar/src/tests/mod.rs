//! Tests against a real tokenizer.json: specd-text's byte-level test tokenizer (ids 0..=255 are
//! the bytes, then multi-byte pieces, then `<eos>`), so outputs mix one-byte tokens with pieces
//! that cross JSON's lexemes.

mod cache;
mod positions;
mod refusals;
mod walks;
mod widths;

use std::sync::Arc;

use specd_sampling::TokenMask;
use specd_text::test_tokenizer::byte_tokenizer;

use crate::{ConstraintSpec, ConstraintState, GrammarVocabulary};

/// Pieces that cross lexeme boundaries (`{"`, `":`, `", "`) or spell whole words of the test
/// languages, so walks take both one-byte and multi-byte steps.
const PIECES: [&[u8]; 24] = [
    b"{\"",
    b"\":",
    b"\": ",
    b"\", \"",
    b"\",\"",
    b"\"}",
    b"\"]",
    b"[\"",
    b", ",
    b"name",
    b"age",
    b"color",
    b"red",
    b"green",
    b"blue",
    b"ye",
    b"yes",
    b"yesterday",
    b"no",
    b"12",
    b"00",
    b"true",
    b"null",
    b"(1",
];

/// The test tokenizer's text, its number of ids and its EOS id.
pub(crate) struct TestTokenizer {
    pub json: String,
    pub tokenizer: Arc<tokenizers::Tokenizer>,
    pub tokens: usize,
    pub eos: u32,
}

pub(crate) fn test_tokenizer() -> TestTokenizer {
    let (tokenizer, eos) = byte_tokenizer(&PIECES);
    let json = tokenizer.to_string(false).expect("test tokenizer serializes");
    TestTokenizer { json, tokenizer, tokens: eos as usize + 1, eos }
}

/// The vocabulary of a model whose rows are as wide as the tokenizer, with its one EOS.
pub(crate) fn vocabulary() -> (Arc<GrammarVocabulary>, TestTokenizer) {
    let t = test_tokenizer();
    let vocabulary = GrammarVocabulary::new(&t.json, t.tokens, &[t.eos]).expect("vocabulary");
    (vocabulary, t)
}

/// The bytes of ids of the test tokenizer (EOS excluded).
pub(crate) fn bytes_of(ids: &[u32]) -> Vec<u8> {
    let mut bytes = Vec::new();
    for &id in ids {
        match id {
            0..=255 => bytes.push(id as u8),
            _ => bytes.extend_from_slice(PIECES[id as usize - 256]),
        }
    }
    bytes
}

/// A generator small enough to need no dependency (xorshift64*).
pub(crate) struct XorShift(u64);

impl XorShift {
    pub fn new(seed: u64) -> Self {
        Self(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1)
    }

    pub fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    pub fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
}

/// Where a walk ended.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum WalkEnd {
    /// `is_finished()` with no EOS drawn.
    Finished,
    /// An EOS id was drawn (and accepted).
    Eos,
}

/// Draws uniformly among the allowed tokens until the state is finished or EOS is drawn; the
/// text tokens drawn. Checks at every step that the mask and `advance` agree on a random id.
pub(crate) fn walk(
    state: &mut ConstraintState,
    rng: &mut XorShift,
    eos: &[u32],
    max_steps: usize,
) -> (Vec<u32>, WalkEnd) {
    let mut tokens = Vec::new();
    for _ in 0..max_steps {
        if state.is_finished() {
            return (tokens, WalkEnd::Finished);
        }
        let mask = state.allowed().expect("mask");
        let allowed: Vec<u32> = mask.allowed().collect();
        assert!(!allowed.is_empty(), "an unfinished state allows something, after {:?}", tokens);
        let probe = rng.below(mask.vocab_size()) as u32;
        assert_eq!(state.valid_prefix_len(&[probe]), usize::from(mask.allows(probe)), "token {probe} after {tokens:?}");
        let token = allowed[rng.below(allowed.len())];
        state.advance(token).expect("an allowed token is accepted");
        if eos.contains(&token) {
            assert!(state.is_finished(), "finished after EOS");
            return (tokens, WalkEnd::Eos);
        }
        tokens.push(token);
    }
    panic!("walk did not finish in {max_steps} steps: {:?}", String::from_utf8_lossy(&bytes_of(&tokens)));
}

/// Runs `walks` walks of `spec` from a fresh state each; the outputs as text, checked to be
/// UTF-8 and to decode through the tokenizer to the same text.
pub(crate) fn walk_outputs(spec: &ConstraintSpec, walks: usize, seed: u64) -> Vec<String> {
    let (vocabulary, t) = vocabulary();
    let mut rng = XorShift::new(seed);
    let fresh = vocabulary.compile(spec).expect("compiles");
    (0..walks)
        .map(|_| {
            let mut state = fresh.clone();
            let (tokens, _) = walk(&mut state, &mut rng, &[t.eos], 10_000);
            let text = String::from_utf8(bytes_of(&tokens)).expect("outputs are UTF-8");
            assert_eq!(t.tokenizer.decode(&tokens, false).expect("decodes"), text);
            text
        })
        .collect()
}

/// The mask's ids at or past `from`.
pub(crate) fn ids_from(mask: &TokenMask, from: usize) -> Vec<u32> {
    mask.allowed().filter(|&id| id as usize >= from).collect()
}

#[test]
fn shared_types_are_send_and_sync() {
    fn send<T: Send>() {}
    fn send_sync<T: Send + Sync>() {}
    send::<ConstraintState>();
    send_sync::<GrammarVocabulary>();
    send_sync::<crate::GrammarError>();
    send_sync::<ConstraintSpec>();
}
