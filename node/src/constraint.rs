//! A session's output constraint on a node (docs/rule.md#constrained-decoding): the grammar
//! engine's state, kept on the committed output and moved along a block's candidates only to
//! read the masks there.
//!
//! The engine's state follows a token sequence: the one it last followed is kept, and each
//! request names another (the session's output so far, perhaps with candidates after it).
//! The engine rolls back to where the two agree and advances from there, so a rejected suffix
//! costs what it took to reach it, whatever the coordinator committed in between.

use std::time::{Duration, Instant};

use specd_grammar::{ConstraintState, GrammarError};
use specd_sampling::TokenMask;

use crate::block_masks::BlockMasks;
use crate::error::NodeError;

/// Masks that took at least this long last time are computed on a second thread during the
/// forward pass they belong to; quicker ones inline, where a thread would cost more than it
/// hides (starting and joining one takes tens of µs; a small vocabulary's masks take less).
const MASKS_WORTH_A_THREAD: Duration = Duration::from_micros(100);

/// The engine's state and the output tokens it has followed.
#[derive(Debug, Clone)]
pub struct FollowedConstraint {
    state: ConstraintState,
    followed: Vec<u32>,
    /// How long the last masks took (one row's, or a block's).
    last_masks: Duration,
}

impl FollowedConstraint {
    pub fn new(state: ConstraintState) -> Self {
        // Until measured, assume a thread pays: the first masks of a large vocabulary are the
        // slowest (the engine's lexer starts empty).
        Self { state, followed: Vec::new(), last_masks: MASKS_WORTH_A_THREAD }
    }

    /// Runs `pass` (a forward pass) and `masks` (this constraint's masks for it, which depend
    /// on the tokens alone): `masks` on a second thread while `pass` runs where the last masks
    /// took long enough to pay for a thread, else `masks` first, then `pass`.
    pub fn alongside<M: Send, R>(
        &mut self,
        masks: impl FnOnce(&mut Self) -> Result<M, NodeError> + Send,
        pass: impl FnOnce() -> R,
    ) -> (R, Result<M, NodeError>) {
        if self.last_masks < MASKS_WORTH_A_THREAD {
            let masks = masks(self);
            return (pass(), masks);
        }
        std::thread::scope(|scope| {
            let masks = scope.spawn(move || masks(self));
            let passed = pass();
            let masks = masks
                .join()
                .unwrap_or_else(|_| Err(NodeError::Internal("the constraint's mask thread panicked".into())));
            (passed, masks)
        })
    }

    /// The tokens the constraint allows after `output`; `None` when `output` leaves the
    /// language (a candidate the constraint forbids): nothing after it can be drawn, so no
    /// mask applies to a row that a rule will never read.
    pub fn mask_after(&mut self, output: &[u32]) -> Result<Option<TokenMask>, NodeError> {
        let started = Instant::now();
        if !self.follow(output)? {
            return Ok(None);
        }
        let mask = self.state.allowed()?;
        self.last_masks = started.elapsed();
        Ok(Some(mask))
    }

    /// The masks of a block's γ + 1 rows: after `output`, then after each candidate. A row
    /// after a candidate the constraint forbids gets `None` (see [`Self::mask_after`]).
    pub fn block_masks(
        &mut self,
        rule: BlockMasks,
        output: &[u32],
        candidates: &[u32],
    ) -> Result<Vec<Option<TokenMask>>, NodeError> {
        match rule {
            BlockMasks::Exact => {}
            #[cfg(feature = "testing")]
            BlockMasks::FirstStateEverywhere => return Ok(vec![self.mask_after(output)?; candidates.len() + 1]),
        }
        let started = Instant::now();
        let mut masks = Vec::with_capacity(candidates.len() + 1);
        masks.push(self.mask_after(output)?);
        // The engine stays after the output; each allowed candidate moves it one token on (the
        // next request rolls back what it did not commit, as `follow` does for any sequence).
        for &candidate in candidates {
            let allowed = masks.last().is_some_and(|mask| mask.as_ref().is_some_and(|m| m.allows(candidate)));
            if !allowed {
                masks.push(None);
                continue;
            }
            self.state.advance(candidate)?;
            self.followed.push(candidate);
            masks.push(Some(self.state.allowed()?));
        }
        self.last_masks = started.elapsed();
        Ok(masks)
    }

    /// Whether the constraint forbids `token` after `output`: one token checked, no mask
    /// computed (a mask costs about a hundred times more at a large vocabulary). After an
    /// output that already left the language nothing is said to be forbidden, as no mask
    /// applies there ([`Self::mask_after`]).
    pub fn forbids_after(&mut self, output: &[u32], token: u32) -> Result<bool, NodeError> {
        Ok(self.follow(output)? && self.state.valid_prefix_len(&[token]) == 0)
    }

    /// Brings the engine to the end of `output`; `false` when a token of it is forbidden,
    /// with the engine left after the longest allowed prefix.
    fn follow(&mut self, output: &[u32]) -> Result<bool, NodeError> {
        let shared = self.followed.iter().zip(output).take_while(|(a, b)| a == b).count();
        if shared < self.followed.len() {
            self.state.rollback(self.followed.len() - shared)?;
            self.followed.truncate(shared);
        }
        for &token in &output[shared..] {
            match self.state.advance(token) {
                Ok(()) => self.followed.push(token),
                Err(GrammarError::Rejected { .. }) => return Ok(false),
                Err(other) => return Err(other.into()),
            }
        }
        Ok(true)
    }
}

#[cfg(test)]
mod tests {
    //! Every mask is checked against a fresh engine state moved along the same tokens, so a
    //! rollback that went to the wrong place, or a block row read after the wrong prefix,
    //! shows as a different mask.

    use std::sync::Arc;
    use std::time::Duration;

    use specd_grammar::{ConstraintSpec, GrammarVocabulary};
    use specd_sampling::TokenMask;
    use specd_text::test_tokenizer::byte_tokenizer;

    use super::FollowedConstraint;
    use crate::block_masks::BlockMasks;
    use crate::error::NodeError;

    const A: u32 = b'a' as u32;
    const B: u32 = b'b' as u32;
    const C: u32 = b'c' as u32;
    const D: u32 = b'd' as u32;
    const X: u32 = b'x' as u32;

    /// A byte-level vocabulary (ids 0..=255 are the bytes, 256 is EOS) and "ab" or "ac", then
    /// one or more "d": short enough to reason about, with a fork, a loop and an end.
    struct Fixture {
        vocabulary: Arc<GrammarVocabulary>,
        spec: ConstraintSpec,
        eos: u32,
    }

    fn fixture() -> Fixture {
        let (tokenizer, eos) = byte_tokenizer(&[]);
        let json = tokenizer.to_string(false).expect("test tokenizer serializes");
        let vocabulary = GrammarVocabulary::new(&json, eos as usize + 1, &[eos]).expect("vocabulary");
        Fixture { vocabulary, spec: ConstraintSpec::Regex("(ab|ac)d+".into()), eos }
    }

    impl Fixture {
        fn followed(&self) -> FollowedConstraint {
            FollowedConstraint::new(self.vocabulary.compile(&self.spec).expect("compiles"))
        }

        /// The mask after `output` from a state that never saw anything else.
        fn fresh(&self, output: &[u32]) -> TokenMask {
            let mut state = self.vocabulary.compile(&self.spec).expect("compiles");
            state.advance_all(output).expect("an output in the language");
            state.allowed().expect("mask")
        }
    }

    #[test]
    fn masks_after_any_sequence_of_outputs_equal_a_fresh_state_s() {
        let f = fixture();
        let mut followed = f.followed();
        // Forward, a branch switched (one token rolled back), further on, all the way back,
        // and the other branch again.
        for output in [&[A][..], &[A, B], &[A, C], &[A, C, D, D], &[], &[A, B, D]] {
            assert_eq!(followed.mask_after(output).unwrap(), Some(f.fresh(output)), "after {output:?}");
        }
        // Spot checks that the fresh masks are the language's, not merely equal to each other.
        let after_a = f.fresh(&[A]);
        assert_eq!(after_a.allowed().collect::<Vec<_>>(), [B, C]);
        assert!(f.fresh(&[A, B, D]).allows(f.eos) && !f.fresh(&[A, B]).allows(f.eos));
    }

    #[test]
    fn an_output_that_leaves_the_language_has_no_mask_and_does_not_derail_the_next() {
        let f = fixture();
        let mut followed = f.followed();
        assert_eq!(followed.mask_after(&[B]).unwrap(), None);
        assert_eq!(followed.mask_after(&[A, X, D]).unwrap(), None);
        assert_eq!(followed.mask_after(&[A, B]).unwrap(), Some(f.fresh(&[A, B])));
    }

    #[test]
    fn a_block_s_rows_are_the_masks_after_each_candidate_and_none_past_a_forbidden_one() {
        let f = fixture();
        let mut followed = f.followed();
        let rows = followed.block_masks(BlockMasks::Exact, &[A], &[B, D, X, D]).unwrap();
        let expected = vec![Some(f.fresh(&[A])), Some(f.fresh(&[A, B])), Some(f.fresh(&[A, B, D])), None, None];
        assert_eq!(rows, expected);
        // A first candidate forbidden: only the row before it has a mask.
        let rows = followed.block_masks(BlockMasks::Exact, &[A], &[X, B]).unwrap();
        assert_eq!(rows, vec![Some(f.fresh(&[A])), None, None]);
        // The next request starts where the coordinator committed, whatever the block moved.
        followed.block_masks(BlockMasks::Exact, &[A], &[B, D, D]).unwrap();
        assert_eq!(followed.mask_after(&[A, C]).unwrap(), Some(f.fresh(&[A, C])));
    }

    #[test]
    fn forbids_after_checks_the_one_token_in_the_output_s_state() {
        let f = fixture();
        let mut followed = f.followed();
        assert!(!followed.forbids_after(&[A], B).unwrap());
        assert!(followed.forbids_after(&[A], X).unwrap());
        // "ab" is not yet complete: the end is forbidden there, and allowed after a "d".
        assert!(followed.forbids_after(&[A, B], f.eos).unwrap());
        assert!(!followed.forbids_after(&[A, B, D], f.eos).unwrap());
        // After an output that left the language no mask applies, so nothing is forbidden.
        assert!(!followed.forbids_after(&[X], X).unwrap());
        assert!(followed.forbids_after(&[A, C], A).unwrap());
    }

    #[test]
    fn costly_masks_run_beside_the_pass_and_cheap_ones_before_it_with_the_same_result() {
        let f = fixture();
        let caller = std::thread::current().id();
        let masks = |c: &mut FollowedConstraint| {
            let mask = c.mask_after(&[A, B])?;
            Ok::<_, NodeError>((std::thread::current().id(), mask))
        };
        // Until measured, a constraint's masks are taken to cost a thread.
        let mut unmeasured = f.followed();
        let (passed, beside) = unmeasured.alongside(masks, || 7);
        let (thread, beside) = beside.unwrap();
        assert_eq!(passed, 7);
        assert_ne!(thread, caller);
        let mut cheap = FollowedConstraint { last_masks: Duration::ZERO, ..f.followed() };
        let (passed, inline) = cheap.alongside(masks, || 8);
        let (thread, inline) = inline.unwrap();
        assert_eq!((passed, thread), (8, caller));
        assert_eq!(beside, inline);
        assert_eq!(inline, Some(f.fresh(&[A, B])));
    }
}
