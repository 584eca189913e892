//! A target and a draft node serving on loopback inside this process.

use std::net::SocketAddr;
use std::time::Duration;

use specd_draft_node::DraftNode;
use specd_draft_node::proposer::ProposerConfig;
use specd_node::NodeConfig;
use specd_target_node::TargetNode;

use super::runtime::bind;

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
