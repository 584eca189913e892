//! Serving a session's rounds on one long-lived bidirectional stream (the `*Stream` RPCs of
//! `nodes.proto`, or the same stream handed over in process, `specd_proto::in_process`):
//! requests are handled one at a time, in order, exactly as the unary calls would be, and
//! the first error ends the stream with its status.

use std::future::Future;

use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tokio_stream::{Stream, StreamExt};
use tonic::Status;

/// The reply stream a `*Stream` RPC returns.
pub type ReplyStream<R> = ReceiverStream<Result<R, Status>>;

/// Answers each request of `requests` with `handle`, in order, until the caller closes the
/// stream, goes away or a request fails.
pub fn serve_rounds<Q, R, F, Fut>(
    mut requests: impl Stream<Item = Result<Q, Status>> + Send + Unpin + 'static,
    handle: F,
) -> ReplyStream<R>
where
    Q: Send + 'static,
    R: Send + 'static,
    F: Fn(Q) -> Fut + Send + 'static,
    Fut: Future<Output = Result<R, Status>> + Send,
{
    // One slot: a round's reply is awaited before the next request is sent.
    let (replies, rx) = mpsc::channel(1);
    tokio::spawn(async move {
        while let Some(request) = requests.next().await {
            let reply = match request {
                Ok(request) => handle(request).await,
                Err(status) => Err(status),
            };
            let failed = reply.is_err();
            if replies.send(reply).await.is_err() || failed {
                break;
            }
        }
    });
    ReceiverStream::new(rx)
}
