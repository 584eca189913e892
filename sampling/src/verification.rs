//! Which rule judges a drafted block, and the entry points that run the chosen one.
//!
//! Both rules are exact; they differ in how much of a block they keep. Token verification
//! (docs/rule.md, [`crate::dense_rule`], [`crate::sparse_rule`]) stops at the first rejected
//! candidate. Block verification ([`crate::block_rule`]) judges the block as a whole and
//! accepts, in expectation, at least as many candidates from the same target pass.

use std::fmt;
use std::str::FromStr;

use crate::block_rule::{verify_whole_block_dense, verify_whole_block_sparse};
use crate::dense_rule::{DenseCandidate, verify_block_dense};
use crate::dist::DenseDist;
use crate::error::Result;
use crate::rng::RoundKey;
use crate::rule::BlockOutcome;
use crate::sparse_rule::{SparseCandidate, verify_block_sparse};
use crate::target_pieces::ScoredBlock;

/// The verification rule a coordinator applies (`--verify`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum Verification {
    /// Accept candidates one by one; stop at the first rejection.
    Token,
    /// Judge the block as a whole (Sun et al., ICLR 2025).
    #[default]
    Block,
}

impl Verification {
    pub const ALL: [Verification; 2] = [Verification::Token, Verification::Block];

    pub fn name(self) -> &'static str {
        match self {
            Self::Token => "token",
            Self::Block => "block",
        }
    }
}

impl fmt::Display for Verification {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for Verification {
    type Err = String;

    fn from_str(s: &str) -> std::result::Result<Self, Self::Err> {
        Self::ALL
            .into_iter()
            .find(|v| v.name() == s)
            .ok_or_else(|| format!("unknown verification rule {s:?}: expected token or block"))
    }
}

/// Runs `verification` on full distributions.
pub fn verify_dense(
    verification: Verification,
    candidates: &[DenseCandidate<'_>],
    p: &[DenseDist],
    key: RoundKey,
) -> Result<BlockOutcome> {
    match verification {
        Verification::Token => verify_block_dense(candidates, p, key),
        Verification::Block => verify_whole_block_dense(candidates, p, key),
    }
}

/// Runs `verification` on the sparse wire format.
pub fn verify_sparse(
    verification: Verification,
    candidates: &[SparseCandidate<'_>],
    scored: &ScoredBlock,
    key: RoundKey,
) -> Result<BlockOutcome> {
    match verification {
        Verification::Token => verify_block_sparse(candidates, scored, key),
        Verification::Block => verify_whole_block_sparse(candidates, scored, key),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip_and_unknown_ones_are_refused() {
        for v in Verification::ALL {
            assert_eq!(v.to_string().parse::<Verification>(), Ok(v));
        }
        let err = "tree".parse::<Verification>().unwrap_err();
        assert!(err.contains("token or block"), "{err}");
    }
}
