//! [`BlockMasks`]: how a target masks a constrained block's rows, right or (in tests) wrong
//! on purpose.

/// How a block's rows are masked. Only [`BlockMasks::Exact`] is right; with the `testing`
/// feature a bug kept on purpose joins it, so that the law audit under a constraint shows it
/// catches a target that masks with the wrong state.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum BlockMasks {
    /// Row i with the state after the output and the first i candidates.
    #[default]
    Exact,
    /// Every row with the state after the output alone, the block's first.
    #[cfg(feature = "testing")]
    FirstStateEverywhere,
}
