//! A session's link to its draft node. The draft is an accelerator, never a dependency: when
//! it cannot be reached, fails or times out, the session goes on with target-only rounds
//! (γ = 0, exact like every other round) and tries again later, with a fresh draft session
//! caught up on everything committed so far.

use specd_ngram::MatchSpan;
use std::collections::VecDeque;
use std::time::{Duration, Instant};

use specd_proto::v1::{OpenSessionRequest, ProposalSource, ProposeResponse};
use tokio::sync::oneshot;
use tracing::Instrument;

use crate::error::CoordinatorError;
use crate::nodes::load::ReplicaLease;
use crate::nodes::{DraftChoice, DraftClient, DraftRounds};
use crate::policy::copies::CopyChoice;
use crate::session::round_report::{Cursor, RoundReport};

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
    /// The draft's model has proposed a candidate of this session. A `model+ngram` draft
    /// answers from matches without running its model, so its model's first pass, which also
    /// runs the prompt through it, can come rounds after the first ([`first_model_pass`]).
    pub model_ran: bool,
    /// Whether a `model+ngram` draft's copies still pay in this session.
    pub copies: CopyChoice,
    /// A draft that proposes only after an n-gram match of these lengths
    /// ([`Self::has_nothing_for`]).
    pub proposes_only_after_match: Option<MatchSpan>,
    /// A `model+ngram` draft: the policy learns α from its model's draws alone
    /// ([`RoundReport::policy_acceptances`]), and [`Self::copies`] weighs the copies.
    pub copies_besides_model: bool,
    /// The draft draws trees from its model (`OpenSessionResponse.draws_trees`): a round of a
    /// generation with a tree shape asks it for one.
    pub draws_trees: bool,
    /// Prompt tokens its prefix cache held (`OpenSessionResponse.cached_tokens`).
    pub cached_tokens: usize,
}

impl DraftSession {
    /// Whether the draft is sure to propose nothing after `committed` (the prompt and the
    /// output so far): it proposes only after an n-gram match, the sequence ends in none,
    /// and no pushed block or late reply is on its way. Its own copy of the sequence is the
    /// same (it follows the rollback points), and it runs the same match (`specd-ngram`), so
    /// the round can run target-only without the round trip that would bring back nothing.
    /// (A block it drafted ahead on a right guess would have come from the same sequence,
    /// and so be empty too.)
    pub fn has_nothing_for(&self, committed: &[u32]) -> bool {
        let Some(span) = self.proposes_only_after_match else { return false };
        self.pushed.is_empty() && self.unanswered.is_empty() && specd_ngram::longest_match(committed, span).is_none()
    }
}

/// Whether a block with these candidate sources is the model's first of its session.
/// On the grounded bench prompts, whose ends match text earlier in the prompt, a
/// `model+ngram` draft's first blocks were copies; its model's first pass then ran 260 prompt
/// tokens in one round, which priced a draft step at 4.4 ms against a target pass of 2.9, and
/// the policy, remembering it for the sessions after, stopped drafting for all of them.
fn first_model_pass(model_ran: bool, sources: &[ProposalSource]) -> bool {
    !model_ran && proposed_by_model(sources)
}

fn proposed_by_model(sources: &[ProposalSource]) -> bool {
    sources.contains(&ProposalSource::Model)
}

/// What opening a draft session gives: the session, or why there is none.
type Opened = Result<DraftSession, CoordinatorError>;

#[derive(Debug)]
enum State {
    // Boxed: a session with its stream is ten times the size of the waiting state.
    Up(Box<DraftSession>),
    /// A draft session being opened in the background: rounds go on target-only meanwhile
    /// (across a 50 ms link, opening costs two round trips, 10% of a 48-token generation),
    /// and what they commit is pending for it.
    /// `wait`: the wait before this try, doubled if it fails.
    Opening {
        opened: oneshot::Receiver<Opened>,
        pending: Vec<u32>,
        wait: Duration,
    },
    Down {
        retry_at: Instant,
        wait: Duration,
    },
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
    /// A draft session has been open once: opening another is getting the draft back.
    was_up: bool,
    /// Times the draft was lost.
    pub fallbacks: u64,
    /// Prompt tokens the draft's prefix cache held when its first session opened.
    pub cached_tokens: usize,
    /// The choice of copies a draft session starts with: where earlier sessions left it.
    copies: CopyChoice,
    /// The generation counted on its draft replica while the link lives: until its sessions
    /// are released ([`Self::close`]), or dropped with a failed generation.
    _lease: ReplicaLease,
}

impl DraftLink {
    /// Starts opening the draft's session and round stream in the background; a draft that
    /// fails to open is only logged.
    pub fn start(choice: &DraftChoice, template: OpenSessionRequest, copies: CopyChoice) -> Self {
        let (client, _lease) = (choice.client.clone(), choice.engage());
        let (session_id, prompt) = (template.session_id.clone(), template.prompt_token_ids.clone());
        let state = open_in_background(&client, &template, session_id.clone(), prompt, FIRST_RETRY / 2, &copies);
        Self {
            client,
            template,
            state,
            opened: vec![session_id],
            was_up: false,
            fallbacks: 0,
            cached_tokens: 0,
            copies,
            _lease,
        }
    }

    /// The open draft session's choice of copies, where it has one to make (a `model+ngram`
    /// draft).
    pub fn copy_choice(&mut self) -> Option<&CopyChoice> {
        self.session().filter(|d| d.copies_besides_model).map(|d| &d.copies)
    }

    /// Waits for a draft session being opened, at most `grace` (`None`: until it is open or
    /// has failed).
    pub async fn wait_until_open(&mut self, grace: Option<Duration>) {
        let State::Opening { opened, .. } = &mut self.state else { return };
        let result = match grace {
            None => opened.await,
            Some(grace) => match tokio::time::timeout(grace, opened).await {
                Ok(result) => result,
                Err(_) => return,
            },
        };
        self.settle(result.ok());
    }

    /// Whether a draft session is being opened in the background.
    pub fn opening(&mut self) -> bool {
        self.settle_if_done();
        matches!(self.state, State::Opening { .. })
    }

    /// Whether the draft's times in the next round will be a round's cost: its cache holds
    /// the prompt, and it catches up on at most the corrected token of its last round and one
    /// target-only round's token (a plain probe), which ride along with its first step.
    pub fn steady(&mut self) -> bool {
        self.session().is_some_and(|d| d.cache_filled && d.cursor.pending.len() <= 2)
    }

    /// Whether `report`'s round was the first to ask the draft's model for a candidate: its
    /// draft time then holds the prompt's pass through the model, not a round's cost.
    pub fn first_model_pass(&mut self, report: &RoundReport) -> bool {
        self.session().is_some_and(|d| first_model_pass(d.model_ran, &report.sources))
    }

    /// The open draft session, if there is one (one opened in the background counts once it
    /// is).
    pub fn session(&mut self) -> Option<&mut DraftSession> {
        self.settle_if_done();
        match &mut self.state {
            State::Up(session) => Some(session),
            State::Opening { .. } | State::Down { .. } => None,
        }
    }

    /// After a round: the draft's cursor follows the committed sequence.
    pub fn after_round(&mut self, base: usize, report: &RoundReport) {
        match &mut self.state {
            State::Up(session) if report.drafted => {
                session.cache_filled = true;
                session.copies.observe(report, first_model_pass(session.model_ran, &report.sources));
                session.model_ran |= proposed_by_model(&report.sources);
                session.cursor.advance(base, report);
            }
            State::Up(session) => session.cursor.append(&report.outcome.tokens),
            State::Opening { pending, .. } => pending.extend_from_slice(&report.outcome.tokens),
            State::Down { .. } => {}
        }
    }

    /// The draft failed in a round: go on without it.
    pub fn lost(&mut self, err: &CoordinatorError) {
        self.fallbacks += 1;
        self.down(err, "draft lost: decoding target-only until it answers again");
    }

    /// When the draft is down and its wait is over, starts opening a fresh draft session
    /// holding `committed` (prompt and output so far) in the background.
    pub fn reconnect_if_due(&mut self, committed: &[u32]) {
        let State::Down { retry_at, wait } = self.state else { return };
        if Instant::now() < retry_at {
            return;
        }
        let session_id = format!("{}.{}", self.template.session_id, self.opened.len());
        // Registered before the call: a session the node opened just as the call timed out
        // is released with the rest.
        self.opened.push(session_id.clone());
        self.state =
            open_in_background(&self.client, &self.template, session_id, committed.to_vec(), wait, &self.copies);
    }

    fn settle_if_done(&mut self) {
        let State::Opening { opened, .. } = &mut self.state else { return };
        match opened.try_recv() {
            Err(oneshot::error::TryRecvError::Empty) => {}
            Ok(result) => self.settle(Some(result)),
            Err(oneshot::error::TryRecvError::Closed) => self.settle(None),
        }
    }

    /// Takes the result of an open: the session, holding what was committed meanwhile as
    /// pending, or a wait before the next try. `None`: the opening task ended without an
    /// answer.
    fn settle(&mut self, result: Option<Opened>) {
        let State::Opening { pending, .. } = &mut self.state else { return };
        let pending = std::mem::take(pending);
        let unanswered = || CoordinatorError::Unreachable {
            role: self.client.role,
            address: self.client.address.clone(),
            message: "opening the draft session ended without an answer".into(),
        };
        match result.unwrap_or_else(|| Err(unanswered())) {
            Ok(mut session) => {
                session.cursor.pending = pending;
                if !self.was_up {
                    self.cached_tokens = session.cached_tokens;
                }
                if self.was_up {
                    tracing::info!(address = %self.client.address, "draft back: speculating again");
                }
                self.was_up = true;
                self.state = State::Up(Box::new(session));
            }
            Err(err) if self.was_up => self.down(&err, "draft still unavailable"),
            Err(err) => self.down(&err, "cannot open a draft session: decoding target-only for now"),
        }
    }

    fn down(&mut self, err: &CoordinatorError, what: &str) {
        let wait = match self.state {
            State::Down { wait, .. } | State::Opening { wait, .. } => (wait * 2).min(MAX_RETRY),
            State::Up(_) => FIRST_RETRY,
        };
        tracing::warn!(address = %self.client.address, %err, retry_in_s = wait.as_secs_f64(), "{what}");
        self.state = State::Down { retry_at: Instant::now() + wait, wait };
    }
}

impl DraftLink {
    /// Releases every draft session of this link now and waits for it. One still being
    /// opened is released in the background once its open has ended (released before, the
    /// node would open it afterwards and keep it): a slow draft must not hold the
    /// generation's last reply.
    pub async fn close(mut self) {
        let (ids, in_flight, last) = self.take_sessions();
        if let Some((opened, id)) = in_flight {
            let later = release_when_opened(self.client.clone(), opened, id);
            tokio::spawn(later.instrument(tracing::Span::current()));
        }
        release(self.client.clone(), ids, last).await;
    }

    /// The ids of the sessions opened, the one being opened with its result to come, and the
    /// open session's cursor (its id and where its copy of the committed sequence stands).
    fn take_sessions(&mut self) -> Taken {
        let mut ids = std::mem::take(&mut self.opened);
        let down = State::Down { retry_at: Instant::now(), wait: MAX_RETRY };
        let (in_flight, last) = match std::mem::replace(&mut self.state, down) {
            // The session being opened is the last one registered.
            State::Opening { opened, .. } => (ids.pop().map(|id| (opened, id)), None),
            State::Up(session) => (None, Some((session.session_id, session.cursor))),
            State::Down { .. } => (None, None),
        };
        (ids, in_flight, last)
    }
}

/// What [`DraftLink::take_sessions`] takes: the ids opened, the one being opened with its
/// result to come, and the open session's id and cursor.
type Taken = (Vec<String>, Option<(oneshot::Receiver<Opened>, String)>, Option<(String, Cursor)>);

/// Releases `ids`; the one `last` names with its cursor, so that the node's copy of the
/// committed sequence ends complete (a suffix index learns from it).
async fn release(client: DraftClient, ids: Vec<String>, last: Option<(String, Cursor)>) {
    for id in ids {
        let cursor = last.as_ref().filter(|(last, _)| *last == id).map(|(_, c)| (c.valid, c.pending.as_slice()));
        if let Err(err) = client.release(id.clone(), cursor).await {
            tracing::warn!(session = %id, %err, "draft release failed");
        }
    }
}

async fn release_when_opened(client: DraftClient, opened: oneshot::Receiver<Opened>, id: String) {
    let _ = opened.await;
    release(client, vec![id], None).await;
}

impl Drop for DraftLink {
    fn drop(&mut self) {
        if self.opened.is_empty() {
            return;
        }
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            tracing::warn!(sessions = ?self.opened, "no runtime to release draft sessions on");
            return;
        };
        let (ids, in_flight, last) = self.take_sessions();
        let client = self.client.clone();
        let releases = async move {
            if let Some((opened, id)) = in_flight {
                release_when_opened(client.clone(), opened, id).await;
            }
            release(client, ids, last).await;
        };
        // Still the generation's span: the releases belong to its trace.
        runtime.spawn(releases.instrument(tracing::Span::current()));
    }
}

/// Starts opening draft session `session_id` holding `prompt` in the background, with the
/// template's sampling and seed: the state of a link while it opens. `wait`: the wait before
/// this try. The caller registers `session_id` for release.
fn open_in_background(
    client: &DraftClient,
    template: &OpenSessionRequest,
    session_id: String,
    prompt: Vec<u32>,
    wait: Duration,
    copies: &CopyChoice,
) -> State {
    // A draft that reconnects is sent the output so far after the prompt, as output.
    let prompt_len = template.prompt_token_ids.len() as u32;
    let request =
        OpenSessionRequest { session_id: session_id.clone(), prompt_token_ids: prompt, prompt_len, ..template.clone() };
    let (client, copies) = (client.clone(), copies.clone());
    let (send, opened) = oneshot::channel();
    let open = async move {
        let valid = request.prompt_token_ids.len();
        let result = async {
            let opened = client.open_session(request).await?;
            let rounds = client.open_rounds().await?;
            Ok(DraftSession {
                session_id,
                rounds,
                cursor: Cursor { valid, pending: Vec::new() },
                drafting_ahead: false,
                pushed: VecDeque::new(),
                unanswered: VecDeque::new(),
                cache_filled: false,
                model_ran: false,
                copies,
                proposes_only_after_match: opened.proposes_only_after_match,
                copies_besides_model: opened.copies_besides_model,
                draws_trees: opened.draws_trees,
                cached_tokens: opened.cached_tokens,
            })
        };
        // A link dropped meanwhile releases the session once this has ended.
        let _ = send.send(result.await);
    };
    // Still the generation's span: the calls belong to its trace.
    tokio::spawn(open.instrument(tracing::Span::current()));
    State::Opening { opened, pending: Vec::new(), wait }
}

#[cfg(test)]
mod tests {
    use super::first_model_pass;
    use specd_proto::v1::ProposalSource::{Model, OutputMatch, PromptMatch, Suffix};

    #[test]
    fn the_model_s_first_block_is_its_first_pass_whenever_it_comes() {
        // A model draft: its first block.
        assert!(first_model_pass(false, &[Model, Model]));
        // model+ngram: copies first, then the model's first candidate, then later ones.
        assert!(!first_model_pass(false, &[PromptMatch, PromptMatch]));
        assert!(first_model_pass(false, &[OutputMatch, Model]));
        assert!(!first_model_pass(true, &[Model, OutputMatch]));
        // Drafts without a model, and rounds that drafted nothing, never.
        assert!(!first_model_pass(false, &[Suffix, Suffix]));
        assert!(!first_model_pass(false, &[]));
    }
}
