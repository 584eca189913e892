//! The running average that the adaptive policy and the load governor learn with.

/// An exponentially weighted running average that starts as a plain mean: the k-th
/// observation weighs max(1/k, weight). Early estimates then rest on all the data so far,
/// not on a prior that a small smoothing weight would keep for dozens of observations, long
/// enough to turn drafting off for good (docs/adaptive.md).
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Average {
    pub(crate) mean: Option<f64>,
    pub(crate) count: u64,
}

impl Average {
    /// An average that starts at `prior`, counted as `weight` observations.
    pub(crate) fn prior(prior: f64, weight: u64) -> Self {
        Self { mean: Some(prior), count: weight }
    }

    pub(crate) fn get(&self) -> Option<f64> {
        self.mean
    }

    pub(crate) fn add(&mut self, x: f64, weight: f64) {
        self.add_share(x, weight, 1.0);
    }

    /// [`Self::add`] for an observation worth `share` (≤ 1) of a full one.
    pub(crate) fn add_share(&mut self, x: f64, weight: f64, share: f64) {
        if x.is_finite() {
            self.count += 1;
            let w = (1.0 / self.count as f64).max(weight) * share;
            self.mean = Some(self.mean.map_or(x, |m| m + w * (x - m)));
        }
    }
}
