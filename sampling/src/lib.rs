//! specd-sampling: the law that specd preserves, and nothing else (no networks, no tensors).
//!
//! Speculative sampling (Leviathan et al. 2023, arXiv:2211.17192; Chen et al. 2023,
//! arXiv:2302.01318) lets a cheap draft propose tokens that a target accepts or corrects so
//! that the output is distributed exactly as the target's own sampling. Modules:
//!
//! - [`params`]: [`SamplingParams`], validated sampling settings;
//! - [`effective`]: logits + settings + history → the effective distribution p or q
//!   (penalties → temperature → top-k → top-p → min-p; temperature 0 is greedy);
//! - [`dist`]: [`DenseDist`], [`SparseDist`] and the draft's [`Truncation`] to a sparse q;
//! - [`rng`]: Philox4x32-10 counter-based randomness keyed by (seed, round, position, purpose);
//! - [`rule`]: the algorithm and [`BlockOutcome`]; [`dense_rule`] applies it on full
//!   distributions, [`sparse_rule`] on the sparse wire format, whose target half is
//!   [`target_pieces`];
//! - [`block_rule`]: block verification (Sun et al. 2025), the block judged as a whole, with
//!   its weights in [`block_weights`]; [`verification`] names the two rules
//!   ([`Verification`]) and runs the chosen one;
//! - `excess` (private): one block position as both rules read it, on either wire format;
//!   `token_rule` (private): token verification's loop, which both wire formats share;
//! - [`tree_rule`]: exact verification of a tree of drafts (recursive rejection sampling over
//!   each node's children), with the exact laws of tree rounds in [`tree_law`] and the
//!   target's distributions after every node, each on its own path, in [`tree_distributions`];
//!   [`tree_drafting`] draws a node's children as a draft does;
//! - [`naive`]: the wrong "resample from p" rule, kept so tests can prove their power;
//! - [`law`]: exact output laws by enumeration (one position, one round, L tokens);
//! - [`mask`]: [`TokenMask`], the tokens a constraint (a JSON schema, a grammar) allows at
//!   one position, applied to logits before every setting;
//! - [`logprobs`]: a token's log-probability and the most likely alternatives, for clients;
//! - [`cost`]: expected tokens per round, speedup and the best draft length γ;
//! - [`chi2`]: Pearson's χ² goodness-of-fit test for the statistical tests;
//! - [`error`]: the crate's error type, [`SamplingError`];
//! - `kernels` (private): vocabulary-wide sums and draws written to run fast;
//! - `rows` (private): a large block's per-position work spread over threads.

pub mod block_rule;
pub mod block_weights;
pub mod chi2;
pub mod cost;
pub mod dense_rule;
pub mod dist;
pub mod effective;
pub mod error;
mod excess;
mod kernels;
pub mod law;
pub mod logprobs;
pub mod mask;
pub mod naive;
pub mod params;
pub mod rng;
mod rows;
pub mod rule;
pub mod sparse_rule;
pub mod target_pieces;
mod token_rule;
pub mod tree_distributions;
pub mod tree_drafting;
pub mod tree_law;
pub mod tree_rule;
pub mod verification;

pub use block_rule::{verify_whole_block_dense, verify_whole_block_sparse};
pub use cost::{CostModel, MAX_GAMMA};
pub use dense_rule::{DenseCandidate, verify_block_dense};
pub use dist::{DenseDist, SparseDist, Truncation};
pub use effective::{TokenHistory, block_distributions, effective_distribution};
pub use error::{Result, SamplingError};
pub use mask::TokenMask;
pub use params::SamplingParams;
pub use rng::{DrawKeys, Purpose, RoundKey, StreamKey};
pub use rule::{AcceptedInExpectation, BlockOutcome, EmittedFrom, acceptance_probability};
pub use sparse_rule::{SparseCandidate, verify_block_sparse};
pub use target_pieces::{ScoredBlock, ScoredNode, ScoredPosition, score_block, score_tree};
pub use tree_distributions::tree_distributions;
pub use tree_drafting::{ChildSource, draw_children};
pub use tree_law::{MAX_TREE_CANDIDATES, TreeShape};
pub use verification::{Verification, verify_dense, verify_sparse};
