//! How many bytes of KV cache a model's sessions may hold together, resolved once the weights
//! are loaded: a fixed number, or a fraction of the memory the device has free then (the way
//! vLLM's `--gpu-memory-utilization` sizes its cache).

use std::fmt;

use crate::device::DeviceSpec;
use crate::error::{ModelError, Result};

/// The budget as configured (`--kv-budget-mib`, `--kv-memory-fraction`).
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub enum KvBudget {
    /// No bound (tests; the caller bounds sessions some other way).
    #[default]
    Unbounded,
    /// Exactly this many bytes.
    Bytes(u64),
    /// This fraction (0 < f ≤ 1) of the device memory free after the weights: on CUDA the
    /// device's free memory as `nvidia-smi` reports it, on a CPU `MemAvailable` of
    /// `/proc/meminfo`.
    FractionOfFree(f64),
}

impl KvBudget {
    /// The bytes this budget allows on `device` now (`None`: unbounded). Call it after the
    /// weights are loaded, so that they are not counted as free.
    pub fn resolve(self, device: DeviceSpec) -> Result<Option<u64>> {
        match self {
            Self::Unbounded => Ok(None),
            Self::Bytes(bytes) => Ok(Some(bytes)),
            Self::FractionOfFree(fraction) => {
                if !(fraction > 0.0 && fraction <= 1.0) {
                    return Err(ModelError::InvalidInput(format!(
                        "the KV memory fraction {fraction} must be in (0, 1]"
                    )));
                }
                let free = free_bytes(device)?;
                Ok(Some((free as f64 * fraction) as u64))
            }
        }
    }
}

impl fmt::Display for KvBudget {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Unbounded => write!(f, "unbounded"),
            Self::Bytes(bytes) => write!(f, "{bytes} bytes"),
            Self::FractionOfFree(fraction) => write!(f, "{fraction} of the free memory"),
        }
    }
}

/// Bytes free on `device` now.
pub fn free_bytes(device: DeviceSpec) -> Result<u64> {
    match device {
        DeviceSpec::Cpu => {
            let path = "/proc/meminfo";
            let text = std::fs::read_to_string(path).map_err(|source| ModelError::Io { path: path.into(), source })?;
            mem_available(&text)
                .ok_or_else(|| ModelError::Device(format!("{path} has no MemAvailable line; pass --kv-budget-mib")))
        }
        DeviceSpec::Cuda(index) => cuda_free_bytes(index),
    }
}

/// `MemAvailable` of a `/proc/meminfo` text, in bytes.
fn mem_available(meminfo: &str) -> Option<u64> {
    let line = meminfo.lines().find(|l| l.starts_with("MemAvailable:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024)
}

/// Free memory of CUDA device `index` (as libtorch numbers it), read from `nvidia-smi`:
/// tch exposes no `cudaMemGetInfo`, and calling the CUDA runtime ourselves would need
/// `unsafe`. libtorch's index counts the devices `CUDA_VISIBLE_DEVICES` leaves, and
/// nvidia-smi numbers all of them, so the index is mapped through that list first.
fn cuda_free_bytes(index: usize) -> Result<u64> {
    let id = match std::env::var("CUDA_VISIBLE_DEVICES") {
        Ok(visible) if !visible.trim().is_empty() => visible
            .split(',')
            .nth(index)
            .map(|s| s.trim().to_owned())
            .ok_or_else(|| ModelError::Device(format!("cuda:{index} is not in CUDA_VISIBLE_DEVICES={visible}")))?,
        _ => index.to_string(),
    };
    let output = std::process::Command::new("nvidia-smi")
        .args(["--query-gpu=memory.free", "--format=csv,noheader,nounits", &format!("--id={id}")])
        .output()
        .map_err(|e| {
            ModelError::Device(format!(
                "cannot run nvidia-smi to read cuda:{index}'s free memory ({e}); pass --kv-budget-mib"
            ))
        })?;
    let text = String::from_utf8_lossy(&output.stdout);
    let mib: u64 = text.trim().lines().next().and_then(|l| l.trim().parse().ok()).ok_or_else(|| {
        ModelError::Device(format!(
            "nvidia-smi gave no free memory for cuda:{index} ({}); pass --kv-budget-mib",
            String::from_utf8_lossy(&output.stderr).trim()
        ))
    })?;
    Ok(mib * 1024 * 1024)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mem_available_is_read_in_bytes() {
        let text = "MemTotal:       24000000 kB\nMemFree:         1000 kB\nMemAvailable:    2048 kB\n";
        assert_eq!(mem_available(text), Some(2048 * 1024));
        assert_eq!(mem_available("MemTotal: 5 kB\n"), None);
    }

    #[test]
    fn a_fraction_of_the_free_memory_on_this_cpu() {
        let free = free_bytes(DeviceSpec::Cpu).unwrap();
        assert!(free > 0);
        let half = KvBudget::FractionOfFree(0.5).resolve(DeviceSpec::Cpu).unwrap().unwrap();
        // MemAvailable moves between the two reads, by far less than a quarter.
        assert!(half > free / 4 && half < free * 3 / 4, "half {half} of {free}");
        assert_eq!(KvBudget::Bytes(7).resolve(DeviceSpec::Cpu).unwrap(), Some(7));
        assert_eq!(KvBudget::Unbounded.resolve(DeviceSpec::Cpu).unwrap(), None);
        assert!(KvBudget::FractionOfFree(0.0).resolve(DeviceSpec::Cpu).is_err());
        assert!(KvBudget::FractionOfFree(1.5).resolve(DeviceSpec::Cpu).is_err());
    }
}
