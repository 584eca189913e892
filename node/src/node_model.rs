//! What both node roles share: a model on its worker thread and the sessions open on it,
//! each with a role-specific state `S` that knows its model session.

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use specd_model::{
    BatchPolicy, BoxedModel, DeviceSpec, LanguageModel, LoadOptions, ModelError, ModelHandle, ModelWorker, SessionId,
    Slowed, TeamPinning, load_model, pin_model_team,
};

use crate::faults::NodeFaults;
use crate::history::SessionHistory;
use crate::registry::{RegistryError, SessionRegistry};

/// Pass lengths built at start: 1 to MAX_GAMMA + 1 tokens, every verify block of one session
/// and every batched pass of up to that many tokens in all. Longer passes (prefills, larger
/// batches) build their kernels when they first come.
const WARM_UP_TOKENS: usize = specd_sampling::MAX_GAMMA as usize + 1;

/// What a node's model is wrapped in to stand in for another (benchmarks and tests; none in
/// service).
#[derive(Debug, Clone, Copy, Default)]
pub struct StandIn {
    /// Added to every forward pass ([`Slowed`]); zero: none.
    pub forward_delay: Duration,
    /// Faults a test injects (an allocation failure at pass N).
    pub faults: NodeFaults,
}

impl StandIn {
    fn wrap(self, model: BoxedModel) -> BoxedModel {
        let model: BoxedModel =
            if self.forward_delay.is_zero() { model } else { Box::new(Slowed::new(model, self.forward_delay)) };
        #[cfg(feature = "testing")]
        if let Some(pass) = self.faults.oom_at_pass {
            return Box::new(specd_model::InjectedOom::new(model, pass));
        }
        model
    }
}

/// A role's per-session state.
pub trait NodeSessionState: Clone + Send + 'static {
    fn model_session(&self) -> SessionId;
    /// After a failed job: the model may have truncated or extended the session's cache
    /// half-way, so nothing in it may be trusted any more.
    fn forget_cache(&mut self);
}

/// Why a session operation on a node failed.
#[derive(Debug, thiserror::Error)]
pub enum NodeSessionError {
    #[error("unknown session {0}")]
    Unknown(String),
    #[error(transparent)]
    Registry(#[from] RegistryError),
    #[error(transparent)]
    Model(#[from] ModelError),
}

/// A loaded model and its sessions. Cheap to clone: the state is shared.
#[derive(Debug)]
pub struct NodeModel<S> {
    model: ModelHandle,
    sessions: Arc<SessionRegistry<S>>,
}

impl<S> Clone for NodeModel<S> {
    fn clone(&self) -> Self {
        Self { model: self.model.clone(), sessions: Arc::clone(&self.sessions) }
    }
}

impl<S: NodeSessionState> NodeModel<S> {
    /// Loads `path` on a worker thread named `thread`, warms it up and gives it its KV
    /// budget (`options.kv_budget`, measured then); blocks until the model is ready.
    /// `stand_in` says what the model is wrapped in (in service: nothing); `batch` says
    /// how concurrent sessions' forward passes are batched; `pin_threads`: a CPU model's
    /// threads get one CPU each where they use them all ([`specd_model::pinning`]).
    pub fn load(
        thread: &str,
        path: &Path,
        options: LoadOptions,
        max_sessions: usize,
        stand_in: StandIn,
        batch: BatchPolicy,
        pin_threads: bool,
    ) -> Result<Self, ModelError> {
        let path = path.to_owned();
        let model = ModelWorker::spawn_batched(thread, 64, batch, move || {
            let mut model = load_model(&path, &options)?;
            let started = Instant::now();
            let passes = model.warm_up(WARM_UP_TOKENS)?;
            if passes > 0 {
                tracing::info!(passes, elapsed_ms = started.elapsed().as_millis() as u64, "model warmed up");
            }
            // Measured now and not at load: warm-up's kernels and workspaces take memory too.
            // On this thread, the model's: on CUDA its device is in use here.
            model.set_memory_budget(options.kv_budget.resolve(options.device)?)?;
            if pin_threads && options.device == DeviceSpec::Cpu {
                match pin_model_team() {
                    TeamPinning::Pinned { cpus } => tracing::info!(?cpus, "model threads pinned, one CPU each"),
                    TeamPinning::Unpinned(why) => tracing::info!(why, "model threads left to the scheduler"),
                }
            }
            Ok(stand_in.wrap(model))
        })?;
        Ok(Self { model, sessions: Arc::new(SessionRegistry::new(max_sessions)) })
    }

    pub fn handle(&self) -> &ModelHandle {
        &self.model
    }

    pub fn active_sessions(&self) -> usize {
        self.sessions.len()
    }

    /// Opens a model session for `history` (its prompt, and any output already committed) and
    /// registers the state `build` makes of it. The
    /// session reserves KV cache for `reach` tokens (at least the history and one more, at
    /// most the model's context; `None`: the whole context), admitted against the budget
    /// before any pass runs. Runs as its own task: a caller that goes away half-way (a deadline) cannot leave a
    /// model session that is open but not registered.
    pub async fn open(
        &self,
        id: String,
        history: SessionHistory,
        reach: Option<usize>,
        build: impl FnOnce(SessionId, SessionHistory) -> S + Send + 'static,
    ) -> Result<(), NodeSessionError> {
        let this = self.clone();
        tokio::spawn(async move { this.open_now(id, history, reach, build).await })
            .await
            .map_err(|e| NodeSessionError::Model(ModelError::WorkerGone(format!("open task failed: {e}"))))?
    }

    async fn open_now(
        &self,
        id: String,
        history: SessionHistory,
        reach: Option<usize>,
        build: impl FnOnce(SessionId, SessionHistory) -> S,
    ) -> Result<(), NodeSessionError> {
        self.sessions.check_new(&id)?;
        let vocab_size = self.model.info().vocab_size;
        if let Some(bad) = history.tokens().iter().find(|&&t| t as usize >= vocab_size) {
            return Err(ModelError::InvalidInput(format!(
                "prompt token {bad} is outside the vocabulary of {vocab_size}"
            ))
            .into());
        }
        let context = self.model.info().context_length;
        let capacity = reach.map(|r| r.max(history.len() + 1).min(context));
        let model_session = self.model.open_session(capacity).await?;
        if let Err((err, state)) = self.sessions.insert(id, build(model_session, history)) {
            let _ = self.model.release(state.model_session()).await;
            return Err(err.into());
        }
        Ok(())
    }

    /// Runs `job` against the model ([`ModelHandle::call`]) with a copy of the session's
    /// state. When it succeeds the session takes the state the job left; when it fails the
    /// session keeps the state it had, with its cache forgotten (see
    /// [`NodeSessionState::forget_cache`]). So a job may change its state freely, however far
    /// it gets.
    pub async fn run<R: Send + 'static, E: Send + 'static>(
        &self,
        id: &str,
        job: impl FnOnce(&mut dyn LanguageModel, &mut S) -> Result<R, E> + Send + 'static,
    ) -> Result<Result<R, E>, NodeSessionError> {
        let session = self.sessions.get(id).ok_or_else(|| NodeSessionError::Unknown(id.to_owned()))?;
        let mut state = session.lock().await;
        let snapshot = state.clone();
        let (updated, result) = self
            .model
            .call(move |m| {
                let mut state = snapshot;
                let result = job(m, &mut state);
                Ok((state, result))
            })
            .await?;
        match &result {
            Ok(_) => *state = updated,
            Err(_) => state.forget_cache(),
        }
        Ok(result)
    }

    /// Releases the session; `false` when it was not open. Runs as its own task, so that a
    /// caller that goes away cannot leave a session unregistered but still holding its cache.
    pub async fn release(&self, id: &str) -> Result<bool, NodeSessionError> {
        let Some(session) = self.sessions.remove(id) else {
            return Ok(false);
        };
        let model = self.model.clone();
        tokio::spawn(async move {
            let model_session = session.lock().await.model_session();
            model.release(model_session).await
        })
        .await
        .map_err(|e| NodeSessionError::Model(ModelError::WorkerGone(format!("release task failed: {e}"))))??;
        Ok(true)
    }

    /// Releases, every `ttl / 4`, the sessions unused for `ttl`: a coordinator that died
    /// without releasing them must not hold KV cache forever. Stops when the node is dropped.
    pub fn spawn_reaper(&self, ttl: Duration) {
        let (sessions, model) = (Arc::downgrade(&self.sessions), self.model.clone());
        let period = (ttl / 4).max(Duration::from_millis(50));
        tokio::spawn(async move {
            loop {
                tokio::time::sleep(period).await;
                let Some(sessions) = sessions.upgrade() else { return };
                for id in sessions.idle(ttl) {
                    let Some(session) = sessions.remove(&id) else { continue };
                    let model_session = session.lock().await.model_session();
                    match model.release(model_session).await {
                        Ok(()) => tracing::info!(session = %id, idle_s = ttl.as_secs_f64(), "released an idle session"),
                        Err(err) => tracing::warn!(session = %id, %err, "releasing an idle session failed"),
                    }
                }
            }
        });
    }

    pub async fn kv_cache_bytes(&self) -> Result<u64, NodeSessionError> {
        Ok(self.model.memory_in_use().await?.0)
    }
}
