//! Faults a test injects into a node on purpose, to show that what guards against them works.

use specd_device_sampling::DeviceRule;

use crate::block_masks::BlockMasks;

/// What a node is told to do wrong. Without the `testing` feature it has no fields, so a node
/// in service cannot be given any.
#[derive(Debug, Clone, Copy, Default)]
pub struct NodeFaults {
    /// Forward pass number N fails with a real allocation failure
    /// (`specd_model::InjectedOom`), to show that it fails its requests only.
    #[cfg(feature = "testing")]
    pub oom_at_pass: Option<u64>,
    /// The rule of the target's device path, broken on purpose to show that the law audits
    /// catch it.
    #[cfg(feature = "testing")]
    pub device_rule: DeviceRule,
    /// An ending session's prefix-cache entry keeps the rows past its rollback point, those
    /// of rejected candidates, under the committed tokens' ids: the store bug the law audit
    /// with the cache on must catch.
    #[cfg(feature = "testing")]
    pub prefix_cache_keeps_rejected_rows: bool,
    /// How a constrained block's rows are masked, broken on purpose to show that the law
    /// audit under a constraint catches it.
    #[cfg(feature = "testing")]
    pub block_masks: BlockMasks,
}

impl NodeFaults {
    /// Whether an ending session's entry keeps its rejected candidates' rows (only ever true
    /// in a test that broke it on purpose).
    pub fn prefix_cache_keeps_rejected_rows(&self) -> bool {
        #[cfg(feature = "testing")]
        return self.prefix_cache_keeps_rejected_rows;
        #[cfg(not(feature = "testing"))]
        false
    }

    /// How a constrained block's rows are masked: [`BlockMasks::Exact`] unless a test broke it.
    pub fn block_masks(&self) -> BlockMasks {
        #[cfg(feature = "testing")]
        return self.block_masks;
        #[cfg(not(feature = "testing"))]
        BlockMasks::Exact
    }

    /// The device path's rule: [`DeviceRule::Exact`] unless a test broke it.
    pub fn device_rule(&self) -> DeviceRule {
        #[cfg(feature = "testing")]
        return self.device_rule;
        #[cfg(not(feature = "testing"))]
        DeviceRule::Exact
    }
}
