//! The wrong rule, kept as a counterexample: on rejection, resample from p instead of the
//! residual. Its output law is β-weighted towards q's accepted mass and is *not* p
//! (DESIGN.md §1: (0.59, 0.295, 0.115) instead of (0.6, 0.3, 0.1)). It exists so that the
//! statistical tests can prove they would catch it, and so `specd rule` can show it.

use crate::dense_rule::{DenseCandidate, RoundKey, verify_block_dense_with};
use crate::dist::DenseDist;
use crate::error::Result;
use crate::rule::BlockOutcome;

/// The block loop of [`crate::dense_rule::verify_block_dense`] with "resample from p" at the
/// first rejection. Do not use for generation.
pub fn naive_verify_block_dense(
    candidates: &[DenseCandidate<'_>],
    p: &[DenseDist],
    key: RoundKey,
) -> Result<BlockOutcome> {
    verify_block_dense_with(candidates, p, key, |p_i, _q_i, _residual_mass, u| p_i.sample(u))
}
