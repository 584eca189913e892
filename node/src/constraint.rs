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
