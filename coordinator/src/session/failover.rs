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

#[cfg(test)]
mod tests {
    use super::*;
    use tonic::{Code, Status};

    fn node(code: Code) -> CoordinatorError {
        CoordinatorError::Node { role: "target", address: "http://t:1".into(), status: Status::new(code, "x") }
    }

    fn unreachable() -> CoordinatorError {
        CoordinatorError::Unreachable { role: "target", address: "http://t:1".into(), message: "refused".into() }
    }

    #[test]
    fn a_target_lost_before_the_session_opened_is_replaced_by_a_spare_where_there_is_one() {
        for lost in [unreachable(), node(Code::Unavailable), node(Code::DeadlineExceeded), node(Code::Unknown)] {
            assert!(matches!(after_open_error(lost, true), Recovery::FailOver(_)));
        }
        let closed = CoordinatorError::StreamClosed { role: "target", address: "http://t:1".into() };
        assert!(matches!(after_open_error(closed, true), Recovery::FailOver(_)));
        // Without a spare the loss is the generation's error as it came, not wrapped.
        let Recovery::Fail(err) = after_open_error(unreachable(), false) else { panic!("failed over to nothing") };
        assert!(matches!(err, CoordinatorError::Unreachable { .. }), "{err:?}");
    }

    #[test]
    fn a_target_that_refuses_the_session_is_not_asked_again_elsewhere() {
        for refused in [node(Code::InvalidArgument), node(Code::ResourceExhausted), node(Code::Internal)] {
            let Recovery::Fail(err) = after_open_error(refused, true) else { panic!("a refusal failed over") };
            assert!(matches!(err, CoordinatorError::Node { .. }), "{err:?}");
        }
        let protocol = CoordinatorError::Protocol("x".into());
        assert!(matches!(after_open_error(protocol, true), Recovery::Fail(CoordinatorError::Protocol(_))));
    }

    #[test]
    fn a_round_s_losses_fail_over_or_go_on_without_the_draft_and_anything_else_ends_the_generation() {
        let Recovery::FailOver(lost) = after_round_error(CoordinatorError::TargetLost(Box::new(unreachable()))) else {
            panic!("a lost target did not fail over")
        };
        assert!(matches!(lost, CoordinatorError::Unreachable { .. }), "{lost:?}");
        let draft_lost = CoordinatorError::DraftLost(Box::new(CoordinatorError::Protocol("bad block".into())));
        let Recovery::WithoutDraft(err) = after_round_error(draft_lost) else { panic!("a lost draft ended it") };
        assert_eq!(err.to_string(), "protocol: bad block");
        // A target error `run_round` did not mark as a loss (a refusal, a reply the rule
        // cannot use) ends the generation: the round may have been half used.
        for fatal in [node(Code::Unavailable), CoordinatorError::Protocol("bonus token".into())] {
            assert!(matches!(after_round_error(fatal), Recovery::Fail(_)));
        }
    }

    #[tokio::test]
    async fn failing_over_takes_the_first_spare_that_opens_and_uses_up_those_before_it() {
        let spares = ["a", "b", "c", "d"];
        let mut left = spares.iter().copied();
        let mut tried = Vec::new();
        let opens = |spare: &'static str, tried: &mut Vec<&str>| {
            tried.push(spare);
            std::future::ready((spare == "c").then_some(spare.len()))
        };
        let opened = first_that_opens(&mut left, |s| opens(s, &mut tried)).await;
        assert_eq!(opened, Some(("c", 1)));
        assert_eq!(tried, ["a", "b", "c"]);
        // The next loss goes on from the spare after it.
        assert_eq!(left.next(), Some("d"));
    }

    #[tokio::test]
    async fn with_no_spare_left_that_opens_the_loss_ends_the_generation() {
        let mut none = std::iter::empty::<&str>();
        assert_eq!(first_that_opens(&mut none, |_| std::future::ready(Some(()))).await, None);
        let mut failing = ["a", "b"].into_iter();
        assert_eq!(first_that_opens(&mut failing, |_| std::future::ready(None::<()>)).await, None);
        assert_eq!(failing.next(), None, "every spare was tried");
        let err = no_spare_left(unreachable());
        assert!(
            matches!(&err, CoordinatorError::TargetLost(lost) if matches!(**lost, CoordinatorError::Unreachable { .. }))
        );
        assert_eq!(err.code(), Code::Unavailable);
    }
}
