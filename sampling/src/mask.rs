//! [`TokenMask`]: the tokens a constraint (a JSON schema, a regular expression, a grammar)
//! allows at one position. The law under a constraint is the effective distribution of the
//! masked logits: a forbidden token's logit is `-inf` before penalties, temperature, top-k,
//! top-p and min-p (docs/rule.md#constrained-decoding), so the rule stays exact with that p.

use crate::error::{Result, SamplingError};

/// One bit per token id, 32 ids a word, id `i` at bit `i % 32` of word `i / 32` (the layout
/// grammar engines use, so a mask crosses from one without a copy per token).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TokenMask {
    words: Vec<u32>,
    vocab_size: usize,
}

impl TokenMask {
    /// Every id below `vocab_size` allowed.
    pub fn allow_all(vocab_size: usize) -> Self {
        let mut mask = Self { words: vec![u32::MAX; vocab_size.div_ceil(32)], vocab_size };
        mask.clear_tail();
        mask
    }

    /// Only these ids; an id at or beyond `vocab_size` is an error.
    pub fn allow_only(vocab_size: usize, tokens: &[u32]) -> Result<Self> {
        let mut words = vec![0u32; vocab_size.div_ceil(32)];
        for &token in tokens {
            if token as usize >= vocab_size {
                return Err(SamplingError::TokenOutOfRange { token, vocab_size });
            }
            words[token as usize / 32] |= 1 << (token % 32);
        }
        Ok(Self { words, vocab_size })
    }

    /// From words in the layout above. Words past `vocab_size` are dropped and bits past it
    /// cleared: an engine's vocabulary may be wider than the model's rows (a token it adds),
    /// and such an id can never be drawn from the model's logits.
    pub fn from_words(mut words: Vec<u32>, vocab_size: usize) -> Self {
        words.resize(vocab_size.div_ceil(32), 0);
        let mut mask = Self { words, vocab_size };
        mask.clear_tail();
        mask
    }

    fn clear_tail(&mut self) {
        let used = self.vocab_size % 32;
        if used != 0
            && let Some(last) = self.words.last_mut()
        {
            *last &= (1u32 << used) - 1;
        }
    }

    pub fn vocab_size(&self) -> usize {
        self.vocab_size
    }

    pub fn words(&self) -> &[u32] {
        &self.words
    }

    pub fn allows(&self, token: u32) -> bool {
        (token as usize) < self.vocab_size && self.words[token as usize / 32] & (1 << (token % 32)) != 0
    }

    /// How many ids are allowed.
    pub fn count(&self) -> usize {
        self.words.iter().map(|w| w.count_ones() as usize).sum()
    }

    /// The allowed ids, in increasing order.
    pub fn allowed(&self) -> impl Iterator<Item = u32> + '_ {
        self.words.iter().enumerate().flat_map(|(w, &word)| {
            (0..32u32).filter(move |bit| word & (1 << bit) != 0).map(move |bit| w as u32 * 32 + bit)
        })
    }

    /// Sets every forbidden id's logit to `-inf`. A row wider than the mask (a model with
    /// padding rows no token string maps to) has its extra ids forbidden too. An empty mask
    /// is an error: no distribution is left to draw from.
    pub fn apply_to_logits(&self, logits: &mut [f32]) -> Result<()> {
        if self.count() == 0 {
            return Err(SamplingError::EmptyDistribution);
        }
        for (w, chunk) in logits.chunks_mut(32).enumerate() {
            let word = self.words.get(w).copied().unwrap_or(0);
            if word == u32::MAX {
                continue;
            }
            for (bit, logit) in chunk.iter_mut().enumerate() {
                if word & (1 << bit) == 0 {
                    *logit = f32::NEG_INFINITY;
                }
            }
        }
        Ok(())
    }

    /// A copy of `logits` with [`Self::apply_to_logits`] applied: for a row the caller only
    /// borrows (a node's host logits).
    pub fn masked(&self, logits: &[f32]) -> Result<Vec<f32>> {
        let mut row = logits.to_vec();
        self.apply_to_logits(&mut row)?;
        Ok(row)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::effective::{TokenHistory, effective_distribution};
    use crate::params::SamplingParams;

    #[test]
    fn masks_know_their_ids_and_clear_what_lies_past_the_vocabulary() {
        let mask = TokenMask::allow_only(70, &[0, 31, 32, 69]).unwrap();
        assert_eq!(mask.allowed().collect::<Vec<_>>(), vec![0, 31, 32, 69]);
        assert_eq!(mask.count(), 4);
        assert!(mask.allows(69) && !mask.allows(68) && !mask.allows(70) && !mask.allows(1000));
        assert!(TokenMask::allow_only(70, &[70]).is_err());
        assert_eq!(TokenMask::allow_all(70).count(), 70);
        let wide = TokenMask::from_words(vec![u32::MAX; 4], 40);
        assert_eq!(wide.count(), 40);
        assert_eq!(wide.words().len(), 2);
    }

    /// The masked law is p restricted to the allowed ids and renormalised, whatever the
    /// settings that come after the mask; a token the mask forbids has probability 0 even
    /// where top-k would otherwise have kept it.
    #[test]
    fn the_masked_law_is_p_restricted_and_renormalised() {
        let logits = [2.0f32, 1.0, 0.5, -1.0, 3.0, 0.0];
        let mask = TokenMask::allow_only(6, &[1, 2, 3]).unwrap();
        let masked = mask.masked(&logits).unwrap();
        let mut in_place = logits;
        mask.apply_to_logits(&mut in_place).unwrap();
        assert_eq!(masked, in_place);
        let params = SamplingParams { temperature: 1.0, ..SamplingParams::default() };
        let p = effective_distribution(&logits, &params, TokenHistory::default()).unwrap();
        let pm = effective_distribution(&masked, &params, TokenHistory::default()).unwrap();
        let kept: f64 = [1, 2, 3].iter().map(|&t| p.prob(t)).sum();
        for t in 0..6u32 {
            let want = if mask.allows(t) { p.prob(t) / kept } else { 0.0 };
            assert!((pm.prob(t) - want).abs() < 1e-12, "token {t}: {} vs {want}", pm.prob(t));
        }
        let top2 = SamplingParams { temperature: 1.0, top_k: 2, ..SamplingParams::default() };
        let pk = effective_distribution(&masked, &top2, TokenHistory::default()).unwrap();
        assert_eq!((pk.prob(4), pk.prob(3)), (0.0, 0.0));
        assert!(pk.prob(1) > 0.0 && pk.prob(2) > 0.0);
        let greedy = SamplingParams::greedy();
        assert_eq!(effective_distribution(&masked, &greedy, TokenHistory::default()).unwrap().prob(1), 1.0);
        let mut row = logits;
        assert!(TokenMask::allow_only(6, &[]).unwrap().apply_to_logits(&mut row).is_err());
    }
}
