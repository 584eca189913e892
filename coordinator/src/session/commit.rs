//! Committing a round's tokens to the output, and when the output ends: a stop token, EOS,
//! the length asked for, a stop string in the decoded text, or an output complete in the
//! language of its constraint. What the client is sent of a round is what its commit gives.

use specd_grammar::{ConstraintState, GrammarError};
use specd_proto::v1::{FinishReason, OutputLogprob};
use specd_text::TextStream;

use crate::error::CoordinatorError;
use crate::request::GenerationSpec;

/// When a generation ends, besides a stop string (the text stream finds those).
#[derive(Debug, Clone, Copy)]
pub struct StopConditions<'a> {
    pub stop_token_ids: &'a [u32],
    /// Empty when the request ignores EOS.
    pub eos_token_ids: &'a [u32],
    pub max_new_tokens: usize,
}

impl<'a> StopConditions<'a> {
    pub fn of(spec: &'a GenerationSpec) -> Self {
        Self {
            stop_token_ids: &spec.stop_token_ids,
            eos_token_ids: &spec.eos_token_ids,
            max_new_tokens: spec.max_new_tokens,
        }
    }

    /// Why the output ends with `token`, its `generated`-th token, if it does. A stop token
    /// is a stop even when it is also EOS.
    pub fn after(&self, token: u32, generated: usize) -> Option<FinishReason> {
        if self.stop_token_ids.contains(&token) {
            Some(FinishReason::Stop)
        } else if self.eos_token_ids.contains(&token) {
            Some(FinishReason::Eos)
        } else if generated >= self.max_new_tokens {
            Some(FinishReason::Length)
        } else {
            None
        }
    }
}

/// What one round's commit adds to the output.
#[derive(Debug, Default, PartialEq)]
pub struct Committed {
    /// The tokens committed, up to the one that ended the output.
    pub token_ids: Vec<u32>,
    /// The text they complete that can be sent now (where the output is decoded).
    pub text: String,
    /// One per committed token, where the client asked for them.
    pub logprobs: Vec<OutputLogprob>,
    /// Why the output ended with these tokens, if it did.
    pub finish: Option<FinishReason>,
}

/// The committed sequence C (the prompt and the output so far) and the output's text.
#[derive(Debug)]
pub struct Output {
    committed: Vec<u32>,
    prompt_len: usize,
    /// `None` where the output is not decoded.
    text: Option<TextStream>,
    /// The output constraint's engine, after the committed output; `None`: unconstrained.
    constraint: Option<ConstraintState>,
}

impl Output {
    pub fn new(prompt: &[u32], text: Option<TextStream>, constraint: Option<ConstraintState>) -> Self {
        Self { committed: prompt.to_vec(), prompt_len: prompt.len(), text, constraint }
    }

    /// The prompt and the output so far.
    pub fn committed(&self) -> &[u32] {
        &self.committed
    }

    /// How many tokens the output holds.
    pub fn generated(&self) -> usize {
        self.committed.len() - self.prompt_len
    }

    /// Commits a round's `tokens` (with their `logprobs`, where asked for) in order, up to the
    /// first that ends the output. Text a token completes is released at once, except what
    /// may still become a stop string or is an incomplete character; a stop string ends the
    /// output with the token that completed it, and so does a token that completes the output
    /// in its constraint's language (nothing but the end may follow). Once the output ends,
    /// the text held back is released too. A token the constraint forbids is the target's
    /// fault, and an error: its masks allow no such token.
    pub fn commit(
        &mut self,
        tokens: &[u32],
        logprobs: &[OutputLogprob],
        stops: StopConditions<'_>,
    ) -> Result<Committed, CoordinatorError> {
        let before = self.committed.len();
        let mut committed = Committed::default();
        for (j, &token) in tokens.iter().enumerate() {
            committed.logprobs.extend(logprobs.get(j).cloned());
            self.committed.push(token);
            if let Some(text) = self.text.as_mut() {
                let pushed = text.push(token)?;
                committed.text.push_str(&pushed.text);
                if pushed.stopped {
                    committed.finish = Some(FinishReason::Stop);
                    break;
                }
            }
            committed.finish = stops.after(token, self.generated());
            if committed.finish.is_none()
                && let Some(constraint) = self.constraint.as_mut()
            {
                constraint.advance(token).map_err(|err| match err {
                    GrammarError::Rejected { token } => CoordinatorError::Protocol(format!(
                        "the target committed token {token}, which the output constraint forbids there"
                    )),
                    other => other.into(),
                })?;
                if constraint.is_finished() {
                    committed.finish = Some(FinishReason::Stop);
                }
            }
            if committed.finish.is_some() {
                break;
            }
        }
        if let (Some(text), Some(_)) = (self.text.as_mut(), committed.finish) {
            committed.text.push_str(&text.finish()?);
        }
        committed.token_ids = self.committed[before..].to_vec();
        Ok(committed)
    }
}

#[cfg(test)]
mod tests {
    use specd_text::test_tokenizer::{byte_ids, byte_tokenizer};

    use super::*;

    const EOS: u32 = 2;
    const STOP: u32 = 3;

    fn stops(max_new_tokens: usize) -> StopConditions<'static> {
        StopConditions { stop_token_ids: &[STOP], eos_token_ids: &[EOS], max_new_tokens }
    }

    /// A test's tokens are the bytes of a string.
    fn ids(text: &str) -> Vec<u32> {
        byte_ids(text.as_bytes())
    }

    fn decoded(prompt: &str, stop_strings: &[&str]) -> Output {
        let stop_strings = stop_strings.iter().map(|s| (*s).to_owned()).collect();
        Output::new(&ids(prompt), Some(TextStream::new(byte_tokenizer(&[]).0, &ids(prompt), stop_strings)), None)
    }

    /// A distinct log-probability for each token, to tell them apart.
    fn logprob(token: u32) -> OutputLogprob {
        OutputLogprob { logprob: -f64::from(token), top: Vec::new() }
    }

    #[test]
    fn a_round_s_tokens_are_appended_to_the_committed_sequence_with_their_logprobs() {
        let mut output = Output::new(&[7, 8], None, None);
        let first = output.commit(&[10, 11], &[logprob(10), logprob(11)], stops(10)).unwrap();
        assert_eq!(first.token_ids, [10, 11]);
        assert_eq!(first.logprobs, [logprob(10), logprob(11)]);
        assert_eq!((first.text.as_str(), first.finish), ("", None));
        // Log-probabilities only where they were asked for.
        let second = output.commit(&[12], &[], stops(10)).unwrap();
        assert_eq!(second, Committed { token_ids: vec![12], ..Committed::default() });
        assert_eq!(output.committed(), [7, 8, 10, 11, 12]);
        assert_eq!(output.generated(), 3);
    }

    #[test]
    fn eos_ends_the_output_with_it_and_drops_the_rest_of_the_block() {
        let mut output = Output::new(&[7], None, None);
        let committed = output.commit(&[10, EOS, 11], &[logprob(10), logprob(EOS), logprob(11)], stops(10)).unwrap();
        assert_eq!(committed.token_ids, [10, EOS]);
        assert_eq!(committed.logprobs, [logprob(10), logprob(EOS)]);
        assert_eq!(committed.finish, Some(FinishReason::Eos));
        assert_eq!(output.committed(), [7, 10, EOS]);
    }

    #[test]
    fn a_request_that_ignores_eos_goes_on_past_it() {
        // `ignore_eos` leaves the spec without EOS ids (request::validate).
        let ignoring = StopConditions { eos_token_ids: &[], ..stops(10) };
        let mut output = Output::new(&[7], None, None);
        let committed = output.commit(&[10, EOS, 11], &[], ignoring).unwrap();
        assert_eq!((committed.token_ids, committed.finish), (vec![10, EOS, 11], None));
    }

    #[test]
    fn stop_tokens_eos_and_the_length_end_the_output_in_that_order() {
        let stops = StopConditions { stop_token_ids: &[STOP], eos_token_ids: &[EOS, STOP], max_new_tokens: 4 };
        assert_eq!(stops.after(STOP, 1), Some(FinishReason::Stop));
        assert_eq!(stops.after(STOP, 4), Some(FinishReason::Stop));
        assert_eq!(stops.after(EOS, 4), Some(FinishReason::Eos));
        assert_eq!(stops.after(10, 4), Some(FinishReason::Length));
        assert_eq!(stops.after(10, 5), Some(FinishReason::Length));
        assert_eq!(stops.after(10, 3), None);
    }

    #[test]
    fn the_length_cuts_a_block_mid_way() {
        let mut output = Output::new(&[7], None, None);
        assert_eq!(output.commit(&[10, 11], &[], stops(3)).unwrap().finish, None);
        // One token left of 3: the round's block of three commits only its first.
        let committed = output.commit(&[12, 13, 14], &[], stops(3)).unwrap();
        assert_eq!(committed.token_ids, [12]);
        assert_eq!(committed.finish, Some(FinishReason::Length));
        assert_eq!(output.generated(), 3);
    }

    #[test]
    fn a_stop_token_ends_the_output_with_it() {
        let mut output = Output::new(&[7], None, None);
        let committed = output.commit(&[10, STOP, 11], &[], stops(10)).unwrap();
        assert_eq!((committed.token_ids, committed.finish), (vec![10, STOP], Some(FinishReason::Stop)));
    }

    #[test]
    fn text_is_released_as_tokens_complete_it_and_the_rest_when_the_output_ends() {
        let mut output = decoded("Q:", &[]);
        let first = output.commit(&ids("ab"), &[], stops(3)).unwrap();
        assert_eq!((first.text.as_str(), first.finish), ("ab", None));
        let last = output.commit(&ids("cd"), &[], stops(3)).unwrap();
        assert_eq!((last.text.as_str(), last.token_ids, last.finish), ("c", ids("c"), Some(FinishReason::Length)));
    }

    #[test]
    fn a_stop_string_across_tokens_and_rounds_ends_the_output_with_the_token_that_completes_it() {
        let mut output = decoded("Q:", &["END"]);
        // "E" could begin the stop string: held back.
        let first = output.commit(&ids("abE"), &[], stops(20)).unwrap();
        assert_eq!((first.text.as_str(), first.finish), ("ab", None));
        // The next round completes it with its second token; the rest of the block is dropped,
        // and the text ends before the stop string.
        let second = output.commit(&ids("NDxy"), &[], stops(20)).unwrap();
        assert_eq!(second.token_ids, ids("ND"));
        assert_eq!((second.text.as_str(), second.finish), ("", Some(FinishReason::Stop)));
        assert_eq!(output.committed(), ids("Q:abEND"));
    }

    #[test]
    fn text_held_back_for_a_stop_string_that_never_comes_is_released_at_the_end() {
        let mut output = decoded("Q:", &["END"]);
        let first = output.commit(&ids("aE"), &[], stops(10)).unwrap();
        assert_eq!(first.text, "a");
        let last = output.commit(&ids("N"), &[], StopConditions { eos_token_ids: &[u32::from(b'N')], ..stops(10) });
        assert_eq!(
            last.unwrap(),
            Committed {
                token_ids: ids("N"),
                text: "EN".into(),
                finish: Some(FinishReason::Eos),
                ..Committed::default()
            }
        );
    }
}
