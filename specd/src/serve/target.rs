//! `specd target`: a target node serving its model.

use std::net::SocketAddr;
use std::path::PathBuf;

use clap::Args;
use specd_target_node::TargetNode;

use super::check_config::{CheckArgs, check_node};
use super::node_options::NodeOptions;
use super::runtime::{announce, bind, log_openmp_wait, run_role};
use super::service_options::ServiceArgs;
use super::shutdown::serve_until_signal;

/// Run a target node: the big model, scoring whole blocks in one forward pass.
#[derive(Debug, Args)]
pub struct TargetArgs {
    /// Checkpoint directory in Hugging Face format (Llama, Mistral, Qwen2, Qwen3 or Gemma 3
    /// text) or table-model .json.
    #[arg(long, env = "SPECD_MODEL")]
    model: PathBuf,
    /// Address to serve on.
    #[arg(long, env = "SPECD_LISTEN", default_value = "127.0.0.1:50052")]
    listen: SocketAddr,
    #[command(flatten)]
    pub(super) node: NodeOptions,
    #[command(flatten)]
    service: ServiceArgs,
    #[command(flatten)]
    check: CheckArgs,
}

impl TargetArgs {
    /// Whether this run serves a target (and not only `--check-config`).
    pub fn serves(&self) -> bool {
        !self.check.check_config
    }
}

pub fn run_target(args: &TargetArgs) -> anyhow::Result<()> {
    let mut config = args.node.config(args.model.clone())?;
    config.tls = args.service.tls.tls()?;
    let grace = args.service.drain.grace()?;
    if args.check.check_config {
        return check_node("target", args.listen, &config, &args.service);
    }
    run_role("specd-target", args.service.telemetry.endpoint(), async {
        let listener = bind(args.listen).await?;
        config.metrics = args.service.metrics.start().await?;
        log_openmp_wait();
        let node = TargetNode::load(config).await?;
        announce(&listener)?;
        serve_until_signal(grace, |stop| specd_target_node::serve(listener, node, stop)).await
    })
}
