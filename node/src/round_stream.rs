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

/// What sends on a [`ReplyStream`].
pub type ReplySender<R> = mpsc::Sender<Result<R, Status>>;

/// Answers each request of `requests` with `handle`, in order, until the caller closes the
/// stream, goes away or a request fails.
pub fn serve_rounds<Q, R, F, Fut>(
    requests: impl Stream<Item = Result<Q, Status>> + Send + Unpin + 'static,
    handle: F,
) -> ReplyStream<R>
where
    Q: Send + 'static,
    R: Send + 'static,
    F: Fn(Q) -> Fut + Send + 'static,
    Fut: Future<Output = Result<R, Status>> + Send,
{
    // One slot: a round's reply is awaited before the next request is sent.
    serve_rounds_lending(requests, 1, move |request, _| {
        let reply = handle(request);
        async move { reply.await.map(Some) }
    })
}

/// As [`serve_rounds`], with the stream's sender lent to each request's handler and `queue`
/// replies buffered for the caller. A handler may send its reply itself, and more after it
/// (a draft node's blocks pushed ahead), and then answer `None`; an error it returns is
/// sent, and ends the stream.
pub fn serve_rounds_lending<Q, R, F, Fut>(
    mut requests: impl Stream<Item = Result<Q, Status>> + Send + Unpin + 'static,
    queue: usize,
    handle: F,
) -> ReplyStream<R>
where
    Q: Send + 'static,
    R: Send + 'static,
    F: Fn(Q, ReplySender<R>) -> Fut + Send + 'static,
    Fut: Future<Output = Result<Option<R>, Status>> + Send,
{
    let (replies, rx) = mpsc::channel(queue);
    tokio::spawn(async move {
        while let Some(request) = requests.next().await {
            let reply = match request {
                Ok(request) => handle(request, replies.clone()).await.transpose(),
                Err(status) => Some(Err(status)),
            };
            let Some(reply) = reply else { continue };
            let failed = reply.is_err();
            if replies.send(reply).await.is_err() || failed {
                break;
            }
        }
    });
    ReceiverStream::new(rx)
}
