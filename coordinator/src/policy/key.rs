//! What the policy's memory is keyed by: the sampling settings, on which acceptance depends,
//! and the load, on which the costs do. With many sessions the nodes' passes are shared and
//! the machine's compute is the limit; alone, the latency of a pass is.

use std::fmt;

use specd_sampling::SamplingParams;

/// The sampling settings a session runs with, as the memory tells them apart: two settings
/// are one key when every parameter has the same value (every NaN counting as one value).
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct SettingsKey {
    temperature: u64,
    top_k: u32,
    top_p: u64,
    min_p: u64,
    repetition_penalty: u64,
    presence_penalty: u64,
    frequency_penalty: u64,
}

/// A parameter's value as a key: its bits, and one NaN for all of them.
fn value_bits(x: f64) -> u64 {
    if x.is_nan() { f64::NAN.to_bits() } else { x.to_bits() }
}

impl SettingsKey {
    /// The key of `params`.
    pub fn of(params: &SamplingParams) -> Self {
        // Destructured whole, so that a new parameter cannot be left out of the key.
        let SamplingParams {
            temperature,
            top_k,
            top_p,
            min_p,
            repetition_penalty,
            presence_penalty,
            frequency_penalty,
        } = *params;
        Self {
            temperature: value_bits(temperature),
            top_k,
            top_p: value_bits(top_p),
            min_p: value_bits(min_p),
            repetition_penalty: value_bits(repetition_penalty),
            presence_penalty: value_bits(presence_penalty),
            frequency_penalty: value_bits(frequency_penalty),
        }
    }

    /// The settings the key was made from.
    pub fn params(&self) -> SamplingParams {
        SamplingParams {
            temperature: f64::from_bits(self.temperature),
            top_k: self.top_k,
            top_p: f64::from_bits(self.top_p),
            min_p: f64::from_bits(self.min_p),
            repetition_penalty: f64::from_bits(self.repetition_penalty),
            presence_penalty: f64::from_bits(self.presence_penalty),
            frequency_penalty: f64::from_bits(self.frequency_penalty),
        }
    }
}

impl fmt::Debug for SettingsKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("SettingsKey").field(&self.params()).finish()
    }
}

impl fmt::Display for SettingsKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:?}", self.params())
    }
}

/// How many generations run at once, rounded up to a power of two: sessions at about the
/// same load learn from each other.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct LoadLevel {
    log2: u32,
}

impl LoadLevel {
    /// The level of `running` generations (this one included; 0 counts as 1).
    pub fn of(running: usize) -> Self {
        Self { log2: running.max(1).next_power_of_two().ilog2() }
    }
}

impl fmt::Display for LoadLevel {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "2^{}", self.log2)
    }
}

/// One entry of the policy's memory: sessions with the same settings at the same load level
/// share what they learn.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct PolicyKey {
    pub settings: SettingsKey,
    pub load: LoadLevel,
}

impl PolicyKey {
    /// The key of a session with `params`, `running` generations running now.
    pub fn of(params: &SamplingParams, running: usize) -> Self {
        Self { settings: SettingsKey::of(params), load: LoadLevel::of(running) }
    }
}

impl fmt::Display for PolicyKey {
    /// As the logs have always read: `SamplingParams { temperature: 1.0, … } load 2^3`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} load {}", self.settings, self.load)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn load_levels_are_powers_of_two() {
        assert_eq!(LoadLevel::of(0), LoadLevel::of(1));
        assert_eq!(LoadLevel::of(3), LoadLevel::of(4));
        assert_ne!(LoadLevel::of(4), LoadLevel::of(5));
        assert_eq!(LoadLevel::of(8).to_string(), "2^3");
    }

    #[test]
    fn settings_are_one_key_exactly_when_they_print_the_same() {
        let params = |temperature: f64| SamplingParams { temperature, ..SamplingParams::default() };
        let same_print = |a: &SamplingParams, b: &SamplingParams| format!("{a:?}") == format!("{b:?}");
        let values = [0.0, -0.0, 1.0, 0.8, 0.8 + 1e-16, f64::NAN, -f64::NAN, f64::INFINITY];
        for a in values {
            for b in values {
                let (a, b) = (params(a), params(b));
                assert_eq!(SettingsKey::of(&a) == SettingsKey::of(&b), same_print(&a, &b), "{a:?} {b:?}");
            }
        }
        let key = PolicyKey::of(&params(0.8), 5);
        assert_eq!(key.to_string(), format!("{:?} load 2^3", params(0.8)));
    }
}
