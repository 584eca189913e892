//! `specd draft`: a draft node serving its proposer.

use std::net::SocketAddr;
use std::path::PathBuf;

use clap::Args;
use specd_draft_node::DraftNode;

use super::check_config::{CheckArgs, check_node};
use super::draft_options::{ProposerOptions, draft_model_path};
use super::node_options::NodeOptions;
use super::runtime::{announce, bind, log_openmp_wait, run_role};
use super::service_options::ServiceArgs;
use super::shutdown::serve_until_signal;

/// Run a draft node: the cheap model (or a proposer with none), proposing blocks with their
/// distributions.
#[derive(Debug, Args)]
pub struct DraftArgs {
    /// Checkpoint directory or table-model .json; its tokenizer must match the target's.
    /// Not needed by --proposer ngram or suffix.
    #[arg(long, env = "SPECD_MODEL")]
    model: Option<PathBuf>,
    #[command(flatten)]
    pub(super) proposer: ProposerOptions,
    /// Address to serve on.
    #[arg(long, env = "SPECD_LISTEN", default_value = "127.0.0.1:50053")]
    listen: SocketAddr,
    #[command(flatten)]
    pub(super) node: NodeOptions,
    #[command(flatten)]
    service: ServiceArgs,
    #[command(flatten)]
    check: CheckArgs,
}

pub fn run_draft(args: &DraftArgs) -> anyhow::Result<()> {
    let proposer = args.proposer.config()?;
    let mut config = args.node.config(draft_model_path("--model", args.model.as_ref(), proposer.kind)?)?;
    config.tls = args.service.tls.tls()?;
    let grace = args.service.drain.grace()?;
    if args.check.check_config {
        return check_node("draft", args.listen, &config, &args.service);
    }
    run_role("specd-draft", args.service.telemetry.endpoint(), async {
        let listener = bind(args.listen).await?;
        config.metrics = args.service.metrics.start().await?;
        log_openmp_wait();
        let node = DraftNode::start(config, proposer).await?;
        announce(&listener)?;
        serve_until_signal(grace, |stop| specd_draft_node::serve(listener, node, stop)).await
    })
}
