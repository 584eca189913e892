//! A byte-level tokenizer built in Rust for unit tests: ids 0..=255 are single bytes, ids from
//! 256 are the given byte strings, and the last id is a special `<eos>`. Any byte string is a
//! token stream, so tests choose exactly where characters and stop strings are split.

use std::str::FromStr;
use std::sync::Arc;

use tokenizers::Tokenizer;

/// GPT-2's byte-to-character map used by byte-level tokenizers.
fn byte_char(b: u8) -> char {
    let printable = |b: u8| (b'!'..=b'~').contains(&b) || (0xA1..=0xAC).contains(&b) || (0xAE..=0xFF).contains(&b);
    if printable(b) {
        return char::from(b);
    }
    let shifted = (0..b).filter(|&x| !printable(x)).count() as u32;
    char::from_u32(256 + shifted).expect("valid char")
}

fn token_string(bytes: &[u8]) -> String {
    bytes.iter().map(|&b| byte_char(b)).collect()
}

/// The tokenizer and the id of `<eos>`.
pub fn byte_tokenizer(pieces: &[&[u8]]) -> (Arc<Tokenizer>, u32) {
    let mut vocab = serde_json::Map::new();
    for b in 0..=255u8 {
        vocab.insert(token_string(&[b]), u32::from(b).into());
    }
    for (i, piece) in pieces.iter().enumerate() {
        assert!(piece.len() > 1, "single bytes already have their ids");
        vocab.insert(token_string(piece), (256 + i as u32).into());
    }
    let eos = 256 + pieces.len() as u32;
    let spec = serde_json::json!({
        "version": "1.0",
        "truncation": null,
        "padding": null,
        "added_tokens": [{"id": eos, "content": "<eos>", "single_word": false, "lstrip": false,
                          "rstrip": false, "normalized": false, "special": true}],
        "normalizer": null,
        "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true, "use_regex": true},
        "post_processor": null,
        "decoder": {"type": "ByteLevel", "add_prefix_space": true, "trim_offsets": true, "use_regex": true},
        "model": {"type": "BPE", "dropout": null, "unk_token": null, "continuing_subword_prefix": null,
                  "end_of_word_suffix": null, "fuse_unk": false, "byte_fallback": false,
                  "ignore_merges": false, "vocab": vocab, "merges": []}
    });
    let tokenizer = Tokenizer::from_str(&spec.to_string()).expect("test tokenizer");
    (Arc::new(tokenizer), eos)
}

/// The ids of `bytes`, one per byte.
pub fn byte_ids(bytes: &[u8]) -> Vec<u32> {
    bytes.iter().map(|&b| u32::from(b)).collect()
}

#[test]
fn ids_decode_to_their_bytes() {
    let (t, eos) = byte_tokenizer(&[b"hello", " wörld".as_bytes()]);
    let mut ids = byte_ids("é€ ".as_bytes());
    ids.extend([256, eos, 257]);
    assert_eq!(t.decode(&ids, true).unwrap(), "é€ hello wörld");
    assert_eq!(t.decode(&byte_ids(&[0xE2, 0x82]), true).unwrap(), "\u{FFFD}");
}
