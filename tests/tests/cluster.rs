//! The whole-cluster checks that load the CPU and assert no timings, in one test binary: it
//! is linked once rather than once per file (about 30 s each in release). Each file is a
//! module and reads as its own test; run one with `cargo test --release -p specd-e2e --test
//! cluster law_through_cluster::`.
//!
//! - [`constraint_law`]: the output law under a constraint (a regular expression), on both
//!   distribution paths and with a draft that does not mask, and masks of the wrong state
//!   caught;
//! - [`constraint_outputs`]: outputs under a JSON schema on a random-weight checkpoint:
//!   greedy identity per proposer, every output that ends with `stop` valid;
//! - [`law_through_cluster`]: the output law through three gRPC servers, χ² against the
//!   exact target law;
//! - [`optimistic`]: optimistic drafting, same outputs and the same law;
//! - [`greedy_hf`]: greedy identity on Hugging Face checkpoints;
//! - [`vocab_padding`]: a draft without the target's padding rows, same law;
//! - [`kv_budget`]: KV memory by the request: admission against the target's budget, and a
//!   pass out of memory failing its request only;
//! - [`proposers`]: the n-gram, suffix and model+ngram proposers: the law, greedy identity,
//!   the suffix node's memory bound;
//! - [`tree_cache`]: both nodes' caches after a tree round, against fresh sessions;
//! - [`prefix_cache_law`]: the law of a conversation's second turn with the prefix caches on,
//!   and a store that keeps a rejected candidate's row caught.
//!
//! `service.rs`, `discovery.rs` and `metrics.rs` are modules of another binary,
//! `deadlines.rs`: they assert deadlines, which a law check running beside them could make
//! them miss.
//!
//! Every test here runs its cluster on a current-thread runtime: the nodes' models have
//! threads of their own, and a second runtime worker only added wake-ups between threads.
//! Two law checks side by side (libtest runs two at once on two cores) took 12.9 s instead
//! of 17.7 s at 20 000 samples each, and the whole binary 27 minutes instead of about 37
//! (docs/testing.md).

mod constraint_law;
mod constraint_outputs;
mod greedy_hf;
mod kv_budget;
mod law_through_cluster;
mod optimistic;
mod prefix_cache_law;
mod proposers;
mod tree_cache;
mod vocab_padding;
