//! How many bytes of KV cache a model's sessions may hold together: a fixed number, or a
//! fraction of the memory the device has free once the model is loaded and warmed up (the
//! way vLLM's `--gpu-memory-utilization` sizes its cache), and where that free memory is
//! read.

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
    /// This fraction (0 < f ≤ 1) of the device memory free once the model is loaded and
    /// warmed up (warm-up and its workspaces take memory too): on CUDA as the CUDA runtime
    /// reports it, or `nvidia-smi` where the runtime cannot be asked; on a CPU `MemAvailable`
    /// of `/proc/meminfo`. A model loaded with it holds no bound until the budget is resolved
    /// and set ([`crate::LanguageModel::set_memory_budget`]), which a node does right after
    /// warm-up.
    FractionOfFree(f64),
}

impl KvBudget {
    /// The bytes this budget allows on `device` now (`None`: unbounded). Call it once the
    /// model is loaded and warmed up, so that neither is counted as free.
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
                let free = free_memory(device)?;
                Ok(Some((free.bytes as f64 * fraction) as u64))
            }
        }
    }

    /// What a model holds from load, before anything is measured: the fixed bytes, or no
    /// bound (for a fraction: until [`Self::resolve`] measures it after warm-up).
    pub fn without_measuring(self) -> Option<u64> {
        match self {
            Self::Bytes(bytes) => Some(bytes),
            Self::Unbounded | Self::FractionOfFree(_) => None,
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

/// Where a device's free memory was read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MemorySource {
    /// `MemAvailable` of `/proc/meminfo` (the CPU).
    MemInfo,
    /// `cudaMemGetInfo` of the CUDA runtime libtorch loaded ([`specd_cuda_memory`]).
    CudaRuntime,
    /// `nvidia-smi --query-gpu=memory.free`, where the runtime could not be asked.
    NvidiaSmi,
}

impl fmt::Display for MemorySource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::MemInfo => "/proc/meminfo",
            Self::CudaRuntime => "the CUDA runtime",
            Self::NvidiaSmi => "nvidia-smi",
        })
    }
}

/// A device's free memory, where it was read, and why the CUDA runtime was passed over for
/// `nvidia-smi` when it was.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FreeMemory {
    pub bytes: u64,
    pub source: MemorySource,
    pub runtime_failure: Option<String>,
}

/// Bytes free on `device` now, logging where they were read. On CUDA, call it on the thread
/// that runs the model there ([`specd_cuda_memory::device_memory`] says why).
pub fn free_memory(device: DeviceSpec) -> Result<FreeMemory> {
    let free = match device {
        DeviceSpec::Cpu => {
            let path = "/proc/meminfo";
            let text = std::fs::read_to_string(path).map_err(|source| ModelError::Io { path: path.into(), source })?;
            let bytes = mem_available(&text)
                .ok_or_else(|| ModelError::Device(format!("{path} has no MemAvailable line; pass --kv-budget-mib")))?;
            FreeMemory { bytes, source: MemorySource::MemInfo, runtime_failure: None }
        }
        DeviceSpec::Cuda(index) => first_that_answers(
            device,
            || specd_cuda_memory::device_memory(index).map(|m| m.free_bytes).map_err(|e| e.to_string()),
            || nvidia_smi_free_bytes(index),
        )?,
    };
    if let Some(why) = &free.runtime_failure {
        tracing::warn!(%device, "the CUDA runtime gave no free memory ({why}): asking nvidia-smi");
    }
    tracing::info!(%device, free_bytes = free.bytes, source = %free.source, "free memory read");
    Ok(free)
}

/// A CUDA device's free memory from `runtime` (the CUDA runtime), else from `fallback`
/// (`nvidia-smi`), saying which answered; both failing is one error that gives both
/// reasons.
fn first_that_answers(
    device: DeviceSpec,
    runtime: impl FnOnce() -> std::result::Result<u64, String>,
    fallback: impl FnOnce() -> std::result::Result<u64, String>,
) -> Result<FreeMemory> {
    let why = match runtime() {
        Ok(bytes) => return Ok(FreeMemory { bytes, source: MemorySource::CudaRuntime, runtime_failure: None }),
        Err(why) => why,
    };
    match fallback() {
        Ok(bytes) => Ok(FreeMemory { bytes, source: MemorySource::NvidiaSmi, runtime_failure: Some(why) }),
        Err(smi) => Err(ModelError::Device(format!(
            "cannot read {device}'s free memory, neither from {} ({why}) nor from {} ({smi}); pass \
             --kv-budget-mib",
            MemorySource::CudaRuntime,
            MemorySource::NvidiaSmi
        ))),
    }
}

/// `MemAvailable` of a `/proc/meminfo` text, in bytes.
fn mem_available(meminfo: &str) -> Option<u64> {
    let line = meminfo.lines().find(|l| l.starts_with("MemAvailable:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024)
}

/// Free memory of CUDA device `index` (as libtorch numbers it), read from `nvidia-smi`.
/// libtorch's index counts the devices `CUDA_VISIBLE_DEVICES` leaves, and nvidia-smi
/// numbers all of them, so the index is mapped through that list first.
fn nvidia_smi_free_bytes(index: usize) -> std::result::Result<u64, String> {
    let id = match std::env::var("CUDA_VISIBLE_DEVICES") {
        Ok(visible) if !visible.trim().is_empty() => visible
            .split(',')
            .nth(index)
            .map(|s| s.trim().to_owned())
            .ok_or_else(|| format!("cuda:{index} is not in CUDA_VISIBLE_DEVICES={visible}"))?,
        _ => index.to_string(),
    };
    let output = std::process::Command::new("nvidia-smi")
        .args(["--query-gpu=memory.free", "--format=csv,noheader,nounits", &format!("--id={id}")])
        .output()
        .map_err(|e| format!("cannot run it ({e})"))?;
    let text = String::from_utf8_lossy(&output.stdout);
    let mib: u64 =
        text.trim().lines().next().and_then(|l| l.trim().parse().ok()).ok_or_else(|| {
            format!("no free memory for GPU {id} ({})", String::from_utf8_lossy(&output.stderr).trim())
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
        let free = free_memory(DeviceSpec::Cpu).unwrap();
        assert_eq!(free.source, MemorySource::MemInfo);
        assert!(free.bytes > 0);
        let half = KvBudget::FractionOfFree(0.5).resolve(DeviceSpec::Cpu).unwrap().unwrap();
        // MemAvailable moves between the two reads, by far less than a quarter.
        assert!(half > free.bytes / 4 && half < free.bytes * 3 / 4, "half {half} of {free:?}");
        assert_eq!(KvBudget::Bytes(7).resolve(DeviceSpec::Cpu).unwrap(), Some(7));
        assert_eq!(KvBudget::Unbounded.resolve(DeviceSpec::Cpu).unwrap(), None);
        assert!(KvBudget::FractionOfFree(0.0).resolve(DeviceSpec::Cpu).is_err());
        assert!(KvBudget::FractionOfFree(1.5).resolve(DeviceSpec::Cpu).is_err());
    }

    #[test]
    fn what_a_model_holds_before_anything_is_measured() {
        assert_eq!(KvBudget::Bytes(7).without_measuring(), Some(7));
        assert_eq!(KvBudget::Unbounded.without_measuring(), None);
        assert_eq!(KvBudget::FractionOfFree(0.9).without_measuring(), None);
    }

    #[test]
    fn the_cuda_runtime_is_asked_first_and_nvidia_smi_only_when_it_fails() {
        let device = DeviceSpec::Cuda(1);
        let unasked = || -> std::result::Result<u64, String> { panic!("nvidia-smi asked though the runtime answered") };
        let free = first_that_answers(device, || Ok(5), unasked).unwrap();
        assert_eq!(free, FreeMemory { bytes: 5, source: MemorySource::CudaRuntime, runtime_failure: None });
        let free = first_that_answers(device, || Err("no libcudart".into()), || Ok(7)).unwrap();
        assert_eq!(
            free,
            FreeMemory { bytes: 7, source: MemorySource::NvidiaSmi, runtime_failure: Some("no libcudart".into()) }
        );
        let err = first_that_answers(device, || Err("no libcudart".into()), || Err("not found".into()))
            .unwrap_err()
            .to_string();
        for part in ["cuda:1", "from the CUDA runtime (no libcudart)", "from nvidia-smi (not found)", "--kv-budget-mib"]
        {
            assert!(err.contains(part), "{part:?} is not in {err}");
        }
    }

    /// Without a GPU both sources fail, and say so in one error rather than a panic; with
    /// one, the runtime answers.
    #[test]
    fn a_cuda_device_s_free_memory_or_an_error_that_names_both_sources() {
        match free_memory(DeviceSpec::Cuda(0)) {
            Ok(free) => assert!(free.bytes > 0 && free.source == MemorySource::CudaRuntime, "{free:?}"),
            Err(err) => {
                let err = err.to_string();
                eprintln!("cuda:0 (no GPU here): {err}");
                assert!(err.contains("from the CUDA runtime (") && err.contains("from nvidia-smi ("), "{err}");
            }
        }
    }
}
