//! A target and a draft node serving on loopback inside this process.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use specd_coordinator::InProcessNodes;
use specd_draft_node::DraftNode;
use specd_draft_node::proposer::ProposerConfig;
use specd_model::KvBudget;
use specd_node::NodeConfig;
use specd_target_node::TargetNode;

use super::flag_values::RoundTransport;
use super::runtime::bind;
use super::shared_budget::{BudgetClaim, SharedBudget, shared_budget};

/// A target and a draft node serving on free loopback ports in this process (`specd up`,
/// `specd bench --embedded`).
#[derive(Debug)]
pub struct LoopbackNodes {
    pub target_url: String,
    pub draft_url: String,
    target: TargetNode,
    draft: DraftNode,
    stop: tokio::sync::watch::Sender<bool>,
    tasks: Vec<tokio::task::JoinHandle<Result<(), specd_proto::transport::ServeError>>>,
}

impl LoopbackNodes {
    /// Loads both models (concurrently; the draft's only where `proposer` needs one), splits
    /// one device's KV budget between them where they share it
    /// ([`super::shared_budget`]), and starts serving them.
    pub async fn start(
        mut target_config: NodeConfig,
        mut draft_config: NodeConfig,
        proposer: ProposerConfig,
    ) -> anyhow::Result<Self> {
        let loopback: SocketAddr = "127.0.0.1:0".parse()?;
        let (target_listener, draft_listener) = (bind(loopback).await?, bind(loopback).await?);
        let target_url = format!("http://{}", target_listener.local_addr()?);
        let draft_url = format!("http://{}", draft_listener.local_addr()?);
        let claim = |config: &NodeConfig| BudgetClaim { device: config.device, budget: config.kv_budget };
        let shared =
            proposer.kind.needs_model().then(|| shared_budget(claim(&target_config), claim(&draft_config))).flatten();
        if let Some(shared) = shared {
            // Neither measures for itself (each would take its fraction of the same free
            // memory): both load unbounded, and get their shares below, before serving.
            tracing::info!(device = %shared.device, "target and draft share one KV budget, measured once both are warm");
            (target_config.kv_budget, draft_config.kv_budget) = (KvBudget::Unbounded, KvBudget::Unbounded);
        }
        let (target, draft) = tokio::join!(TargetNode::load(target_config), DraftNode::start(draft_config, proposer));
        let (target, draft) = (target?, draft?);
        if let Some(shared) = shared {
            split_budget(shared, &target, &draft).await?;
        }
        let (stop, stop_rx) = tokio::sync::watch::channel(false);
        let stopped = |mut rx: tokio::sync::watch::Receiver<bool>| async move {
            let _ = rx.wait_for(|stop| *stop).await;
        };
        let tasks = vec![
            tokio::spawn(specd_target_node::serve(target_listener, target.clone(), stopped(stop_rx.clone()))),
            tokio::spawn(specd_draft_node::serve(draft_listener, draft.clone(), stopped(stop_rx))),
        ];
        Ok(Self { target_url, draft_url, target, draft, stop, tasks })
    }

    /// What a coordinator in this process is given to reach these nodes' rounds
    /// (`CoordinatorConfig::in_process`): both nodes' handles, or none with
    /// [`RoundTransport::Grpc`].
    pub fn in_process(&self, transport: RoundTransport) -> InProcessNodes {
        match transport {
            RoundTransport::InProcess => InProcessNodes::default()
                .with_target(self.target_url.clone(), Arc::new(self.target.clone()))
                .with_draft(self.draft_url.clone(), Arc::new(self.draft.clone())),
            RoundTransport::Grpc => InProcessNodes::default(),
        }
    }

    /// Stops both nodes, waiting up to `grace` for them to drain.
    pub async fn stop(self, grace: Duration) {
        let _ = self.stop.send(true);
        if tokio::time::timeout(grace, futures_join_all(self.tasks)).await.is_err() {
            tracing::warn!("nodes still draining after the grace period: exiting");
        }
    }
}

/// Measures the shared device's free memory once, now that both models are loaded and
/// warm, and gives each node its share of the budget.
async fn split_budget(shared: SharedBudget, target: &TargetNode, draft: &DraftNode) -> anyhow::Result<()> {
    let (target, Some(draft)) = (target.node(), draft.model_node()) else {
        return Ok(());
    };
    // On the target's model thread, where its device is in use.
    let free = target.free_memory().await?;
    let per_token = |node: &specd_node::Node| node.model().handle().info().kv_bytes_per_token;
    let shares = shared.shares(free.bytes, per_token(target), per_token(draft));
    target.set_kv_budget(Some(shares.target)).await?;
    draft.set_kv_budget(Some(shares.draft)).await?;
    tracing::info!(
        device = %shared.device,
        free_bytes = free.bytes,
        source = %free.source,
        fraction = shared.fraction,
        target_bytes = shares.target,
        draft_bytes = shares.draft,
        "one KV budget for both nodes, split in proportion to their KV bytes per token"
    );
    Ok(())
}

async fn futures_join_all<T>(tasks: Vec<tokio::task::JoinHandle<T>>) {
    for task in tasks {
        let _ = task.await;
    }
}
