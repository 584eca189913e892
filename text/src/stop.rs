//! Streamed output text with stop strings.
//!
//! Text comes from an [`IncrementalDetokenizer`]. Text that could be the start of a stop
//! string is held back until the next tokens show it is not; when a stop string completes,
//! the stream stops, its text ends just before the stop string, and the caller keeps the
//! output up to and including the token that completed it (the first token whose text
//! contains the stop string, as the coordinator has always cut). The search looks also at the
//! text the detokenizer holds back before an incomplete trailing character, so a stop string
//! is found with the token that completes it even when that token ends inside the next
//! character. Stop strings work across tokens and rounds: the stream keeps its state.

use std::sync::Arc;

use tokenizers::Tokenizer;

use crate::detokenizer::IncrementalDetokenizer;
use crate::error::TextError;

/// What one token adds to the stream.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Pushed {
    /// Text to send now.
    pub text: String,
    /// A stop string completed with this token: `text` ends before it, keep the tokens up to
    /// and including this one, and push no more.
    pub stopped: bool,
}

/// One generation's text with stop strings.
#[derive(Debug)]
pub struct TextStream {
    detokenizer: IncrementalDetokenizer,
    stop_strings: Vec<String>,
    /// Stable text not sent yet, because it could begin a stop string.
    unsent: String,
    stopped: bool,
}

impl TextStream {
    /// Empty stop strings are ignored (they would stop before any text).
    pub fn new(tokenizer: Arc<Tokenizer>, prompt_ids: &[u32], stop_strings: Vec<String>) -> Self {
        let stop_strings = stop_strings.into_iter().filter(|s| !s.is_empty()).collect();
        Self {
            detokenizer: IncrementalDetokenizer::new(tokenizer, prompt_ids),
            stop_strings,
            unsent: String::new(),
            stopped: false,
        }
    }

    /// Adds one generated id. After a stop, further ids add nothing and report `stopped`.
    pub fn push(&mut self, id: u32) -> Result<Pushed, TextError> {
        if self.stopped {
            return Ok(Pushed { text: String::new(), stopped: true });
        }
        let stable = self.detokenizer.push(id)?;
        self.unsent.push_str(&stable);
        if self.stop_strings.is_empty() {
            return Ok(Pushed { text: std::mem::take(&mut self.unsent), stopped: false });
        }
        // The text there is now: what is stable plus what the detokenizer holds back before a
        // trailing incomplete character (that part will not change).
        let pending = self.detokenizer.pending().trim_end_matches('\u{FFFD}');
        let mut seen = self.unsent.clone();
        seen.push_str(pending);
        if let Some(at) = self.find_stop(&seen) {
            self.stopped = true;
            self.unsent.clear();
            seen.truncate(at);
            return Ok(Pushed { text: seen, stopped: true });
        }
        let hold_from = self.possible_stop_start(&seen).min(self.unsent.len());
        let text = self.unsent.drain(..hold_from).collect();
        Ok(Pushed { text, stopped: false })
    }

    /// Releases the rest at the end of the generation (a stop string completed only by the
    /// held tail still cuts the text).
    pub fn finish(&mut self) -> Result<String, TextError> {
        if self.stopped {
            return Ok(String::new());
        }
        let tail = self.detokenizer.finish()?;
        self.unsent.push_str(&tail);
        let mut text = std::mem::take(&mut self.unsent);
        if let Some(at) = self.find_stop(&text) {
            self.stopped = true;
            text.truncate(at);
        }
        Ok(text)
    }

    /// Whether a stop string has ended the stream.
    pub fn is_stopped(&self) -> bool {
        self.stopped
    }

    /// Where the first stop string begins in `text`. `text` is short: what was held back
    /// (shorter than the longest stop string) plus what the last token added.
    fn find_stop(&self, text: &str) -> Option<usize> {
        self.stop_strings.iter().filter_map(|s| text.find(s.as_str())).min()
    }

    /// The earliest position from which the end of `text` is a proper prefix of a stop string
    /// (`text.len()` when there is none): text from there must wait.
    fn possible_stop_start(&self, text: &str) -> usize {
        let longest = self.stop_strings.iter().map(String::len).max().unwrap_or(0);
        let from = text.len().saturating_sub(longest.saturating_sub(1));
        (from..text.len())
            .filter(|&i| text.is_char_boundary(i))
            .find(|&i| self.stop_strings.iter().any(|s| s.starts_with(&text[i..])))
            .unwrap_or(text.len())
    }
}
