//! `specd delay-proxy` (hidden): a TCP proxy adding a one-way delay to each direction, run by
//! the network-namespace harness (`specd bench --netns`, the netns tests) inside the
//! coordinator's namespace in front of a node. See `specd_netns::delay_proxy`.

use std::net::SocketAddr;

use clap::Args;
use specd_netns::Delay;

use crate::cli_error::invalid;
use crate::serve::{bind, shutdown_signal};

/// Forward TCP connections to --upstream, delaying each direction by --delay-ms.
#[derive(Debug, Args)]
pub struct DelayProxyArgs {
    /// Address to accept connections on; prints `listening on HOST:PORT` when ready.
    #[arg(long, default_value = "127.0.0.1:0")]
    listen: SocketAddr,
    /// Where to forward each connection.
    #[arg(long)]
    upstream: SocketAddr,
    /// One-way delay added to each direction, in milliseconds.
    #[arg(long, default_value_t = 0.0)]
    delay_ms: f64,
    /// Each chunk's delay varies uniformly by ± this many milliseconds (order is kept).
    #[arg(long, default_value_t = 0.0)]
    jitter_ms: f64,
}

/// Runs the subcommand until Ctrl-C or SIGTERM.
pub fn run(args: &DelayProxyArgs) -> anyhow::Result<()> {
    let delay = Delay::from_ms(args.delay_ms, args.jitter_ms).ok_or_else(|| {
        invalid(format!("--delay-ms {} and --jitter-ms {} must be in [0, 60000]", args.delay_ms, args.jitter_ms))
    })?;
    let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(1).enable_all().build()?;
    runtime.block_on(async {
        let listener = bind(args.listen).await?;
        outln!("listening on {}", listener.local_addr()?);
        tokio::select! {
            result = specd_netns::delay_proxy::serve(listener, args.upstream, delay) => Ok(result?),
            () = shutdown_signal() => Ok(()),
        }
    })
}
