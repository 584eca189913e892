//! [`ModelTokens`]: what a matcher needs to know of the model's ids beside the grammar engine:
//! the width of its logit rows, which ids its tokenizer spells, its EOS ids.

use llguidance::toktrie::TokEnv;

/// Shared by a vocabulary and every matcher compiled against it.
pub(crate) struct ModelTokens {
    /// The width of the model's logit rows, and of every mask.
    pub vocab_size: usize,
    /// Ids below this are the tokenizer's; the rest up to `vocab_size` are padding.
    pub tokenizer_vocab: usize,
    /// Sorted, without repeats; empty for a model with no EOS.
    pub eos_token_ids: Vec<u32>,
    /// The engine's view of the tokenizer (its trie holds each id's bytes).
    pub env: TokEnv,
}

impl ModelTokens {
    pub(crate) fn is_eos(&self, token: u32) -> bool {
        self.eos_token_ids.binary_search(&token).is_ok()
    }

    /// Whether `token` spells some text: an id of the tokenizer with bytes (not padding, not a
    /// hole in the tokenizer's ids). Only such a token can extend an output.
    pub(crate) fn spells_text(&self, token: u32) -> bool {
        (token as usize) < self.tokenizer_vocab && self.env.tok_trie().token_len(token) > 0
    }

    /// Bits of `words` (a mask at least `vocab_size` wide) cleared for padding ids, which
    /// llguidance should never set but which no mask may allow whatever the grammar says (a
    /// Lark grammar can name any id as a token).
    pub(crate) fn clear_padding(&self, words: &mut [u32]) {
        for id in self.tokenizer_vocab..self.vocab_size {
            if !self.is_eos(id as u32)
                && let Some(word) = words.get_mut(id / 32)
            {
                *word &= !(1u32 << (id % 32));
            }
        }
    }

    /// The mask after a complete output: the EOS ids, and nothing for a model without one.
    pub(crate) fn eos_words(&self) -> Vec<u32> {
        let mut words = vec![0u32; self.vocab_size.div_ceil(32)];
        for &eos in &self.eos_token_ids {
            words[eos as usize / 32] |= 1 << (eos % 32);
        }
        words
    }
}
