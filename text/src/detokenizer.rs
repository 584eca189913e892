//! Generated ids to text, one token at a time, at O(a small window) per token.
//!
//! The method is vLLM's and TGI's (prefix_offset/read_offset): keep a window of ids starting a
//! few tokens before the text not yet returned. For each new id, decode the window twice:
//! `prefix = decode(window[prefix_offset..read_offset])` (text already returned) and
//! `full = decode(window[prefix_offset..])`; what `full` adds to `prefix` is the new text. It
//! is held back while `full` ends in U+FFFD (the token ended inside a multi-byte character
//! whose other bytes come with the next tokens); once it does not, it is returned and the
//! window moves forward (`prefix_offset = read_offset`, `read_offset = end`).
//!
//! Why this is exact: both decodes start at the same token, so whatever a decoder does only
//! at the start of a decode (Metaspace/Llama's `Strip` removing the first token's leading
//! space) happens to both and cancels; the rest of a decode is the concatenation of its
//! tokens' text, except that bytes (byte-level BPE, byte fallback) are joined before being
//! read as UTF-8. The window always starts where the text was complete, so the joined bytes
//! of the window read the same as in a whole decode. The window starts inside the prompt with
//! a few non-special prompt tokens before the output, so the first output token is not
//! decoded as if it started the text: a Metaspace tokenizer's first generated token keeps its
//! leading space, as `decode(prompt + output)` has it. Hence the concatenation of all
//! returned text equals `decode(prompt + output)[len(decode(prompt))..]` whenever that is
//! well defined, i.e. whenever each `decode(prompt + output[..k])` is a prefix of the next
//! one up to a trailing U+FFFD (it is not, for example, when a prompt ends inside a character
//! or a byte-fallback run is invalid UTF-8).

use std::sync::Arc;

use tokenizers::Tokenizer;

use crate::error::TextError;

/// How many non-special prompt tokens the window starts with: enough context for the first
/// output token to decode as it does after the prompt (vLLM uses 5).
const PROMPT_CONTEXT: usize = 5;

/// Incremental decoding of one generation's output.
#[derive(Debug)]
pub struct IncrementalDetokenizer {
    tokenizer: Arc<Tokenizer>,
    /// The window: ids from the start of the decode context to the last pushed.
    ids: Vec<u32>,
    /// Where the decode context starts in `ids` (text before it is never decoded again).
    prefix_offset: usize,
    /// Where the ids whose text is not returned yet start in `ids`.
    read_offset: usize,
    /// `decode(ids[prefix_offset..read_offset])`, computed when the offsets move.
    prefix_text: Option<String>,
    /// What the last push decoded past `prefix_text` but held back.
    held: String,
}

impl IncrementalDetokenizer {
    /// Starts after `prompt_ids` (which are never returned as text).
    pub fn new(tokenizer: Arc<Tokenizer>, prompt_ids: &[u32]) -> Self {
        let start = context_start(&tokenizer, prompt_ids);
        let ids = prompt_ids[start..].to_vec();
        let read_offset = ids.len();
        Self { tokenizer, ids, prefix_offset: 0, read_offset, prefix_text: None, held: String::new() }
    }

    /// Adds one generated id; returns the text that became stable with it (often empty).
    pub fn push(&mut self, id: u32) -> Result<String, TextError> {
        self.ids.push(id);
        let prefix = self.prefix_text()?.to_owned();
        let full = self.decode(&self.ids[self.prefix_offset..])?;
        let new = new_text(&prefix, &full);
        if full.len() <= prefix.len() || full.ends_with('\u{FFFD}') {
            self.held = new.to_owned();
            return Ok(String::new());
        }
        let new = new.to_owned();
        self.advance();
        Ok(new)
    }

    /// Returns everything held back (an incomplete character stays as U+FFFD, as a whole
    /// decode writes it). Pushing after `finish` continues from there.
    pub fn finish(&mut self) -> Result<String, TextError> {
        if self.read_offset == self.ids.len() {
            return Ok(String::new());
        }
        let prefix = self.prefix_text()?.to_owned();
        let full = self.decode(&self.ids[self.prefix_offset..])?;
        let new = new_text(&prefix, &full).to_owned();
        self.advance();
        Ok(new)
    }

    /// The text decoded past what was returned but held back (for stop strings that end
    /// before a held incomplete character).
    pub fn pending(&self) -> &str {
        &self.held
    }

    /// How many ids the window holds: stays a few tokens long however long the output grows
    /// (it grows only while text is held back), which is what keeps a push O(1) in the output.
    pub fn window_len(&self) -> usize {
        self.ids.len()
    }

    fn advance(&mut self) {
        // Drop the ids before the new context start so that the window stays small.
        self.ids.drain(..self.read_offset);
        self.prefix_offset = 0;
        self.read_offset = self.ids.len();
        self.prefix_text = None;
        self.held.clear();
    }

    fn prefix_text(&mut self) -> Result<&str, TextError> {
        if self.prefix_text.is_none() {
            self.prefix_text = Some(self.decode(&self.ids[self.prefix_offset..self.read_offset])?);
        }
        Ok(self.prefix_text.as_deref().unwrap_or_default())
    }

    fn decode(&self, ids: &[u32]) -> Result<String, TextError> {
        self.tokenizer.decode(ids, true).map_err(|e| TextError::Tokenizer(e.to_string()))
    }
}

/// What `full` adds to `prefix`. When `full` does not start with `prefix` (the prompt ended
/// inside a character the output completed), the text from where they differ, so that the
/// completed character is not lost.
fn new_text<'a>(prefix: &str, full: &'a str) -> &'a str {
    if let Some(rest) = full.strip_prefix(prefix) {
        return rest;
    }
    let mut common = prefix.bytes().zip(full.bytes()).take_while(|(a, b)| a == b).count();
    while !full.is_char_boundary(common) {
        common -= 1;
    }
    &full[common..]
}

/// Where the decode context starts in the prompt: [`PROMPT_CONTEXT`] non-special tokens back
/// (special tokens decode to nothing, so they give no context).
fn context_start(tokenizer: &Tokenizer, prompt_ids: &[u32]) -> usize {
    let added = tokenizer.get_added_vocabulary();
    let mut plain = 0;
    for (i, &id) in prompt_ids.iter().enumerate().rev() {
        let special = tokenizer.id_to_token(id).is_some_and(|t| added.is_special_token(&t));
        if !special {
            plain += 1;
            if plain == PROMPT_CONTEXT {
                return i;
            }
        }
    }
    0
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_tokenizer::{byte_ids, byte_tokenizer};

    #[test]
    fn holds_split_characters_and_keeps_the_window_small() {
        let (t, eos) = byte_tokenizer(&[b"word "]);
        let prompt = byte_ids(b"a prompt of some length");
        let mut d = IncrementalDetokenizer::new(t, &prompt);
        assert_eq!(d.window_len(), 5, "five prompt tokens of context");
        // "\u{20ac}" is three bytes, so three ids: nothing until the last one.
        assert_eq!(d.push(0xE2).unwrap(), "");
        assert_eq!(d.pending(), "\u{FFFD}");
        assert_eq!(d.push(0x82).unwrap(), "");
        assert_eq!(d.push(0xAC).unwrap(), "\u{20ac}");
        assert_eq!(d.push(eos).unwrap(), "", "special tokens are skipped");
        for _ in 0..10_000 {
            assert_eq!(d.push(256).unwrap(), "word ");
            assert!(d.window_len() <= 3, "window {}", d.window_len());
        }
        assert_eq!(d.push(0xF0).unwrap(), "");
        assert_eq!(d.finish().unwrap(), "\u{FFFD}", "an incomplete character is flushed as a whole decode writes it");
        assert_eq!(d.finish().unwrap(), "");
    }

    #[test]
    fn new_text_never_slices_inside_a_character() {
        assert_eq!(new_text("ab", "abc"), "c");
        assert_eq!(new_text("a\u{FFFD}", "aé"), "é", "a completed character is returned");
        assert_eq!(new_text("xé", "xè!"), "è!");
        assert_eq!(new_text("abc", "ab"), "");
    }
}
