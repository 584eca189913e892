//! `specd coordinator`: the public Generation API in front of target and draft nodes.

use std::net::SocketAddr;
use std::time::Duration;

use clap::Args;
use specd_coordinator::{CoordinatorTls, GammaChoice, NodeAddress};

use super::check_config::{CheckArgs, metrics_summary, traces_summary};
use super::coordinator_options::{HttpOptions, NodeTlsArgs, PolicyOptions, announce_http};
use super::runtime::{announce, bind, run_role};
use super::service_options::ServiceArgs;
use super::shutdown::serve_until_signal;
use crate::cli_error::invalid;

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
    run_role("specd-coordinator", args.service.telemetry.endpoint(), async {
        let listener = bind(args.listen).await?;
        let http = args.http.bind(None).await?;
        config.metrics = args.service.metrics.start().await?;
        let service = specd_coordinator::connect(&config).await?;
        announce_http(http.as_ref())?;
        announce(&listener)?;
        serve_until_signal(grace, |stop| specd_coordinator::serve_all(listener, http, service, stop)).await
    })
}

/// The node addresses of `flag`, parsed (no network access).
fn node_addresses(flag: &str, addresses: &[String]) -> anyhow::Result<Vec<NodeAddress>> {
    NodeAddress::parse_all(addresses).map_err(|e| invalid(format!("{flag}: {e}")))
}

fn list(addresses: &[NodeAddress]) -> String {
    addresses.iter().map(ToString::to_string).collect::<Vec<_>>().join(",")
}
