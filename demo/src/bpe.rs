//! A byte-level BPE tokenizer trained on the corpus (the GPT-2 scheme: every byte is a
//! token, merges learned from pair counts), written as `tokenizer.json`.

use std::path::Path;

use tokenizers::models::TrainerWrapper;
use tokenizers::models::bpe::{BPE, BpeTrainerBuilder};
use tokenizers::pre_tokenizers::byte_level::ByteLevel;
use tokenizers::{AddedToken, Tokenizer};

use crate::corpus::Document;
use crate::error::{DemoError, Result};
use crate::spec::{END_OF_TEXT, END_OF_TEXT_STR};

/// Trains a tokenizer of `vocab_size` ids on `docs` and saves it to `path`.
pub fn train(docs: &[Document], vocab_size: usize, path: &Path) -> Result<Tokenizer> {
    let fail = |message: String| DemoError::Tokenizer { path: path.to_owned(), message };
    // No prefix space: code is mostly at line starts, and a prompt must encode as written.
    let byte_level = ByteLevel::new(false, true, true);
    let mut tokenizer = Tokenizer::new(BPE::default());
    tokenizer.with_pre_tokenizer(Some(byte_level));
    tokenizer.with_decoder(Some(byte_level));
    let mut trainer: TrainerWrapper = BpeTrainerBuilder::new()
        .vocab_size(vocab_size)
        .min_frequency(2)
        .show_progress(false)
        .special_tokens(vec![AddedToken::from(END_OF_TEXT_STR, true)])
        .initial_alphabet(ByteLevel::alphabet().into_iter().collect())
        .build()
        .into();
    tokenizer.train(&mut trainer, docs.iter().map(|d| d.text.as_str())).map_err(|e| fail(e.to_string()))?;
    if tokenizer.token_to_id(END_OF_TEXT_STR) != Some(END_OF_TEXT) {
        return Err(fail(format!("{END_OF_TEXT_STR} did not get id {END_OF_TEXT}")));
    }
    tokenizer.save(path, false).map_err(|e| fail(e.to_string()))?;
    Ok(tokenizer)
}

/// Every document's ids, each followed by `<|endoftext|>`, as one stream.
pub fn encode_stream(tokenizer: &Tokenizer, docs: &[Document]) -> Result<Vec<u32>> {
    let texts: Vec<&str> = docs.iter().map(|d| d.text.as_str()).collect();
    let encodings = tokenizer
        .encode_batch(texts, false)
        .map_err(|e| DemoError::Tokenizer { path: "tokenizer.json".into(), message: e.to_string() })?;
    let mut stream = Vec::new();
    for e in encodings {
        stream.extend_from_slice(e.get_ids());
        stream.push(END_OF_TEXT);
    }
    Ok(stream)
}
