//! What a generation owes the nodes when it ends: the release of its session on the target
//! (by a guard, whichever way it ends) and of its draft sessions, run after its last reply.

use tracing::Instrument;

use crate::nodes::TargetClient;
use crate::session::draft_filing::DraftFiling;
use crate::session::draft_link::DraftLink;
use crate::session::round_report::Cursor;

/// Releases the target's session when the generation ends, whichever way: finish, error,
/// timeout or a client that went away (the actor's future is then dropped). The draft's
/// sessions are released by their [`DraftLink`] the same way.
#[derive(Debug)]
pub struct ReleaseGuard {
    session_id: String,
    /// `None` once released.
    target: Option<TargetClient>,
    /// Where the target's copy of the committed sequence stands once the generation has
    /// finished: its prefix cache keeps the committed tokens' rows. `None` (a generation that
    /// failed or was dropped): nothing is kept.
    last: Option<Cursor>,
}

impl ReleaseGuard {
    /// Guards session `session_id` on `target`.
    pub fn new(session_id: String, target: TargetClient) -> Self {
        Self { session_id, target: Some(target), last: None }
    }

    /// The generation finished with the target's cursor at `last`.
    pub fn set_last(&mut self, last: Cursor) {
        self.last = Some(last);
    }

    /// The session moves to `next`: the lost target's session is released in the background
    /// (if the node comes back, it gets nothing stale).
    pub fn move_to(&mut self, next: TargetClient) {
        if let Some(old) = self.target.replace(next) {
            let id = self.session_id.clone();
            tokio::spawn(
                async move {
                    let _ = old.release(id, None).await;
                }
                .instrument(tracing::Span::current()),
            );
        }
    }

    /// Releases now and waits for it, so that a draining server only stops once the nodes
    /// hold nothing of this generation; the drop below then has nothing left to do.
    async fn release_now(mut self) {
        let Some(target) = self.target.take() else { return };
        let last = self.last.as_ref().map(|c| (c.valid, c.pending.as_slice()));
        if let Err(err) = target.release(self.session_id.clone(), last).await {
            tracing::warn!(session = %self.session_id, %err, "target release failed");
        }
    }
}

impl Drop for ReleaseGuard {
    fn drop(&mut self) {
        let Some(target) = self.target.take() else { return };
        let id = self.session_id.clone();
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            tracing::warn!(session = %id, "no runtime to release node sessions on");
            return;
        };
        // Still the generation's span: the releases belong to its trace.
        let span = tracing::Span::current();
        let release = async move {
            if let Err(err) = target.release(id.clone(), None).await {
                tracing::warn!(session = %id, %err, "target release failed");
            }
        };
        runtime.spawn(release.instrument(span));
    }
}

/// The releases a finished generation still owes the nodes. They run after its last reply,
/// so that the client does not wait for them (across a 50 ms link to the draft, releasing is
/// a round trip, 6% of a 48-token generation), and before its stream closes, so that a
/// draining server still waits for them.
#[derive(Debug)]
pub struct PendingReleases {
    target: ReleaseGuard,
    draft: DraftOwed,
}

/// What a finished generation owes its draft.
#[derive(Debug)]
pub enum DraftOwed {
    /// The draft sessions it opened, released with the last one's cursor.
    Sessions(DraftLink),
    /// It ran without the draft: its committed sequence (prompt and output), to be filed
    /// there for the conversation's next turn. Like a release, two calls to the draft and
    /// not its pass over the turn, which the node runs after answering.
    Filing(DraftFiling, Vec<u32>),
    Nothing,
}

impl PendingReleases {
    pub fn new(target: ReleaseGuard, draft: DraftOwed) -> Self {
        Self { target, draft }
    }

    pub async fn release(self) {
        let draft = async {
            match self.draft {
                DraftOwed::Sessions(link) => link.close().await,
                DraftOwed::Filing(filing, committed) => filing.file(committed).await,
                DraftOwed::Nothing => {}
            }
        };
        tokio::join!(self.target.release_now(), draft);
    }
}
