//! The listener side of every specd gRPC server.

use tokio::net::{TcpListener, TcpStream};
use tokio_stream::wrappers::TcpListenerStream;
use tokio_stream::{Stream, StreamExt};

/// Accepted connections with Nagle's algorithm off. A round is a few small request/response
/// messages; with Nagle on, each can wait for the peer's delayed ACK (tens of milliseconds),
/// which would dwarf the model's work.
pub fn incoming(listener: TcpListener) -> impl Stream<Item = std::io::Result<TcpStream>> {
    TcpListenerStream::new(listener).map(|accepted| {
        if let Ok(stream) = &accepted {
            let _ = stream.set_nodelay(true);
        }
        accepted
    })
}
