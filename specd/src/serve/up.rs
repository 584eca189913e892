//! `specd up`: all three roles in one process, the nodes on free loopback ports.

use std::net::SocketAddr;
use std::path::PathBuf;

use clap::Args;
use specd_draft_node::proposer::ProposerKind;

use super::check_config::{CheckArgs, check_model, metrics_summary, shown_dtype, traces_summary};
use super::coordinator_options::{HttpOptions, PolicyOptions, announce_http};
use super::draft_options::{DraftOptions, ProposerOptions, draft_model_path};
use super::flag_values::RoundTransport;
use super::loopback::LoopbackNodes;
use super::node_options::NodeOptions;
use super::runtime::{announce, bind, log_openmp_wait, run_role};
use super::service_options::{MetricsOptions, ServerTlsArgs, TelemetryArgs};
use super::shutdown::{DrainArgs, serve_until_signal};

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
    /// How the coordinator sends each round to the nodes: `in-process` (handed over on
    /// channels, the default) or `grpc` (over loopback, as to remote nodes). Both carry the
    /// same messages; the nodes serve gRPC on loopback either way.
    #[arg(long, env = "SPECD_ROUND_TRANSPORT", value_enum, default_value_t = RoundTransport::InProcess)]
    round_transport: RoundTransport,
    /// TLS on the coordinator's gRPC API (the nodes listen on loopback only, in plain text).
    #[command(flatten)]
    tls: ServerTlsArgs,
    #[command(flatten)]
    metrics: MetricsOptions,
    #[command(flatten)]
    check: CheckArgs,
}

impl UpArgs {
    /// Whether this run serves the roles (and not only `--check-config`).
    pub fn serves(&self) -> bool {
        !self.check.check_config
    }
}

pub fn run_up(args: &UpArgs) -> anyhow::Result<()> {
    let mut target_config = args.node.config(args.target_model.clone())?;
    let proposer = args.proposer.config()?;
    let draft_model = draft_model_path("--draft-model", args.draft_model.as_ref(), proposer.kind)?;
    let mut draft_config = args.draft.apply(args.node.config(draft_model)?);
    let grace = args.drain.grace()?;
    let server_tls = args.tls.tls()?;
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
            "config ok: up on {}{}, target {target}, draft {draft}, {} {} (draft {} {}, {} engine), rounds {}{}{traces}",
            args.listen,
            args.http.summary(Some(UP_HTTP_LISTEN)),
            target_config.device,
            target_config.dtype,
            draft_config.device,
            shown_dtype("draft", &draft_config),
            draft_config.engine,
            args.round_transport.summary(),
            metrics_summary(&args.metrics),
        );
        return Ok(());
    }
    // One process, one exporter: all three roles' spans carry the service name `specd`.
    run_role("specd", args.telemetry.endpoint(), async {
        let public = bind(args.listen).await?;
        let http = args.http.bind(Some(UP_HTTP_LISTEN)).await?;
        let metrics = args.metrics.start().await?;
        (target_config.metrics, draft_config.metrics) = (metrics.clone(), metrics.clone());
        log_openmp_wait();
        let nodes = LoopbackNodes::start(target_config, draft_config, proposer).await?;
        let mut config = args.policy.config(vec![nodes.target_url.clone()], vec![nodes.draft_url.clone()])?;
        config.in_process = nodes.in_process(args.round_transport);
        config.metrics = metrics;
        config.tls.server = server_tls;
        let service = specd_coordinator::connect(&config).await?;
        announce_http(http.as_ref())?;
        announce(&public)?;
        let result = serve_until_signal(grace, |stop| specd_coordinator::serve_all(public, http, service, stop)).await;
        // The coordinator has drained (or run out of grace): now the nodes.
        nodes.stop(grace).await;
        result
    })
}
