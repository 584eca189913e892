//! The generation's session on a target replica: its round stream, what it holds of the
//! committed sequence, and the spares it moves to when the replica is lost
//! ([`crate::session::failover`] decides when).

use specd_proto::v1::OpenSessionRequest;

use crate::error::CoordinatorError;
use crate::nodes::prefix_routes::RouteNote;
use crate::nodes::{TargetClient, TargetRounds};
use crate::session::failover::{Recovery, after_open_error, first_that_opens, no_spare_left};
use crate::session::release::ReleaseGuard;
use crate::session::round_report::Cursor;

/// The session on the target replica serving it now.
#[derive(Debug)]
pub struct TargetSession<'a> {
    pub rounds: TargetRounds,
    pub cursor: Cursor,
    /// Whether the next round's pass also fills the cache with everything committed (the
    /// first round, and the first on a replica failed over to).
    pub refills: bool,
    /// The target the session runs on scores trees (`OpenSessionResponse.scores_trees`).
    pub scores_trees: bool,
    /// Prompt tokens the first target found in its prefix cache.
    pub cached_tokens: usize,
    release: ReleaseGuard,
    /// The replicas not tried yet, in order.
    spares: std::slice::Iter<'a, TargetClient>,
    /// The session's open request (id, prompt, sampling, seed, reservation): reused, with the
    /// committed tokens as the prompt, on a spare.
    open: OpenSessionRequest,
    /// Told where the session opens and moves, so that later prompts sharing this one's
    /// prefix follow it.
    route: RouteNote,
}

/// What opening the session on a target gave: its round stream, and whether it scores trees.
#[derive(Debug)]
struct Opened {
    rounds: TargetRounds,
    scores_trees: bool,
    cached_tokens: usize,
}

/// Opens the session and its round stream on `target`.
async fn open_on(target: &TargetClient, request: OpenSessionRequest) -> Result<Opened, CoordinatorError> {
    let opened = target.open_session(request).await?;
    let rounds = target.open_rounds().await?;
    Ok(Opened { rounds, scores_trees: opened.scores_trees, cached_tokens: opened.cached_tokens })
}

impl<'a> TargetSession<'a> {
    /// Opens the session on `target`, or on the first of `spares` that opens it when `target`
    /// went away before the session started, and tells `route` where it opened.
    pub async fn open(
        target: &TargetClient,
        spares: &'a [TargetClient],
        route: &RouteNote,
        open: OpenSessionRequest,
    ) -> Result<Self, CoordinatorError> {
        let mut release = ReleaseGuard::new(open.session_id.clone(), target.clone());
        let mut spares = spares.iter();
        let (on, opened) = match open_on(target, open.clone()).await {
            Ok(opened) => (target, opened),
            Err(err) => match after_open_error(err, spares.len() > 0) {
                Recovery::FailOver(lost) => {
                    let (next, opened) = fail_over(lost, &mut spares, &open, &open.prompt_token_ids).await?;
                    release.move_to(next.clone());
                    (next, opened)
                }
                Recovery::WithoutDraft(err) | Recovery::Fail(err) => return Err(err),
            },
        };
        route.opened_on(&on.address);
        let cursor = Cursor { valid: open.prompt_token_ids.len(), pending: Vec::new() };
        let Opened { rounds, scores_trees, cached_tokens } = opened;
        let route = route.clone();
        Ok(Self { rounds, cursor, refills: true, scores_trees, cached_tokens, release, spares, open, route })
    }

    /// The target was lost in a round: the session moves to the next spare that opens it,
    /// holding `committed` (the prompt and the output so far); the loss when none is left.
    pub async fn fail_over(&mut self, lost: CoordinatorError, committed: &[u32]) -> Result<(), CoordinatorError> {
        let (next, opened) = fail_over(lost, &mut self.spares, &self.open, committed).await?;
        self.release.move_to(next.clone());
        self.route.opened_on(&next.address);
        (self.rounds, self.scores_trees) = (opened.rounds, opened.scores_trees);
        self.cursor = Cursor { valid: committed.len(), pending: Vec::new() };
        self.refills = true;
        Ok(())
    }

    /// What the generation still owes the target when it ends: the release of its session,
    /// with where the target's copy of the committed sequence stands.
    pub fn into_release(mut self) -> ReleaseGuard {
        self.release.set_last(self.cursor);
        self.release
    }
}

/// Opens the session, holding `committed`, on the next of `spares` that answers.
async fn fail_over<'a>(
    lost: CoordinatorError,
    spares: &mut std::slice::Iter<'a, TargetClient>,
    open: &OpenSessionRequest,
    committed: &[u32],
) -> Result<(&'a TargetClient, Opened), CoordinatorError> {
    tracing::warn!(%lost, "target lost");
    let opened = first_that_opens(spares, |next: &'a TargetClient| {
        // The output so far stays output on the spare: its penalties count it.
        let prompt_len = open.prompt_token_ids.len() as u32;
        let request = OpenSessionRequest { prompt_token_ids: committed.to_vec(), prompt_len, ..open.clone() };
        async move {
            let opened = open_on(next, request).await;
            opened.inspect_err(|err| tracing::warn!(address = %next.address, %err, "spare target unavailable too")).ok()
        }
    })
    .await;
    let Some((next, opened)) = opened else { return Err(no_spare_left(lost)) };
    tracing::info!(address = %next.address, tokens = committed.len(), "moved to another target");
    Ok((next, opened))
}
