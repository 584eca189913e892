//! Adaptive draft length (docs/adaptive.md): per session, pick the γ in 0..=max that maximises
//! expected tokens per millisecond, from what the session's own rounds measured, starting
//! from what earlier sessions learnt.
//!
//! The model of a round, every term measured:
//! - α: the per-position acceptance, from Σ min(p, q) of every evaluated position (exact from
//!   the target's p on the draft's support; lower variance than counting accepts);
//! - a draft step: draft time ÷ γ;
//! - a verify pass: `verify(γ) = verify(0) + slope·γ`, because on CPU scoring γ+1 tokens costs
//!   more than scoring one (BENCHMARKS.md: 1.9× for 6 tokens in f32);
//! - the rest of a round (network, hand-offs, the rule): measured separately for speculative
//!   rounds (two calls) and target-only rounds (one call).
//!
//! Expected tokens of a round are (1 - α^(γ+1)) / (1 - α), so speed(γ) = that ÷
//! (γ·draft + verify(γ) + overhead) and speed(0) = 1 ÷ (verify(0) + overhead(0)). The two cost
//! cases of docs/rule.md: with α = 0.5, a target pass of 100 ms and draft steps of 20 ms,
//! γ = 1 gives 1.25× and the policy drafts; with draft steps of 60 ms every γ is slower than
//! target-only (γ = 1: 0.94×, the "0.875×" family of cases) and the policy picks γ = 0, which
//! is plain target decoding.
//!
//! A session starts from what the coordinator's earlier sessions with the same sampling
//! settings and about the same number of concurrent generations learnt ([`PolicyMemory`]):
//! their latest costs, and the α of all their positions (its own α starts there, counted as
//! [`SESSION_ALPHA_PRIOR_WEIGHT`] positions, and then follows its prompt). A short request
//! must not spend its few rounds re-learning that drafting does not pay (a 20 ms link to the
//! draft, a draft that knows nothing of the target, a target whose passes are shared by many
//! sessions). The first session of its kind, and a session that explores, starts with one
//! speculative and one target-only round, so both sides are measured (the first round's
//! passes also fill the caches and teach only α: a first session drafts once more to measure
//! the draft, an explorer keeps the learnt draft costs); the α of an explorer
//! that runs alone starts from the population's counted as only 2 positions, so its own
//! soon decide. That drafting does not pay is trusted only once the α behind
//! it is several sessions' worth: one prompt's positions are not independent. Either way a
//! session re-measures the side it is not using now and then: a target-only round every
//! [`PLAIN_PROBE_EVERY`] rounds while drafting, a round at the best drafting γ while not, as
//! often as costs at most [`DRAFT_PROBE_BUDGET`] of the session's rate (after
//! [`DRAFT_PROBE_MIN`] to [`DRAFT_PROBE_MAX`] target-only rounds: near break-even often, since a probe
//! there loses little and a session whose α dipped must get back, rarely across a slow link,
//! where a probe costs several target passes). The law
//! stays exact whatever γ is chosen: each round's rule is exact for its γ, and γ depends only
//! on earlier rounds.

pub(crate) mod average;
mod choose;
pub mod copies;
pub mod governor;
pub mod key;
mod memory;
mod observe;
mod remeasure;
mod state;

pub use choose::{DRAFT_PROBE_BUDGET, DRAFT_PROBE_MAX, DRAFT_PROBE_MIN, MEASURING_ROUNDS, PLAIN_PROBE_EVERY};
pub use memory::{CONFIDENT_POSITIONS, EXPLORE_EVERY, PolicyMemory, SESSION_ALPHA_PRIOR_WEIGHT};
pub use observe::SteadyCosts;
pub use state::{AdaptiveGamma, START_GAMMA};
