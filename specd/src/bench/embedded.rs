//! `specd bench --embedded`: the three roles started in this process on loopback with the
//! demo pair, measured, and stopped again.

use std::time::Duration;

use super::args::BenchArgs;
use super::measure::measure;
use super::netns::draft_delay;
use crate::serve::{LoopbackNodes, PolicyOptions, bind};

/// Starts the nodes and a coordinator with its default policy, measures it, and stops them.
pub(super) async fn run(args: &BenchArgs, prompts: &[String]) -> anyhow::Result<serde_json::Value> {
    let target = args.node.config(args.demo_dir.join("target"))?;
    let mut draft = args.draft.apply(args.node.config(args.demo_dir.join("draft"))?);
    if let Some(delay) = draft_delay(args.draft_delay_ms)? {
        draft.forward_delay = delay;
    }
    let nodes = LoopbackNodes::start(target, draft, args.proposer.config()?).await?;
    let policy = PolicyOptions::defaults()?;
    let mut config = policy.config(vec![nodes.target_url.clone()], vec![nodes.draft_url.clone()])?;
    config.in_process = nodes.in_process(args.round_transport);
    if let Some(on) = args.optimistic {
        config.optimistic = on;
    }
    if let Some(verification) = args.verify {
        config.verification = verification;
    }
    if let Some(tree) = &args.tree {
        config.tree = tree.clone();
    }
    let service = specd_coordinator::connect(&config).await?;
    let listener = bind("127.0.0.1:0".parse()?).await?;
    let endpoint = format!("http://{}", listener.local_addr()?);
    let (stop, mut stopped) = tokio::sync::watch::channel(false);
    let server = tokio::spawn(specd_coordinator::serve(listener, service, async move {
        let _ = stopped.wait_for(|s| *s).await;
    }));
    let report = measure(args, endpoint, prompts).await;
    let _ = stop.send(true);
    let _ = server.await;
    nodes.stop(Duration::from_secs(5)).await;
    report
}
