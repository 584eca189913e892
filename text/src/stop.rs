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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_tokenizer::{byte_ids, byte_tokenizer};

    /// Pushes `ids`, returning the text of each push (and of `finish` when it does not stop)
    /// and the index of the stopping push.
    fn run(stream: &mut TextStream, ids: &[u32]) -> (Vec<String>, Option<usize>) {
        let mut texts = Vec::new();
        for (i, &id) in ids.iter().enumerate() {
            let pushed = stream.push(id).unwrap();
            texts.push(pushed.text);
            if pushed.stopped {
                return (texts, Some(i));
            }
        }
        texts.push(stream.finish().unwrap());
        (texts, None)
    }

    fn stops(s: &[&str]) -> Vec<String> {
        s.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn a_stop_string_split_over_three_tokens_stops_at_the_third() {
        let (t, _) = byte_tokenizer(&[b"Say ", b"ST", b" more"]);
        let mut s = TextStream::new(t.clone(), &[], stops(&["STOP"]));
        let (texts, stopped) = run(&mut s, &[256, 257, u32::from(b'O'), u32::from(b'P'), 258]);
        assert_eq!(texts, ["Say ", "", "", ""]);
        assert_eq!(stopped, Some(3), "the token that completes the stop string");
        assert_eq!(s.push(260).unwrap(), Pushed { text: String::new(), stopped: true });
        assert_eq!(s.finish().unwrap(), "");

        // A false start is released as soon as it cannot be a stop string.
        let mut s = TextStream::new(t, &[], stops(&["STOP"]));
        let (texts, stopped) = run(&mut s, &[257, u32::from(b'O'), 256]);
        assert_eq!(texts, ["", "", "STOSay ", ""]);
        assert_eq!(stopped, None);
    }

    #[test]
    fn a_stop_string_ending_inside_a_multi_byte_character() {
        // "\u{20ac}" = E2 82 AC, one id per byte: the stop completes with the third byte.
        let (t, _) = byte_tokenizer(&[b"xy", &[b'a', b'b', 0xE2]]);
        let mut s = TextStream::new(t.clone(), &[], stops(&["1\u{20ac}"]));
        let mut ids = byte_ids(b"pay 1");
        ids.extend(byte_ids("\u{20ac}".as_bytes()));
        let (texts, stopped) = run(&mut s, &ids);
        assert_eq!(stopped, Some(ids.len() - 1));
        assert_eq!(texts.concat(), "pay ");

        // A token that ends inside the next character ("ab" + E2): the stop string "ab" is
        // found with that token, not one later when the character completes.
        let mut s = TextStream::new(t.clone(), &[], stops(&["ab"]));
        let (texts, stopped) = run(&mut s, &[256, 257, 0x82, 0xAC]);
        assert_eq!((texts.concat(), stopped), ("xy".to_owned(), Some(1)));

        // A stop string never matches part of a different character with the same first byte.
        let mut s = TextStream::new(t, &[], stops(&["\u{e9}"]));
        let (texts, stopped) = run(&mut s, &byte_ids("\u{e8}\u{ea}".as_bytes()));
        assert_eq!((texts.concat(), stopped), ("\u{e8}\u{ea}".to_owned(), None));
    }

    #[test]
    fn the_earliest_stop_string_wins_and_finish_releases_what_was_held() {
        let (t, _) = byte_tokenizer(&[]);
        let mut s = TextStream::new(t.clone(), &[], stops(&["cd", "bcx", ""]));
        let (texts, stopped) = run(&mut s, &byte_ids(b"abcd"));
        assert_eq!((texts.concat(), stopped), ("ab".to_owned(), Some(3)));
        let mut s = TextStream::new(t, &[], stops(&["\n\n"]));
        let (texts, stopped) = run(&mut s, &byte_ids(b"x\n"));
        assert_eq!(texts, ["x", "", "\n"], "the newline waits, then finish releases it");
        assert_eq!(stopped, None);
    }

    /// Random byte streams against the rule stated on whole decodes: the output stops at the
    /// first token k whose decode(output[..=k]) contains a stop string, and the text is that
    /// decode up to the first stop string.
    #[test]
    fn random_streams_match_the_rule_on_whole_decodes() {
        let pieces: [&[u8]; 6] = [b"ab", b"\na", b"b\n\n", "\u{e9}".as_bytes(), &[b'a', 0xE2], &[0x82, 0xAC]];
        let (t, eos) = byte_tokenizer(&pieces);
        let alphabet: Vec<u32> =
            [b'a', b'b', b'\n', 0xC3, 0xA9, 0xE2, 0x82, 0xAC].iter().map(|&b| u32::from(b)).chain(256..=eos).collect();
        let stop_sets =
            [stops(&["ab"]), stops(&["\n\n", "\u{20ac}"]), stops(&["b\u{e9}a", "aa"]), stops(&["\u{e9}\u{e9}"])];
        let mut state = 0x5eed_u64;
        let mut next = |n: usize| {
            state = state.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            ((state >> 33) % n as u64) as usize
        };
        let mut stopped_runs = 0;
        for run_index in 0..400 {
            let set = &stop_sets[run_index % stop_sets.len()];
            let ids: Vec<u32> = (0..1 + next(12)).map(|_| alphabet[next(alphabet.len())]).collect();
            let decode = |k: usize| t.decode(&ids[..k], true).unwrap();
            let first_stop = |text: &str| set.iter().filter_map(|s| text.find(s.as_str())).min();
            let want = match (1..=ids.len()).find(|&k| first_stop(&decode(k)).is_some()) {
                Some(k) => {
                    let text = decode(k);
                    (text[..first_stop(&text).unwrap()].to_owned(), Some(k - 1))
                }
                None => (decode(ids.len()), None),
            };
            let mut s = TextStream::new(t.clone(), &[], set.clone());
            let (texts, stopped) = run(&mut s, &ids);
            assert_eq!((texts.concat(), stopped), want, "ids {ids:?}, stops {set:?}");
            stopped_runs += usize::from(stopped.is_some());
        }
        assert!(
            stopped_runs > 50 && stopped_runs < 350,
            "{stopped_runs} of 400 runs stopped: the streams must exercise both"
        );
    }
}
