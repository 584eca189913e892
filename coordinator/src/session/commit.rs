//! Committing a round's tokens to the output, and when the output ends: a stop token, EOS,
//! the length asked for, or a stop string in the decoded text. What the client is sent of a
//! round is what its commit gives.

use specd_proto::v1::{FinishReason, OutputLogprob};
use specd_text::{TextError, TextStream};

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
}

impl Output {
    pub fn new(prompt: &[u32], text: Option<TextStream>) -> Self {
        Self { committed: prompt.to_vec(), prompt_len: prompt.len(), text }
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
    /// output with the token that completed it. Once the output ends, the text held back is
    /// released too.
    pub fn commit(
        &mut self,
        tokens: &[u32],
        logprobs: &[OutputLogprob],
        stops: StopConditions<'_>,
    ) -> Result<Committed, TextError> {
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
