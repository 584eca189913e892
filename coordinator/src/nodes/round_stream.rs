//! A session's long-lived round stream to one node (`ProposeStream` / `VerifyStream`): one
//! request, then its reply, per round, over gRPC or handed over in process
//! (`specd_proto::in_process`). BENCHMARKS.md has the measurement behind choosing streams
//! over unary calls: on loopback a round's transport takes about half as long.

use std::time::Duration;

use specd_proto::in_process::Rounds;
use tokio::sync::mpsc;
use tokio_stream::StreamExt;
use tonic::Status;

use crate::error::CoordinatorError;

/// Requests go out on `requests`; replies come back, in order, on `replies`.
pub struct RoundStream<Q, R> {
    role: &'static str,
    address: String,
    timeout: Duration,
    requests: mpsc::Sender<Q>,
    replies: Rounds<R>,
}

/// Turns a node's status into the coordinator's error, keeping the node's address.
pub fn node_error(role: &'static str, address: &str, status: Status) -> CoordinatorError {
    if status.code() == tonic::Code::Unavailable {
        CoordinatorError::Unreachable { role, address: address.to_owned(), message: status.message().into() }
    } else {
        CoordinatorError::Node { role, address: address.to_owned(), status }
    }
}

impl<Q, R> std::fmt::Debug for RoundStream<Q, R> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RoundStream").field("role", &self.role).field("address", &self.address).finish_non_exhaustive()
    }
}

impl<Q, R> RoundStream<Q, R> {
    pub fn new(
        role: &'static str,
        address: String,
        timeout: Duration,
        requests: mpsc::Sender<Q>,
        replies: Rounds<R>,
    ) -> Self {
        Self { role, address, timeout, requests, replies }
    }

    /// Sends `request` and waits, at most the node timeout, for its reply.
    pub async fn call(&mut self, request: Q) -> Result<R, CoordinatorError> {
        self.send(request).await?;
        self.receive().await
    }

    /// Sends `request` without waiting for anything back. A closed request side means the
    /// node ended the stream: its status follows on the reply side.
    pub async fn send(&mut self, request: Q) -> Result<(), CoordinatorError> {
        match tokio::time::timeout(self.timeout, self.requests.send(request)).await {
            Ok(Ok(())) => Ok(()),
            Ok(Err(_)) => match self.receive().await {
                Err(err) => Err(err),
                Ok(_) => Err(CoordinatorError::StreamClosed { role: self.role, address: self.address.clone() }),
            },
            Err(_) => Err(self.timed_out()),
        }
    }

    /// The next message of the reply side, waiting at most the node timeout.
    pub async fn receive(&mut self) -> Result<R, CoordinatorError> {
        match tokio::time::timeout(self.timeout, self.replies.next()).await {
            Ok(Some(Ok(reply))) => Ok(reply),
            Ok(None) => Err(CoordinatorError::StreamClosed { role: self.role, address: self.address.clone() }),
            Ok(Some(Err(status))) => Err(node_error(self.role, &self.address, status)),
            Err(_) => Err(self.timed_out()),
        }
    }

    fn timed_out(&self) -> CoordinatorError {
        node_error(self.role, &self.address, Status::deadline_exceeded(format!("no reply within {:?}", self.timeout)))
    }
}
