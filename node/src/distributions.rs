//! Where a node turns logits into distributions: on the host, from every row copied out of
//! the model (`specd-sampling`), or on the model's device with libtorch, copying only the
//! few numbers the wire carries (`specd-device-sampling`). Both give the same law; they
//! differ in time and in bytes moved.

use std::fmt;
use std::str::FromStr;

use specd_model::DeviceSpec;

/// `--distributions`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Distributions {
    /// [`Self::Device`] on a GPU; on a CPU, whichever measured faster there (see
    /// [`Self::resolve`]).
    #[default]
    Auto,
    Host,
    Device,
}

impl Distributions {
    /// The path a node on `device` takes.
    ///
    /// On a CPU the host path stays: at V = 128 256, γ = 5 it built a verify's pieces in
    /// 1/1.4 to 1/13 of the time libtorch took on the same cores
    /// (`cargo bench -p specd-device-sampling --bench host_vs_device`, BENCHMARKS.md), and the
    /// copy it saves is a memcpy there. On a GPU the copy and the host's work are what the
    /// device path removes.
    pub fn resolve(self, device: DeviceSpec) -> Self {
        match (self, device) {
            (Self::Auto, DeviceSpec::Cpu) => Self::Host,
            (Self::Auto, DeviceSpec::Cuda(_)) => Self::Device,
            (chosen, _) => chosen,
        }
    }

    pub fn on_device(self) -> bool {
        self == Self::Device
    }
}

impl FromStr for Distributions {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "auto" => Ok(Self::Auto),
            "host" => Ok(Self::Host),
            "device" => Ok(Self::Device),
            other => Err(format!("`{other}`: expected auto, host or device")),
        }
    }
}

impl fmt::Display for Distributions {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Auto => "auto",
            Self::Host => "host",
            Self::Device => "device",
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn auto_is_device_on_a_gpu_and_the_choice_stands_otherwise() {
        assert_eq!(Distributions::Auto.resolve(DeviceSpec::Cuda(0)), Distributions::Device);
        assert_eq!(Distributions::Auto.resolve(DeviceSpec::Cpu), Distributions::Host);
        assert_eq!(Distributions::Device.resolve(DeviceSpec::Cpu), Distributions::Device);
        assert_eq!(Distributions::Host.resolve(DeviceSpec::Cuda(1)), Distributions::Host);
        for text in ["auto", "host", "device"] {
            assert_eq!(text.parse::<Distributions>().unwrap().to_string(), text);
        }
        assert!("gpu".parse::<Distributions>().unwrap_err().contains("auto, host or device"));
    }
}
