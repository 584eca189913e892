//! A session's link to its draft node. The draft is an accelerator, never a dependency: when
//! it cannot be reached, fails or times out, the session goes on with target-only rounds
//! (γ = 0, exact like every other round) and tries again later, with a fresh draft session
//! caught up on everything committed so far.

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use specd_proto::v1::{OpenSessionRequest, ProposeResponse};
use tracing::Instrument;

use crate::error::CoordinatorError;
use crate::nodes::{DraftClient, DraftRounds};
use crate::round::{Cursor, RoundReport};

/// First wait before trying a lost draft again; it doubles up to [`MAX_RETRY`].
pub const FIRST_RETRY: Duration = Duration::from_secs(1);
pub const MAX_RETRY: Duration = Duration::from_secs(30);

/// An open draft session: its id on the node, its round stream and what it holds of C.
#[derive(Debug)]
pub struct DraftSession {
    pub session_id: String,
    pub rounds: DraftRounds,
    pub cursor: Cursor,
    /// The last Propose asked the draft to draft the next block ahead.
    pub drafting_ahead: bool,
    /// Blocks the draft pushed ahead that no round has taken yet, oldest first.
    pub pushed: VecDeque<ProposeResponse>,
    /// For each Propose whose block was taken from a push, oldest first, the candidates of
    /// that block: its reply is still to come and must agree.
    pub unanswered: VecDeque<Vec<u32>>,
    /// The node has run a pass of this session: its cache holds the prompt.
    pub cache_filled: bool,
}

#[derive(Debug)]
enum State {
    // Boxed: a session with its stream is ten times the size of the waiting state.
    Up(Box<DraftSession>),
    Down { retry_at: Instant, wait: Duration },
}

/// The link; releases every draft session it opened when dropped.
#[derive(Debug)]
pub struct DraftLink {
    client: DraftClient,
    /// The session's open request (id, prompt, sampling, seed): reused, with the committed
    /// tokens as the prompt, to reopen.
    template: OpenSessionRequest,
    state: State,
    opened: Vec<String>,
    /// Times the draft was lost.
    pub fallbacks: u64,
}

impl DraftLink {
    /// Opens the draft's session and round stream; a draft that fails here is only logged.
    pub async fn open(client: DraftClient, template: OpenSessionRequest) -> Self {
        let mut link = Self {
            client,
            template,
            state: State::Down { retry_at: Instant::now(), wait: FIRST_RETRY / 2 },
            opened: Vec::new(),
            fallbacks: 0,
        };
        let session_id = link.template.session_id.clone();
        let prompt = link.template.prompt_token_ids.clone();
        if let Err(err) = link.connect(session_id, prompt).await {
            link.down(&err, "cannot open a draft session: decoding target-only for now");
        }
        link
    }

    /// Whether the draft's times in the next round will be a round's cost: its cache holds
    /// the prompt, and it catches up on at most the corrected token of its last round and one
    /// target-only round's token (a plain probe), which ride along with its first step.
    pub fn steady(&mut self) -> bool {
        self.session().is_some_and(|d| d.cache_filled && d.cursor.pending.len() <= 2)
    }

    /// The open draft session, if there is one.
    pub fn session(&mut self) -> Option<&mut DraftSession> {
        match &mut self.state {
            State::Up(session) => Some(session),
            State::Down { .. } => None,
        }
    }

    /// After a round: the draft's cursor follows the committed sequence.
    pub fn after_round(&mut self, base: usize, report: &RoundReport) {
        if let State::Up(session) = &mut self.state {
            if report.gamma > 0 {
                session.cache_filled = true;
                session.cursor.advance(base, &report.outcome);
            } else {
                session.cursor.append(&report.outcome.tokens);
            }
        }
    }

    /// The draft failed in a round: go on without it.
    pub fn lost(&mut self, err: &CoordinatorError) {
        self.fallbacks += 1;
        self.down(err, "draft lost: decoding target-only until it answers again");
    }

    /// When the draft is down and its wait is over, opens a fresh draft session holding
    /// `committed` (prompt and output so far).
    pub async fn reconnect_if_due(&mut self, committed: &[u32]) {
        let State::Down { retry_at, .. } = self.state else { return };
        if Instant::now() < retry_at {
            return;
        }
        let session_id = format!("{}.{}", self.template.session_id, self.opened.len());
        match self.connect(session_id, committed.to_vec()).await {
            Ok(()) => tracing::info!(address = %self.client.address, "draft back: speculating again"),
            Err(err) => self.down(&err, "draft still unavailable"),
        }
    }

    async fn connect(&mut self, session_id: String, prompt: Vec<u32>) -> Result<(), CoordinatorError> {
        let request =
            OpenSessionRequest { session_id: session_id.clone(), prompt_token_ids: prompt, ..self.template.clone() };
        let valid = request.prompt_token_ids.len();
        // Registered before the call: a session the node opened just as the call timed out
        // is released with the rest.
        self.opened.push(session_id.clone());
        self.client.open_session(request).await?;
        let rounds = self.client.open_rounds().await?;
        self.state = State::Up(Box::new(DraftSession {
            session_id,
            rounds,
            cursor: Cursor { valid, pending: Vec::new() },
            drafting_ahead: false,
            pushed: VecDeque::new(),
            unanswered: VecDeque::new(),
            cache_filled: false,
        }));
        Ok(())
    }

    fn down(&mut self, err: &CoordinatorError, what: &str) {
        let wait = match self.state {
            State::Down { wait, .. } => (wait * 2).min(MAX_RETRY),
            State::Up(_) => FIRST_RETRY,
        };
        tracing::warn!(address = %self.client.address, %err, retry_in_s = wait.as_secs_f64(), "{what}");
        self.state = State::Down { retry_at: Instant::now() + wait, wait };
    }
}

impl DraftLink {
    /// Releases every draft session of this link now and waits for it.
    pub async fn close(mut self) {
        for id in std::mem::take(&mut self.opened) {
            if let Err(err) = self.client.release(id.clone()).await {
                tracing::warn!(session = %id, %err, "draft release failed");
            }
        }
    }
}

impl Drop for DraftLink {
    fn drop(&mut self) {
        let (client, ids) = (self.client.clone(), std::mem::take(&mut self.opened));
        if ids.is_empty() {
            return;
        }
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            tracing::warn!(sessions = ?ids, "no runtime to release draft sessions on");
            return;
        };
        let release = async move {
            for id in ids {
                if let Err(err) = client.release(id.clone()).await {
                    tracing::warn!(session = %id, %err, "draft release failed");
                }
            }
        };
        // Still the generation's span: the releases belong to its trace.
        runtime.spawn(release.instrument(tracing::Span::current()));
    }
}
