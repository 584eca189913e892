//! `specd target`, `specd draft`, `specd coordinator` and `specd up`: the roles as servers.
//!
//! Each prints `listening on HOST:PORT` once it is ready to take requests (model loaded,
//! peers connected) and stops cleanly on Ctrl-C or SIGTERM. With `--metrics-listen` each
//! also serves Prometheus metrics at `GET /metrics` (`specd up`: all three roles on one).

use std::future::Future;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::Context;
use clap::Args;
use specd_coordinator::{
    Admission, CoordinatorConfig, CoordinatorTls, Discovery, GammaChoice, HttpConfig, NodeAddress, RuleVariant,
};
use specd_draft_node::DraftNode;
use specd_draft_node::proposer::{MatchSpan, ProposerConfig, ProposerKind};
use specd_model::{BatchPolicy, DType, DeviceSpec, Engine, KvBudget, LlamaConfig, ModelError, TableModel};
use specd_node::{Distributions, NodeConfig};
use specd_proto::tls::{ClientTls, ServerTls};
use specd_sampling::{MAX_GAMMA, Truncation};
use specd_target_node::TargetNode;
use specd_telemetry::{Metrics, TelemetryOptions};
use tokio::net::TcpListener;

use crate::cli_error::invalid;

pub(crate) fn parse_device(s: &str) -> Result<DeviceSpec, String> {
    s.parse().map_err(|e: ModelError| e.to_string())
}

pub(crate) fn parse_dtype(s: &str) -> Result<DType, String> {
    s.parse().map_err(|e: ModelError| e.to_string())
}

pub(crate) fn parse_engine(s: &str) -> Result<Engine, String> {
    s.parse().map_err(|e: ModelError| e.to_string())
}

/// `--gamma`: `auto` or a number.
#[derive(Debug, Clone, Copy)]
pub enum GammaFlag {
    Auto,
    Fixed(u32),
}

pub(crate) fn parse_gamma(s: &str) -> Result<GammaFlag, String> {
    if s == "auto" {
        return Ok(GammaFlag::Auto);
    }
    s.parse().map(GammaFlag::Fixed).map_err(|_| format!("{s:?} is neither `auto` nor a whole number"))
}

/// Options every node role shares.
#[derive(Debug, Clone, Args)]
pub struct NodeOptions {
    /// cpu or cuda:N.
    #[arg(long, env = "SPECD_DEVICE", default_value = "cpu", value_parser = parse_device)]
    device: DeviceSpec,
    /// auto, f32, f16, bf16 or f64 (f64: slow, for exact greedy identity checks). auto: the
    /// checkpoint's own dtype on a GPU; on a CPU bf16 where it has bf16 matrix units (AMX),
    /// f32 elsewhere.
    #[arg(long, env = "SPECD_DTYPE", default_value = "auto", value_parser = parse_dtype)]
    dtype: DType,
    /// What computes the model's passes: libtorch (every family, CPU or GPU), host (plain
    /// Rust f32 on one CPU thread, for Llama, Mistral and Qwen2 checkpoints: much faster
    /// for a tiny draft, whose libtorch pass is mostly the cost of each operation), or auto
    /// (host for a CPU model of at most 4 M parameters that it can run, with --dtype f32 or
    /// auto; libtorch otherwise).
    #[arg(long, env = "SPECD_ENGINE", default_value = "auto", value_parser = parse_engine)]
    engine: Engine,
    /// Load a checkpoint even when it holds tensors the model does not use (a bias its
    /// config.json does not declare, a layer past num_hidden_layers); refused by default,
    /// naming them, since the model would compute something else than the checkpoint.
    #[arg(long, env = "SPECD_ALLOW_UNUSED_WEIGHTS")]
    allow_unused_weights: bool,
    /// Sessions a node holds at once; more are refused with RESOURCE_EXHAUSTED.
    #[arg(long, env = "SPECD_MAX_SESSIONS", default_value_t = 256)]
    max_sessions: usize,
    /// KV-cache budget of a node in MiB (all sessions together); overrides
    /// --kv-memory-fraction.
    #[arg(long, env = "SPECD_KV_BUDGET_MIB")]
    kv_budget_mib: Option<u64>,
    /// KV-cache budget of a node as a fraction of the memory free once its weights are
    /// loaded (like vLLM's --gpu-memory-utilization): on CUDA the device's free memory as
    /// nvidia-smi reports it, on a CPU MemAvailable. A session reserves what its request can
    /// reach; one that does not fit is refused with RESOURCE_EXHAUSTED. Two nodes on one
    /// device each take their fraction of what is free when they load: give each its share.
    #[arg(long, env = "SPECD_KV_MEMORY_FRACTION", default_value_t = 0.9)]
    kv_memory_fraction: f64,
    /// Milliseconds added to every forward pass of this node's model: stands in for a slower
    /// (bigger) model in benchmarks and tests. 0 in service.
    #[arg(long, env = "SPECD_FORWARD_DELAY_MS", default_value_t = 0.0)]
    forward_delay_ms: f64,
    /// Seconds after which a session nobody used is released (its coordinator died without
    /// releasing it); 0 keeps sessions until released.
    #[arg(long, env = "SPECD_SESSION_TTL_S", default_value_t = 600.0)]
    session_ttl_s: f64,
    /// libtorch threads of the model (default: one per core). 1 suits small draft models:
    /// their operations are too short to split, and on a busy machine waiting for a second
    /// thread costs more than it saves.
    #[arg(long, env = "SPECD_THREADS")]
    threads: Option<usize>,
    /// Threads a target uses after each verify pass to turn the block's rows of logits into
    /// distributions and score them, where the work is large enough to split (about 64 Ki
    /// logits a thread: the 6 rows of γ = 5 take 2 threads from a vocabulary of about
    /// 22 000). Default: 1 on a CPU, whose cores the model's threads use (and where they are
    /// pinned, threads started from the model's share its CPU), and up to 4 with a GPU.
    #[arg(long, env = "SPECD_SAMPLING_THREADS")]
    sampling_threads: Option<usize>,
    /// Where a node turns logits into distributions: `device` builds them with libtorch on
    /// the model's device and copies only the few numbers the sparse reply carries (about
    /// 500 bytes a verify, not every row: 3 MB at a vocabulary of 128 256); `host` copies
    /// the rows and builds them on the CPU. `auto`: device with a GPU, host on a CPU (where
    /// it measured faster). Dense replies and requests for log-probabilities are built on
    /// the host either way.
    #[arg(long, env = "SPECD_DISTRIBUTIONS", default_value = "auto")]
    distributions: Distributions,
    /// Give a CPU model's two threads one CPU each, where the process may run on exactly two
    /// CPUs and no OMP_PROC_BIND, OMP_PLACES or GOMP_CPU_AFFINITY is set. Without it, Linux
    /// now and then puts both on one CPU beside an idle one, and a pass takes twice as long
    /// (BENCHMARKS.md). Larger teams are never pinned (model/src/pinning.rs says why).
    #[arg(long, env = "SPECD_PIN_THREADS", default_value_t = true, action = clap::ArgAction::Set)]
    pin_threads: bool,
    /// Most sessions whose forward passes share one pass of the model (batching across
    /// sessions: their tokens go through the weights together, each attends to its own
    /// cache). 1 turns batching off.
    #[arg(long, env = "SPECD_MAX_BATCH_SEQUENCES", default_value_t = BatchPolicy::default().max_sequences)]
    max_batch_sequences: usize,
    /// Most tokens in one batched forward pass (bounds how much long prefills delay the
    /// others); a single request above it still runs, alone.
    #[arg(long, env = "SPECD_MAX_BATCH_TOKENS", default_value_t = BatchPolicy::default().max_tokens)]
    max_batch_tokens: usize,
    /// Microseconds to wait for more sessions' forwards after the first of a batch, only
    /// while fewer are gathered than sessions are open (a lone session never waits); 0 takes
    /// only those already waiting.
    #[arg(long, env = "SPECD_BATCH_WINDOW_US", default_value_t = BatchPolicy::default().window.as_micros() as u64)]
    batch_window_us: u64,
}

/// How the draft model runs where one process starts both nodes (`specd up`, `specd bench
/// --embedded` and `--netns`); the other node flags apply to both.
#[derive(Debug, Clone, Args)]
pub struct DraftOptions {
    /// libtorch threads of the draft model (its steps are too short to split; --threads
    /// then applies to the target only).
    #[arg(long, env = "SPECD_DRAFT_THREADS", default_value_t = 1)]
    pub(crate) draft_threads: usize,
    /// dtype of the draft model (default: --dtype). A small draft's steps are per-operation
    /// overhead, which f32 has least of on a CPU, even beside a bf16 target.
    #[arg(long, env = "SPECD_DRAFT_DTYPE", value_parser = parse_dtype)]
    pub(crate) draft_dtype: Option<DType>,
    /// What computes the draft's passes (default: --engine); see --engine.
    #[arg(long, env = "SPECD_DRAFT_ENGINE", value_parser = parse_engine)]
    pub(crate) draft_engine: Option<Engine>,
}

impl DraftOptions {
    /// The draft node's configuration: the shared node options with the draft's own.
    pub(crate) fn apply(&self, mut config: NodeConfig) -> NodeConfig {
        config.threads = Some(self.draft_threads);
        config.dtype = self.draft_dtype.unwrap_or(config.dtype);
        config.engine = self.draft_engine.unwrap_or(config.engine);
        config
    }
}

/// What a draft node proposes with (`specd draft`, `specd up`, `specd bench`).
#[derive(Debug, Clone, Args)]
pub struct ProposerOptions {
    /// model (the draft model samples), ngram (prompt lookup: copies what followed the
    /// longest match of the last tokens in the prompt and output; no model), suffix (the
    /// most frequent continuation over recent sessions and this one; no model), or
    /// model+ngram (a match proposes; the model where there is none).
    #[arg(long, env = "SPECD_PROPOSER", default_value = "model", value_parser = parse_proposer)]
    pub(crate) proposer: ProposerKind,
    /// Shortest n-gram match that proposes (ngram, suffix, model+ngram).
    #[arg(long, env = "SPECD_NGRAM_MIN", default_value_t = 2)]
    pub(crate) ngram_min: usize,
    /// Longest n-gram match tried first (at most 32).
    #[arg(long, env = "SPECD_NGRAM_MAX", default_value_t = 4)]
    pub(crate) ngram_max: usize,
    /// Tokens of finished sessions the suffix proposer's index holds. Its memory: up to
    /// this × ngram-max contexts of up to ngram-max tokens each (at most about 580 bytes a
    /// token at the default ngram-max 4, so 145 MiB at the default budget). Sessions with
    /// the request's seed are left out of its proposals.
    #[arg(long, env = "SPECD_SUFFIX_BUDGET_TOKENS", default_value_t = 1 << 18)]
    pub(crate) suffix_budget_tokens: usize,
}

fn parse_proposer(s: &str) -> Result<ProposerKind, String> {
    s.parse()
}

impl ProposerOptions {
    pub(crate) fn config(&self) -> anyhow::Result<ProposerConfig> {
        let span =
            MatchSpan::new(self.ngram_min, self.ngram_max).map_err(|e| invalid(format!("--ngram-min/max: {e}")))?;
        if self.suffix_budget_tokens == 0 {
            return Err(invalid("--suffix-budget-tokens must be at least 1"));
        }
        Ok(ProposerConfig { kind: self.proposer, span, suffix_budget_tokens: self.suffix_budget_tokens })
    }

    /// The flags that give a `specd draft` process this proposer (`specd bench --netns`).
    pub(crate) fn to_args(&self) -> Vec<String> {
        vec![
            format!("--proposer={}", self.proposer),
            format!("--ngram-min={}", self.ngram_min),
            format!("--ngram-max={}", self.ngram_max),
            format!("--suffix-budget-tokens={}", self.suffix_budget_tokens),
        ]
    }
}

/// The draft model a proposer needs: required for `model` and `model+ngram`, not read
/// otherwise (an empty path stands for none).
fn draft_model_path(flag: &str, model: Option<&PathBuf>, proposer: ProposerKind) -> anyhow::Result<PathBuf> {
    match model {
        // A model that would never be loaded is a mistake worth saying, not ignoring.
        Some(path) if !proposer.needs_model() => Err(invalid(format!(
            "--proposer {proposer} drafts without a model, so {flag} {} would be ignored: remove it, or use \
             --proposer model+ngram to draft with both",
            path.display()
        ))),
        Some(path) => Ok(path.clone()),
        None if proposer.needs_model() => Err(invalid(format!("{flag} is required with --proposer {proposer}"))),
        None => Ok(PathBuf::new()),
    }
}

/// Where to serve Prometheus metrics (off by default).
#[derive(Debug, Clone, Args)]
pub struct MetricsOptions {
    /// Serve Prometheus metrics at http://HOST:PORT/metrics (all roles of `specd up` on one).
    #[arg(long, env = "SPECD_METRICS_LISTEN")]
    metrics_listen: Option<SocketAddr>,
}

/// `--check-config`: validate and exit. Deliberately without an environment variable: a
/// stray `SPECD_CHECK_CONFIG` in a ConfigMap would stop every pod at once.
#[derive(Debug, Clone, Args)]
pub struct CheckArgs {
    /// Validate every flag and environment variable (addresses, numbers, TLS files, the
    /// model's config.json or table file; the weights are not loaded), print one line and
    /// exit: 0 when valid, 2 with the problem otherwise. Starts nothing.
    #[arg(long)]
    check_config: bool,
}

impl TargetArgs {
    /// Whether this run serves a target (and not only `--check-config`).
    pub fn serves(&self) -> bool {
        !self.check.check_config
    }
}

impl UpArgs {
    /// Whether this run serves the roles (and not only `--check-config`).
    pub fn serves(&self) -> bool {
        !self.check.check_config
    }
}

/// What every server role has: traces, draining, its TLS identity, metrics.
#[derive(Debug, Args)]
pub struct ServiceArgs {
    #[command(flatten)]
    telemetry: TelemetryArgs,
    #[command(flatten)]
    drain: DrainArgs,
    #[command(flatten)]
    tls: ServerTlsArgs,
    #[command(flatten)]
    metrics: MetricsOptions,
}

/// Run a target node: the big model, scoring whole blocks in one forward pass.
#[derive(Debug, Args)]
pub struct TargetArgs {
    /// Checkpoint directory (Llama, Mistral, Qwen2 in Hugging Face format) or table-model .json.
    #[arg(long, env = "SPECD_MODEL")]
    model: PathBuf,
    /// Address to serve on.
    #[arg(long, env = "SPECD_LISTEN", default_value = "127.0.0.1:50052")]
    listen: SocketAddr,
    #[command(flatten)]
    node: NodeOptions,
    #[command(flatten)]
    service: ServiceArgs,
    #[command(flatten)]
    check: CheckArgs,
}

/// Run a draft node: the cheap model (or a proposer with none), proposing blocks with their
/// distributions.
#[derive(Debug, Args)]
pub struct DraftArgs {
    /// Checkpoint directory or table-model .json; its tokenizer must match the target's.
    /// Not needed by --proposer ngram or suffix.
    #[arg(long, env = "SPECD_MODEL")]
    model: Option<PathBuf>,
    #[command(flatten)]
    proposer: ProposerOptions,
    /// Address to serve on.
    #[arg(long, env = "SPECD_LISTEN", default_value = "127.0.0.1:50053")]
    listen: SocketAddr,
    #[command(flatten)]
    node: NodeOptions,
    #[command(flatten)]
    service: ServiceArgs,
    #[command(flatten)]
    check: CheckArgs,
}

/// The TLS identity a role serves with, and whom it lets in.
#[derive(Debug, Clone, Args)]
pub struct ServerTlsArgs {
    /// PEM certificate (chain) to serve TLS with; with --tls-key.
    #[arg(long, env = "SPECD_TLS_CERT")]
    tls_cert: Option<PathBuf>,
    /// PEM private key of --tls-cert.
    #[arg(long, env = "SPECD_TLS_KEY")]
    tls_key: Option<PathBuf>,
    /// PEM CA: only clients with a certificate it signed get in (mutual TLS).
    #[arg(long, env = "SPECD_TLS_CLIENT_CA")]
    tls_client_ca: Option<PathBuf>,
}

impl ServerTlsArgs {
    fn tls(&self) -> anyhow::Result<ServerTls> {
        let tls =
            ServerTls { cert: self.tls_cert.clone(), key: self.tls_key.clone(), client_ca: self.tls_client_ca.clone() };
        // Read now: a missing file is a startup error, not a failed handshake later.
        tls.config().map_err(|e| invalid(e.to_string()))?;
        Ok(tls)
    }
}

/// How the coordinator reaches TLS nodes (`https://` URLs).
#[derive(Debug, Clone, Args)]
pub struct NodeTlsArgs {
    /// PEM CA that signed the nodes' certificates; turns TLS to the nodes on.
    #[arg(long, env = "SPECD_NODE_TLS_CA")]
    node_tls_ca: Option<PathBuf>,
    /// PEM client certificate for nodes that require mutual TLS; with --node-tls-key.
    #[arg(long, env = "SPECD_NODE_TLS_CERT")]
    node_tls_cert: Option<PathBuf>,
    /// PEM private key of --node-tls-cert.
    #[arg(long, env = "SPECD_NODE_TLS_KEY")]
    node_tls_key: Option<PathBuf>,
    /// Name the nodes' certificates carry, when it is not the host of their URLs.
    #[arg(long, env = "SPECD_NODE_TLS_DOMAIN")]
    node_tls_domain: Option<String>,
}

impl NodeTlsArgs {
    fn tls(&self) -> anyhow::Result<ClientTls> {
        let tls = ClientTls {
            ca: self.node_tls_ca.clone(),
            cert: self.node_tls_cert.clone(),
            key: self.node_tls_key.clone(),
            domain: self.node_tls_domain.clone(),
        };
        tls.config("check").map_err(|e| invalid(e.to_string()))?;
        Ok(tls)
    }
}

/// How a role stops; every role has these.
#[derive(Debug, Clone, Args)]
pub struct DrainArgs {
    /// On SIGTERM or Ctrl-C: health turns NOT_SERVING, nothing new is admitted, and requests
    /// in flight get this many seconds to finish before the process exits anyway.
    #[arg(long, env = "SPECD_SHUTDOWN_GRACE_S", default_value_t = 30.0)]
    shutdown_grace_s: f64,
}

impl DrainArgs {
    fn grace(&self) -> anyhow::Result<Duration> {
        Duration::try_from_secs_f64(self.shutdown_grace_s).map_err(|_| {
            invalid(format!("--shutdown-grace-s {} must be a number of seconds ≥ 0", self.shutdown_grace_s))
        })
    }
}

/// What tells a server to stop admitting and drain.
type Stop = std::pin::Pin<Box<dyn Future<Output = ()> + Send>>;

/// Runs `serve(stop)` until Ctrl-C or SIGTERM, then resolves `stop` and gives the requests in
/// flight at most `grace` to finish.
async fn serve_until_signal<Fut, E>(grace: Duration, serve: impl FnOnce(Stop) -> Fut) -> anyhow::Result<()>
where
    Fut: Future<Output = Result<(), E>>,
    anyhow::Error: From<E>,
{
    let (stop_tx, mut stop_rx) = tokio::sync::watch::channel(false);
    let stop: Stop = Box::pin(async move {
        let _ = stop_rx.wait_for(|stop| *stop).await;
    });
    let server = serve(stop);
    tokio::pin!(server);
    tokio::select! {
        result = &mut server => return Ok(result?),
        () = shutdown_signal() => {}
    }
    let _ = stop_tx.send(true);
    match tokio::time::timeout(grace, server).await {
        Ok(result) => Ok(result?),
        Err(_) => {
            tracing::warn!(grace_s = grace.as_secs_f64(), "grace period over: exiting with requests still in flight");
            Ok(())
        }
    }
}

/// Where traces go; every role has these.
#[derive(Debug, Clone, Args)]
pub struct TelemetryArgs {
    /// OTLP/gRPC collector to export traces to, e.g. http://127.0.0.1:4317. Unset or empty: the
    /// standard OTEL_EXPORTER_OTLP_ENDPOINT decides, and without it no traces are exported.
    #[arg(long, env = "SPECD_OTLP_ENDPOINT")]
    otlp_endpoint: Option<String>,
}

impl TelemetryArgs {
    /// `--otlp-endpoint`; empty is the same as unset (a ConfigMap can carry it switched off).
    fn endpoint(&self) -> Option<String> {
        self.otlp_endpoint.clone().filter(|e| !e.is_empty())
    }
}

/// The OpenAI-compatible HTTP API of a coordinator.
#[derive(Debug, Clone, Args)]
pub struct HttpOptions {
    /// Where to serve the OpenAI-compatible HTTP API (/v1/completions, /v1/chat/completions,
    /// /v1/models, /health), or `off`. `specd up` serves it on 127.0.0.1:8000 by default.
    #[arg(long, env = "SPECD_HTTP_LISTEN", value_parser = parse_http_listen)]
    http_listen: Option<HttpListen>,
    /// The model name HTTP clients must send; unset: the target model directory's name.
    #[arg(long, env = "SPECD_SERVED_MODEL_NAME")]
    served_model_name: Option<String>,
}

/// `--http-listen`: an address, or `off`.
#[derive(Debug, Clone, Copy)]
pub struct HttpListen(Option<SocketAddr>);

fn parse_http_listen(s: &str) -> Result<HttpListen, String> {
    match s {
        "off" => Ok(HttpListen(None)),
        _ => s.parse().map(|a| HttpListen(Some(a))).map_err(|e| format!("{s:?}: {e} (expected HOST:PORT or off)")),
    }
}

impl HttpOptions {
    /// The address to serve on: the flag's, else `default`.
    fn address(&self, default: Option<SocketAddr>) -> Option<SocketAddr> {
        self.http_listen.map_or(default, |l| l.0)
    }

    /// Binds the HTTP API's address, if any, and says where it is.
    async fn bind(&self, default: Option<SocketAddr>) -> anyhow::Result<Option<(TcpListener, HttpConfig)>> {
        let Some(addr) = self.address(default) else { return Ok(None) };
        let listener = bind(addr).await?;
        let config = HttpConfig { served_model_name: self.served_model_name.clone() };
        Ok(Some((listener, config)))
    }

    fn summary(&self, default: Option<SocketAddr>) -> String {
        self.address(default).map(|a| format!(", HTTP API on {a}")).unwrap_or_default()
    }
}

/// Says where the HTTP API answers, before `listening on` (which tests and scripts wait for).
fn announce_http(http: Option<&(TcpListener, HttpConfig)>) -> anyhow::Result<()> {
    if let Some((listener, _)) = http {
        outln!("OpenAI-compatible HTTP API on http://{}/v1", listener.local_addr()?);
    }
    Ok(())
}

/// Options of the coordinator's policy.
#[derive(Debug, Clone, Args)]
pub struct PolicyOptions {
    /// Draft length when a request does not set one: `auto` (adaptive, per session, from
    /// measured acceptance and costs; 0 when drafting does not pay) or a fixed γ (0:
    /// target-only).
    #[arg(long, env = "SPECD_GAMMA", default_value = "auto", value_parser = parse_gamma)]
    gamma: GammaFlag,
    /// The largest γ the adaptive policy may choose.
    #[arg(long, env = "SPECD_MAX_GAMMA", default_value_t = 8)]
    max_gamma: u32,
    /// max_new_tokens when a request does not set one.
    #[arg(long, env = "SPECD_MAX_NEW_TOKENS", default_value_t = 256)]
    max_new_tokens: u32,
    /// The draft keeps the smallest set of tokens holding 1 - epsilon of q's mass ...
    #[arg(long, env = "SPECD_TRUNCATION_EPSILON", default_value_t = 1e-4)]
    truncation_epsilon: f64,
    /// ... but at most this many (sparse wire format).
    #[arg(long, env = "SPECD_TRUNCATION_MAX_ENTRIES", default_value_t = 64)]
    truncation_max_entries: usize,
    /// Clients must send `authorization: Bearer <token>` (health and reflection stay open).
    #[arg(long, env = "SPECD_API_TOKEN", hide_env_values = true)]
    api_token: Option<String>,
    /// Generations in flight at once; more are refused with RESOURCE_EXHAUSTED (0: no limit).
    #[arg(long, env = "SPECD_MAX_GENERATIONS", default_value_t = 512)]
    max_generations: usize,
    /// Deadline of each call to a node, and of connecting to one, in seconds.
    #[arg(long, env = "SPECD_NODE_TIMEOUT_S", default_value_t = 30.0)]
    node_timeout_s: f64,
    /// Optimistic drafting: `on` asks the draft to draft each next block while the target
    /// verifies this one (guessing every candidate accepted and the bonus token); a right
    /// guess saves the next round its draft time. Exact either way. Off by default: it pays
    /// when the draft has cores of its own (another machine or pod); when draft and target
    /// share cores (`specd up` on a small machine) the work drafted ahead slows the verify.
    #[arg(long, env = "SPECD_OPTIMISTIC", default_value = "off", value_parser = parse_on_off, action = clap::ArgAction::Set)]
    optimistic: bool,
    /// The model directory whose tokenizer.json (and tokenizer_config.json's chat template,
    /// generation_config.json) the coordinator uses; unset: the target node sends its own when
    /// the coordinator connects.
    #[arg(long, env = "SPECD_TOKENIZER")]
    tokenizer: Option<PathBuf>,
    /// `auto`: the model's generation_config.json (temperature, top_p, top_k,
    /// repetition_penalty, do_sample) supplies the defaults of what a request leaves unset, as
    /// in transformers and vLLM; `none`: specd's own defaults (T = 1, no truncation).
    #[arg(long, env = "SPECD_GENERATION_CONFIG", default_value = "auto", value_parser = parse_generation_config)]
    generation_config: bool,
}

/// `auto` or `none`.
fn parse_generation_config(s: &str) -> Result<bool, String> {
    match s {
        "auto" => Ok(true),
        "none" => Ok(false),
        other => Err(format!("{other:?}: expected auto or none")),
    }
}

/// `on` or `off`.
pub(crate) fn parse_on_off(s: &str) -> Result<bool, String> {
    match s {
        "on" | "true" | "1" => Ok(true),
        "off" | "false" | "0" => Ok(false),
        other => Err(format!("{other:?}: expected on or off")),
    }
}

/// Run a coordinator: the public Generation API in front of target and draft nodes.
#[derive(Debug, Args)]
pub struct CoordinatorArgs {
    /// Address to serve clients on.
    #[arg(long, env = "SPECD_LISTEN", default_value = "127.0.0.1:50051")]
    listen: SocketAddr,
    /// Target nodes, comma-separated: http://HOST:PORT (https:// with --node-tls-ca) for one
    /// replica, or dns:///HOST:PORT for every address HOST resolves to (all A and AAAA
    /// records, e.g. a Kubernetes headless Service), re-resolved every
    /// --discovery-interval-s. New sessions go round-robin over the replicas.
    #[arg(long, env = "SPECD_TARGET", value_delimiter = ',', required = true)]
    target: Vec<String>,
    /// Draft nodes, the same way; none means target-only decoding.
    #[arg(long, env = "SPECD_DRAFT", value_delimiter = ',')]
    draft: Vec<String>,
    /// Seconds between two resolutions of the dns:/// node addresses: new replicas are added,
    /// vanished ones get no new sessions (running sessions stay where their KV cache is).
    #[arg(long, env = "SPECD_DISCOVERY_INTERVAL_S", default_value_t = 10.0)]
    discovery_interval_s: f64,
    #[command(flatten)]
    policy: PolicyOptions,
    #[command(flatten)]
    http: HttpOptions,
    #[command(flatten)]
    node_tls: NodeTlsArgs,
    #[command(flatten)]
    service: ServiceArgs,
    #[command(flatten)]
    check: CheckArgs,
}

/// Where `specd up` serves the HTTP API unless told otherwise (vLLM's port).
const UP_HTTP_LISTEN: SocketAddr = SocketAddr::new(std::net::IpAddr::V4(std::net::Ipv4Addr::LOCALHOST), 8000);

/// Run all three roles on loopback: a target node, a draft node and the coordinator, each a
/// real gRPC server; clients use the coordinator's address.
#[derive(Debug, Args)]
pub struct UpArgs {
    /// The target model: checkpoint directory or table-model .json.
    #[arg(long, env = "SPECD_TARGET_MODEL")]
    target_model: PathBuf,
    /// The draft model: checkpoint directory or table-model .json (not needed by
    /// --proposer ngram or suffix).
    #[arg(long, env = "SPECD_DRAFT_MODEL")]
    draft_model: Option<PathBuf>,
    #[command(flatten)]
    proposer: ProposerOptions,
    /// Address the coordinator serves clients on (the nodes take free loopback ports).
    #[arg(long, env = "SPECD_LISTEN", default_value = "127.0.0.1:50051")]
    listen: SocketAddr,
    #[command(flatten)]
    node: NodeOptions,
    #[command(flatten)]
    draft: DraftOptions,
    #[command(flatten)]
    policy: PolicyOptions,
    #[command(flatten)]
    http: HttpOptions,
    #[command(flatten)]
    telemetry: TelemetryArgs,
    #[command(flatten)]
    drain: DrainArgs,
    #[command(flatten)]
    metrics: MetricsOptions,
    #[command(flatten)]
    check: CheckArgs,
}

impl MetricsOptions {
    /// With `--metrics-listen`: binds it, serves `GET /metrics` in the background for as
    /// long as the runtime runs, and returns the registry the roles record into.
    async fn start(&self) -> anyhow::Result<Option<Metrics>> {
        let Some(addr) = self.metrics_listen else { return Ok(None) };
        let listener = bind(addr).await?;
        tracing::info!("metrics on http://{}/metrics", listener.local_addr()?);
        let metrics = Metrics::new();
        let serve = specd_telemetry::serve_metrics(listener, metrics.clone(), std::future::pending());
        tokio::spawn(async move {
            if let Err(err) = serve.await {
                tracing::error!(%err, "metrics server stopped");
            }
        });
        Ok(Some(metrics))
    }
}

impl NodeOptions {
    pub(crate) fn dtype(&self) -> DType {
        self.dtype
    }

    fn kv_budget(&self) -> anyhow::Result<KvBudget> {
        if let Some(mib) = self.kv_budget_mib {
            return Ok(KvBudget::Bytes(mib.saturating_mul(1024 * 1024)));
        }
        if !(self.kv_memory_fraction > 0.0 && self.kv_memory_fraction <= 1.0) {
            return Err(invalid(format!("--kv-memory-fraction {} must be in (0, 1]", self.kv_memory_fraction)));
        }
        Ok(KvBudget::FractionOfFree(self.kv_memory_fraction))
    }

    /// The flags that give a `specd target` or `specd draft` process these options
    /// (`specd bench --netns`), with the forward delay replaced where given, and for the
    /// draft its own options over the shared ones, as [`DraftOptions::apply`] does.
    pub(crate) fn to_args(&self, forward_delay_ms: Option<f64>, draft: Option<&DraftOptions>) -> Vec<String> {
        let threads = draft.map(|d| d.draft_threads).or(self.threads);
        let dtype = draft.and_then(|d| d.draft_dtype).unwrap_or(self.dtype);
        let mut args = vec![
            format!("--device={}", self.device),
            format!("--dtype={dtype}"),
            format!("--max-sessions={}", self.max_sessions),
            format!("--forward-delay-ms={}", forward_delay_ms.unwrap_or(self.forward_delay_ms)),
            format!("--session-ttl-s={}", self.session_ttl_s),
        ];
        args.push(format!("--max-batch-sequences={}", self.max_batch_sequences));
        args.push(format!("--max-batch-tokens={}", self.max_batch_tokens));
        args.push(format!("--batch-window-us={}", self.batch_window_us));
        args.extend(self.kv_budget_mib.map(|m| format!("--kv-budget-mib={m}")));
        args.push(format!("--kv-memory-fraction={}", self.kv_memory_fraction));
        args.extend(threads.map(|t| format!("--threads={t}")));
        args.extend(self.sampling_threads.map(|t| format!("--sampling-threads={t}")));
        args.push(format!("--distributions={}", self.distributions));
        args.push(format!("--pin-threads={}", self.pin_threads));
        args
    }

    pub(crate) fn config(&self, model: PathBuf) -> anyhow::Result<NodeConfig> {
        let forward_delay = Duration::try_from_secs_f64(self.forward_delay_ms / 1e3)
            .ok()
            .filter(|d| *d <= Duration::from_secs(60))
            .ok_or_else(|| invalid(format!("--forward-delay-ms {} must be in [0, 60000]", self.forward_delay_ms)))?;
        if self.max_batch_sequences == 0 || self.max_batch_tokens == 0 {
            return Err(invalid(format!(
                "--max-batch-sequences {} and --max-batch-tokens {} must be at least 1",
                self.max_batch_sequences, self.max_batch_tokens
            )));
        }
        if let Some(n) = self.sampling_threads
            && !(1..=64).contains(&n)
        {
            return Err(invalid(format!("--sampling-threads {n} must be between 1 and 64")));
        }
        if self.batch_window_us > 100_000 {
            return Err(invalid(format!("--batch-window-us {} must be at most 100000", self.batch_window_us)));
        }
        let batch = BatchPolicy {
            max_sequences: self.max_batch_sequences,
            max_tokens: self.max_batch_tokens,
            window: Duration::from_micros(self.batch_window_us),
            ..BatchPolicy::default()
        };
        Ok(NodeConfig {
            model,
            device: self.device,
            dtype: self.dtype,
            max_sessions: self.max_sessions,
            kv_budget: self.kv_budget()?,
            forward_delay,
            oom_at_pass: None,
            session_ttl: match Duration::try_from_secs_f64(self.session_ttl_s) {
                Ok(ttl) if ttl.is_zero() => None,
                Ok(ttl) => Some(ttl),
                Err(_) => return Err(invalid(format!("--session-ttl-s {} must be ≥ 0", self.session_ttl_s))),
            },
            tls: ServerTls::default(),
            metrics: None,
            threads: self.threads,
            sampling_threads: self.sampling_threads,
            pin_threads: self.pin_threads,
            allow_unused_weights: self.allow_unused_weights,
            engine: self.engine,
            distributions: self.distributions,
            device_rule: Default::default(),
            batch,
        })
    }
}

impl PolicyOptions {
    /// The defaults `specd coordinator` starts with (and the `SPECD_*` variables set).
    pub(crate) fn defaults() -> anyhow::Result<Self> {
        #[derive(clap::Parser)]
        struct Only {
            #[command(flatten)]
            policy: PolicyOptions,
        }
        Ok(<Only as clap::Parser>::try_parse_from(["specd"])?.policy)
    }

    pub(crate) fn config(&self, targets: Vec<String>, drafts: Vec<String>) -> anyhow::Result<CoordinatorConfig> {
        if self.max_new_tokens == 0 {
            return Err(invalid("--max-new-tokens must be at least 1"));
        }
        let gamma = match self.gamma {
            GammaFlag::Fixed(g) if g > MAX_GAMMA => {
                return Err(invalid(format!("--gamma {g} is above the maximum {MAX_GAMMA}")));
            }
            GammaFlag::Fixed(g) => GammaChoice::Fixed(g),
            GammaFlag::Auto if self.max_gamma > MAX_GAMMA => {
                return Err(invalid(format!("--max-gamma {} is above the maximum {MAX_GAMMA}", self.max_gamma)));
            }
            GammaFlag::Auto => GammaChoice::Adaptive { max: self.max_gamma },
        };
        let truncation = Truncation::new(self.truncation_epsilon, self.truncation_max_entries)
            .map_err(|e| invalid(format!("--truncation-*: {e}")))?;
        if !(self.node_timeout_s.is_finite() && self.node_timeout_s > 0.0) {
            return Err(invalid(format!("--node-timeout-s {} must be positive", self.node_timeout_s)));
        }
        Ok(CoordinatorConfig {
            targets,
            drafts,
            default_gamma: gamma,
            default_max_new_tokens: self.max_new_tokens,
            truncation,
            node_timeout: Duration::from_secs_f64(self.node_timeout_s),
            rule: RuleVariant::Exact,
            optimistic: self.optimistic,
            tls: CoordinatorTls::default(),
            admission: Admission {
                api_token: self.api_token.clone().filter(|t| !t.is_empty()),
                max_generations: (self.max_generations > 0).then_some(self.max_generations),
            },
            metrics: None,
            discovery: Discovery::default(),
            tokenizer: self.tokenizer.clone(),
            generation_config: self.generation_config,
        })
    }
}

/// Runs a role on a multi-threaded runtime with logs on stderr (`RUST_LOG`, default info) and,
/// when configured, traces exported as `service_name`.
fn run_role<F>(service_name: &str, telemetry: &TelemetryArgs, role: F) -> anyhow::Result<()>
where
    F: Future<Output = anyhow::Result<()>>,
{
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;
    let options = TelemetryOptions { service_name: service_name.to_owned(), otlp_endpoint: telemetry.endpoint() };
    // The OTLP client is a tonic channel: it is made inside the runtime.
    let guard = {
        let _entered = runtime.enter();
        specd_telemetry::init(&options)?
    };
    let result = runtime.block_on(role);
    // Flushes the last spans while the runtime still drives the exporter's connection.
    drop(guard);
    result
}

/// Resolves on Ctrl-C or SIGTERM.
pub(crate) async fn shutdown_signal() {
    let ctrl_c = tokio::signal::ctrl_c();
    #[cfg(unix)]
    {
        let mut term = match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(s) => s,
            Err(_) => {
                let _ = ctrl_c.await;
                return;
            }
        };
        tokio::select! {
            _ = ctrl_c => {},
            _ = term.recv() => {},
        }
    }
    #[cfg(not(unix))]
    let _ = ctrl_c.await;
    tracing::info!("shutting down");
}

pub(crate) async fn bind(addr: SocketAddr) -> anyhow::Result<TcpListener> {
    TcpListener::bind(addr).await.with_context(|| format!("cannot listen on {addr}"))
}

/// Says how idle libtorch workers wait ([`crate::openmp`]): it moves a CPU verify pass.
fn log_openmp_wait() {
    tracing::info!(openmp = %crate::openmp::describe(), "idle OpenMP workers");
}

fn announce(listener: &TcpListener) -> anyhow::Result<()> {
    outln!("listening on {}", listener.local_addr()?);
    Ok(())
}

pub fn run_target(args: &TargetArgs) -> anyhow::Result<()> {
    let mut config = args.node.config(args.model.clone())?;
    config.tls = args.service.tls.tls()?;
    let grace = args.service.drain.grace()?;
    if args.check.check_config {
        return check_node("target", args.listen, &config, &args.service);
    }
    run_role("specd-target", &args.service.telemetry, async {
        let listener = bind(args.listen).await?;
        config.metrics = args.service.metrics.start().await?;
        log_openmp_wait();
        let node = TargetNode::load(config).await?;
        announce(&listener)?;
        serve_until_signal(grace, |stop| specd_target_node::serve(listener, node, stop)).await
    })
}

pub fn run_draft(args: &DraftArgs) -> anyhow::Result<()> {
    let proposer = args.proposer.config()?;
    let mut config = args.node.config(draft_model_path("--model", args.model.as_ref(), proposer.kind)?)?;
    config.tls = args.service.tls.tls()?;
    let grace = args.service.drain.grace()?;
    if args.check.check_config {
        return check_node("draft", args.listen, &config, &args.service);
    }
    run_role("specd-draft", &args.service.telemetry, async {
        let listener = bind(args.listen).await?;
        config.metrics = args.service.metrics.start().await?;
        log_openmp_wait();
        let node = DraftNode::start(config, proposer).await?;
        announce(&listener)?;
        serve_until_signal(grace, |stop| specd_draft_node::serve(listener, node, stop)).await
    })
}

pub fn run_coordinator(args: &CoordinatorArgs) -> anyhow::Result<()> {
    let mut config = args.policy.config(args.target.clone(), args.draft.clone())?;
    config.tls = CoordinatorTls { server: args.service.tls.tls()?, nodes: args.node_tls.tls()? };
    let grace = args.service.drain.grace()?;
    let (targets, drafts) = (node_addresses("--target", &args.target)?, node_addresses("--draft", &args.draft)?);
    config.discovery.interval = Duration::try_from_secs_f64(args.discovery_interval_s)
        .ok()
        .filter(|d| !d.is_zero())
        .ok_or_else(|| invalid(format!("--discovery-interval-s {} must be positive", args.discovery_interval_s)))?;
    if args.check.check_config {
        let traces = traces_summary(&args.service.telemetry)?;
        let dns = targets.iter().chain(&drafts).any(|a| matches!(a, NodeAddress::Dns { .. }));
        let every = if dns { format!(" (re-resolved every {:?})", config.discovery.interval) } else { String::new() };
        outln!(
            "config ok: coordinator on {}{}, targets {}, drafts {}{every}, gamma {}{}{traces}",
            args.listen,
            args.http.summary(None),
            list(&targets),
            if drafts.is_empty() { "none (target-only)".to_owned() } else { list(&drafts) },
            match config.default_gamma {
                GammaChoice::Fixed(g) => g.to_string(),
                GammaChoice::Adaptive { max } => format!("auto (max {max})"),
            },
            metrics_summary(&args.service.metrics),
        );
        return Ok(());
    }
    run_role("specd-coordinator", &args.service.telemetry, async {
        let listener = bind(args.listen).await?;
        let http = args.http.bind(None).await?;
        config.metrics = args.service.metrics.start().await?;
        let service = specd_coordinator::connect(&config).await?;
        announce_http(http.as_ref())?;
        announce(&listener)?;
        serve_until_signal(grace, |stop| specd_coordinator::serve_all(listener, http, service, stop)).await
    })
}

pub fn run_up(args: &UpArgs) -> anyhow::Result<()> {
    let mut target_config = args.node.config(args.target_model.clone())?;
    let proposer = args.proposer.config()?;
    let draft_model = draft_model_path("--draft-model", args.draft_model.as_ref(), proposer.kind)?;
    let mut draft_config = args.draft.apply(args.node.config(draft_model)?);
    let grace = args.drain.grace()?;
    if args.check.check_config {
        args.policy.config(Vec::new(), Vec::new())?;
        let target = check_model(&target_config.model)?;
        let draft = if proposer.kind.needs_model() {
            let model = check_model(&draft_config.model)?;
            if proposer.kind == ProposerKind::Model { model } else { format!("{model} ({})", proposer.kind) }
        } else {
            format!("none ({})", proposer.kind)
        };
        let traces = traces_summary(&args.telemetry)?;
        outln!(
            "config ok: up on {}{}, target {target}, draft {draft}, {} {} (draft {}){}{traces}",
            args.listen,
            args.http.summary(Some(UP_HTTP_LISTEN)),
            target_config.device,
            target_config.dtype,
            draft_config.dtype,
            metrics_summary(&args.metrics),
        );
        return Ok(());
    }
    // One process, one exporter: all three roles' spans carry the service name `specd`.
    run_role("specd", &args.telemetry, async {
        let public = bind(args.listen).await?;
        let http = args.http.bind(Some(UP_HTTP_LISTEN)).await?;
        let metrics = args.metrics.start().await?;
        (target_config.metrics, draft_config.metrics) = (metrics.clone(), metrics.clone());
        log_openmp_wait();
        let nodes = LoopbackNodes::start(target_config, draft_config, proposer).await?;
        let mut config = args.policy.config(vec![nodes.target_url.clone()], vec![nodes.draft_url.clone()])?;
        config.metrics = metrics;
        let service = specd_coordinator::connect(&config).await?;
        announce_http(http.as_ref())?;
        announce(&public)?;
        let result = serve_until_signal(grace, |stop| specd_coordinator::serve_all(public, http, service, stop)).await;
        // The coordinator has drained (or run out of grace): now the nodes.
        nodes.stop(grace).await;
        result
    })
}

/// A target and a draft node serving on free loopback ports in this process (`specd up`,
/// `specd bench --embedded`).
#[derive(Debug)]
pub struct LoopbackNodes {
    pub target_url: String,
    pub draft_url: String,
    stop: tokio::sync::watch::Sender<bool>,
    tasks: Vec<tokio::task::JoinHandle<Result<(), specd_proto::transport::ServeError>>>,
}

impl LoopbackNodes {
    /// Loads both models (concurrently; the draft's only where `proposer` needs one) and
    /// starts serving them.
    pub async fn start(
        target_config: NodeConfig,
        draft_config: NodeConfig,
        proposer: ProposerConfig,
    ) -> anyhow::Result<Self> {
        let loopback: SocketAddr = "127.0.0.1:0".parse()?;
        let (target_listener, draft_listener) = (bind(loopback).await?, bind(loopback).await?);
        let target_url = format!("http://{}", target_listener.local_addr()?);
        let draft_url = format!("http://{}", draft_listener.local_addr()?);
        let (target, draft) = tokio::join!(TargetNode::load(target_config), DraftNode::start(draft_config, proposer));
        let (target, draft) = (target?, draft?);
        let (stop, stop_rx) = tokio::sync::watch::channel(false);
        let stopped = |mut rx: tokio::sync::watch::Receiver<bool>| async move {
            let _ = rx.wait_for(|stop| *stop).await;
        };
        let tasks = vec![
            tokio::spawn(specd_target_node::serve(target_listener, target, stopped(stop_rx.clone()))),
            tokio::spawn(specd_draft_node::serve(draft_listener, draft, stopped(stop_rx))),
        ];
        Ok(Self { target_url, draft_url, stop, tasks })
    }

    /// Stops both nodes, waiting up to `grace` for them to drain.
    pub async fn stop(self, grace: Duration) {
        let _ = self.stop.send(true);
        if tokio::time::timeout(grace, futures_join_all(self.tasks)).await.is_err() {
            tracing::warn!("nodes still draining after the grace period: exiting");
        }
    }
}

async fn futures_join_all<T>(tasks: Vec<tokio::task::JoinHandle<T>>) {
    for task in tasks {
        let _ = task.await;
    }
}

/// The node addresses of `flag`, parsed (no network access).
fn node_addresses(flag: &str, addresses: &[String]) -> anyhow::Result<Vec<NodeAddress>> {
    NodeAddress::parse_all(addresses).map_err(|e| invalid(format!("{flag}: {e}")))
}

fn list(addresses: &[NodeAddress]) -> String {
    addresses.iter().map(ToString::to_string).collect::<Vec<_>>().join(",")
}

/// What `--check-config` says about a model path: a checkpoint directory whose config.json
/// parses and names a supported architecture, with weights beside it; or a table-model
/// file that loads. The weights themselves are not read.
fn check_model(path: &Path) -> anyhow::Result<String> {
    let bad = |why: String| invalid(format!("model {}: {why}", path.display()));
    if path.is_dir() {
        let config = LlamaConfig::from_dir(path).map_err(|e| bad(e.to_string()))?;
        let weights = ["model.safetensors", "model.safetensors.index.json"];
        if !weights.iter().any(|w| path.join(w).is_file()) {
            return Err(bad(format!("neither {} nor {} is there", weights[0], weights[1])));
        }
        let tokenizer = if path.join("tokenizer.json").is_file() { "" } else { ", no tokenizer.json" };
        Ok(format!(
            "{} ({:?}, vocabulary {}, context {}{tokenizer})",
            path.display(),
            config.architecture,
            config.vocab_size,
            config.max_position_embeddings
        ))
    } else if path.is_file() {
        TableModel::load(path, None).map_err(|e| bad(e.to_string()))?;
        Ok(format!("{} (table model)", path.display()))
    } else {
        Err(bad("no such file or directory (a checkpoint directory or a table-model .json)".into()))
    }
}

/// Where traces go, for `--check-config`; an endpoint that is not an http(s) URL is invalid.
fn traces_summary(telemetry: &TelemetryArgs) -> anyhow::Result<String> {
    let from_env = std::env::var("OTEL_EXPORTER_OTLP_ENDPOINT").ok().filter(|e| !e.is_empty());
    let Some(endpoint) = telemetry.endpoint().or(from_env) else { return Ok(String::new()) };
    let uri: tonic::transport::Uri =
        endpoint.parse().map_err(|e| invalid(format!("OTLP endpoint {endpoint:?} is not a URL: {e}")))?;
    if !matches!(uri.scheme_str(), Some("http" | "https")) || uri.host().is_none() {
        return Err(invalid(format!("OTLP endpoint {endpoint:?}: expected http://HOST:PORT or https://HOST:PORT")));
    }
    Ok(format!(", traces to {endpoint}"))
}

fn metrics_summary(metrics: &MetricsOptions) -> String {
    metrics.metrics_listen.map(|a| format!(", metrics on {a}")).unwrap_or_default()
}

/// `--check-config` of a node role: everything but loading the weights.
fn check_node(role: &str, listen: SocketAddr, config: &NodeConfig, service: &ServiceArgs) -> anyhow::Result<()> {
    // An empty path: a draft whose proposer needs no model.
    let model = if config.model.as_os_str().is_empty() { "none".to_owned() } else { check_model(&config.model)? };
    let traces = traces_summary(&service.telemetry)?;
    let tls = if service.tls.tls_client_ca.is_some() {
        ", mutual TLS"
    } else if service.tls.tls_cert.is_some() {
        ", TLS"
    } else {
        ""
    };
    outln!(
        "config ok: {role} on {listen}{tls}, model {model}, {} {}{}{traces}",
        config.device,
        config.dtype,
        metrics_summary(&service.metrics)
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::NodeOptions;

    #[derive(Parser)]
    struct Flags {
        #[command(flatten)]
        node: NodeOptions,
    }

    fn node(args: &[&str]) -> NodeOptions {
        Flags::try_parse_from(std::iter::once("node").chain(args.iter().copied())).unwrap().node
    }

    #[test]
    fn a_draft_model_a_model_less_proposer_would_ignore_is_refused() {
        use specd_draft_node::proposer::ProposerKind;
        let model = std::path::PathBuf::from("m");
        let err = super::draft_model_path("--model", Some(&model), ProposerKind::Ngram).unwrap_err().to_string();
        assert!(err.contains("--proposer ngram drafts without a model") && err.contains("--model m"), "{err}");
        assert_eq!(super::draft_model_path("--model", Some(&model), ProposerKind::ModelNgram).unwrap(), model);
        assert!(super::draft_model_path("--model", None, ProposerKind::Model).is_err());
        assert_eq!(super::draft_model_path("--model", None, ProposerKind::Suffix).unwrap(), std::path::PathBuf::new());
    }

    #[test]
    fn sampling_threads_are_checked_and_passed_on() {
        let error = node(&["--sampling-threads", "0"]).config("m".into()).unwrap_err().to_string();
        assert!(error.contains("--sampling-threads 0 must be between 1 and 64"), "{error}");
        let four = node(&["--sampling-threads", "4"]);
        assert_eq!(four.config("m".into()).unwrap().sampling_threads, Some(4));
        assert!(four.to_args(None, None).contains(&"--sampling-threads=4".to_owned()));
        assert_eq!(node(&[]).config("m".into()).unwrap().sampling_threads, None);
    }

    #[test]
    fn distributions_are_parsed_and_passed_on() {
        use specd_node::Distributions;
        assert_eq!(node(&[]).config("m".into()).unwrap().distributions, Distributions::Auto);
        let device = node(&["--distributions", "device"]);
        assert_eq!(device.config("m".into()).unwrap().distributions, Distributions::Device);
        assert!(device.to_args(None, None).contains(&"--distributions=device".to_owned()));
        let error = Flags::try_parse_from(["node", "--distributions", "gpu"]).err().map(|e| e.to_string());
        let error = error.expect("--distributions gpu is refused");
        assert!(error.contains("expected auto, host or device"), "{error}");
    }
}
