//! [`GrammarVocabulary`]: one model's vocabulary as the grammar engine sees it (every id's
//! bytes in a token trie, its EOS ids, the width of its logit rows), and the compiler of
//! constraints against it.

use std::fmt;
use std::panic::AssertUnwindSafe;
use std::str::FromStr;
use std::sync::{Arc, Mutex};

use llguidance::api::ParserLimits;
use llguidance::toktrie::{TokEnv, TokRxInfo, TokTrie};
use llguidance::{Matcher, ParserFactory, panic_utils};
use tokenizers::Tokenizer;

use crate::compiled::CompiledCache;
use crate::error::GrammarError;
use crate::limits::request_limits;
use crate::model_tokens::ModelTokens;
use crate::spec::ConstraintSpec;
use crate::state::ConstraintState;
use crate::tokenizer_env::ModelTokenizerEnv;

/// Shared by every session of one model (behind an [`Arc`]).
pub struct GrammarVocabulary {
    factory: ParserFactory,
    compiled: Mutex<CompiledCache>,
    tokens: Arc<ModelTokens>,
}

impl fmt::Debug for GrammarVocabulary {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("GrammarVocabulary")
            .field("vocab_size", &self.tokens.vocab_size)
            .field("tokenizer_vocab", &self.tokens.tokenizer_vocab)
            .field("eos_token_ids", &self.tokens.eos_token_ids)
            .finish_non_exhaustive()
    }
}

/// The bytes of each token of a tokenizer without a decoder, whose text Hugging Face's
/// `tokenizers` decodes by joining the tokens with spaces: after a prompt each token adds a
/// space and itself, so those are its bytes (a word-level vocabulary, as specd's table models
/// write). `None` when the tokenizer has a decoder, or no vocabulary map to read.
fn spaced_words(json: &serde_json::Value) -> Option<Vec<Vec<u8>>> {
    if !json.get("decoder").is_some_and(serde_json::Value::is_null) {
        return None;
    }
    let vocab = json.get("model")?.get("vocab")?.as_object()?;
    let added = json.get("added_tokens").and_then(serde_json::Value::as_array);
    let named =
        vocab.iter().map(|(name, id)| (name.as_str(), id.as_u64())).chain(added.into_iter().flatten().map(|token| {
            (
                token.get("content").and_then(|c| c.as_str()).unwrap_or(""),
                token.get("id").and_then(serde_json::Value::as_u64),
            )
        }));
    let mut words: Vec<Vec<u8>> = Vec::new();
    for (name, id) in named {
        let id = usize::try_from(id?).ok()?;
        if words.len() <= id {
            words.resize(id + 1, Vec::new());
        }
        words[id] = [b" ", name.as_bytes()].concat();
    }
    Some(words)
}

impl GrammarVocabulary {
    /// `tokenizer_json`: the text of the model's tokenizer.json. `vocab_size`: the width of
    /// its logit rows, which may exceed the tokenizer's vocabulary (padding ids that no string
    /// maps to, and that no constraint ever allows). `eos_token_ids`: the ids that end an
    /// output; may be empty, for a model with no EOS.
    pub fn new(tokenizer_json: &str, vocab_size: usize, eos_token_ids: &[u32]) -> Result<Arc<Self>, GrammarError> {
        Self::with_limits(tokenizer_json, vocab_size, eos_token_ids, request_limits())
    }

    /// [`Self::new`] with other limits than [`request_limits`] (tests run out of them).
    pub(crate) fn with_limits(
        tokenizer_json: &str,
        vocab_size: usize,
        eos_token_ids: &[u32],
        limits: ParserLimits,
    ) -> Result<Arc<Self>, GrammarError> {
        let vocabulary = |message: String| GrammarError::Vocabulary(message);
        let json: serde_json::Value =
            serde_json::from_str(tokenizer_json).map_err(|e| vocabulary(format!("tokenizer.json is not JSON: {e}")))?;
        // llguidance asserts on some malformed vocabularies (a `<0x..>` byte token that is not
        // hex) and toktrie on inconsistent ones; a model's files must not bring the server
        // down, so its panics come back as errors.
        let mut words = match spaced_words(&json) {
            Some(words) => words,
            None => panic_utils::catch_unwind(AssertUnwindSafe(|| llguidance::token_bytes_from_tokenizer_json(&json)))
                .map_err(|e| vocabulary(format!("tokenizer.json: {e}")))?,
        };
        let tokenizer_vocab = words.len();
        if tokenizer_vocab == 0 || tokenizer_vocab > vocab_size {
            return Err(vocabulary(format!(
                "tokenizer.json has {tokenizer_vocab} tokens but the model's logit rows are {vocab_size} wide"
            )));
        }
        // One id past the model's rows is the engine's EOS for a model that has none: the
        // engine can then say "complete", and the id never shows in a mask (TokenMask drops
        // what lies past `vocab_size`).
        let virtual_eos = u32::try_from(vocab_size)
            .ok()
            .filter(|&id| id < u32::MAX)
            .ok_or_else(|| vocabulary(format!("vocab_size {vocab_size} does not fit token ids")))?;
        if let Some(&eos) = eos_token_ids.iter().find(|&&eos| eos >= virtual_eos) {
            return Err(vocabulary(format!("EOS id {eos} is outside the model's {vocab_size} logit rows")));
        }
        // Padding ids (and the virtual EOS) spell nothing, so no lexeme can ever match them.
        words.resize(vocab_size + 1, Vec::new());
        let info = TokRxInfo::new(virtual_eos + 1, eos_token_ids.first().copied().unwrap_or(virtual_eos));
        let eos_in_trie: Vec<u32> = if eos_token_ids.is_empty() { vec![virtual_eos] } else { eos_token_ids.to_vec() };
        let trie = panic_utils::catch_unwind(AssertUnwindSafe(|| {
            Ok(TokTrie::from(&info, &words).with_eos_tokens(&eos_in_trie))
        }))
        .map_err(|e| vocabulary(format!("token trie: {e}")))?;
        let tokenizer = Tokenizer::from_str(tokenizer_json).map_err(|e| vocabulary(format!("tokenizer.json: {e}")))?;
        let env: TokEnv = Arc::new(ModelTokenizerEnv::new(trie, tokenizer));
        let mut factory = ParserFactory::new_simple(&env).map_err(|e| vocabulary(format!("grammar engine: {e}")))?;
        // llguidance writes warnings to stderr by default; ours go through the errors we return.
        factory.quiet();
        *factory.limits_mut() = limits;
        let mut eos_token_ids = eos_token_ids.to_vec();
        eos_token_ids.sort_unstable();
        eos_token_ids.dedup();
        let tokens = Arc::new(ModelTokens { vocab_size, tokenizer_vocab, eos_token_ids, env: env.clone() });
        Ok(Arc::new(Self { factory, compiled: Mutex::default(), tokens }))
    }

    /// The width of the model's logit rows, and of every mask.
    pub fn vocab_size(&self) -> usize {
        self.tokens.vocab_size
    }

    /// The ids that end an output (none for a model with no EOS).
    pub fn eos_token_ids(&self) -> &[u32] {
        &self.tokens.eos_token_ids
    }

    /// A matcher for `spec`, positioned before the first output token. A malformed schema,
    /// expression or grammar, and a schema keyword llguidance does not implement, are
    /// [`GrammarError::Invalid`] with llguidance's message naming it; one too costly to
    /// compile is [`GrammarError::Budget`].
    ///
    /// A constraint compiled before (the same kind and text) is not compiled again: its fresh
    /// matcher is cloned ([`crate::compiled`]).
    pub fn compile(self: &Arc<Self>, spec: &ConstraintSpec) -> Result<ConstraintState, GrammarError> {
        let key = spec.cache_key();
        let cached =
            self.compiled.lock().map_err(|_| GrammarError::Internal("compiled cache poisoned".into()))?.get(&key);
        let matcher = match cached {
            Some(matcher) => matcher,
            None => {
                let matcher = self.fresh_matcher(spec)?;
                if let Ok(mut compiled) = self.compiled.lock() {
                    compiled.insert(key, &matcher);
                }
                matcher
            }
        };
        Ok(ConstraintState::new(Arc::clone(&self.tokens), matcher))
    }

    /// Compiles `spec` into a matcher before its first token.
    pub(crate) fn fresh_matcher(&self, spec: &ConstraintSpec) -> Result<Matcher, GrammarError> {
        let grammar = spec.to_grammar()?;
        let parser = self.factory.create_parser(grammar).map_err(|e| GrammarError::from_compile(&e.to_string()))?;
        let matcher = Matcher::new(Ok(parser));
        if let Some(message) = matcher.get_error() {
            return Err(GrammarError::from_compile(&message));
        }
        Ok(matcher)
    }
}
