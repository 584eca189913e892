//! Unary calls vs one long-lived bidirectional stream per node, for the round protocol's
//! traffic on loopback (docs/architecture.md): a round is a Propose (≈60 B out, ≈7 KB back at γ = 5
//! with V = 32 000) then a Verify (≈1.5 KB out, ≈200 B back). The server only echoes, so the
//! figures are the transport's share of a round's overhead and nothing else. Two more rows
//! for roles in one process: the stream over an in-memory pipe instead of TCP (gRPC still
//! encodes and frames every message), and the messages handed to a task on channels, as
//! `specd_proto::in_process` does.
//!
//! `cargo bench -p specd-proto --bench round_transport` prints the median and 90th percentile
//! round time of each, measured in alternating blocks in one run.

use std::time::{Duration, Instant};

use specd_proto::bench::echo_client::EchoClient;
use specd_proto::bench::echo_server::{Echo, EchoServer};
use specd_proto::bench::{EchoReply, EchoRequest};
use specd_proto::transport::incoming;
use tokio::sync::mpsc;
use tokio_stream::StreamExt;
use tokio_stream::wrappers::ReceiverStream;
use tonic::transport::{Channel, Server};
use tonic::{Request, Response, Status, Streaming};

const ROUNDS_PER_BLOCK: usize = 250;
const BLOCKS: usize = 12;
/// (request bytes, reply bytes) of Propose and Verify.
const CALLS: [(usize, u32); 2] = [(60, 7_000), (1_500, 200)];

struct EchoService;

fn reply_to(request: &EchoRequest) -> EchoReply {
    EchoReply { payload: vec![7; request.reply_bytes as usize] }
}

#[tonic::async_trait]
impl Echo for EchoService {
    async fn unary(&self, request: Request<EchoRequest>) -> Result<Response<EchoReply>, Status> {
        Ok(Response::new(reply_to(request.get_ref())))
    }

    type StreamStream = ReceiverStream<Result<EchoReply, Status>>;

    async fn stream(&self, request: Request<Streaming<EchoRequest>>) -> Result<Response<Self::StreamStream>, Status> {
        let mut requests = request.into_inner();
        let (tx, rx) = mpsc::channel(4);
        tokio::spawn(async move {
            while let Some(Ok(request)) = requests.next().await {
                if tx.send(Ok(reply_to(&request))).await.is_err() {
                    break;
                }
            }
        });
        Ok(Response::new(ReceiverStream::new(rx)))
    }
}

struct StreamClient {
    requests: mpsc::Sender<EchoRequest>,
    replies: Streaming<EchoReply>,
}

async fn unary_round(client: &mut EchoClient<Channel>) {
    for (out, back) in CALLS {
        let reply = client.unary(EchoRequest { payload: vec![1; out], reply_bytes: back }).await.expect("unary call");
        assert_eq!(reply.get_ref().payload.len(), back as usize);
    }
}

async fn stream_round(client: &mut StreamClient) {
    for (out, back) in CALLS {
        client.requests.send(EchoRequest { payload: vec![1; out], reply_bytes: back }).await.expect("stream send");
        let reply = client.replies.message().await.expect("stream reply").expect("stream open");
        assert_eq!(reply.payload.len(), back as usize);
    }
}

fn summary(name: &str, mut rounds: Vec<Duration>) -> f64 {
    rounds.sort();
    let at = |q: f64| rounds[((rounds.len() - 1) as f64 * q) as usize].as_secs_f64() * 1e6;
    println!("{name:<8} rounds {:>5}  median {:>7.1} µs  p90 {:>7.1} µs", rounds.len(), at(0.5), at(0.9));
    at(0.5)
}

fn main() {
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build().expect("tokio runtime");
    runtime.block_on(async {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind loopback");
        let addr = listener.local_addr().expect("local address");
        tokio::spawn(
            Server::builder().add_service(EchoServer::new(EchoService)).serve_with_incoming(incoming(listener)),
        );
        let channel = Channel::from_shared(format!("http://{addr}"))
            .expect("url")
            .tcp_nodelay(true)
            .connect()
            .await
            .expect("connect");
        let mut unary = EchoClient::new(channel.clone());
        let (requests, rx) = mpsc::channel(4);
        let replies = EchoClient::new(channel).stream(ReceiverStream::new(rx)).await.expect("open stream").into_inner();
        let mut stream = StreamClient { requests, replies };
        // The same stream over an in-memory pipe instead of loopback TCP.
        let (client_io, server_io) = tokio::io::duplex(1 << 20);
        tokio::spawn(
            Server::builder().add_service(EchoServer::new(EchoService)).serve_with_incoming(tokio_stream::once(Ok::<
                _,
                std::io::Error,
            >(
                server_io,
            ))),
        );
        let mut client_io = Some(client_io);
        let memory_channel = tonic::transport::Endpoint::from_static("http://in-memory")
            .connect_with_connector(tower::service_fn(move |_: tonic::transport::Uri| {
                let io = client_io.take();
                async move { io.map(hyper_util::rt::TokioIo::new).ok_or_else(|| std::io::Error::other("used")) }
            }))
            .await
            .expect("connect in memory");
        let (requests, rx) = mpsc::channel(4);
        let replies = EchoClient::new(memory_channel).stream(ReceiverStream::new(rx)).await.expect("open").into_inner();
        let mut memory = StreamClient { requests, replies };
        // No gRPC: a task answering on channels, as a direct call to a node's handler would.
        let (direct_tx, mut direct_rx) = mpsc::channel::<EchoRequest>(1);
        let (reply_tx, mut reply_rx) = mpsc::channel::<EchoReply>(1);
        tokio::spawn(async move {
            while let Some(r) = direct_rx.recv().await {
                if reply_tx.send(reply_to(&r)).await.is_err() {
                    break;
                }
            }
        });
        let mut direct_times = Vec::new();
        let mut memory_times = Vec::new();
        for _ in 0..50 {
            unary_round(&mut unary).await;
            stream_round(&mut stream).await;
        }
        let (mut unary_times, mut stream_times) = (Vec::new(), Vec::new());
        for _ in 0..BLOCKS {
            for _ in 0..ROUNDS_PER_BLOCK {
                let started = Instant::now();
                unary_round(&mut unary).await;
                unary_times.push(started.elapsed());
            }
            for _ in 0..ROUNDS_PER_BLOCK {
                let started = Instant::now();
                stream_round(&mut stream).await;
                stream_times.push(started.elapsed());
            }
            for _ in 0..ROUNDS_PER_BLOCK {
                let started = Instant::now();
                stream_round(&mut memory).await;
                memory_times.push(started.elapsed());
            }
            for _ in 0..ROUNDS_PER_BLOCK {
                let started = Instant::now();
                for (out, back) in CALLS {
                    direct_tx.send(EchoRequest { payload: vec![1; out], reply_bytes: back }).await.expect("send");
                    assert_eq!(reply_rx.recv().await.expect("reply").payload.len(), back as usize);
                }
                direct_times.push(started.elapsed());
            }
        }
        println!("one round = Propose {:?} then Verify {:?} (request bytes, reply bytes)", CALLS[0], CALLS[1]);
        let unary_median = summary("unary", unary_times);
        let stream_median = summary("stream", stream_times);
        let memory_median = summary("memory", memory_times);
        let direct_median = summary("channels", direct_times);
        println!(
            "median ÷ stream: unary {:.2}, in-memory pipe {:.2}, channels {:.2}",
            unary_median / stream_median,
            memory_median / stream_median,
            direct_median / stream_median
        );
    });
}
