//! Incremental detokenization equals a whole decode for random token streams: of the model
//! fixtures' tokenizer, of a byte-level tokenizer whose ids split CJK and emoji characters,
//! and of a Llama-2-like Metaspace tokenizer with byte fallback, where it is also compared
//! with transformers' decode of prompt + output (the first generated token keeps its space).

mod common;

use std::sync::Arc;

use common::Rng;
use specd_text::{IncrementalDetokenizer, Tokenizer};

/// A generation: prompt ids and output ids.
#[derive(Clone, Debug, serde::Serialize)]
struct Stream {
    prompt: Vec<u32>,
    output: Vec<u32>,
}

fn decode(t: &Tokenizer, ids: &[u32]) -> String {
    t.decode(ids, true).unwrap()
}

/// The concatenation of every push and the finish.
fn incremental(t: &Arc<Tokenizer>, s: &Stream) -> String {
    let mut d = IncrementalDetokenizer::new(t.clone(), &s.prompt);
    let mut text: String = s.output.iter().map(|&id| d.push(id).unwrap()).collect();
    text.push_str(&d.finish().unwrap());
    text
}

/// `decode(prompt + output)[len(decode(prompt))..]` when it is well defined: every decode of
/// prompt + output[..k] is a prefix of the next once a trailing incomplete character
/// (U+FFFD) is set aside, and decode(prompt) is a prefix of the whole.
fn expected(t: &Tokenizer, s: &Stream) -> Option<String> {
    let all: Vec<u32> = s.prompt.iter().chain(&s.output).copied().collect();
    let mut before = decode(t, &s.prompt);
    let prompt_text = before.clone();
    for k in s.prompt.len() + 1..=all.len() {
        let now = decode(t, &all[..k]);
        if !now.starts_with(before.trim_end_matches('\u{FFFD}')) {
            return None;
        }
        before = now;
    }
    before.strip_prefix(prompt_text.as_str()).map(str::to_owned)
}

fn random_ids(rng: &mut Rng, vocab: usize, len: usize) -> Vec<u32> {
    (0..len).map(|_| rng.below(vocab) as u32).collect()
}

/// Random ids over the whole vocabulary (special tokens included); returns how many streams
/// were well defined and compared.
fn check_random_streams(name: &str, seed: u64, streams: usize) -> usize {
    let t = common::tokenizer(name);
    let vocab = t.get_vocab_size(true);
    let mut rng = Rng::new(seed);
    let mut compared = 0;
    for _ in 0..streams {
        let prompt_len = rng.below(12);
        let output_len = 1 + rng.below(40);
        let s =
            Stream { prompt: random_ids(&mut rng, vocab, prompt_len), output: random_ids(&mut rng, vocab, output_len) };
        if let Some(want) = expected(&t, &s) {
            assert_eq!(incremental(&t, &s), want, "{name}: {s:?}");
            compared += 1;
        }
    }
    compared
}

#[test]
fn byte_level_streams_that_split_characters_equal_a_whole_decode() {
    let t = common::tokenizer("byte_level");
    // The streams do split characters: some single ids decode to an incomplete character.
    let splitting = (0..t.get_vocab_size(true) as u32).filter(|&id| decode(&t, &[id]).contains('\u{FFFD}')).count();
    assert!(splitting > 50, "only {splitting} ids hold part of a character");
    let compared = check_random_streams("byte_level", 7, 300);
    assert!(compared >= 270, "only {compared} of 300 streams were well defined");
}

#[test]
fn fixture_tokenizer_streams_equal_a_whole_decode() {
    let compared = check_random_streams("fixture_bpe", 11, 300);
    assert_eq!(compared, 300, "an ASCII byte-level vocabulary is always well defined");
}

/// Metaspace streams are built from encodings of words (byte fallback for characters not in
/// the vocabulary), random ordinary ids and eos, so the bytes are valid UTF-8 and the stream
/// is well defined; prompts are empty, only `<s>`, or encoded text with `<s>`.
fn metaspace_streams(t: &Tokenizer, rng: &mut Rng, count: usize) -> Vec<Stream> {
    const WORDS: [&str; 12] =
        ["hello", "world", "the", "quick", "fox", "😀", "é", "日本", " spaced", "x\n", "ück", "lazy dog"];
    let vocab = t.get_vocab_size(true);
    let encode = |text: &str, special: bool| t.encode(text, special).unwrap().get_ids().to_vec();
    (0..count)
        .map(|i| {
            let prompt = match i % 4 {
                0 => Vec::new(),
                1 => vec![1],
                _ => encode(
                    &(0..1 + rng.below(4)).map(|_| WORDS[rng.below(WORDS.len())]).collect::<Vec<_>>().join(" "),
                    true,
                ),
            };
            let mut output = Vec::new();
            for _ in 0..1 + rng.below(10) {
                match rng.below(6) {
                    0 => output.push(259 + rng.below(vocab - 259) as u32),
                    1 => output.push(2),
                    _ => output.extend(encode(WORDS[rng.below(WORDS.len())], false)),
                }
            }
            Stream { prompt, output }
        })
        .collect()
}

#[test]
fn metaspace_streams_equal_transformers_decode_and_keep_the_first_space() {
    let t = common::tokenizer("metaspace");
    let mut rng = Rng::new(3);
    let streams = metaspace_streams(&t, &mut rng, 200);
    // transformers decodes prompt and prompt + output of every stream in one call.
    let sequences: Vec<Vec<u32>> =
        streams.iter().flat_map(|s| [s.prompt.clone(), s.prompt.iter().chain(&s.output).copied().collect()]).collect();
    let job = serde_json::json!({"tokenizer": common::tokenizer_path("metaspace"), "sequences": sequences});
    let reference: Vec<String> = common::reference("decode", &job);
    let mut naive_differs = 0;
    for (s, pair) in streams.iter().zip(reference.chunks(2)) {
        let want = pair[1].strip_prefix(pair[0].as_str()).unwrap_or_else(|| panic!("prompt text not a prefix: {s:?}"));
        // (A byte-fallback run is read as UTF-8 as a whole, so intermediate decodes are not
        // always prefixes of the next ("日" then "日\u{FFFD}\u{FFFD}..." then "日本"); the
        // final text is still exact.)
        let all: Vec<u32> = s.prompt.iter().chain(&s.output).copied().collect();
        assert_eq!(decode(&t, &all), pair[1], "the tokenizers crate and transformers disagree: {s:?}");
        assert_eq!(incremental(&t, s), want, "{s:?}");
        // Decoding the output alone (what a per-output decode does) drops the first space.
        naive_differs += usize::from(decode(&t, &s.output) != want);
    }
    assert!(naive_differs >= 50, "only {naive_differs} streams would catch a detokenizer that drops the first space");
}
