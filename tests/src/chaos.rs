//! A TCP proxy that cuts every connection through it after a random lifetime, independent of
//! what flows through it: a draft node that keeps dying and coming back, as seen by the
//! coordinator.

use std::time::Duration;

use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinHandle;

/// Accepts on a loopback port and forwards to `upstream`, cutting each connection after a
/// lifetime drawn uniformly from `[0, 2·mean)`; stops accepting when dropped.
#[derive(Debug)]
pub struct ChaosProxy {
    pub url: String,
    task: JoinHandle<()>,
}

impl Drop for ChaosProxy {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// xorshift64*: the proxy's own randomness, unrelated to any generation's seed.
fn next(state: &mut u64) -> u64 {
    *state ^= *state >> 12;
    *state ^= *state << 25;
    *state ^= *state >> 27;
    state.wrapping_mul(0x2545_f491_4f6c_dd1d)
}

impl ChaosProxy {
    pub async fn start(upstream: String, mean_lifetime: Duration, seed: u64) -> anyhow::Result<Self> {
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let url = format!("http://{}", listener.local_addr()?);
        let task = tokio::spawn(async move {
            let mut state = seed | 1;
            while let Ok((mut client, _)) = listener.accept().await {
                let lifetime = mean_lifetime.mul_f64(2.0 * (next(&mut state) >> 11) as f64 / (1u64 << 53) as f64);
                let upstream = upstream.clone();
                tokio::spawn(async move {
                    let Ok(mut server) = TcpStream::connect(&upstream).await else { return };
                    let _ = client.set_nodelay(true);
                    let _ = server.set_nodelay(true);
                    // Dropping both sockets at the deadline resets the connection mid-whatever.
                    let _ =
                        tokio::time::timeout(lifetime, tokio::io::copy_bidirectional(&mut client, &mut server)).await;
                });
            }
        });
        Ok(Self { url, task })
    }
}
