//! What a constraint costs per generated token at a Llama-3-sized vocabulary (V = 128 256): the
//! mask (`allowed`) and the step (`advance`) along one fixed valid output of a JSON schema.
//!
//! The vocabulary is synthetic and byte-level: the 256 bytes, common JSON pieces, then random
//! printable ASCII strings of 2 to 10 bytes, then `<eos>`. With `SPECD_MASK_VOCAB=FILE` it is
//! that tokenizer.json instead, whose last id is EOS: `scripts/tekken_tokenizer.py` writes a
//! real one of this size from PyPI (mistral-common's tekken vocabulary). Random strings put
//! quotes and backslashes inside far more tokens than a real vocabulary does, so the two
//! differ in what llguidance's slices of the vocabulary save (BENCHMARKS.md). The output is a seeded random walk
//! among each position's allowed tokens, found before timing. Three figures:
//! - `compile`: compiling the schema (once per request);
//! - `walk_cold`: compiling plus following the whole output, as one request does (the lexer's
//!   automaton starts empty and fills as the output goes);
//! - `walk_warm`: following the output from a clone of a state whose lexer has already seen it
//!   (clones share the lexer's cache): the steady per-token cost;
//! - `advance_only_warm`: the same without the masks, what checking drawn tokens costs.
//!
//! Throughput is tokens of the output, so criterion's time per element is the cost per token.

use std::collections::HashSet;
use std::hint::black_box;
use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use serde_json::json;
use specd_grammar::{ConstraintSpec, ConstraintState, GrammarVocabulary};
use specd_text::test_tokenizer::byte_tokenizer;

const VOCAB: usize = 128_256;
const JSON_PIECES: [&str; 16] = [
    "{\"", "\":", "\": ", "\", \"", "\",\"", "\"}", "\"]", "[\"", ", ", "},", "true", "false", "null", "\n", "  ",
    "\": \"",
];

struct XorShift(u64);

impl XorShift {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
}

/// The synthetic tokenizer.json and its EOS id (the last of `VOCAB` ids).
fn tokenizer_json() -> (String, u32) {
    let mut rng = XorShift(0x5EED_1234_ABCD_0001);
    let mut seen: HashSet<Vec<u8>> = HashSet::new();
    let mut pieces: Vec<Vec<u8>> = Vec::new();
    for piece in JSON_PIECES.iter().filter(|p| p.len() > 1) {
        if seen.insert(piece.as_bytes().to_vec()) {
            pieces.push(piece.as_bytes().to_vec());
        }
    }
    while pieces.len() < VOCAB - 256 - 1 {
        let len = 2 + rng.below(9);
        let piece: Vec<u8> = (0..len).map(|_| b' ' + rng.below(95) as u8).collect();
        if seen.insert(piece.clone()) {
            pieces.push(piece);
        }
    }
    let refs: Vec<&[u8]> = pieces.iter().map(Vec::as_slice).collect();
    let (tokenizer, eos) = byte_tokenizer(&refs);
    assert_eq!(eos as usize, VOCAB - 1);
    (tokenizer.to_string(false).expect("serializes"), eos)
}

fn schema() -> ConstraintSpec {
    ConstraintSpec::JsonSchema(json!({
        "type": "object",
        "properties": {
            "id": {"type": "integer"},
            "name": {"type": "string", "maxLength": 40},
            "email": {"type": "string", "format": "email"},
            "active": {"type": "boolean"},
            "score": {"type": "number"},
            "tags": {"type": "array", "items": {"type": "string", "maxLength": 12}, "maxItems": 5},
            "role": {"enum": ["admin", "user", "guest"]}
        },
        "required": ["id", "name", "active", "role"],
        "additionalProperties": false
    }))
}

/// A valid output: uniform draws among the allowed tokens until the language ends or EOS,
/// the first walk of at least 64 tokens (EOS excluded).
fn valid_path(vocabulary: &Arc<GrammarVocabulary>, eos: u32) -> Vec<u32> {
    let mut rng = XorShift(0xC0FF_EE00_0000_0042);
    loop {
        let mut state = vocabulary.compile(&schema()).expect("compiles");
        let mut path = Vec::new();
        while !state.is_finished() && path.len() < 4096 {
            let allowed: Vec<u32> = state.allowed().expect("mask").allowed().collect();
            let token = allowed[rng.below(allowed.len())];
            state.advance(token).expect("allowed");
            if token == eos {
                break;
            }
            path.push(token);
        }
        if path.len() >= 64 {
            return path;
        }
    }
}

/// A JSON instance of [`schema`] such as a model writes, in the layout the constraint asks for
/// when the schema names none (one line, `", "` and `": "`).
const NATURAL: &str = r#"{"id": 4172, "name": "Ada Lovelace", "email": "ada@example.com", "active": true, "score": 97.5, "tags": ["math", "poetry", "engines"], "role": "admin"}"#;

/// [`NATURAL`] as tokens: at each position the allowed token that spells the longest prefix of
/// what is left (a tokenizer's own split may differ; the masks at the positions are what
/// matter), then EOS.
fn natural_path(vocabulary: &Arc<GrammarVocabulary>, json: &str, eos: u32) -> Vec<u32> {
    let tokenizer = tokenizers::Tokenizer::from_str(json).expect("tokenizer");
    let spelled: Vec<Vec<u8>> = (0..VOCAB as u32)
        .map(|id| if id == eos { Vec::new() } else { tokenizer.decode(&[id], false).unwrap_or_default().into_bytes() })
        .collect();
    let mut state = vocabulary.compile(&schema()).expect("compiles");
    let (mut rest, mut path) = (NATURAL.as_bytes(), Vec::new());
    while !rest.is_empty() {
        let token = state
            .allowed()
            .expect("mask")
            .allowed()
            .filter(|&id| !spelled[id as usize].is_empty() && rest.starts_with(&spelled[id as usize]))
            .max_by_key(|&id| spelled[id as usize].len())
            .unwrap_or_else(|| panic!("no allowed token spells the start of {:?}", String::from_utf8_lossy(rest)));
        state.advance(token).expect("allowed");
        rest = &rest[spelled[token as usize].len()..];
        path.push(token);
    }
    assert!(state.is_finished(), "the instance is complete");
    path
}

fn follow(state: &mut ConstraintState, path: &[u32]) -> usize {
    let mut allowed = 0;
    for &token in path {
        allowed += state.allowed().expect("mask").count();
        state.advance(token).expect("valid path");
    }
    allowed
}

/// `SPECD_MASK_VOCAB`'s tokenizer.json and its last id, or the synthetic one.
fn vocabulary_json() -> (String, u32, &'static str) {
    match std::env::var("SPECD_MASK_VOCAB") {
        Ok(path) => {
            let json = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("SPECD_MASK_VOCAB={path}: {e}"));
            (json, VOCAB as u32 - 1, "file")
        }
        Err(_) => {
            let (json, eos) = tokenizer_json();
            (json, eos, "synthetic")
        }
    }
}

fn mask(c: &mut Criterion) {
    let (json, eos, source) = vocabulary_json();
    let vocabulary = GrammarVocabulary::new(&json, VOCAB, &[eos]).expect("vocabulary");
    let spec = schema();
    let mut group = c.benchmark_group(format!("json_schema_v128256_{source}"));
    group.sample_size(10).warm_up_time(Duration::from_secs(1)).measurement_time(Duration::from_secs(5));
    group.bench_function("compile", |b| b.iter(|| vocabulary.compile(black_box(&spec)).expect("compiles")));
    for (name, path) in [("random", valid_path(&vocabulary, eos)), ("natural", natural_path(&vocabulary, &json, eos))] {
        eprintln!("{name} path: {} tokens", path.len());
        let warm = vocabulary.compile(&spec).expect("compiles");
        follow(&mut warm.clone(), &path);
        group.throughput(Throughput::Elements(path.len() as u64));
        group.bench_function(format!("{name}_walk_cold"), |b| {
            b.iter(|| follow(&mut vocabulary.compile(black_box(&spec)).expect("compiles"), &path));
        });
        group.bench_function(format!("{name}_walk_warm"), |b| b.iter(|| follow(&mut warm.clone(), black_box(&path))));
        group.bench_function(format!("{name}_advance_only_warm"), |b| {
            b.iter(|| warm.clone().advance_all(black_box(&path)).expect("valid path"));
        });
    }
    group.finish();
}

criterion_group!(benches, mask);
criterion_main!(benches);
