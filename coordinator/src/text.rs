//! Text output: incremental detokenization and stop strings.
//!
//! The coordinator holds no tokenizer (it links no model code); the target node decodes. After
//! each round the whole output is decoded again and only the new part is streamed. Until the
//! generation finishes, two kinds of tail are held back: replacement characters (U+FFFD),
//! which usually stand for the first bytes of a character whose other bytes come with the
//! next tokens, and any suffix that could be the start of a stop string, so that a stop
//! string spanning two rounds never reaches the client.

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
    /// The text already sent to the client.
    sent: String,
}

impl TextOutput {
    pub fn new(stop_strings: Vec<String>) -> Self {
        Self { stop_strings, sent: String::new() }
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
            return Ok(TextDelta { text: self.send_up_to(&text, at), stop_at_tokens: Some(keep) });
        }
        let end = if finishing { text.len() } else { self.releasable(&text) };
        Ok(TextDelta { text: self.send_up_to(&text, end), stop_at_tokens: None })
    }

    /// How much of `text` may be sent before the generation finishes.
    fn releasable(&self, text: &str) -> usize {
        let end = text.trim_end_matches('\u{FFFD}').len();
        let head = &text[..end];
        let held = self
            .stop_strings
            .iter()
            .flat_map(|s| (1..s.len()).filter(|&k| s.is_char_boundary(k) && head.ends_with(&s[..k])))
            .max()
            .unwrap_or(0);
        end - held
    }

    /// Sends `text[..end]` past what was sent. If the decoder rewrote text that was already
    /// sent (a replacement character that became the real one), what the client has cannot
    /// be taken back: as many characters of `text` as were rewritten are skipped.
    fn send_up_to(&mut self, text: &str, end: usize) -> String {
        let common = self.sent.bytes().zip(text.bytes()).take_while(|(a, b)| a == b).count();
        let common = floor_char_boundary(text, floor_char_boundary(&self.sent, common));
        let rewritten_chars = self.sent[common..].chars().count();
        let start = text[common..].char_indices().nth(rewritten_chars).map_or(text.len(), |(i, _)| common + i);
        if start >= end {
            return String::new();
        }
        self.sent = text[..end].to_owned();
        text[start..end].to_owned()
    }

    fn find_stop(&self, text: &str) -> Option<usize> {
        let longest = self.stop_strings.iter().map(String::len).max().unwrap_or(0);
        let from = floor_char_boundary(text, self.sent.len().saturating_sub(longest).min(text.len()));
        self.stop_strings.iter().filter_map(|s| text[from..].find(s.as_str()).map(|i| from + i)).min()
    }
}

fn floor_char_boundary(text: &str, mut at: usize) -> usize {
    at = at.min(text.len());
    while at > 0 && !text.is_char_boundary(at) {
        at -= 1;
    }
    at
}

#[cfg(test)]
mod tests {
    use super::*;

    fn output(stops: &[&str]) -> TextOutput {
        TextOutput::new(stops.iter().map(|s| s.to_string()).collect())
    }

    #[test]
    fn holds_back_possible_stop_starts_and_replacement_characters() {
        let t = output(&["\n\n", "END"]);
        assert_eq!(t.releasable("Hello\n"), 5, "a lone newline may begin the stop string");
        assert_eq!(t.releasable("Hello EN"), 6);
        assert_eq!(t.releasable("Hello"), 5);
        assert_eq!(t.releasable("caf\u{FFFD}\u{FFFD}"), 3, "every trailing U+FFFD waits");
    }

    #[test]
    fn sends_each_byte_once_even_when_the_tail_is_rewritten() {
        let mut t = output(&[]);
        assert_eq!(t.send_up_to("ab", 2), "ab");
        assert_eq!(t.send_up_to("abcd", 4), "cd");
        assert_eq!(t.send_up_to("abcd", 4), "");
        // The decoder turned a replacement character into the real one: nothing is resent.
        let mut u = output(&[]);
        assert_eq!(u.send_up_to("x\u{FFFD}", 4), "x\u{FFFD}");
        assert_eq!(u.send_up_to("x\u{e9}y", 4), "y");
    }

    #[test]
    fn stop_search_covers_text_not_yet_sent() {
        let mut t = output(&["\n\n"]);
        t.send_up_to("Hello", 5);
        assert_eq!(t.find_stop("Hello\n\nmore"), Some(5));
        assert_eq!(t.find_stop("Hello\nmore"), None);
    }
}
