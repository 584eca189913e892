//! Adaptive draft length (docs/adaptive.md): per session, the γ in 0..=max with the most
//! expected tokens per millisecond, from what the session's own rounds measured, starting
//! from what earlier sessions with the same settings and load learnt.
//!
//! A round at γ is expected to commit (1 − α^(γ+1)) / (1 − α) tokens in γ·draft step +
//! verify(0) + slope·γ + overhead, every term measured by the session; a target-only round
//! commits one in verify(0) + overhead(0). The pieces, each in its own file:
//! - `state.rs`: one session's estimates ([`AdaptiveGamma`]);
//! - `observe.rs`: what a finished round teaches them, and which of its times count
//!   ([`SteadyCosts`]);
//! - `choose.rs`: each round's γ, and the probes of the side not in use (a target-only round
//!   every [`PLAIN_PROBE_EVERY`] while drafting, a drafting one within
//!   [`DRAFT_PROBE_BUDGET`] while not);
//! - `memory.rs`: what sessions learn from each other ([`PolicyMemory`]), per [`key`];
//! - [`governor`]: under load, whether a load level's sessions draft at all;
//! - [`copies`]: whether a `model+ngram` draft's copies pay;
//! - `average.rs` and `remeasure.rs`: the running average all of them learn with, and how
//!   often a side not in use is measured again;
//! - [`trees`]: `--tree auto`, whether a session's rounds draft trees or chains.
//!
//! A short request must not spend its few rounds re-learning what earlier sessions already
//! measured, which is why the memory exists. The law stays exact whatever γ is chosen: each
//! round's rule is exact for its γ, and γ depends only on earlier rounds.

pub(crate) mod average;
mod choose;
pub mod copies;
pub mod governor;
pub mod key;
mod memory;
mod observe;
mod remeasure;
mod state;
pub mod trees;

pub use choose::{DRAFT_PROBE_BUDGET, DRAFT_PROBE_MAX, DRAFT_PROBE_MIN, MEASURING_ROUNDS, PLAIN_PROBE_EVERY};
pub use memory::{CONFIDENT_POSITIONS, EXPLORE_EVERY, PolicyMemory, SESSION_ALPHA_PRIOR_WEIGHT};
pub use observe::SteadyCosts;
pub use state::{AdaptiveGamma, START_GAMMA};
