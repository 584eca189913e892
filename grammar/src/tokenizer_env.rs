//! [`ModelTokenizerEnv`]: the model's vocabulary as llguidance's [`TokenizerEnv`], a token trie
//! of every id's bytes plus the model's own tokenizer for turning text into ids.

use llguidance::toktrie::{TokTrie, TokenId, TokenizerEnv};
use tokenizers::Tokenizer;

pub(crate) struct ModelTokenizerEnv {
    trie: TokTrie,
    tokenizer: Tokenizer,
}

impl ModelTokenizerEnv {
    pub(crate) fn new(trie: TokTrie, tokenizer: Tokenizer) -> Self {
        Self { trie, tokenizer }
    }
}

impl TokenizerEnv for ModelTokenizerEnv {
    fn tok_trie(&self) -> &TokTrie {
        &self.trie
    }

    /// Text as the model's tokenizer splits it, without special tokens. Bytes that are not
    /// UTF-8 (a character cut between tokens) cannot go through the tokenizer, so they, and any
    /// text the tokenizer fails on, take the trie's greedy longest-match split instead.
    fn tokenize_bytes(&self, bytes: &[u8]) -> Vec<TokenId> {
        self.trie.tokenize_with_greedy_fallback(bytes, |text| match self.tokenizer.encode(text, false) {
            Ok(encoding) => encoding.get_ids().to_vec(),
            Err(_) => self.trie.greedy_tokenize(text.as_bytes()),
        })
    }

    /// llguidance narrows the mask to a single token where the grammar forces text (the
    /// tokenizer's split of that text, "forcing") only for a canonical tokenizer. We say ours
    /// is not, so a mask is always every token that keeps the output in the language: the law
    /// docs/rule.md#constrained-decoding states (the model's p restricted to those tokens),
    /// and the set [`crate::ConstraintState::advance`] accepts, so a mask and the tokens it
    /// admits never disagree. With forcing off llguidance calls `tokenize_bytes` nowhere on
    /// our path; it stays exact so that turning forcing on is this one line.
    fn tokenize_is_canonical(&self) -> bool {
        false
    }
}
