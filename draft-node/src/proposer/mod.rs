//! What proposes a block's candidates: the draft model, or a deterministic proposer that
//! copies tokens without any randomness (docs/rule.md, deterministic proposers), or both.
//!
//! - [`kind`]: [`ProposerKind`] (`model`, `ngram`, `suffix`, `model+ngram`) and
//!   [`ProposerConfig`], the flags' values;
//! - [`ngram`]: prompt lookup: the longest match of the sequence's last tokens earlier in
//!   it, and what followed;
//! - [`suffix`]: [`SuffixIndex`], continuation counts over recent sessions in bounded
//!   memory, and the proposals it makes with the current session.
//!
//! A deterministic candidate's q is one-hot: the rule accepts it with probability p(x) and
//! otherwise emits from p with x removed, which keeps the output law exact.

pub mod kind;
pub mod ngram;
pub mod suffix;

pub use kind::{ProposerConfig, ProposerKind};
pub use ngram::{Lookup, MatchSpan, NgramMatch};
pub use suffix::SuffixIndex;
