//! Faults a test injects into a node on purpose, to show that what guards against them works.

use specd_device_sampling::DeviceRule;

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
}

impl NodeFaults {
    /// The device path's rule: [`DeviceRule::Exact`] unless a test broke it.
    pub fn device_rule(&self) -> DeviceRule {
        #[cfg(feature = "testing")]
        return self.device_rule;
        #[cfg(not(feature = "testing"))]
        DeviceRule::Exact
    }
}
