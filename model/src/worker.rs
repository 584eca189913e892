//! One dedicated OS thread that owns the model and every session's KV cache.
//!
//! `tch::Tensor` is `Send` but not `Sync`, and libtorch wants one thread driving a model's
//! state, so nodes never share the model behind a mutex: they hold a clonable
//! [`ModelHandle`] that sends jobs over a bounded channel and awaits a one-shot reply. The
//! thread stops when every handle is gone. A job that panics inside libtorch fails only its
//! own request (the reply channel is dropped and the caller sees
//! [`ModelError::WorkerGone`]); the thread keeps serving.
//!
//! With a [`BatchPolicy`] that batches, jobs given to [`ModelHandle::call`] run off the
//! thread and their forward passes share batches with other sessions' (see [`crate::batching`]).

use std::sync::Arc;

use tokio::sync::mpsc;

use crate::batching::{
    BatchCounters, BatchPolicy, BatchTotals, Job, Message, RemoteModel, failed, gone, job, run_blocking, serve,
};
use crate::device::DeviceSpec;
use crate::error::{ModelError, Result};
use crate::kv_budget::{FreeMemory, free_memory};
use crate::language_model::{LanguageModel, Logits, ModelInfo, SessionId};

/// Starts model worker threads.
#[derive(Debug)]
pub struct ModelWorker;

impl ModelWorker {
    /// Spawns a thread named `name`, builds the model there with `factory` (under
    /// `tch::no_grad_guard`), and returns a handle once the model is loaded. `queue` bounds
    /// the number of waiting requests.
    pub fn spawn<M, F>(name: &str, queue: usize, factory: F) -> Result<ModelHandle>
    where
        M: LanguageModel + 'static,
        F: FnOnce() -> Result<M> + Send + 'static,
    {
        Self::spawn_batched(name, queue, BatchPolicy::UNBATCHED, factory)
    }

    /// [`Self::spawn`], with forward passes of concurrent jobs batched by `policy`.
    pub fn spawn_batched<M, F>(name: &str, queue: usize, policy: BatchPolicy, factory: F) -> Result<ModelHandle>
    where
        M: LanguageModel + 'static,
        F: FnOnce() -> Result<M> + Send + 'static,
    {
        let (tx, mut rx) = mpsc::channel::<Message>(queue.max(1));
        let counters = Arc::new(BatchCounters::default());
        let thread_counters = Arc::clone(&counters);
        let (ready_tx, ready_rx) = std::sync::mpsc::channel::<Result<ModelInfo>>();
        std::thread::Builder::new()
            .name(name.to_owned())
            .spawn(move || {
                let _guard = tch::no_grad_guard();
                let mut model = match factory() {
                    Ok(m) => m,
                    Err(e) => {
                        let _ = ready_tx.send(Err(e));
                        return;
                    }
                };
                let _ = ready_tx.send(Ok(model.info().clone()));
                serve(&mut model, &mut rx, policy, &thread_counters);
            })
            .map_err(|e| ModelError::WorkerGone(format!("cannot spawn thread: {e}")))?;
        let info = ready_rx.recv().map_err(|_| ModelError::WorkerGone("the worker died while loading".into()))??;
        Ok(ModelHandle { tx, info: Arc::new(info), policy, counters })
    }
}

/// A clonable handle to a model worker. Async methods for use inside a runtime;
/// `*_blocking` methods for plain threads (they must not be called from async code).
#[derive(Debug, Clone)]
pub struct ModelHandle {
    tx: mpsc::Sender<Message>,
    info: Arc<ModelInfo>,
    policy: BatchPolicy,
    counters: Arc<BatchCounters>,
}

impl ModelHandle {
    /// The model's static facts.
    pub fn info(&self) -> &ModelInfo {
        &self.info
    }

    /// How this worker batches.
    pub fn batch_policy(&self) -> BatchPolicy {
        self.policy
    }

    /// Forward passes run so far in batches, and the sequences they carried.
    pub fn batch_totals(&self) -> BatchTotals {
        self.counters.totals()
    }

    /// Sends `f` to the model thread as the message `wrap` makes of it and awaits its result.
    async fn on_thread<R, F>(&self, wrap: fn(Job) -> Message, f: F) -> Result<R>
    where
        R: Send + 'static,
        F: FnOnce(&mut dyn LanguageModel) -> Result<R> + Send + 'static,
    {
        self.queue(wrap, f).await?.result().await
    }

    async fn queue<R, F>(&self, wrap: fn(Job) -> Message, f: F) -> Result<QueuedJob<R>>
    where
        R: Send + 'static,
        F: FnOnce(&mut dyn LanguageModel) -> Result<R> + Send + 'static,
    {
        let (job, rx) = job(f);
        self.tx.send(wrap(job)).await.map_err(|_| gone())?;
        Ok(QueuedJob(rx))
    }

    /// Queues `f` on the worker thread itself, like [`Self::call_on_thread`], and returns as
    /// soon as it is queued. The thread takes its messages in order, so whatever is sent to
    /// it afterwards runs after `f`: a caller can go on without waiting for `f` to finish.
    pub async fn queue_on_thread<R, F>(&self, f: F) -> Result<QueuedJob<R>>
    where
        R: Send + 'static,
        F: FnOnce(&mut dyn LanguageModel) -> Result<R> + Send + 'static,
    {
        self.queue(Message::Job, f).await
    }

    /// Runs `f` against the model and awaits its result: on the worker thread, or, when the
    /// worker batches (and passes are slow enough for it to pay), on a blocking thread whose
    /// forward passes join the worker's batches.
    pub async fn call<R, F>(&self, f: F) -> Result<R>
    where
        R: Send + 'static,
        F: FnOnce(&mut dyn LanguageModel) -> Result<R> + Send + 'static,
    {
        if self.batching_pays() {
            let mut remote = RemoteModel::new(self.tx.clone(), Arc::clone(&self.info));
            return tokio::task::spawn_blocking(move || f(&mut remote)).await.map_err(|_| failed())?;
        }
        self.on_thread(Message::Call, f).await
    }

    /// Whether jobs go through batching now: the policy batches, another session is open to
    /// share a pass with, and passes are slow enough ([`BatchPolicy::min_pass`]; with a
    /// minimum, the first job, not yet timed, runs unbatched). A lone session's job runs on
    /// the model thread: its forwards could only ever make batches of one, and each would
    /// still pay the hand-offs between threads.
    fn batching_pays(&self) -> bool {
        let min = self.policy.min_pass;
        let pass = self.counters.pass_time();
        self.policy.batched()
            && self.counters.open_sessions() >= 2
            && (min.is_zero() || (!pass.is_zero() && pass >= min))
    }

    /// Runs `f` on the worker thread itself (small operations, never batched).
    pub async fn call_on_thread<R, F>(&self, f: F) -> Result<R>
    where
        R: Send + 'static,
        F: FnOnce(&mut dyn LanguageModel) -> Result<R> + Send + 'static,
    {
        self.on_thread(Message::Job, f).await
    }

    /// Runs `f` against the model and blocks until it is done (batched like [`Self::call`]).
    pub fn call_blocking<R, F>(&self, f: F) -> Result<R>
    where
        R: Send + 'static,
        F: FnOnce(&mut dyn LanguageModel) -> Result<R> + Send + 'static,
    {
        if self.batching_pays() {
            let mut remote = RemoteModel::new(self.tx.clone(), Arc::clone(&self.info));
            return f(&mut remote);
        }
        run_blocking(&self.tx, Message::Call, f)
    }

    /// See [`LanguageModel::open_session`].
    pub async fn open_session(&self, capacity: Option<usize>) -> Result<SessionId> {
        self.call_on_thread(move |m| m.open_session(capacity)).await
    }

    /// See [`LanguageModel::forward`].
    pub async fn forward(&self, session: SessionId, tokens: Vec<u32>) -> Result<Logits> {
        self.call(move |m| m.forward(session, &tokens)).await
    }

    /// Truncates to `len` then forwards `tokens`: one round's work in one message.
    pub async fn truncate_and_forward(&self, session: SessionId, len: usize, tokens: Vec<u32>) -> Result<Logits> {
        self.call(move |m| {
            m.truncate(session, len)?;
            m.forward(session, &tokens)
        })
        .await
    }

    /// See [`LanguageModel::truncate`].
    pub async fn truncate(&self, session: SessionId, len: usize) -> Result<()> {
        self.call_on_thread(move |m| m.truncate(session, len)).await
    }

    /// See [`LanguageModel::release`].
    pub async fn release(&self, session: SessionId) -> Result<()> {
        self.call_on_thread(move |m| m.release(session)).await
    }

    /// See [`LanguageModel::session_len`].
    pub async fn session_len(&self, session: SessionId) -> Result<usize> {
        self.call_on_thread(move |m| m.session_len(session)).await
    }

    /// See [`LanguageModel::memory_in_use`].
    pub async fn memory_in_use(&self) -> Result<(u64, Option<u64>)> {
        self.call_on_thread(|m| Ok(m.memory_in_use())).await
    }

    /// See [`LanguageModel::set_memory_budget`].
    pub async fn set_memory_budget(&self, budget: Option<u64>) -> Result<()> {
        self.call_on_thread(move |m| m.set_memory_budget(budget)).await
    }

    /// The free memory of `device`, the model's, read on the model's thread: on CUDA the
    /// runtime answers for the thread's current device, and there the device is in use
    /// already ([`crate::kv_budget::free_memory`]).
    pub async fn free_memory(&self, device: DeviceSpec) -> Result<FreeMemory> {
        self.call_on_thread(move |_| free_memory(device)).await
    }

    /// See [`LanguageModel::encode`].
    pub async fn encode(&self, text: String) -> Result<Vec<u32>> {
        self.call_on_thread(move |m| m.encode(&text)).await
    }

    /// Blocking [`Self::open_session`].
    pub fn open_session_blocking(&self, capacity: Option<usize>) -> Result<SessionId> {
        self.call_blocking(move |m| m.open_session(capacity))
    }

    /// Blocking [`Self::forward`].
    pub fn forward_blocking(&self, session: SessionId, tokens: Vec<u32>) -> Result<Logits> {
        self.call_blocking(move |m| m.forward(session, &tokens))
    }

    /// Blocking [`Self::truncate`].
    pub fn truncate_blocking(&self, session: SessionId, len: usize) -> Result<()> {
        self.call_blocking(move |m| m.truncate(session, len))
    }

    /// Blocking [`Self::release`].
    pub fn release_blocking(&self, session: SessionId) -> Result<()> {
        self.call_blocking(move |m| m.release(session))
    }

    /// Blocking [`Self::encode`].
    pub fn encode_blocking(&self, text: String) -> Result<Vec<u32>> {
        self.call_blocking(move |m| m.encode(&text))
    }
}

/// A job queued on the model thread ([`ModelHandle::queue_on_thread`]), its result to come.
#[derive(Debug)]
pub struct QueuedJob<R>(tokio::sync::oneshot::Receiver<Result<R>>);

impl<R> QueuedJob<R> {
    /// What the job returned, once it has run.
    pub async fn result(self) -> Result<R> {
        self.0.await.map_err(|_| failed())?
    }
}
