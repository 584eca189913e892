//! Text output: incremental detokenization and stop strings.
//!
//! The coordinator holds no tokenizer (it links no model code); the target node decodes. After
//! each round the whole output is decoded again and only the new suffix is streamed. A
//! trailing U+FFFD is held back until the next round, since it usually is a multi-byte
//! character whose remaining bytes come with the next token.

use crate::error::CoordinatorError;
use crate::nodes::TargetClient;

/// What a round adds to the text.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct TextDelta {
    pub text: String,
    /// Set when a stop string matched: how many tokens of the output to keep (the first
    /// tokens whose text contains the stop string).
    pub stop_at_tokens: Option<usize>,
}

/// The text side of one generation.
#[derive(Debug)]
pub struct TextOutput {
    stop_strings: Vec<String>,
    /// Bytes of text already sent to the client.
    emitted: usize,
    /// Where the next stop-string search may start (earlier text was searched already).
    searched: usize,
}

impl TextOutput {
    pub fn new(stop_strings: Vec<String>) -> Self {
        Self { stop_strings, emitted: 0, searched: 0 }
    }

    /// Decodes `output` (all generated tokens, `before` of them from earlier rounds) and
    /// returns what is new; on a stop string, the text up to it and where to cut the tokens.
    pub async fn advance(
        &mut self,
        target: &TargetClient,
        output: &[u32],
        before: usize,
        finishing: bool,
    ) -> Result<TextDelta, CoordinatorError> {
        let text = target.detokenize(output.to_vec()).await?;
        if let Some(at) = self.find_stop(&text) {
            let mut keep = output.len();
            for k in before + 1..=output.len() {
                let prefix = target.detokenize(output[..k].to_vec()).await?;
                if self.stop_strings.iter().any(|s| prefix.contains(s.as_str())) {
                    keep = k;
                    break;
                }
            }
            let delta = text.get(self.emitted..at).unwrap_or_default().to_owned();
            self.emitted = at;
            return Ok(TextDelta { text: delta, stop_at_tokens: Some(keep) });
        }
        let longest = self.stop_strings.iter().map(String::len).max().unwrap_or(0);
        self.searched = floor_char_boundary(&text, text.len().saturating_sub(longest));
        let mut end = text.len();
        if !finishing && text.ends_with('\u{FFFD}') {
            end -= '\u{FFFD}'.len_utf8();
        }
        let delta = text.get(self.emitted..end).unwrap_or_default().to_owned();
        self.emitted = self.emitted.max(end);
        Ok(TextDelta { text: delta, stop_at_tokens: None })
    }

    fn find_stop(&self, text: &str) -> Option<usize> {
        let from = floor_char_boundary(text, self.searched.min(text.len()));
        self.stop_strings.iter().filter_map(|s| text[from..].find(s.as_str()).map(|i| from + i)).min()
    }
}

fn floor_char_boundary(text: &str, mut at: usize) -> usize {
    while at > 0 && !text.is_char_boundary(at) {
        at -= 1;
    }
    at
}
