//! `specd bench --netns`: the three roles as processes in their own network namespaces
//! (`specd_netns`), with a round-trip time between draft and coordinator added by a delay
//! proxy, and the measurement itself run next to the coordinator.
//!
//! The measuring process must reach the coordinator's loopback, so `specd bench --netns`
//! sets up the cluster, then runs itself again inside the coordinator's namespace with the
//! same flags plus the hidden `--netns-child URL`, which measures that endpoint and adds the
//! network's settings to the report.

use std::time::Duration;

use clap::Args;
use serde_json::json;
use specd_netns::{ClusterSpec, Delay, NetnsCluster, check_privileges};

use crate::cli_error::invalid;

/// The network of `--netns` runs.
#[derive(Debug, Clone, Args)]
pub struct NetnsOptions {
    /// Start the three roles as processes in their own network namespaces (needs root and
    /// iproute2), with the demo pair of --demo-dir and --rtt-ms between draft and coordinator.
    #[arg(long, env = "SPECD_BENCH_NETNS")]
    pub netns: bool,
    /// Round-trip time added between draft and coordinator, in ms (half each way), for --netns.
    #[arg(long, env = "SPECD_BENCH_RTT_MS", default_value_t = 0.0, requires = "netns")]
    pub rtt_ms: f64,
    /// Round-trip time added between coordinator and target, in ms, for --netns.
    #[arg(long, env = "SPECD_BENCH_TARGET_RTT_MS", default_value_t = 0.0, requires = "netns")]
    pub target_rtt_ms: f64,
    /// Each delayed direction varies by ± this many ms per chunk (order kept), for --netns.
    #[arg(long, env = "SPECD_BENCH_JITTER_MS", default_value_t = 0.0, requires = "netns")]
    pub jitter_ms: f64,
    /// An extra flag for the coordinator process of --netns, e.g. --coordinator-arg=--max-gamma=6
    /// (repeatable).
    #[arg(long, requires = "netns", allow_hyphen_values = true)]
    pub coordinator_arg: Vec<String>,
    /// Set by `--netns` on its own second run inside the coordinator's namespace.
    #[arg(long, hide = true, requires = "netns")]
    pub netns_child: Option<String>,
}

impl NetnsOptions {
    fn links(&self) -> anyhow::Result<(Delay, Delay)> {
        let link = |flag: &str, rtt: f64| {
            Delay::from_ms(rtt / 2.0, self.jitter_ms).ok_or_else(|| {
                invalid(format!("{flag} {rtt} and --jitter-ms {} must be in [0, 60000]", self.jitter_ms))
            })
        };
        Ok((link("--rtt-ms", self.rtt_ms)?, link("--target-rtt-ms", self.target_rtt_ms)?))
    }

    pub fn validate(&self) -> anyhow::Result<()> {
        // clap's `requires` ignores flags left at their defaults, and an explicit 0 is one.
        let network_set = self.rtt_ms != 0.0 || self.target_rtt_ms != 0.0 || self.jitter_ms != 0.0;
        if !self.netns && (network_set || !self.coordinator_arg.is_empty()) {
            return Err(invalid("--rtt-ms, --target-rtt-ms, --jitter-ms and --coordinator-arg need --netns"));
        }
        self.links().map(|_| ())
    }

    /// The network's settings, added to the report of a `--netns` run.
    pub fn annotate(&self, report: &mut serde_json::Value, draft_delay_ms: Option<f64>) {
        report["network"] = json!("netns");
        report["rtt_ms"] = json!(self.rtt_ms);
        report["target_rtt_ms"] = json!(self.target_rtt_ms);
        report["jitter_ms"] = json!(self.jitter_ms);
        report["draft_delay_ms"] = json!(draft_delay_ms.unwrap_or(0.0));
    }
}

/// Starts the cluster, runs the measurement inside the coordinator's namespace, tears down.
pub fn run(
    netns: &NetnsOptions,
    demo_dir: &std::path::Path,
    target_args: Vec<String>,
    draft_args: Vec<String>,
    json: bool,
) -> anyhow::Result<()> {
    check_privileges().map_err(|e| invalid(format!("specd bench --netns: {e}. Run it as root, or use --embedded")))?;
    let (draft_link, target_link) = netns.links()?;
    let binary = std::env::current_exe()?;
    let log_dir = std::env::temp_dir().join(format!("specd-bench-netns-{}", std::process::id()));
    std::fs::create_dir_all(&log_dir)?;
    let spec = ClusterSpec {
        draft_link,
        target_link,
        target_args,
        draft_args,
        coordinator_args: netns.coordinator_arg.clone(),
        log_dir: Some(log_dir.clone()),
        ..ClusterSpec::new(&binary, demo_dir.join("target"), demo_dir.join("draft"))
    };
    if !json {
        eprintln!(
            "netns: draft ↔ coordinator RTT {} ms, coordinator ↔ target RTT {} ms (role logs in {})",
            netns.rtt_ms,
            netns.target_rtt_ms,
            log_dir.display()
        );
    }
    let cluster = NetnsCluster::start(&spec)?;
    let status = cluster
        .command(&binary)
        .args(std::env::args_os().skip(1))
        .arg("--netns-child")
        .arg(&cluster.endpoint)
        .status()?;
    drop(cluster);
    if !status.success() {
        anyhow::bail!("the measuring run inside the coordinator's namespace failed ({status})");
    }
    Ok(())
}

/// `--draft-delay-ms`, checked.
pub fn draft_delay(ms: Option<f64>) -> anyhow::Result<Option<Duration>> {
    ms.map(|ms| {
        Delay::from_ms(ms, 0.0)
            .map(|d| d.one_way)
            .ok_or_else(|| invalid(format!("--draft-delay-ms {ms} must be in [0, 60000]")))
    })
    .transpose()
}
