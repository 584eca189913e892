//! The whole-cluster checks that assert deadlines, in one test binary of their own: no law
//! check runs beside them to make them miss one, and they are linked once rather than three
//! times (70-90 s each in release on a 2-vCPU host, docs/testing.md). Each file is a module
//! and reads as its own test; run one with `cargo test --release -p specd-e2e --test
//! deadlines discovery::`.
//!
//! - [`service`]: the cluster as a client sees it: greedy identity, cancellation, bad input,
//!   unreachable peers;
//! - [`metrics`]: `GET /metrics` after a generation against the response's own stats;
//! - [`discovery`]: replicas behind one name, balancing, routing by prefix, failover.

mod discovery;
mod metrics;
mod service;
