//! What both node roles share: a model on its worker thread and the sessions open on it,
//! each with a role-specific state `S` that knows its model session.

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use specd_model::{
    BatchPolicy, BoxedModel, DeviceSpec, LanguageModel, LoadOptions, ModelError, ModelHandle, ModelWorker, PrefixCache,
    PrefixCacheOptions, PrefixRequest, SessionId, Slowed, TeamPinning, load_model, pin_model_team,
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
    fn history(&self) -> &SessionHistory;
    fn history_mut(&mut self) -> &mut SessionHistory;
    /// What the prefix cache files the session's KV under.
    fn cache_salt(&self) -> &str;
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
    /// What an ended session's cache is filed with ([`Retiring`]).
    retiring: Retiring,
}

/// How [`retire`] files an ended session's rows in the prefix cache.
#[derive(Debug, Clone, Copy, Default)]
pub struct Retiring {
    /// Run the committed tokens the session's cache lacks through the model first, so that
    /// the whole committed sequence is filed: the tokens committed after its last pass (a
    /// draft's, by target-only rounds and the last corrected token), or all of them for a
    /// session opened only to file a conversation it never served
    /// (`coordinator::session::draft_filing`). A draft's store then holds every turn, which the
    /// next turn of the conversation would otherwise prefill on its critical path. A target's
    /// cache lacks only the last token, and a pass for it would cost a busy node a pass per
    /// request: targets do not.
    pub fills_missing_rows: bool,
    /// A test's broken store ([`NodeFaults::prefix_cache_keeps_rejected_rows`]).
    pub keeps_rejected_rows: bool,
}

impl<S> Clone for NodeModel<S> {
    fn clone(&self) -> Self {
        Self { model: self.model.clone(), sessions: Arc::clone(&self.sessions), retiring: self.retiring }
    }
}

impl<S: NodeSessionState> NodeModel<S> {
    /// Loads `path` on a worker thread named `thread`, warms it up and gives it its KV
    /// budget (`options.kv_budget`, measured then); blocks until the model is ready.
    /// `stand_in` says what the model is wrapped in (in service: nothing); `batch` says
    /// how concurrent sessions' forward passes are batched; `pin_threads`: a CPU model's
    /// threads get one CPU each where they use them all ([`specd_model::pinning`]);
    /// `prefix_cache`: whether ended sessions' KV is kept ([`specd_model::prefix_cache`]).
    #[allow(clippy::too_many_arguments)]
    pub fn load(
        thread: &str,
        path: &Path,
        options: LoadOptions,
        max_sessions: usize,
        stand_in: StandIn,
        batch: BatchPolicy,
        pin_threads: bool,
        prefix_cache: PrefixCacheOptions,
    ) -> Result<Self, ModelError> {
        let path = path.to_owned();
        let keeps_rejected_rows = stand_in.faults.prefix_cache_keeps_rejected_rows();
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
            let model: BoxedModel = if prefix_cache.enabled {
                tracing::info!(min_tokens = prefix_cache.min_tokens, "prefix cache on");
                Box::new(PrefixCache::new(model, prefix_cache.min_tokens))
            } else {
                model
            };
            Ok(stand_in.wrap(model))
        })?;
        let retiring = Retiring { fills_missing_rows: false, keeps_rejected_rows };
        Ok(Self { model, sessions: Arc::new(SessionRegistry::new(max_sessions)), retiring })
    }

    /// Ended sessions' caches are completed before they are filed ([`Retiring`]); only where
    /// the model has a prefix cache does it matter.
    pub fn filling_missing_rows(mut self, fills: bool) -> Self {
        self.retiring.fills_missing_rows = fills;
        self
    }

    pub fn handle(&self) -> &ModelHandle {
        &self.model
    }

    pub fn active_sessions(&self) -> usize {
        self.sessions.len()
    }

    /// Opens a model session for `history` (its prompt, and any output already committed),
    /// from the longest prefix of it the prefix cache holds under `salt`, and registers the
    /// state `build` makes of it; returns how many tokens the cache held. The session
    /// reserves KV cache for `reach` tokens (at least the history and one more, at most the
    /// model's context; `None`: the whole context), admitted against the budget before any
    /// pass runs. Runs as its own task: a caller that goes away half-way (a deadline) cannot
    /// leave a model session that is open but not registered.
    pub async fn open(
        &self,
        id: String,
        history: SessionHistory,
        reach: Option<usize>,
        salt: String,
        build: impl FnOnce(SessionId, SessionHistory) -> S + Send + 'static,
    ) -> Result<usize, NodeSessionError> {
        let this = self.clone();
        tokio::spawn(async move { this.open_now(id, history, reach, salt, build).await })
            .await
            .map_err(|e| NodeSessionError::Model(ModelError::WorkerGone(format!("open task failed: {e}"))))?
    }

    async fn open_now(
        &self,
        id: String,
        mut history: SessionHistory,
        reach: Option<usize>,
        salt: String,
        build: impl FnOnce(SessionId, SessionHistory) -> S,
    ) -> Result<usize, NodeSessionError> {
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
        let tokens = history.tokens().to_vec();
        let opened = self
            .model
            .call_on_thread(move |m| m.open_with_prefix(&PrefixRequest { tokens: &tokens, salt: &salt, capacity }))
            .await?;
        history.mark_cached_to(opened.reused);
        if let Err((err, state)) = self.sessions.insert(id, build(opened.session, history)) {
            let _ = self.model.release(state.model_session()).await;
            return Err(err.into());
        }
        Ok(opened.reused)
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

    /// Releases the session; `false` when it was not open. `last`: its final rollback point
    /// and the tokens committed after it, which say which of its cache's rows are committed:
    /// those go to the prefix cache (where the model has one), the rest are dropped. Without
    /// them nothing is kept. Runs as its own task, so that a caller that goes away cannot
    /// leave a session unregistered but still holding its cache.
    ///
    /// Returns once [`retire`] is queued on the model thread, not once it has run: the
    /// thread runs its jobs in order, so the next session opened here (a conversation's next
    /// turn) finds what it files, and no caller waits for a draft's fill pass
    /// ([`Retiring::fills_missing_rows`]). A retire that fails is logged.
    pub async fn release(&self, id: &str, last: Option<(usize, Vec<u32>)>) -> Result<bool, NodeSessionError> {
        let Some(session) = self.sessions.remove(id) else {
            return Ok(false);
        };
        let (model, retiring, id) = (self.model.clone(), self.retiring, id.to_owned());
        let (queued, is_queued) = tokio::sync::oneshot::channel();
        tokio::spawn(async move {
            let state = session.lock().await.clone();
            let job = match model.queue_on_thread(move |m| retire(m, state, last, retiring)).await {
                Ok(job) => job,
                Err(err) => {
                    let _ = queued.send(Err(err));
                    return;
                }
            };
            let _ = queued.send(Ok(()));
            if let Err(err) = job.result().await {
                tracing::warn!(session = %id, %err, "ending a released session failed");
            }
        });
        let gone = || ModelError::WorkerGone("the release task ended before queuing its job".into());
        is_queued.await.map_err(|_| gone())??;
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

/// The most committed tokens a draft runs through its model when a session ends
/// ([`Retiring::fills_missing_rows`]): a turn's user message and reply, not a long prompt
/// no pass has seen. At the host engine's prefill of a 0.6 B-shaped model on 2 CPU cores
/// (about 200 tokens/s, BENCHMARKS.md), 512 tokens hold the model thread for 2.5 s.
const MAX_FILL_TOKENS: usize = 512;

/// Ends `state`'s model session: its cache trimmed to the rows of committed tokens (as the
/// next round would trim it, `last` being that round's rollback point and pending tokens),
/// which the model's prefix cache keeps. A history that cannot follow `last` (it has not seen
/// that far), or no `last`, keeps nothing. With `retiring.fills_missing_rows`, the committed
/// tokens the cache lacks are run through the model first, and a pass that fails keeps
/// nothing. `retiring.keeps_rejected_rows` is a test's broken store: the cache is not
/// trimmed, and its rows past the rollback point are filed under the committed tokens' ids.
fn retire<S: NodeSessionState>(
    model: &mut dyn LanguageModel,
    mut state: S,
    last: Option<(usize, Vec<u32>)>,
    retiring: Retiring,
) -> Result<(), ModelError> {
    let session = state.model_session();
    let Some((valid, pending)) = last else { return model.release(session) };
    let history = state.history_mut();
    let rows = history.cached();
    let Ok(catch_up) = history.catch_up(valid, &pending) else { return model.release(session) };
    if retiring.keeps_rejected_rows {
        let filed = rows.min(history.tokens().len());
        return model.retire(session, state.cache_salt(), &state.history().tokens()[..filed]);
    }
    if catch_up.apply_to_cache(model, session).is_err() {
        return model.release(session);
    }
    // A fill longer than MAX_FILL_TOKENS would hold the model thread, and every live
    // session's next pass, for a long prefill: such a session keeps what it has, and its
    // conversation's next turn prefills the rest, as without filling. One at the context's
    // end is not filed either way (its entry would need a row past the context).
    let fills = retiring.fills_missing_rows
        && !catch_up.feed.is_empty()
        && catch_up.feed.len() <= MAX_FILL_TOKENS
        && history.len() < model.info().context_length;
    if fills {
        // One row of logits is asked for, and dropped: only the cache's rows are wanted.
        if model.forward_last(session, &catch_up.feed, 1).is_err() {
            return model.release(session);
        }
        history.mark_cached();
    }
    let committed = history.cached();
    model.retire(session, state.cache_salt(), &state.history().tokens()[..committed])
}

#[cfg(test)]
mod tests {
    use specd_model::{PrefixRequest, TableModel};

    use super::*;

    #[derive(Debug, Clone)]
    struct State {
        session: SessionId,
        history: SessionHistory,
    }

    impl NodeSessionState for State {
        fn model_session(&self) -> SessionId {
            self.session
        }
        fn history(&self) -> &SessionHistory {
            &self.history
        }
        fn history_mut(&mut self) -> &mut SessionHistory {
            &mut self.history
        }
        fn cache_salt(&self) -> &str {
            ""
        }
        fn forget_cache(&mut self) {
            self.history.forget_cache();
        }
    }

    /// A table model under a prefix cache, with a session that scored a block of three
    /// candidates after a 40-token prompt, of which the first was accepted and the second
    /// replaced by 1, ended by `retire` as `retiring` says. The table scores a 2 after the
    /// rejected 6 apart from a 2 after anything else, so the next turn can tell which row
    /// was filed.
    fn ended_after_a_rejection(retiring: Retiring) -> (PrefixCache<TableModel>, Vec<u32>) {
        let after_6_2 = [0.65, 0.05, 0.05, 0.05, 0.05, 0.05, 0.05, 0.05];
        let rules = serde_json::json!([{"suffix": [6, 2], "probs": after_6_2}]);
        let table = serde_json::json!({"vocab_size": 8, "default": vec![0.125; 8], "rules": rules});
        let mut model = PrefixCache::new(TableModel::from_json("t", table, None).unwrap(), 16);
        let prompt: Vec<u32> = (0..40).map(|i| i % 7).collect();
        let opened = model.open_with_prefix(&PrefixRequest { tokens: &prompt, salt: "", capacity: Some(64) }).unwrap();
        let mut history = SessionHistory::new(prompt.clone()).unwrap();
        let catch_up = history.catch_up(prompt.len(), &[]).unwrap();
        model.forward(opened.session, &catch_up.feed).unwrap();
        history.mark_cached();
        model.forward(opened.session, &[5, 6, 7]).unwrap();
        history.push_forwarded(&[5, 6, 7]);
        let state = State { session: opened.session, history };
        retire(&mut model, state, Some((prompt.len() + 1, vec![1])), retiring).unwrap();
        (model, prompt)
    }

    /// What the next turn (the prompt, the accepted 5, the corrected 1, then 2, 3) finds
    /// after [`ended_after_a_rejection`]: the tokens filed, the tokens it reuses, and whether
    /// the 2 it scores reads the corrected 1 before it (a row filed from the rejected 6 reads
    /// as a 6).
    fn next_turn(model: &mut PrefixCache<TableModel>, prompt: &[u32]) -> (usize, usize, bool) {
        let stats = model.prefix_cache_stats().unwrap();
        assert_eq!(stats.entries, 1, "{stats:?}");
        let mut next = prompt.to_vec();
        next.extend([5, 1, 2, 3]);
        let opened = model.open_with_prefix(&PrefixRequest { tokens: &next, salt: "", capacity: Some(64) }).unwrap();
        let logits = model.forward(opened.session, &next[opened.reused..]).unwrap();
        let two = next.len() - 2 - opened.reused;
        let reads_the_1 = logits.row(two).unwrap().windows(2).all(|w| w[0] == w[1]);
        model.release(opened.session).unwrap();
        (stats.tokens, opened.reused, reads_the_1)
    }

    /// The cache keeps the prompt and the accepted candidate, and neither the rejected
    /// candidate's row (which the corrected token would be filed over) nor the corrected
    /// token's, which no pass has fed. The broken store files the rejected 6's row under the
    /// corrected 1: one token more, which the next turn reuses and reads as a 6.
    #[test]
    fn an_ended_session_leaves_the_rows_of_its_committed_tokens_only() {
        let (mut model, prompt) = ended_after_a_rejection(Retiring::default());
        assert_eq!(next_turn(&mut model, &prompt), (prompt.len() + 1, prompt.len() + 1, true));

        // Without the final rollback point nothing is kept.
        let (mut model, prompt) = ended_after_a_rejection(Retiring::default());
        let mut next = prompt.clone();
        next.extend([5, 1, 2, 3]);
        let opened = model.open_with_prefix(&PrefixRequest { tokens: &next, salt: "", capacity: Some(64) }).unwrap();
        let state = State { session: opened.session, history: SessionHistory::new(next).unwrap() };
        retire(&mut model, state, None, Retiring::default()).unwrap();
        assert_eq!(model.prefix_cache_stats().unwrap().entries, 0);

        let broken_store = Retiring { keeps_rejected_rows: true, ..Retiring::default() };
        let (mut broken, _) = ended_after_a_rejection(broken_store);
        assert_eq!(next_turn(&mut broken, &prompt), (prompt.len() + 2, prompt.len() + 2, false));
    }

    /// A draft's store (`fills_missing_rows`) runs the corrected token through the model
    /// after the rollback has dropped the rejected 6's row, and files it: the next turn
    /// reuses the prompt, the accepted 5 and the corrected 1, read as a 1.
    #[test]
    fn a_filling_store_files_every_committed_token_and_no_rejected_one() {
        let filling = Retiring { fills_missing_rows: true, ..Retiring::default() };
        let (mut model, prompt) = ended_after_a_rejection(filling);
        assert_eq!(next_turn(&mut model, &prompt), (prompt.len() + 2, prompt.len() + 2, true));
    }

    /// A session opened only to file a conversation (no pass ran): filling files all of it,
    /// without filling nothing is kept, and nor is it where the fill would pass
    /// MAX_FILL_TOKENS.
    #[test]
    fn a_session_that_never_ran_is_filed_whole_only_by_a_filling_store() {
        for (fills, len, kept) in [(true, 48, 48), (false, 48, 0), (true, MAX_FILL_TOKENS + 1, 0)] {
            let table = serde_json::json!({"vocab_size": 8, "default": vec![0.125; 8]});
            let mut model = PrefixCache::new(TableModel::from_json("t", table, None).unwrap(), 16);
            let conversation: Vec<u32> = (0..len).map(|i| (i % 5) as u32).collect();
            let request = PrefixRequest { tokens: &conversation, salt: "", capacity: Some(len + 1) };
            let opened = model.open_with_prefix(&request).unwrap();
            let state = State { session: opened.session, history: SessionHistory::new(conversation.clone()).unwrap() };
            let retiring = Retiring { fills_missing_rows: fills, ..Retiring::default() };
            retire(&mut model, state, Some((conversation.len(), Vec::new())), retiring).unwrap();
            assert_eq!(model.prefix_cache_stats().unwrap().tokens, kept, "fills_missing_rows {fills}, {len} tokens");
        }
    }
}
