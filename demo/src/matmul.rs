//! Which number format the demo's training runs its matrix products in.
//!
//! bf16 pays wherever the CPU has bf16 instructions: with AMX (`amx_bf16`) its matmuls run
//! on the matrix units, and with only `avx512_bf16` (an AMD EPYC host, 2
//! vCPUs, 2026-12-01) one step of the demo target took 21–23 s in bf16 against 40–71 s in f32,
//! and one of the draft 9.3 s against 16–18 s, alternated on the same busy host
//! (BENCHMARKS.md). Without bf16 instructions libtorch
//! emulates bf16 arithmetic, slower than f32. So the build reads the CPU's features: bf16
//! with bf16 instructions, f32 without. The kind is part of every stage's cache key: builds
//! are deterministic per seed and host class, not across host classes.

use serde::{Deserialize, Serialize};
use specd_model::DeviceSpec;
use tch::Kind;

/// The number format of the training's matrix products (the weights stay f32).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum MatmulKind {
    Bf16,
    F32,
}

impl MatmulKind {
    /// The rule: bf16 where the CPU has bf16 instructions, f32 where it would emulate them.
    pub fn for_cpu(has_bf16_instructions: bool) -> Self {
        if has_bf16_instructions { Self::Bf16 } else { Self::F32 }
    }

    /// What the CPU this process runs on should use.
    pub fn for_this_cpu() -> Self {
        Self::for_cpu(specd_model::cpu_features::has_bf16_instructions())
    }

    /// What a build training on `device` should use: on the CPU the rule above; on a GPU
    /// bf16, which its tensor cores run natively.
    pub fn for_device(device: DeviceSpec) -> Self {
        match device {
            DeviceSpec::Cpu => Self::for_this_cpu(),
            DeviceSpec::Cuda(_) => Self::Bf16,
        }
    }

    pub fn kind(self) -> Kind {
        match self {
            Self::Bf16 => Kind::BFloat16,
            Self::F32 => Kind::Float,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Self::Bf16 => "bf16",
            Self::F32 => "f32",
        }
    }
}

impl std::str::FromStr for MatmulKind {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "bf16" => Ok(Self::Bf16),
            "f32" => Ok(Self::F32),
            other => Err(format!("unknown matmul kind {other:?} (bf16 or f32)")),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use specd_model::cpu_features::cpuinfo_has_bf16_instructions;

    // /proc/cpuinfo flags lines of the host classes this project meets, trimmed to the ones that
    // matter and neighbours that share their prefixes.
    const AMX_HOST: &str = "flags\t: fpu sse2 avx2 avx512f avx512_bf16 avx512_fp16 amx_bf16 amx_tile amx_int8\n";
    const AVX512_BF16_HOST: &str = "flags\t: fpu sse2 avx2 avx512f avx512_bf16 avx512_vnni avx_vnni\n";
    const AVX2_HOST: &str = "flags\t: fpu sse2 avx2 fma avx512f\n";

    #[test]
    fn bf16_with_bf16_instructions_f32_without() {
        assert_eq!(MatmulKind::for_cpu(cpuinfo_has_bf16_instructions(AMX_HOST)), MatmulKind::Bf16);
        assert_eq!(MatmulKind::for_cpu(cpuinfo_has_bf16_instructions(AVX512_BF16_HOST)), MatmulKind::Bf16);
        assert_eq!(MatmulKind::for_cpu(cpuinfo_has_bf16_instructions(AVX2_HOST)), MatmulKind::F32);
        assert_eq!(MatmulKind::for_cpu(cpuinfo_has_bf16_instructions("")), MatmulKind::F32);
    }

    #[test]
    fn names_round_trip() {
        for kind in [MatmulKind::Bf16, MatmulKind::F32] {
            assert_eq!(kind.name().parse::<MatmulKind>(), Ok(kind));
        }
        assert!("f16".parse::<MatmulKind>().is_err());
    }
}
