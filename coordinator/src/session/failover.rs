//! What a generation does when a node fails it: which errors move the session to a spare
//! target, which go on without the draft, and which end the generation. Decisions only, so
//! that they are tested without a network; [`crate::session::target`] acts on them.

use std::future::Future;

use crate::error::CoordinatorError;

/// What the session does about an error.
#[derive(Debug)]
pub enum Recovery {
    /// The target was lost, and nothing of the round was committed or sent: go on on the next
    /// spare target, with everything committed so far.
    FailOver(CoordinatorError),
    /// The draft failed its part of the round: the same round again, target-only (the draft
    /// is an accelerator, never a dependency).
    WithoutDraft(CoordinatorError),
    /// The generation ends with this error.
    Fail(CoordinatorError),
}

/// Opening the session on the target replica picked failed with `err`. A replica that went
/// away before the session started (it was draining, or discovery has not caught up yet) is
/// replaced by a spare, where there is one; a node that refused the session refuses it for
/// every replica, and a lost one without a spare is the generation's error as it came.
pub fn after_open_error(err: CoordinatorError, spares_left: bool) -> Recovery {
    if err.is_node_loss() && spares_left { Recovery::FailOver(err) } else { Recovery::Fail(err) }
}

/// A round failed with `err` (`round::run_round` marks the losses it can recover from).
pub fn after_round_error(err: CoordinatorError) -> Recovery {
    match err {
        CoordinatorError::TargetLost(lost) => Recovery::FailOver(*lost),
        CoordinatorError::DraftLost(lost) => Recovery::WithoutDraft(*lost),
        err => Recovery::Fail(err),
    }
}

/// The first of `spares` that `open` opens, and what it opened; `None` when none is left that
/// does. The spares tried are used up: a later loss goes on from the next one, never back to
/// one that did not answer.
pub async fn first_that_opens<S, R, Fut>(
    spares: &mut impl Iterator<Item = S>,
    mut open: impl FnMut(S) -> Fut,
) -> Option<(S, R)>
where
    S: Copy,
    Fut: Future<Output = Option<R>>,
{
    for spare in spares.by_ref() {
        if let Some(opened) = open(spare).await {
            return Some((spare, opened));
        }
    }
    None
}

/// The error a generation ends with when its target is lost and no spare opens: the loss.
pub fn no_spare_left(lost: CoordinatorError) -> CoordinatorError {
    CoordinatorError::TargetLost(Box::new(lost))
}
