//! specd-device-sampling: the distributions of the rule computed where the logits are.
//!
//! A node's model leaves its logits on its device ([`specd_model`'s `logits_on_device`]);
//! this crate turns them, with libtorch operations on that device, into exactly what the
//! sparse wire format needs, and copies only that to the host: O(γ·K) numbers a verify
//! instead of every row (3 MB at a vocabulary of 128 256 and γ = 5). It computes what
//! `specd-sampling` computes on the host, in f64, in the same order, with the same keyed
//! uniforms (drawn on the host from the Philox streams and passed in), so the two paths
//! agree up to rounding; `specd-sampling` stays the reference and decides every error.
//! Modules:
//!
//! - [`effective`]: rows of logits + settings + history → effective distributions
//!   (penalties → temperature → top-k → top-p → min-p; greedy), and a flag per row that
//!   says when the host's rules would refuse it;
//! - [`draw`]: inverse-CDF draws on a batch of rows, one uniform each;
//! - [`mask`]: output constraints' token masks applied to rows of logits on the device;
//! - [`target`]: the target's sparse reply ([`specd_sampling::ScoredBlock`]) for a block;
//! - [`draft`]: the draft's truncated q and its candidate;
//! - [`error`]: the crate's error type, [`DeviceSamplingError`].

pub mod draft;
pub mod draw;
pub mod effective;
pub mod error;
pub mod mask;
pub mod target;

pub use draft::{DraftDraw, draw_truncated, most_likely};
pub use effective::BlockHistory;
pub use error::{DeviceSamplingError, Result};
pub use mask::masked_rows;
pub use target::{DeviceRule, DeviceScored, score_block, score_block_with};
