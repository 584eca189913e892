//! How a role stops: on Ctrl-C or SIGTERM it stops admitting and gives the requests in
//! flight `--shutdown-grace-s` to finish.

use std::future::Future;
use std::time::Duration;

use clap::Args;

use crate::cli_error::invalid;

/// How a role stops; every role has these.
#[derive(Debug, Clone, Args)]
pub struct DrainArgs {
    /// On SIGTERM or Ctrl-C: health turns NOT_SERVING, nothing new is admitted, and requests
    /// in flight get this many seconds to finish before the process exits anyway.
    #[arg(long, env = "SPECD_SHUTDOWN_GRACE_S", default_value_t = 30.0)]
    shutdown_grace_s: f64,
}

impl DrainArgs {
    pub(super) fn grace(&self) -> anyhow::Result<Duration> {
        Duration::try_from_secs_f64(self.shutdown_grace_s).map_err(|_| {
            invalid(format!("--shutdown-grace-s {} must be a number of seconds ≥ 0", self.shutdown_grace_s))
        })
    }
}

/// What tells a server to stop admitting and drain.
pub(super) type Stop = std::pin::Pin<Box<dyn Future<Output = ()> + Send>>;

/// Runs `serve(stop)` until Ctrl-C or SIGTERM, then resolves `stop` and gives the requests in
/// flight at most `grace` to finish.
pub(super) async fn serve_until_signal<Fut, E>(grace: Duration, serve: impl FnOnce(Stop) -> Fut) -> anyhow::Result<()>
where
    Fut: Future<Output = Result<(), E>>,
    anyhow::Error: From<E>,
{
    let (stop_tx, mut stop_rx) = tokio::sync::watch::channel(false);
    let stop: Stop = Box::pin(async move {
        let _ = stop_rx.wait_for(|stop| *stop).await;
    });
    let server = serve(stop);
    tokio::pin!(server);
    tokio::select! {
        result = &mut server => return Ok(result?),
        () = shutdown_signal() => {}
    }
    let _ = stop_tx.send(true);
    match tokio::time::timeout(grace, server).await {
        Ok(result) => Ok(result?),
        Err(_) => {
            tracing::warn!(grace_s = grace.as_secs_f64(), "grace period over: exiting with requests still in flight");
            Ok(())
        }
    }
}

/// Resolves on Ctrl-C or SIGTERM.
pub(crate) async fn shutdown_signal() {
    let ctrl_c = tokio::signal::ctrl_c();
    #[cfg(unix)]
    {
        let mut term = match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(s) => s,
            Err(_) => {
                let _ = ctrl_c.await;
                return;
            }
        };
        tokio::select! {
            _ = ctrl_c => {},
            _ = term.recv() => {},
        }
    }
    #[cfg(not(unix))]
    let _ = ctrl_c.await;
    tracing::info!("shutting down");
}
