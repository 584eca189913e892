//! A session's long-lived round stream to one node (`ProposeStream` / `VerifyStream`): one
//! request, then its reply, per round. BENCHMARKS.md has the measurement behind choosing
//! streams over unary calls: on loopback a round's transport takes about half as long.

use std::time::Duration;

use tokio::sync::mpsc;
use tonic::{Status, Streaming};

use crate::error::CoordinatorError;

/// Requests go out on `requests`; replies come back, in order, on `replies`.
#[derive(Debug)]
pub struct RoundStream<Q, R> {
    role: &'static str,
    address: String,
    timeout: Duration,
    requests: mpsc::Sender<Q>,
    replies: Streaming<R>,
}

/// Turns a node's status into the coordinator's error, keeping the node's address.
pub fn node_error(role: &'static str, address: &str, status: Status) -> CoordinatorError {
    if status.code() == tonic::Code::Unavailable {
        CoordinatorError::Unreachable { role, address: address.to_owned(), message: status.message().into() }
    } else {
        CoordinatorError::Node { role, address: address.to_owned(), status }
    }
}

impl<Q, R> RoundStream<Q, R> {
    pub fn new(
        role: &'static str,
        address: String,
        timeout: Duration,
        requests: mpsc::Sender<Q>,
        replies: Streaming<R>,
    ) -> Self {
        Self { role, address, timeout, requests, replies }
    }

    /// Sends `request` and waits, at most the node timeout, for its reply.
    pub async fn call(&mut self, request: Q) -> Result<R, CoordinatorError> {
        let exchange = async {
            // A closed request side means the node ended the stream: its status follows on
            // the reply side.
            let sent = self.requests.send(request).await.is_ok();
            match self.replies.message().await {
                Ok(Some(reply)) if sent => Ok(reply),
                Ok(_) => Err(CoordinatorError::StreamClosed { role: self.role, address: self.address.clone() }),
                Err(status) => Err(node_error(self.role, &self.address, status)),
            }
        };
        match tokio::time::timeout(self.timeout, exchange).await {
            Ok(result) => result,
            Err(_) => Err(node_error(
                self.role,
                &self.address,
                Status::deadline_exceeded(format!("no reply within {:?}", self.timeout)),
            )),
        }
    }
}
