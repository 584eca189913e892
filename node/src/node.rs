//! A loaded model with its sessions, as both node roles serve it.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use specd_grammar::{ConstraintSpec, GrammarVocabulary};
use specd_model::{
    AttentionOptions, BatchPolicy, DType, DeviceSpec, Engine, FreeMemory, KvBudget, LanguageModel, LoadOptions,
    PrefixCacheOptions, SessionId,
};
use specd_proto::tls::ServerTls;
use specd_proto::v1::{NodeInfo, OpenSessionRequest, ProposedPosition};
use specd_sampling::{SamplingParams, Truncation};
use specd_telemetry::{Metrics, PrefixCacheSample};

use crate::constraint::FollowedConstraint;
use crate::distributions::Distributions;
use crate::error::NodeError;
use crate::faults::NodeFaults;
use crate::history::SessionHistory;
use crate::node_model::{NodeModel, NodeSessionState, StandIn};

/// How to run a node.
#[derive(Debug, Clone)]
pub struct NodeConfig {
    /// A Hugging Face checkpoint directory or a table-model JSON file.
    pub model: PathBuf,
    pub device: DeviceSpec,
    pub dtype: DType,
    /// What computes the model's passes ([`specd_model::Engine`]).
    pub engine: Engine,
    /// How the libtorch engine attends ([`specd_model::AttentionOptions`]).
    pub attention: AttentionOptions,
    /// Sessions open at once; more are refused with RESOURCE_EXHAUSTED.
    pub max_sessions: usize,
    /// Whether ended sessions' committed KV is kept for later prompts that begin the same
    /// way, and from how many tokens (`--prefix-cache`, `--prefix-cache-min-tokens`).
    pub prefix_cache: PrefixCacheOptions,
    /// Bytes of KV cache all sessions may reserve together, resolved once the model is
    /// loaded and warmed up. Sessions reserve what their request can reach
    /// (`OpenSessionRequest.max_tokens`); one that does not fit is refused with
    /// RESOURCE_EXHAUSTED before any pass runs.
    pub kv_budget: KvBudget,
    /// Added to every forward pass, to stand in for a slower model in benchmarks and tests;
    /// zero in service.
    pub forward_delay: Duration,
    /// Sessions unused this long are released (their coordinator is gone); `None`: never.
    pub session_ttl: Option<Duration>,
    /// TLS, and mutual TLS with a client CA (then only coordinators with a certificate
    /// that CA signed get in).
    pub tls: ServerTls,
    /// Where to show `specd_active_sessions` and `specd_kv_cache_bytes` (`role` label:
    /// this node's role), sampled when Prometheus scrapes.
    pub metrics: Option<Metrics>,
    /// libtorch intra-op threads of the model's thread (`None`: one per core).
    pub threads: Option<usize>,
    /// Threads that turn a verify pass's rows of logits into distributions and score them,
    /// where the vocabulary is large enough to pay (`None`: see
    /// [`Node::sampling_threads`]).
    pub sampling_threads: Option<usize>,
    /// How concurrent sessions' forward passes share one pass of the model.
    pub batch: BatchPolicy,
    /// A CPU model's threads get one CPU each where they use every CPU the process may run
    /// on ([`specd_model::pinning`]).
    pub pin_threads: bool,
    /// Load a checkpoint that holds tensors the model does not use (refused by default).
    pub allow_unused_weights: bool,
    /// Where the node turns logits into distributions ([`Distributions::resolve`]).
    pub distributions: Distributions,
    /// Faults a test injects (none in service, and none can be without the `testing`
    /// feature).
    pub faults: NodeFaults,
}

/// One session on a node: its model session, its token history, and how it samples.
#[derive(Debug, Clone)]
pub struct SessionState {
    pub model_session: SessionId,
    pub history: SessionHistory,
    pub params: SamplingParams,
    /// Every draw is keyed by (seed, round, position, purpose).
    pub seed: u64,
    /// A draft with more rows than its target draws from the first `vocab_limit` ids only
    /// (`OpenSessionRequest.vocab_limit`); `None`: from all of its own.
    pub vocab_limit: Option<usize>,
    /// The draft's blocks drafted ahead of their requests (optimistic drafting), in round
    /// order, each after the one before it; always empty on a target.
    pub lookahead: Vec<Lookahead>,
    /// What the prefix cache files the session's KV under when it ends
    /// (`OpenSessionRequest.cache_salt`).
    pub cache_salt: String,
    /// The request's output constraint (`OpenSessionRequest.constraint`); `None`: none.
    pub constraint: Option<FollowedConstraint>,
}

/// A block a draft drafts before it is asked for (optimistic drafting, docs/architecture.md): the
/// history is extended past the block it last returned by a guessed bonus token and the
/// candidates drafted after it, each as the request it expects would draft it. The request
/// it expects is round `round` with `rollback_to` (every candidate of the last block
/// accepted), pending `[guess]`, the same γ and the same wire format.
#[derive(Debug, Clone, PartialEq)]
pub struct Lookahead {
    pub round: u32,
    pub rollback_to: usize,
    pub gamma: usize,
    /// `None`: dense wire format.
    pub truncation: Option<Truncation>,
    /// The guessed bonus token, once the draft has scored the position after the last block.
    pub guess: Option<u32>,
    /// The candidates drafted so far (at most `gamma`), in the wire format.
    pub positions: Vec<ProposedPosition>,
    /// The block went to the coordinator unasked: its request gets a reply without it.
    pub pushed: bool,
}

impl NodeSessionState for SessionState {
    fn model_session(&self) -> SessionId {
        self.model_session
    }

    fn history(&self) -> &SessionHistory {
        &self.history
    }

    fn history_mut(&mut self) -> &mut SessionHistory {
        &mut self.history
    }

    fn cache_salt(&self) -> &str {
        &self.cache_salt
    }

    fn forget_cache(&mut self) {
        self.history.forget_cache();
        // Drafted ahead on a cache that can no longer be trusted.
        self.lookahead.clear();
    }
}

/// The dtype a node of `role` loads its model in on this CPU ([`model_dtype`]), for
/// `--check-config` to show before any load. A table model, or no model, takes none.
pub fn load_dtype(role: &str, config: &NodeConfig) -> DType {
    if !config.model.is_dir() {
        return config.dtype;
    }
    let bf16_pairs = specd_model::cpu_features::host_multiplies_bf16_pairs();
    model_dtype(role, config.dtype, config.device, config.engine, bf16_pairs)
}

/// The dtype a node loads its model in: `--dtype`, except that a draft's `auto` on a CPU
/// whose host engine multiplies bf16 pairs (`bf16_pairs`) is bf16, unless its engine is
/// libtorch, whose bf16 is slower than its f32 on such a CPU. `auto` keeps a target's
/// checkpoint values, since its p is the output law; a draft's q only moves the acceptance
/// rate, never the law, and in bf16 there its step takes about half the time
/// (BENCHMARKS.md).
fn model_dtype(role: &str, dtype: DType, device: DeviceSpec, engine: Engine, bf16_pairs: bool) -> DType {
    let bf16_draft = role == "draft"
        && dtype == DType::Auto
        && device == DeviceSpec::Cpu
        && engine != Engine::Libtorch
        && bf16_pairs;
    if bf16_draft { DType::Bf16 } else { dtype }
}

/// A node of either role. Cheap to clone: the state is shared.
#[derive(Debug, Clone)]
pub struct Node {
    role: &'static str,
    model: NodeModel<SessionState>,
    config: Arc<NodeConfig>,
    /// Resolved once: the default reads the CPUs this process may use, which is not free,
    /// and every verify asks.
    sampling_threads: usize,
    /// [`NodeConfig::distributions`], resolved for the node's device.
    distributions: Distributions,
    /// The model's vocabulary as the grammar engine reads it, for constrained sessions; the
    /// reason there is none (no tokenizer.json) otherwise.
    constraints: Result<Arc<GrammarVocabulary>, String>,
}

impl Node {
    /// Loads the model on its own worker thread; blocks until it is ready.
    pub fn load(role: &'static str, config: NodeConfig) -> Result<Self, NodeError> {
        let distributions = config.distributions.resolve(config.device);
        let dtype = load_dtype(role, &config);
        if dtype != config.dtype {
            tracing::info!(%dtype, "draft dtype auto: this CPU multiplies bf16 pairs, and a draft's q does not change the law");
        }
        let options = LoadOptions {
            device: config.device,
            dtype,
            kv_budget: config.kv_budget,
            threads: config.threads,
            allow_unused_weights: config.allow_unused_weights,
            // The node's jobs follow the logits: where they stay on the device, the
            // distributions are built there (target-node `verify`, draft-node `propose`).
            logits_on_device: distributions.on_device(),
            engine: config.engine,
            attention: config.attention,
        };
        let thread = format!("specd-{role}-model");
        let stand_in = StandIn { forward_delay: config.forward_delay, faults: config.faults };
        let model = NodeModel::load(
            &thread,
            &config.model,
            options,
            config.max_sessions,
            stand_in,
            config.batch,
            config.pin_threads,
            config.prefix_cache,
        )?
        .filling_missing_rows(role == "draft" && config.prefix_cache.enabled);
        let info = model.handle().info();
        tracing::info!(engine = info.engine, dtype = %info.dtype, configured = %config.engine, "{} model loaded", info.name);
        let (_, budget) = model.handle().call_blocking(|m| Ok(m.memory_in_use()))?;
        match budget {
            Some(bytes) => tracing::info!(kv_budget_bytes = bytes, configured = %config.kv_budget, "KV cache budget"),
            None => tracing::info!("KV cache unbounded"),
        }
        if let Some(metrics) = &config.metrics {
            export_gauges(metrics, role, &model);
        }
        let sampling_threads = sampling_threads(config.sampling_threads, config.device);
        tracing::info!(%distributions, configured = %config.distributions, "distributions built on the {}", match distributions {
            Distributions::Device => "model's device",
            _ => "host",
        });
        let constraints = constraint_vocabulary(&config.model, info.vocab_size, &info.eos_token_ids);
        match &constraints {
            Ok(_) => tracing::info!("output constraints available (JSON schemas, regular expressions, grammars)"),
            Err(why) => tracing::info!(why, "output constraints unavailable: constrained sessions are refused"),
        }
        Ok(Self { role, model, config: Arc::new(config), sampling_threads, distributions, constraints })
    }

    /// [`Self::load`] on a blocking thread, for async callers; also starts releasing idle
    /// sessions when the config has a TTL.
    pub async fn load_async(role: &'static str, config: NodeConfig) -> Result<Self, NodeError> {
        let node = tokio::task::spawn_blocking(move || Self::load(role, config))
            .await
            .map_err(|e| NodeError::Join(e.to_string()))??;
        if let Some(ttl) = node.config.session_ttl {
            node.model.spawn_reaper(ttl);
        }
        Ok(node)
    }

    pub fn config(&self) -> &NodeConfig {
        &self.config
    }

    /// The threads a block's per-row sampling work may use: the configured count, or by
    /// default one on a CPU (the model's own threads keep its cores busy, and they spin for a
    /// while after each pass) and up to 4 beside a GPU, whose host cores are idle meanwhile.
    pub fn sampling_threads(&self) -> usize {
        self.sampling_threads
    }

    /// Where this node builds its distributions (`auto` resolved).
    pub fn distributions(&self) -> Distributions {
        self.distributions
    }

    pub fn model(&self) -> &NodeModel<SessionState> {
        &self.model
    }

    /// The free memory of the node's device now, read on its model's thread.
    pub async fn free_memory(&self) -> Result<FreeMemory, NodeError> {
        Ok(self.model.handle().free_memory(self.config.device).await?)
    }

    /// Bounds the node's KV cache to `bytes` from now on (`None`: unbounded), in place of the
    /// budget it resolved at load: `specd up` and `specd bench --embedded` split one device's
    /// budget between their two nodes so.
    pub async fn set_kv_budget(&self, bytes: Option<u64>) -> Result<(), NodeError> {
        self.model.handle().set_memory_budget(bytes).await?;
        match bytes {
            Some(bytes) => tracing::info!(role = self.role, kv_budget_bytes = bytes, "KV cache budget set"),
            None => tracing::info!(role = self.role, "KV cache unbounded"),
        }
        Ok(())
    }

    pub async fn info(&self) -> Result<NodeInfo, NodeError> {
        let info = self.model.handle().info();
        Ok(NodeInfo {
            role: self.role.into(),
            model_id: info.name.clone(),
            vocab_size: info.vocab_size as u32,
            tokenizer_fingerprint: info.tokenizer_fingerprint.clone(),
            device: self.config.device.to_string(),
            dtype: info.dtype.to_string(),
            context_length: info.context_length as u32,
            eos_token_ids: info.eos_token_ids.clone(),
            active_sessions: self.model.active_sessions() as u32,
            kv_cache_bytes: self.model.kv_cache_bytes().await?,
            has_tokenizer: info.has_tokenizer,
            proposer: String::new(),
        })
    }

    /// Opens a session from the coordinator's request, validating its sampling settings;
    /// returns how many of its tokens the prefix cache held.
    pub async fn open(&self, request: OpenSessionRequest) -> Result<usize, NodeError> {
        let sampling = request.sampling.ok_or_else(|| NodeError::InvalidRequest("sampling is missing".into()))?;
        let params = SamplingParams::try_from(&sampling)?;
        let seed = request.seed;
        let own = self.model.handle().info().vocab_size;
        let vocab_limit = match request.vocab_limit as usize {
            0 => None,
            limit if limit < own => Some(limit),
            // A draft with fewer rows than the target: its own ids are all the target's.
            _ => None,
        };
        let constraint = match request.constraint.as_ref().map(ConstraintSpec::from_proto).transpose()?.flatten() {
            Some(spec) => {
                let vocabulary = self.constraints.as_ref().map_err(|why| NodeError::NoConstraints(why.clone()))?;
                Some(FollowedConstraint::new(vocabulary.compile(&spec)?))
            }
            None => None,
        };
        let cache_salt = request.cache_salt;
        let salt = cache_salt.clone();
        let build = move |model_session, history| SessionState {
            model_session,
            history,
            params,
            seed,
            vocab_limit,
            lookahead: Vec::new(),
            cache_salt,
            constraint,
        };
        let reach = (request.max_tokens > 0).then_some(request.max_tokens as usize);
        let history = SessionHistory::resumed(request.prompt_token_ids, request.prompt_len as usize)?;
        Ok(self.model.open(request.session_id, history, reach, salt, build).await?)
    }

    /// Runs `job` on the model thread with the session's state; see [`NodeModel::run`] for
    /// what a failed job leaves behind.
    pub async fn run<R: Send + 'static>(
        &self,
        session_id: &str,
        job: impl FnOnce(&mut dyn LanguageModel, &mut SessionState) -> Result<R, NodeError> + Send + 'static,
    ) -> Result<R, NodeError> {
        self.model.run(session_id, job).await?
    }

    /// Releases the session; `false` when it was not open. `last`: the session's final
    /// rollback point and the tokens committed after it (`ReleaseRequest`): its cache's rows
    /// of committed tokens then go to the prefix cache.
    pub async fn release(&self, session_id: &str, last: Option<(usize, &[u32])>) -> Result<bool, NodeError> {
        let last = last.map(|(valid, pending)| (valid, pending.to_vec()));
        Ok(self.model.release(session_id, last).await?)
    }
}

/// The grammar engine's view of the model at `path`: its tokenizer.json (or a table model's
/// token names), its logit width and its EOS ids; why there is none otherwise.
fn constraint_vocabulary(
    path: &std::path::Path,
    vocab_size: usize,
    eos_token_ids: &[u32],
) -> Result<Arc<GrammarVocabulary>, String> {
    let tokenizer_json = if path.is_file() {
        let table = specd_model::TableModel::load(path, None).map_err(|e| e.to_string())?;
        table.tokenizer_json().ok_or_else(|| format!("the table model {} names no tokens", path.display()))?
    } else {
        let file = path.join("tokenizer.json");
        std::fs::read_to_string(&file).map_err(|e| format!("{}: {e}", file.display()))?
    };
    GrammarVocabulary::new(&tokenizer_json, vocab_size, eos_token_ids).map_err(|e| e.to_string())
}

/// Samples the node's open sessions and KV-cache bytes before every scrape.
fn export_gauges(metrics: &Metrics, role: &'static str, model: &NodeModel<SessionState>) {
    let (gauges, model) = (metrics.node(role), model.clone());
    let prefix_cache = metrics.prefix_cache(role);
    metrics.on_scrape(move || {
        let (gauges, model, prefix_cache) = (gauges.clone(), model.clone(), prefix_cache.clone());
        async move {
            if let Ok((kv_bytes, budget)) = model.handle().memory_in_use().await {
                gauges.set(model.active_sessions(), kv_bytes);
                gauges.set_kv_budget(budget);
            }
            if let Ok(Some(stats)) = model.handle().call_on_thread(|m| Ok(m.prefix_cache_stats())).await {
                prefix_cache.record(PrefixCacheSample {
                    lookups: stats.lookups,
                    hits: stats.hits,
                    hit_tokens: stats.hit_tokens,
                    evictions: stats.evictions,
                    bytes: stats.bytes,
                    entries: stats.entries as u64,
                });
            }
        }
    });
}

/// [`Node::sampling_threads`].
fn sampling_threads(configured: Option<usize>, device: DeviceSpec) -> usize {
    configured.unwrap_or_else(|| match device {
        DeviceSpec::Cpu => 1,
        DeviceSpec::Cuda(_) => std::thread::available_parallelism().map_or(1, |n| n.get().min(4)),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_drafts_auto_dtype_is_bf16_on_a_cpu_that_multiplies_bf16_pairs_and_nothing_else_changes() {
        let (cpu, gpu) = (DeviceSpec::Cpu, DeviceSpec::Cuda(0));
        assert_eq!(model_dtype("draft", DType::Auto, cpu, Engine::Auto, true), DType::Bf16);
        assert_eq!(model_dtype("draft", DType::Auto, cpu, Engine::Host, true), DType::Bf16);
        // Not without the instructions, not on libtorch, not on a GPU, not for a target,
        // and never over a dtype asked for.
        assert_eq!(model_dtype("draft", DType::Auto, cpu, Engine::Auto, false), DType::Auto);
        assert_eq!(model_dtype("draft", DType::Auto, cpu, Engine::Libtorch, true), DType::Auto);
        assert_eq!(model_dtype("draft", DType::Auto, gpu, Engine::Auto, true), DType::Auto);
        assert_eq!(model_dtype("target", DType::Auto, cpu, Engine::Auto, true), DType::Auto);
        assert_eq!(model_dtype("draft", DType::F32, cpu, Engine::Host, true), DType::F32);
    }

    #[test]
    fn sampling_threads_are_one_on_a_cpu_unless_set() {
        assert_eq!(sampling_threads(None, DeviceSpec::Cpu), 1);
        assert_eq!(sampling_threads(Some(3), DeviceSpec::Cpu), 3);
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        assert_eq!(sampling_threads(None, DeviceSpec::Cuda(0)), cores.min(4));
        assert_eq!(sampling_threads(Some(2), DeviceSpec::Cuda(0)), 2);
    }
}
