//! Batching across sessions on one model thread (issue #10).
//!
//! With batching on, and another session open to share a pass with, a node's jobs (a Verify,
//! a Propose, drafting ahead) no longer run on the model thread: each runs on a blocking
//! thread of its own against a [`RemoteModel`], whose forward passes are messages to the
//! model thread. The model thread takes the first forward it finds, gathers every other
//! forward already waiting (and, with a window, those arriving within it) up to a token
//! budget, and runs them as one ragged forward pass
//! ([`LanguageModel::forward_batch`]). So the jobs keep their plain, sequential code, and
//! concurrent sessions share the weights' pass: on a CPU a pass over 8 sessions' tokens costs
//! far less than 8 passes, and on a GPU nearly the same as one.
//!
//! Small operations (truncate, session length, open, release) are messages too and run at
//! once, also while a batch is being gathered: a session's truncate arriving just before its
//! forward does not push that forward out of the batch.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use tokio::sync::{mpsc, oneshot};

use crate::error::{ModelError, Result};
use crate::language_model::{
    ForwardItem, LanguageModel, Logits, ModelInfo, OpenedSession, PrefixCacheStats, PrefixRequest, SessionId,
};
use crate::token_tree::TokenTree;

/// The default wait for more sessions' forwards. Sessions of a node run their rounds out of
/// step (each also waits on the other node and the network), so taking only what is already
/// waiting leaves batches half full; a wait this short next to a forward pass (tens of ms on a
/// CPU) fills them, and it is paid only while other sessions are open.
pub const DEFAULT_WINDOW: Duration = Duration::from_millis(2);

/// See [`BatchPolicy::min_pass`].
pub const DEFAULT_MIN_PASS: Duration = Duration::from_millis(1);

/// How the model thread batches forward passes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BatchPolicy {
    /// Most sequences in one forward pass; 1 turns batching off (jobs run on the model
    /// thread itself, with no hand-offs).
    pub max_sequences: usize,
    /// Most tokens in one forward pass (long prefills are bounded by it); a single request
    /// above it still runs, alone.
    pub max_tokens: usize,
    /// After the first forward of a batch, how long to wait for more while fewer forwards are
    /// gathered than sessions are open, and never more than a tenth of a recent forward pass;
    /// zero takes only what is already waiting. A lone session never waits.
    pub window: Duration,
    /// Jobs are batched only while a forward pass takes at least this long (and another
    /// session is open): below it the hand-offs between threads (tens of µs per operation)
    /// cost more than sharing a pass saves, and jobs run on the model thread as without
    /// batching.
    pub min_pass: Duration,
}

impl BatchPolicy {
    /// No batching: every job runs on the model thread, one at a time.
    pub const UNBATCHED: Self =
        Self { max_sequences: 1, max_tokens: usize::MAX, window: Duration::ZERO, min_pass: Duration::ZERO };

    /// Whether jobs are batched.
    pub fn batched(&self) -> bool {
        self.max_sequences > 1
    }
}

impl Default for BatchPolicy {
    fn default() -> Self {
        Self { max_sequences: 16, max_tokens: 512, window: DEFAULT_WINDOW, min_pass: DEFAULT_MIN_PASS }
    }
}

/// Counters of the forward passes a model thread ran, for the mean batch size.
#[derive(Debug, Default)]
pub struct BatchCounters {
    passes: AtomicU64,
    sequences: AtomicU64,
    tokens: AtomicU64,
    /// Running average of a forward pass (a batch's, or a whole job's when unbatched), in
    /// ns; 0 before the first.
    pass_ns: AtomicU64,
    /// Sessions open on the model after the last message the model thread handled.
    open_sessions: AtomicUsize,
}

/// A snapshot of [`BatchCounters`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct BatchTotals {
    /// Forward passes run.
    pub passes: u64,
    /// Sequences they carried (Σ batch size).
    pub sequences: u64,
    /// Tokens they carried.
    pub tokens: u64,
}

impl BatchTotals {
    /// Mean sequences per forward pass (0 before any).
    pub fn mean_batch_size(&self) -> f64 {
        if self.passes == 0 { 0.0 } else { self.sequences as f64 / self.passes as f64 }
    }
}

impl BatchCounters {
    fn record(&self, sequences: usize, tokens: usize) {
        self.passes.fetch_add(1, Ordering::Relaxed);
        self.sequences.fetch_add(sequences as u64, Ordering::Relaxed);
        self.tokens.fetch_add(tokens as u64, Ordering::Relaxed);
    }

    /// Adds a pass (or an unbatched job) that took `took` to the running average.
    fn time_pass(&self, took: Duration) {
        let ns = took.as_nanos().min(u128::from(u64::MAX)) as u64;
        let mean = self.pass_ns.load(Ordering::Relaxed);
        // Only the model thread writes: load and store need no compare-and-swap.
        let next = if mean == 0 { ns } else { (mean as f64 + 0.2 * (ns as f64 - mean as f64)) as u64 };
        self.pass_ns.store(next.max(1), Ordering::Relaxed);
    }

    /// The running average of a forward pass (zero before the first).
    pub fn pass_time(&self) -> Duration {
        Duration::from_nanos(self.pass_ns.load(Ordering::Relaxed))
    }

    /// Sessions open on the model, as the model thread last counted them.
    pub fn open_sessions(&self) -> usize {
        self.open_sessions.load(Ordering::Relaxed)
    }

    fn count_open(&self, model: &dyn LanguageModel) {
        self.open_sessions.store(model.open_sessions(), Ordering::Relaxed);
    }

    /// The totals so far.
    pub fn totals(&self) -> BatchTotals {
        BatchTotals {
            passes: self.passes.load(Ordering::Relaxed),
            sequences: self.sequences.load(Ordering::Relaxed),
            tokens: self.tokens.load(Ordering::Relaxed),
        }
    }
}

/// Work for the model thread. It counts the sessions open before it replies, so that a caller
/// who has just opened or released one sees the count it left.
pub(crate) type Job = Box<dyn FnOnce(&mut dyn LanguageModel, &BatchCounters) + Send>;

/// One session's forward pass, waiting to share a batch. The reply carries the batch size.
pub(crate) struct ForwardRequest {
    session: SessionId,
    tokens: Vec<u32>,
    /// See [`ForwardItem::rows`].
    rows: usize,
    reply: oneshot::Sender<(Result<Logits>, usize)>,
}

/// What the model thread receives.
pub(crate) enum Message {
    /// Runs on the model thread as it is.
    Job(Job),
    /// A node's whole job run on the model thread (not batched): timed, since its time says
    /// whether batching would pay.
    Call(Job),
    /// Joins the next batch.
    Forward(ForwardRequest),
}

/// The model thread's loop: runs jobs as they come and forwards in batches, until every
/// sender is gone.
pub(crate) fn serve(
    model: &mut dyn LanguageModel,
    rx: &mut mpsc::Receiver<Message>,
    policy: BatchPolicy,
    counters: &BatchCounters,
) {
    // A forward that did not fit the last batch: it starts the next one, before anything newer.
    let mut carried: Option<ForwardRequest> = None;
    loop {
        let first = match carried.take() {
            Some(forward) => forward,
            None => match rx.blocking_recv() {
                Some(Message::Job(job)) => {
                    run_job(model, job, counters);
                    continue;
                }
                Some(Message::Call(job)) => {
                    let started = Instant::now();
                    run_job(model, job, counters);
                    counters.time_pass(started.elapsed());
                    continue;
                }
                Some(Message::Forward(forward)) => forward,
                None => return,
            },
        };
        let window = policy.window.min(counters.pass_time().mul_f64(WINDOW_SHARE));
        let (batch, left_over) = gather(model, rx, first, &policy, window, counters);
        let started = Instant::now();
        run_batch(model, batch, counters);
        counters.time_pass(started.elapsed());
        carried = left_over;
    }
}

fn run_job(model: &mut dyn LanguageModel, job: Job, counters: &BatchCounters) {
    // The reply sender lives in the job: a panic drops it, which the caller sees as an error,
    // and the sessions are counted after it instead.
    if std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| job(model, counters))).is_err() {
        counters.count_open(model);
    }
}

/// The wait for more forwards is at most this share of a recent forward pass: a fast model
/// (a table, a tiny test model) must not spend its time waiting for company.
const WINDOW_SHARE: f64 = 0.1;

/// Collects forwards behind `first` (at most `max_sequences` and `max_tokens`), running
/// other messages as they come, and waits up to `window` for more while other sessions are
/// open. A forward that would break the token budget (or repeats a session) is returned to
/// start the next batch.
fn gather(
    model: &mut dyn LanguageModel,
    rx: &mut mpsc::Receiver<Message>,
    first: ForwardRequest,
    policy: &BatchPolicy,
    window: Duration,
    counters: &BatchCounters,
) -> (Vec<ForwardRequest>, Option<ForwardRequest>) {
    let (max_sequences, max_tokens) = (policy.max_sequences, policy.max_tokens);
    let started = Instant::now();
    let mut tokens = first.tokens.len();
    let mut batch = vec![first];
    // Others can only join while other sessions are open (as the jobs last counted them).
    let open = counters.open_sessions();
    while batch.len() < max_sequences && tokens < max_tokens {
        match rx.try_recv() {
            Ok(Message::Job(job) | Message::Call(job)) => run_job(model, job, counters),
            Ok(Message::Forward(next)) => {
                let fits = tokens + next.tokens.len() <= max_tokens;
                let distinct = batch.iter().all(|f| f.session != next.session);
                if !(fits && distinct) {
                    return (batch, Some(next));
                }
                tokens += next.tokens.len();
                batch.push(next);
            }
            Err(mpsc::error::TryRecvError::Empty) if batch.len() < open && started.elapsed() < window => {
                std::thread::sleep(Duration::from_micros(50));
            }
            Err(_) => break,
        }
    }
    (batch, None)
}

/// Runs `batch` as one forward pass and answers every request with the batch size.
fn run_batch(model: &mut dyn LanguageModel, batch: Vec<ForwardRequest>, counters: &BatchCounters) {
    let items: Vec<ForwardItem<'_>> =
        batch.iter().map(|f| ForwardItem { session: f.session, tokens: &f.tokens, rows: f.rows }).collect();
    let size = items.len();
    let tokens = items.iter().map(|item| item.tokens.len()).sum();
    let results = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| model.forward_batch(&items)));
    counters.record(size, tokens);
    let results = results.unwrap_or_else(|_| {
        (0..size).map(|_| Err(ModelError::BatchFailed("the forward pass panicked".into()))).collect()
    });
    for (request, result) in batch.into_iter().zip(results) {
        let _ = request.reply.send((result, size));
    }
}

/// The model as a job running off the model thread sees it: every call is a message to the
/// model thread, and forwards wait to share a batch. For plain threads only (it blocks).
pub(crate) struct RemoteModel {
    tx: mpsc::Sender<Message>,
    info: Arc<ModelInfo>,
    last_batch_size: usize,
}

impl RemoteModel {
    pub(crate) fn new(tx: mpsc::Sender<Message>, info: Arc<ModelInfo>) -> Self {
        Self { tx, info, last_batch_size: 1 }
    }

    fn remote<R: Send + 'static>(
        &self,
        f: impl FnOnce(&mut dyn LanguageModel) -> Result<R> + Send + 'static,
    ) -> Result<R> {
        run_blocking(&self.tx, Message::Job, f)
    }
}

/// `f` as a job for the model thread, and where its result will come.
pub(crate) fn job<R, F>(f: F) -> (Job, oneshot::Receiver<Result<R>>)
where
    R: Send + 'static,
    F: FnOnce(&mut dyn LanguageModel) -> Result<R> + Send + 'static,
{
    let (reply, rx) = oneshot::channel();
    let job: Job = Box::new(move |m, counters| {
        let result = f(m);
        counters.count_open(m);
        let _ = reply.send(result);
    });
    (job, rx)
}

/// Sends `f` to the model thread as the message `wrap` makes of it and blocks for its result.
pub(crate) fn run_blocking<R, F>(tx: &mpsc::Sender<Message>, wrap: fn(Job) -> Message, f: F) -> Result<R>
where
    R: Send + 'static,
    F: FnOnce(&mut dyn LanguageModel) -> Result<R> + Send + 'static,
{
    let (job, rx) = job(f);
    tx.blocking_send(wrap(job)).map_err(|_| gone())?;
    rx.blocking_recv().map_err(|_| failed())?
}

pub(crate) fn gone() -> ModelError {
    ModelError::WorkerGone("the model thread has stopped".into())
}

pub(crate) fn failed() -> ModelError {
    ModelError::WorkerGone("the model thread failed while running the request".into())
}

impl LanguageModel for RemoteModel {
    fn info(&self) -> &ModelInfo {
        &self.info
    }

    fn open_session(&mut self, capacity: Option<usize>) -> Result<SessionId> {
        self.remote(move |m| m.open_session(capacity))
    }

    fn session_len(&self, session: SessionId) -> Result<usize> {
        self.remote(move |m| m.session_len(session))
    }

    fn fork_session(&mut self, source: SessionId, len: usize, capacity: Option<usize>) -> Result<SessionId> {
        self.remote(move |m| m.fork_session(source, len, capacity))
    }

    fn reserve(&mut self, session: SessionId, capacity: usize) -> Result<()> {
        self.remote(move |m| m.reserve(session, capacity))
    }

    fn open_with_prefix(&mut self, request: &PrefixRequest<'_>) -> Result<OpenedSession> {
        let (tokens, salt, capacity) = (request.tokens.to_vec(), request.salt.to_owned(), request.capacity);
        self.remote(move |m| m.open_with_prefix(&PrefixRequest { tokens: &tokens, salt: &salt, capacity }))
    }

    fn retire(&mut self, session: SessionId, salt: &str, committed: &[u32]) -> Result<()> {
        let (salt, committed) = (salt.to_owned(), committed.to_vec());
        self.remote(move |m| m.retire(session, &salt, &committed))
    }

    fn prefix_cache_stats(&self) -> Option<PrefixCacheStats> {
        self.remote(|m| Ok(m.prefix_cache_stats())).unwrap_or(None)
    }

    fn forward(&mut self, session: SessionId, tokens: &[u32]) -> Result<Logits> {
        self.forward_last(session, tokens, tokens.len())
    }

    fn forward_last(&mut self, session: SessionId, tokens: &[u32], rows: usize) -> Result<Logits> {
        let (reply, rx) = oneshot::channel();
        let request = ForwardRequest { session, tokens: tokens.to_vec(), rows, reply };
        self.tx.blocking_send(Message::Forward(request)).map_err(|_| gone())?;
        let (result, size) = rx.blocking_recv().map_err(|_| failed())?;
        self.last_batch_size = size;
        result
    }

    fn last_batch_size(&self) -> usize {
        self.last_batch_size
    }

    /// A tree pass runs alone on the model thread: a tree has a mask of its own, which a
    /// batch of sequences does not take. It and [`Self::keep_tree_path`] must reach the same
    /// model, whether or not the job's other passes are batched.
    fn forward_tree(&mut self, session: SessionId, tree: &TokenTree) -> Result<Logits> {
        let tree = tree.clone();
        self.last_batch_size = 1;
        self.remote(move |m| m.forward_tree(session, &tree))
    }

    fn keep_tree_path(&mut self, session: SessionId, base: usize, tree: &TokenTree, path: &[usize]) -> Result<()> {
        let (tree, path) = (tree.clone(), path.to_vec());
        self.remote(move |m| m.keep_tree_path(session, base, &tree, &path))
    }

    fn truncate(&mut self, session: SessionId, len: usize) -> Result<()> {
        self.remote(move |m| m.truncate(session, len))
    }

    fn release(&mut self, session: SessionId) -> Result<()> {
        self.remote(move |m| m.release(session))
    }

    fn set_memory_budget(&mut self, budget: Option<u64>) -> Result<()> {
        self.remote(move |m| m.set_memory_budget(budget))
    }

    fn memory_in_use(&self) -> (u64, Option<u64>) {
        self.remote(|m| Ok(m.memory_in_use())).unwrap_or((0, None))
    }

    fn open_sessions(&self) -> usize {
        self.remote(|m| Ok(m.open_sessions())).unwrap_or(0)
    }

    fn encode(&self, text: &str) -> Result<Vec<u32>> {
        let text = text.to_owned();
        self.remote(move |m| m.encode(&text))
    }

    fn decode(&self, ids: &[u32]) -> Result<String> {
        let ids = ids.to_vec();
        self.remote(move |m| m.decode(&ids))
    }
}
