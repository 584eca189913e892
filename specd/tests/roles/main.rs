//! The `specd` roles as real processes, under faults and limits, in one test binary: it is
//! linked once rather than seven times (17-33 s each in release on a 2-vCPU host,
//! docs/testing.md). Each file is a module and reads as its own test; run one with `cargo
//! test --release -p specd --test roles soak:: -- --nocapture`.
//!
//! - [`admission`]: the bearer token, `--max-generations` and the client's deadline;
//! - [`draft_loss`]: a draft killed mid-generation, and drafting again when it is back;
//! - [`target_loss`]: a target killed mid-generation, with and without a spare replica;
//! - [`shutdown`]: SIGTERM drains;
//! - [`soak`]: concurrent streams against `specd up`, sessions and memory afterwards;
//! - [`mtls`]: mutual TLS between the coordinator and the nodes;
//! - [`traces`]: one generation's spans from three processes as one trace.

#[path = "../common/mod.rs"]
mod common;

mod admission;
mod draft_loss;
mod mtls;
mod shutdown;
mod soak;
mod target_loss;
mod traces;

/// Held by each test for its whole run: they assert deadlines and measure memory as when
/// each was a binary of its own and had the host to itself, and libtest would otherwise run
/// two at once.
async fn alone() -> tokio::sync::MutexGuard<'static, ()> {
    static ONE: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());
    ONE.lock().await
}
