//! Test harness: a whole specd cluster (target node, draft node, coordinator) as real gRPC
//! servers on 127.0.0.1 ports chosen by the OS, in this process, plus table models written
//! from Rust so that tests know the exact p and q; [`chaos`] puts a connection-cutting proxy
//! in front of the draft.

pub mod chaos;
pub mod law_tables;

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use chaos::ChaosProxy;
use specd_coordinator::{CoordinatorConfig, GammaChoice, InProcessNodes, RuleVariant};
use specd_device_sampling::DeviceRule;
use specd_draft_node::DraftNode;
use specd_draft_node::proposer::ProposerConfig;
use specd_model::{BatchPolicy, DType, DeviceSpec, Engine, KvBudget, PrefixCacheOptions};
use specd_node::{BlockMasks, Distributions, NodeConfig, NodeFaults};
use specd_proto::in_process::{Rounds, ServesRounds};
use specd_proto::v1::draft_service_client::DraftServiceClient;
use specd_proto::v1::generate_request::Prompt;
use specd_proto::v1::generation_client::GenerationClient;
use specd_proto::v1::target_service_client::TargetServiceClient;
use specd_proto::v1::{
    GenerateRequest, InfoRequest, NodeInfo, SamplingParams as WireSampling, Speculation, SpeculationStats,
    StoppingCriteria, TokenIds,
};
use specd_sampling::{Purpose, Truncation, Verification};
use specd_target_node::TargetNode;
use specd_telemetry::Metrics;
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio_stream::StreamExt;
use tonic::transport::Channel;

/// The request of a law check: exactly `length` tokens after `prompt` (EOS ignored), with
/// `sampling`, the coordinator's γ, and the sparse or `dense` wire.
pub fn continuation_request(prompt: &[u32], length: usize, sampling: WireSampling, dense: bool) -> GenerateRequest {
    GenerateRequest {
        prompt: Some(Prompt::TokenIds(TokenIds { ids: prompt.to_vec() })),
        sampling: Some(sampling),
        stopping: Some(StoppingCriteria {
            max_new_tokens: Some(length as u32),
            ignore_eos: true,
            ..Default::default()
        }),
        speculation: Some(Speculation { gamma: None, dense }),
        ..Default::default()
    }
}

/// Streams one generation to its end: every token, and the stats of its last message (a
/// stream's stats are the generation's so far, so the last has them all).
pub async fn stream_to_end(
    client: &mut GenerationClient<Channel>,
    request: GenerateRequest,
) -> anyhow::Result<(Vec<u32>, SpeculationStats)> {
    let mut stream = client.generate_stream(request).await?.into_inner();
    let (mut tokens, mut stats) = (Vec::new(), None);
    while let Some(message) = stream.next().await {
        let message = message?;
        stats = message.stats.or(stats);
        tokens.extend(message.token_ids);
    }
    Ok((tokens, stats.unwrap_or_default()))
}

/// How to start a cluster.
#[derive(Debug, Clone)]
pub struct ClusterOptions {
    /// The coordinator's policy for requests that leave γ unset.
    pub gamma: GammaChoice,
    pub truncation: Truncation,
    pub rule: RuleVariant,
    /// The coordinator's `--verify` (default: block, as the flag's).
    pub verification: Verification,
    pub dtype: DType,
    /// What computes both nodes' passes (default: auto, as the nodes' flag).
    pub engine: Engine,
    /// Record every role's metrics here and serve them at [`Cluster::metrics_url`].
    pub metrics: Option<Metrics>,
    /// The nodes release sessions unused this long.
    pub session_ttl: Option<Duration>,
    /// The coordinator reaches the draft through a [`ChaosProxy`] cutting its connections
    /// after lifetimes of this mean.
    pub draft_chaos: Option<Duration>,
    /// Optimistic drafting (the coordinator's `--optimistic`).
    pub optimistic: bool,
    /// The coordinator's `--tree` (default: off, chains).
    pub tree: specd_coordinator::TreeSetting,
    /// The draft draws the candidates of blocks drafted ahead from these streams
    /// ([`DraftNode::with_lookahead_purpose`]): `Purpose::Draft` unless a test breaks it.
    pub lookahead_purpose: Purpose,
    /// Added to every forward pass of the target and of the draft.
    pub forward_delays: (Duration, Duration),
    /// How both nodes batch concurrent sessions' forward passes (the nodes' default: on).
    pub batch: BatchPolicy,
    /// The draft pushes broken blocks ([`DraftNode::with_corrupt_pushes`]).
    pub corrupt_pushes: bool,
    /// The coordinator reaches the draft through a `specd_netns::delay_proxy` adding this
    /// much each way (loopback stands in for a network; the proxy needs no root).
    pub draft_one_way_delay: Option<Duration>,
    /// The draft node's proposer (`--proposer`; default: the model).
    pub proposer: ProposerConfig,
    /// The target's KV budget (default: unbounded).
    pub target_kv_budget: KvBudget,
    /// The target's forward pass number N fails out of memory (`NodeFaults::oom_at_pass`).
    pub target_oom_at_pass: Option<u64>,
    /// Where both nodes build their distributions (default: auto, the host on a CPU).
    pub distributions: Distributions,
    /// The target's device rule (`NodeFaults::device_rule`; default: exact).
    pub device_rule: DeviceRule,
    /// Both nodes' prefix caches (default: on, as the nodes' flag).
    pub prefix_cache: PrefixCacheOptions,
    /// The target's prefix cache files rejected candidates' rows under committed tokens
    /// (`NodeFaults::prefix_cache_keeps_rejected_rows`; default: no).
    pub target_prefix_cache_keeps_rejected_rows: bool,
    /// How the target masks a constrained block's rows (`NodeFaults::block_masks`; default:
    /// exact).
    pub target_block_masks: BlockMasks,
    /// The coordinator sends its round streams to both nodes in process
    /// (`specd_proto::in_process`, as `specd up` does) rather than over gRPC (default: gRPC).
    pub in_process_rounds: bool,
}

impl Default for ClusterOptions {
    fn default() -> Self {
        Self {
            gamma: GammaChoice::Fixed(4),
            truncation: Truncation::new(1e-4, 64).unwrap(),
            rule: RuleVariant::Exact,
            verification: Verification::default(),
            dtype: DType::F32,
            engine: Engine::Auto,
            metrics: None,
            session_ttl: None,
            draft_chaos: None,
            optimistic: true,
            tree: Default::default(),
            lookahead_purpose: Purpose::Draft,
            forward_delays: (Duration::ZERO, Duration::ZERO),
            batch: BatchPolicy::default(),
            corrupt_pushes: false,
            draft_one_way_delay: None,
            proposer: ProposerConfig::default(),
            target_kv_budget: KvBudget::Unbounded,
            target_oom_at_pass: None,
            distributions: Distributions::Auto,
            device_rule: Default::default(),
            prefix_cache: PrefixCacheOptions::default(),
            target_prefix_cache_keeps_rejected_rows: false,
            target_block_masks: BlockMasks::Exact,
            in_process_rounds: false,
        }
    }
}

/// Three servers; stopped when dropped.
#[derive(Debug)]
pub struct Cluster {
    pub endpoint: String,
    pub target_url: String,
    pub draft_url: String,
    /// `http://127.0.0.1:PORT/metrics` when [`ClusterOptions::metrics`] is set.
    pub metrics_url: Option<String>,
    /// The draft node (a handle: it is served by the cluster's task).
    pub draft: DraftNode,
    /// Round streams handed to the target and the draft in process
    /// ([`ClusterOptions::in_process_rounds`]).
    in_process_streams: [Arc<AtomicUsize>; 2],
    stop: watch::Sender<bool>,
    tasks: Vec<JoinHandle<()>>,
    _chaos: Option<ChaosProxy>,
}

/// A node's in-process handle that counts the round streams handed to it.
#[derive(Debug)]
struct CountedRounds<N> {
    node: N,
    streams: Arc<AtomicUsize>,
}

impl<Q, R, N: ServesRounds<Q, R>> ServesRounds<Q, R> for CountedRounds<N> {
    fn answer_rounds(&self, requests: Rounds<Q>) -> Rounds<R> {
        self.streams.fetch_add(1, Ordering::Relaxed);
        self.node.answer_rounds(requests)
    }
}

async fn loopback() -> anyhow::Result<(TcpListener, String)> {
    let listener = TcpListener::bind("127.0.0.1:0").await?;
    let url = format!("http://{}", listener.local_addr()?);
    Ok((listener, url))
}

impl Cluster {
    pub async fn start(target_model: &Path, draft_model: &Path, options: &ClusterOptions) -> anyhow::Result<Self> {
        let config = |model: &Path, forward_delay| NodeConfig {
            model: model.to_owned(),
            device: DeviceSpec::Cpu,
            dtype: options.dtype,
            engine: options.engine,
            attention: Default::default(),
            max_sessions: 1024,
            prefix_cache: options.prefix_cache,
            kv_budget: KvBudget::Unbounded,
            forward_delay,
            session_ttl: options.session_ttl,
            tls: Default::default(),
            metrics: options.metrics.clone(),
            threads: None,
            sampling_threads: None,
            pin_threads: false,
            allow_unused_weights: false,
            distributions: options.distributions,
            faults: NodeFaults {
                oom_at_pass: None,
                device_rule: options.device_rule,
                prefix_cache_keeps_rejected_rows: false,
                block_masks: BlockMasks::Exact,
            },
            batch: options.batch,
        };
        let target_config = NodeConfig {
            kv_budget: options.target_kv_budget,
            faults: NodeFaults {
                oom_at_pass: options.target_oom_at_pass,
                device_rule: options.device_rule,
                prefix_cache_keeps_rejected_rows: options.target_prefix_cache_keeps_rejected_rows,
                block_masks: options.target_block_masks,
            },
            ..config(target_model, options.forward_delays.0)
        };
        let target = TargetNode::load(target_config).await?;
        let target_handle = target.clone();
        let draft = DraftNode::start(config(draft_model, options.forward_delays.1), options.proposer)
            .await?
            .with_lookahead_purpose(options.lookahead_purpose);
        let draft = if options.corrupt_pushes { draft.with_corrupt_pushes() } else { draft };
        let draft_handle = draft.clone();
        let (stop, stop_rx) = watch::channel(false);
        let stopped = |mut rx: watch::Receiver<bool>| async move {
            let _ = rx.wait_for(|s| *s).await;
        };
        let (target_listener, target_url) = loopback().await?;
        let (draft_listener, draft_url) = loopback().await?;
        let (public, endpoint) = loopback().await?;
        let mut tasks = Vec::new();
        let rx = stop_rx.clone();
        tasks.push(tokio::spawn(async move {
            specd_target_node::serve(target_listener, target, stopped(rx)).await.expect("target serves");
        }));
        let rx = stop_rx.clone();
        tasks.push(tokio::spawn(async move {
            specd_draft_node::serve(draft_listener, draft, stopped(rx)).await.expect("draft serves");
        }));
        let mut chaos = None;
        let coordinator_draft_url = match options.draft_chaos {
            Some(mean) => {
                let upstream = draft_url.trim_start_matches("http://").to_owned();
                let proxy = ChaosProxy::start(upstream, mean, 0x5eed).await?;
                let url = proxy.url.clone();
                chaos = Some(proxy);
                url
            }
            None => draft_url.clone(),
        };
        let coordinator_draft_url = match options.draft_one_way_delay {
            Some(one_way) => {
                let upstream = coordinator_draft_url.trim_start_matches("http://").parse()?;
                let (listener, url) = loopback().await?;
                let delay = specd_netns::delay_proxy::Delay { one_way, jitter: Duration::ZERO };
                let mut stop = stop_rx.clone();
                tasks.push(tokio::spawn(async move {
                    // The proxy serves until its listener fails: the cluster's stop ends it.
                    tokio::select! {
                        _ = specd_netns::delay_proxy::serve(listener, upstream, delay) => {}
                        _ = stop.wait_for(|s| *s) => {}
                    }
                }));
                url
            }
            None => coordinator_draft_url,
        };
        anyhow::ensure!(
            !options.in_process_rounds || (options.draft_chaos.is_none() && options.draft_one_way_delay.is_none()),
            "rounds in process would bypass the draft's proxy: choose one"
        );
        let in_process_streams = [Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0))];
        let in_process = if options.in_process_rounds {
            let streams = |i: usize| Arc::clone(&in_process_streams[i]);
            let target = CountedRounds { node: target_handle, streams: streams(0) };
            let draft = CountedRounds { node: draft_handle.clone(), streams: streams(1) };
            InProcessNodes::default()
                .with_target(target_url.clone(), Arc::new(target))
                .with_draft(coordinator_draft_url.clone(), Arc::new(draft))
        } else {
            InProcessNodes::default()
        };
        let config = CoordinatorConfig {
            targets: vec![target_url.clone()],
            drafts: vec![coordinator_draft_url],
            default_gamma: options.gamma,
            default_max_new_tokens: 64,
            truncation: options.truncation,
            node_timeout: Duration::from_secs(30),
            rule: options.rule,
            verification: options.verification,
            optimistic: options.optimistic,
            tree: options.tree.clone(),
            metrics: options.metrics.clone(),
            tls: Default::default(),
            admission: Default::default(),
            tokenizer: None,
            generation_config: true,
            discovery: Default::default(),
            in_process,
        };
        let service = specd_coordinator::connect(&config).await?;
        let rx = stop_rx.clone();
        tasks.push(tokio::spawn(async move {
            specd_coordinator::serve(public, service, stopped(rx)).await.expect("coordinator serves");
        }));
        let mut metrics_url = None;
        if let Some(metrics) = options.metrics.clone() {
            let (listener, url) = loopback().await?;
            metrics_url = Some(format!("{url}/metrics"));
            let rx = stop_rx;
            tasks.push(tokio::spawn(async move {
                specd_telemetry::serve_metrics(listener, metrics, stopped(rx)).await.expect("metrics served");
            }));
        }
        Ok(Self {
            endpoint,
            target_url,
            draft_url,
            metrics_url,
            draft: draft_handle,
            in_process_streams,
            stop,
            tasks,
            _chaos: chaos,
        })
    }

    /// Round streams the coordinator has handed to the target and to the draft in process.
    pub fn in_process_round_streams(&self) -> (usize, usize) {
        let [target, draft] = &self.in_process_streams;
        (target.load(Ordering::Relaxed), draft.load(Ordering::Relaxed))
    }

    pub async fn client(&self) -> anyhow::Result<GenerationClient<Channel>> {
        Ok(GenerationClient::connect(self.endpoint.clone()).await?)
    }

    pub async fn target_info(&self) -> anyhow::Result<NodeInfo> {
        let mut client = TargetServiceClient::connect(self.target_url.clone()).await?;
        Ok(client.info(InfoRequest {}).await?.into_inner())
    }

    pub async fn draft_info(&self) -> anyhow::Result<NodeInfo> {
        let mut client = DraftServiceClient::connect(self.draft_url.clone()).await?;
        Ok(client.info(InfoRequest {}).await?.into_inner())
    }

    pub async fn shutdown(mut self) {
        let _ = self.stop.send(true);
        for task in self.tasks.drain(..) {
            let _ = task.await;
        }
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        let _ = self.stop.send(true);
    }
}

/// A table model: `default`, and `(prefix, probs)` rules matching the whole history.
#[derive(Debug, Clone)]
pub struct Table {
    pub vocab_size: usize,
    pub default: Vec<f64>,
    pub rules: Vec<(Vec<u32>, Vec<f64>)>,
}

impl Table {
    /// p for the token after `history`: the rule for exactly that history, else the default.
    pub fn probs(&self, history: &[u32]) -> &[f64] {
        self.rules.iter().find(|(prefix, _)| prefix == history).map_or(&self.default, |(_, p)| p)
    }

    /// Writes the table-model JSON file (format: `specd_model::table`).
    pub fn write(&self, path: &Path) -> anyhow::Result<PathBuf> {
        let rules: Vec<_> =
            self.rules.iter().map(|(prefix, probs)| serde_json::json!({"prefix": prefix, "probs": probs})).collect();
        let names: Vec<String> = (0..self.vocab_size).map(|i| format!("t{i}")).collect();
        let file = serde_json::json!({
            "vocab_size": self.vocab_size,
            "tokens": names,
            "default": self.default,
            "rules": rules,
        });
        std::fs::write(path, serde_json::to_vec_pretty(&file)?)?;
        Ok(path.to_owned())
    }
}

/// A fresh directory under the workspace's `target/` for a test's files.
pub fn scratch_dir(name: &str) -> PathBuf {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../target/e2e").join(name);
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("scratch dir");
    dir
}

/// The tiny random Hugging Face checkpoints of `scripts/make_fixtures.py` (made with PyPI
/// `transformers` on first use, shared with the model crate's tests; all share one
/// tokenizer of 96 tokens).
pub fn hf_fixture(name: &str) -> PathBuf {
    static DIR: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    let dir = DIR.get_or_init(|| {
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
        let out = root.join("target/fixtures/model-v5");
        if !out.join("VERSION").is_file() {
            std::fs::create_dir_all(out.parent().expect("parent")).expect("fixture parent");
            let python = std::env::var_os("SPECD_PYTHON").map_or_else(|| root.join(".venv/bin/python"), PathBuf::from);
            let status = std::process::Command::new(&python)
                .arg(root.join("scripts/make_fixtures.py"))
                .arg(&out)
                .status()
                .unwrap_or_else(|e| panic!("cannot run {}: {e}", python.display()));
            assert!(status.success(), "scripts/make_fixtures.py failed; is transformers installed (make pydeps)?");
        }
        out
    });
    dir.join(name)
}
