//! The whole-cluster checks that load the CPU and assert no timings, in one test binary: it
//! is linked once rather than once per file (about 30 s each in release). Each file is a
//! module and reads as its own test; run one with `cargo test --release -p specd-e2e --test
//! cluster law_through_cluster::`.
//!
//! - [`law_through_cluster`]: the output law through three gRPC servers, χ² against the
//!   exact target law;
//! - [`optimistic`]: optimistic drafting, same outputs and the same law;
//! - [`greedy_hf`]: greedy identity on Hugging Face checkpoints;
//! - [`metrics`]: `GET /metrics` agrees with a generation's own stats.
//!
//! `service.rs` and `discovery.rs` stay binaries of their own: they assert latencies, which
//! a law check running beside them would disturb.

mod greedy_hf;
mod law_through_cluster;
mod metrics;
mod optimistic;
