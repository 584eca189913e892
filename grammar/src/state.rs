//! [`ConstraintState`]: one session's matcher, positioned after the tokens it consumed, with the
//! rules that make its masks and the tokens it accepts agree.
//!
//! llguidance's [`Matcher`] goes into a permanent error state when given a token its grammar
//! forbids, so every token is checked first (without changing anything) and only then
//! consumed: a rejected token leaves the state as it was. Once the language is complete and
//! llguidance has stopped, it accepts nothing more, not even EOS; the EOS ids the mask then
//! allows are accepted here and counted, so that rollback undoes them like any other token.

use std::fmt;
use std::sync::Arc;

use llguidance::Matcher;
use specd_sampling::TokenMask;

use crate::error::GrammarError;
use crate::model_tokens::ModelTokens;

/// The matcher of one session. Cloning it gives an independent matcher at the same position
/// (the lexer's cache of automaton states stays shared, behind a lock).
#[derive(Clone)]
pub struct ConstraintState {
    vocabulary: Arc<ModelTokens>,
    matcher: Matcher,
    /// Tokens the matcher itself consumed (net of rollbacks).
    matcher_tokens: usize,
    /// EOS ids accepted after the matcher stopped; always the last tokens consumed.
    eos_after_stop: usize,
    /// The mask at the current position, kept for a second read (`is_finished` and then
    /// `allowed` at one position compute it once).
    mask: Option<TokenMask>,
}

impl fmt::Debug for ConstraintState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ConstraintState")
            .field("consumed", &self.consumed())
            .field("stopped", &self.matcher.is_stopped())
            .field("error", &self.matcher.get_error())
            .finish_non_exhaustive()
    }
}

impl ConstraintState {
    pub(crate) fn new(vocabulary: Arc<ModelTokens>, matcher: Matcher) -> Self {
        Self { vocabulary, matcher, matcher_tokens: 0, eos_after_stop: 0, mask: None }
    }

    /// The tokens allowed next, `vocab_size` wide. Where the output is complete in the
    /// language the model's EOS ids are allowed (all of them); once nothing but the end may
    /// follow only they are, so for a model without EOS the mask is then empty: check
    /// [`Self::is_finished`] first. Padding ids are never allowed.
    pub fn allowed(&mut self) -> Result<TokenMask, GrammarError> {
        if let Some(mask) = &self.mask {
            return Ok(mask.clone());
        }
        self.check_error()?;
        let words = if self.matcher.is_stopped() {
            self.vocabulary.eos_words()
        } else {
            let mut words: Vec<u32> =
                self.matcher.compute_mask().map_err(|e| GrammarError::from_matcher(&e.to_string()))?.into();
            self.vocabulary.clear_padding(&mut words);
            words
        };
        let mask = TokenMask::from_words(words, self.vocabulary.vocab_size);
        self.mask = Some(mask.clone());
        Ok(mask)
    }

    /// Consumes `token`. A token the constraint does not allow here is
    /// [`GrammarError::Rejected`], and the state is left as it was.
    pub fn advance(&mut self, token: u32) -> Result<(), GrammarError> {
        self.check_error()?;
        let rejected = GrammarError::Rejected { token };
        if token as usize >= self.vocabulary.vocab_size {
            return Err(rejected);
        }
        let is_eos = self.vocabulary.is_eos(token);
        if self.matcher.is_stopped() {
            if !is_eos {
                return Err(rejected);
            }
            self.eos_after_stop += 1;
            self.mask = None;
            return Ok(());
        }
        // llguidance's check accepts a token with no bytes (padding, a hole in the ids) as a
        // no-op; such a token cannot be part of any output.
        if !is_eos && !self.vocabulary.spells_text(token) {
            return Err(rejected);
        }
        let valid = self.matcher.validate_tokens(&[token]).map_err(|e| GrammarError::from_matcher(&e.to_string()))?;
        if valid == 0 {
            return Err(rejected);
        }
        self.mask = None;
        self.matcher.consume_token(token).map_err(|e| GrammarError::from_matcher(&e.to_string()))?;
        self.matcher_tokens += 1;
        Ok(())
    }

    /// Consumes `tokens` in order; stops at the first error, with the tokens before it
    /// consumed.
    pub fn advance_all(&mut self, tokens: &[u32]) -> Result<(), GrammarError> {
        tokens.iter().try_for_each(|&token| self.advance(token))
    }

    /// Undoes the last `tokens` advances.
    pub fn rollback(&mut self, tokens: usize) -> Result<(), GrammarError> {
        if tokens > self.consumed() {
            return Err(GrammarError::Internal(format!(
                "rollback of {tokens} tokens after only {} were consumed",
                self.consumed()
            )));
        }
        self.check_error()?;
        let after_stop = tokens.min(self.eos_after_stop);
        let in_matcher = tokens - after_stop;
        self.matcher.rollback(in_matcher).map_err(|e| GrammarError::from_matcher(&e.to_string()))?;
        self.eos_after_stop -= after_stop;
        self.matcher_tokens -= in_matcher;
        if tokens > 0 {
            self.mask = None;
        }
        Ok(())
    }

    /// Tokens consumed so far, net of rollbacks.
    pub fn consumed(&self) -> usize {
        self.matcher_tokens + self.eos_after_stop
    }

    /// Whether nothing but the end may follow: llguidance stopped (the language admits no
    /// continuation, or EOS was consumed), or the output is complete and the mask allows only
    /// EOS ids (nothing, for a model without EOS). A matcher in error is not finished: its
    /// error comes from [`Self::allowed`].
    pub fn is_finished(&mut self) -> bool {
        if self.matcher.is_error() {
            return false;
        }
        if self.eos_after_stop > 0 || self.matcher.is_stopped() {
            return true;
        }
        // The language can only be complete where EOS is allowed, and llguidance knows that
        // without a mask; only then is the mask needed, to see that nothing else is allowed.
        if !self.matcher.is_accepting().unwrap_or(false) {
            return false;
        }
        match self.allowed() {
            Ok(mask) => mask.allowed().all(|token| self.vocabulary.is_eos(token)),
            Err(_) => false,
        }
    }

    /// How many leading `tokens` the constraint accepts in a row from here; the state is the
    /// same afterwards.
    pub fn valid_prefix_len(&mut self, tokens: &[u32]) -> usize {
        let mut accepted = 0;
        for &token in tokens {
            if self.advance(token).is_err() {
                break;
            }
            accepted += 1;
        }
        // Rolling back what this call consumed cannot fail unless the matcher broke while
        // consuming, and then its error is what the next call returns.
        let _ = self.rollback(accepted);
        accepted
    }

    fn check_error(&self) -> Result<(), GrammarError> {
        match self.matcher.get_error() {
            Some(message) => Err(GrammarError::from_matcher(&message)),
            None => Ok(()),
        }
    }
}
