//! specd-coordinator: the public API and the exact speculative round loop.
//!
//! - [`api`]: what clients call: the `specd.v1.Generation` gRPC service (one
//!   [`session::SessionActor`] per request), the OpenAI-compatible HTTP API over it, and
//!   admission (bearer token, generations in flight, deadlines);
//! - [`session`]: a generation's loop as named steps, and the drop guard that releases both
//!   nodes' sessions on finish, error, timeout and client cancel; in it, [`session::open`]
//!   (the sessions asked for), [`session::target`] and [`session::failover`] (the target's
//!   session, moved to a spare when lost), [`session::choose`] (each round's γ),
//!   [`session::round`] (Propose, Verify, the rule from `specd-sampling`),
//!   [`session::propose`] (the draft's part, and the blocks it pushes ahead),
//!   [`session::draft_link`] (the link to the draft, lost and found again),
//!   [`session::round_report`] (what a round leaves behind), [`session::commit`] (a round's
//!   tokens, and the stop conditions), [`session::stream`] (the client's messages),
//!   [`session::stats`], [`session::finish`], [`session::release`], [`session::logprobs`]
//!   and [`session::metrics`];
//! - [`policy`]: adaptive γ from the session's measured acceptance and costs; in it,
//!   [`policy::governor`] (under load, whether a load level's sessions draft at all),
//!   [`policy::copies`] (whether a `model+ngram` draft's copies pay) and the running average
//!   and re-measuring budget they use;
//! - [`nodes`]: typed node clients, the startup compatibility check, replica choice; in it,
//!   [`nodes::discovery`] (`dns:///` addresses, re-resolved), [`nodes::round_stream`] (a
//!   session's long-lived round stream to one node) and which vocabularies fit together;
//! - [`text`]: the model's tokenizer, chat template and generation defaults, fetched from the
//!   target (`specd-text` does the text work: incremental detokenization, stop strings);
//! - [`request`]: validation of client requests;
//! - [`error`]: [`CoordinatorError`] and its status codes;
//! - [`run`] / [`serve`]: the server, with health and reflection.

pub mod api;
pub mod error;
pub mod nodes;
pub mod policy;
pub mod request;
pub mod session;
pub mod text;

use std::future::Future;
use std::time::Duration;

use specd_proto::v1::generation_server::GenerationServer;
use specd_sampling::Truncation;
use tokio::net::TcpListener;
use tonic::server::NamedService;
use tonic::service::Routes;

pub use api::admission::Admission;
pub use api::grpc::GenerationService;
pub use api::http::HttpConfig;
pub use error::CoordinatorError;
pub use nodes::NodePool;
pub use nodes::discovery::{Dialing, Discovery, NodeAddress, Resolver, StaticResolver, SystemResolver};
pub use request::{Defaults, GammaChoice, RuleVariant, TreeSetting};
pub use specd_proto::in_process::InProcessNodes;
use specd_proto::tls::{ClientTls, ServerTls};
/// The syntax of a model's tool calls, for [`HttpConfig::tool_call_format`].
pub use specd_text::ToolCallFormat;

/// TLS on both sides of a coordinator.
#[derive(Debug, Clone, Default)]
pub struct CoordinatorTls {
    /// Its own API: TLS, and mutual TLS with a client CA.
    pub server: ServerTls,
    /// Reaching the nodes (`https://` URLs): their CA, and a client certificate for nodes
    /// that require mutual TLS.
    pub nodes: ClientTls,
}

/// How to run a coordinator.
#[derive(Debug, Clone)]
pub struct CoordinatorConfig {
    /// Target nodes: URLs (`http://host:port`) or `dns:///host:port` names standing for
    /// every replica they resolve to; new sessions go round-robin over them.
    pub targets: Vec<String>,
    /// Draft nodes, the same way; none means target-only decoding.
    pub drafts: Vec<String>,
    /// How `dns:///` names are resolved, and how often again.
    pub discovery: Discovery,
    /// How γ is chosen when a request leaves it unset.
    pub default_gamma: GammaChoice,
    pub default_max_new_tokens: u32,
    /// The draft's truncation of q for the sparse wire format.
    pub truncation: Truncation,
    /// Deadline of every call to a node, and of connecting to one.
    pub node_timeout: Duration,
    /// Always [`RuleVariant::Exact`] in service; with the `testing` feature a wrong variant
    /// exists, so that the law tests can show they catch it.
    pub rule: RuleVariant,
    /// Token or block verification (docs/rule.md): both exact; block verification accepts at
    /// least as many candidates in expectation from the same target pass.
    pub verification: specd_sampling::Verification,
    /// Optimistic drafting (docs/architecture.md): the draft drafts each next block while the target
    /// verifies this one, guessing that every candidate is accepted and which bonus token
    /// comes; a right guess saves the next round its draft time. Exact either way.
    pub optimistic: bool,
    /// Trees of drafts instead of chains (docs/rule.md#trees-of-drafts): one target pass
    /// scores several alternatives at a node.
    pub tree: TreeSetting,
    /// Where to record rounds, tokens, latencies and finish reasons (`specd-telemetry`).
    pub metrics: Option<specd_telemetry::Metrics>,
    pub tls: CoordinatorTls,
    /// Bearer token, generations in flight.
    pub admission: Admission,
    /// Where the tokenizer, chat template and generation defaults come from: this model
    /// directory, or (`None`) the target, which sends them when the coordinator connects.
    pub tokenizer: Option<std::path::PathBuf>,
    /// Use the model's generation_config.json values as request defaults.
    pub generation_config: bool,
    /// Nodes served in this process (`specd up`, `specd bench --embedded`): the round
    /// streams to those of `targets` and `drafts` go through their handles, not gRPC.
    pub in_process: InProcessNodes,
}

/// Connects to the nodes (refusing incompatible ones), then serves until `shutdown`.
pub async fn run(
    listener: TcpListener,
    config: CoordinatorConfig,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), CoordinatorError> {
    let service = connect(&config).await?;
    serve(listener, service, shutdown).await
}

/// Connects to every node and checks they can work together.
pub async fn connect(config: &CoordinatorConfig) -> Result<GenerationService, CoordinatorError> {
    let dialing =
        Dialing { timeout: config.node_timeout, tls: config.tls.nodes.clone(), in_process: config.in_process.clone() };
    let mut pool = NodePool::connect(&config.targets, &config.drafts, &dialing, &config.discovery).await?;
    if let Some(loaded) = text::load(&pool, config.tokenizer.as_deref()).await? {
        pool.facts.text = Some(loaded.text);
        pool.facts.constraints = loaded.constraints;
    }
    pool.facts.has_tokenizer = pool.facts.text.is_some();
    let defaults = Defaults {
        gamma: config.default_gamma,
        max_new_tokens: config.default_max_new_tokens,
        truncation: config.truncation,
        rule: config.rule,
        verification: config.verification,
        optimistic: config.optimistic,
        tree: config.tree.clone(),
        generation_config: config.generation_config,
    };
    let service = GenerationService::new(pool, defaults)
        .with_server_tls(config.tls.server.clone())
        .with_admission(config.admission.clone());
    Ok(match &config.metrics {
        Some(metrics) => service.with_metrics(metrics.coordinator()),
        None => service,
    })
}

/// Serves the Generation API over gRPC on `grpc` and, when `http` is given, the
/// OpenAI-compatible HTTP API beside it, both until `shutdown`.
pub async fn serve_all(
    grpc: TcpListener,
    http: Option<(TcpListener, HttpConfig)>,
    service: GenerationService,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), CoordinatorError> {
    let Some((http, config)) = http else { return serve(grpc, service, shutdown).await };
    // One signal stops both servers.
    let (stop, stopped) = tokio::sync::watch::channel(false);
    let waiter = |mut rx: tokio::sync::watch::Receiver<bool>| async move {
        let _ = rx.wait_for(|stop| *stop).await;
    };
    tokio::spawn(async move {
        shutdown.await;
        let _ = stop.send(true);
    });
    tokio::try_join!(
        serve(grpc, service.clone(), waiter(stopped.clone())),
        api::http::serve(http, service, &config, waiter(stopped)),
    )
    .map(drop)
}

/// Serves the Generation API, grpc.health.v1 and server reflection.
pub async fn serve(
    listener: TcpListener,
    service: GenerationService,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), CoordinatorError> {
    let name = <GenerationServer<GenerationService> as NamedService>::NAME;
    let tls = service.server_tls().clone();
    let routes = Routes::new(GenerationServer::new(service));
    Ok(specd_proto::transport::serve(listener, routes, name, &tls, shutdown).await?)
}
