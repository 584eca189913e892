//! A TCP proxy that adds a one-way delay to each direction of every connection through it.
//!
//! Each direction is a reader and a writer joined by a queue: the reader stamps every chunk
//! it reads with a due time (arrival + delay + jitter, never earlier than the chunk before
//! it, so order is kept) and goes on reading; the writer sleeps until a chunk is due and
//! writes it. Chunks in flight overlap, so the delay adds latency without capping
//! throughput (a 1 MB burst arrives D after it was sent, not D per chunk). Tokio's timer
//! ticks in milliseconds: a delay is exact to about +1 ms. The TCP handshake itself is not
//! delayed; gRPC keeps its connections, so rounds see the delay and connection setup does not.

use std::net::SocketAddr;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;
use tokio::time::Instant;

/// Chunks queued per direction before the reader waits for the writer.
const QUEUE: usize = 1024;
/// The largest chunk read at once.
const CHUNK: usize = 64 * 1024;

/// The delay of each direction of a link.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Delay {
    /// Added to every chunk, each way.
    pub one_way: Duration,
    /// Each chunk gets an extra delay drawn uniformly from [-jitter, +jitter] (the total
    /// clamped at 0; a chunk never overtakes the one before it).
    pub jitter: Duration,
}

impl Delay {
    /// A delay of `one_way_ms` (and `jitter_ms`) milliseconds; `None` unless both are finite
    /// and in [0, 60 000].
    pub fn from_ms(one_way_ms: f64, jitter_ms: f64) -> Option<Self> {
        let ms = |x: f64| (x.is_finite() && (0.0..=60_000.0).contains(&x)).then(|| Duration::from_secs_f64(x / 1e3));
        Some(Self { one_way: ms(one_way_ms)?, jitter: ms(jitter_ms)? })
    }

    /// No delay at all: a link needs no proxy.
    pub fn is_zero(&self) -> bool {
        self.one_way.is_zero() && self.jitter.is_zero()
    }

    fn sample(&self, rng: &mut u64) -> Duration {
        if self.jitter.is_zero() {
            return self.one_way;
        }
        let u = (next(rng) >> 11) as f64 / (1u64 << 53) as f64;
        let total = self.one_way.as_secs_f64() + self.jitter.as_secs_f64() * (2.0 * u - 1.0);
        Duration::from_secs_f64(total.max(0.0))
    }
}

/// xorshift64*: the jitter's randomness, unrelated to any generation's seed.
fn next(state: &mut u64) -> u64 {
    *state ^= *state >> 12;
    *state ^= *state << 25;
    *state ^= *state >> 27;
    state.wrapping_mul(0x2545_f491_4f6c_dd1d)
}

/// Accepts connections on `listener` and forwards each to `upstream` with `delay` each way,
/// until the listener fails.
pub async fn serve(listener: TcpListener, upstream: SocketAddr, delay: Delay) -> std::io::Result<()> {
    let mut seed = 0x9e37_79b9_7f4a_7c15u64;
    loop {
        let (client, _) = listener.accept().await?;
        seed = next(&mut seed) | 1;
        tokio::spawn(connection(client, upstream, delay, seed));
    }
}

async fn connection(client: TcpStream, upstream: SocketAddr, delay: Delay, seed: u64) {
    let Ok(server) = TcpStream::connect(upstream).await else { return };
    let _ = client.set_nodelay(true);
    let _ = server.set_nodelay(true);
    let (client_read, client_write) = client.into_split();
    let (server_read, server_write) = server.into_split();
    tokio::join!(
        direction(client_read, server_write, delay, seed),
        direction(server_read, client_write, delay, seed.rotate_left(17) | 1)
    );
}

/// One direction: what `from` reads reaches `to` `delay` later; end of stream (or an error)
/// is passed on as a shutdown, delayed the same.
async fn direction(mut from: OwnedReadHalf, mut to: OwnedWriteHalf, delay: Delay, mut rng: u64) {
    // An empty chunk stands for the end of the stream.
    let (tx, mut rx) = mpsc::channel::<(Instant, Vec<u8>)>(QUEUE);
    let reader = async move {
        let mut buf = vec![0u8; CHUNK];
        let mut last_due = Instant::now();
        loop {
            let n = from.read(&mut buf).await.unwrap_or(0);
            let due = (Instant::now() + delay.sample(&mut rng)).max(last_due);
            last_due = due;
            if tx.send((due, buf[..n].to_vec())).await.is_err() || n == 0 {
                return;
            }
        }
    };
    let writer = async move {
        while let Some((due, chunk)) = rx.recv().await {
            tokio::time::sleep_until(due).await;
            if chunk.is_empty() || to.write_all(&chunk).await.is_err() {
                break;
            }
        }
        let _ = to.shutdown().await;
        // Dropping `rx` here stops the reader at its next chunk.
    };
    tokio::join!(reader, writer);
}

#[cfg(test)]
mod tests {
    use super::*;

    async fn echo_server() -> SocketAddr {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                tokio::spawn(async move {
                    let (mut r, mut w) = stream.into_split();
                    let _ = tokio::io::copy(&mut r, &mut w).await;
                });
            }
        });
        addr
    }

    async fn proxy(delay: Delay) -> SocketAddr {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(serve(listener, echo_server().await, delay));
        addr
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_round_trip_takes_two_one_way_delays() {
        let delay = Delay::from_ms(25.0, 0.0).unwrap();
        let mut stream = TcpStream::connect(proxy(delay).await).await.unwrap();
        stream.set_nodelay(true).unwrap();
        for _ in 0..3 {
            let started = std::time::Instant::now();
            stream.write_all(b"ping").await.unwrap();
            let mut buf = [0u8; 4];
            stream.read_exact(&mut buf).await.unwrap();
            let rtt = started.elapsed();
            assert_eq!(&buf, b"ping");
            assert!(rtt >= Duration::from_millis(50), "{rtt:?}");
            assert!(rtt < Duration::from_millis(150), "{rtt:?}");
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn bytes_keep_their_order_under_jitter_and_throughput_is_not_capped() {
        // 8 MiB through a 50 ms ± 40 ms link each way: serial per-chunk sleeping would take
        // 128 chunks × 100 ms; the queue takes one round trip plus the copying.
        let delay = Delay::from_ms(50.0, 40.0).unwrap();
        let stream = TcpStream::connect(proxy(delay).await).await.unwrap();
        let (mut r, mut w) = stream.into_split();
        let data: Vec<u8> = (0..8u32 << 20).map(|i| (i.wrapping_mul(2_654_435_761) >> 24) as u8).collect();
        let sent = data.clone();
        let started = std::time::Instant::now();
        let writer = tokio::spawn(async move {
            w.write_all(&sent).await.unwrap();
            w.shutdown().await.unwrap();
        });
        let mut back = Vec::new();
        r.read_to_end(&mut back).await.unwrap();
        writer.await.unwrap();
        let took = started.elapsed();
        assert!(back == data, "bytes reordered or lost ({} of {})", back.len(), data.len());
        assert!(took >= Duration::from_millis(20), "{took:?}");
        assert!(took < Duration::from_secs(3), "throughput capped: {took:?}");
    }

    #[test]
    fn delays_out_of_range_are_refused() {
        assert!(Delay::from_ms(-1.0, 0.0).is_none());
        assert!(Delay::from_ms(f64::NAN, 0.0).is_none());
        assert!(Delay::from_ms(10.0, 1e9).is_none());
        assert!(Delay::from_ms(0.0, 0.0).unwrap().is_zero());
    }
}
