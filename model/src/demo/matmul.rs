//! Which number format the demo's training runs its matrix products in.
//!
//! bfloat16 matmuls are fast only where the CPU multiplies bf16 tiles in hardware (Intel AMX,
//! `amx_bf16`). With only `avx512_bf16`, a 2048×640×1728 bf16 matmul ran no faster than f32
//! (issue #28), and the demo target then trained for 43 minutes instead of about 10, with the
//! conversions on top. So the build reads the CPU's features and trains in bf16 only on AMX.
//! The kind is part of every stage's cache key: builds are deterministic per seed and host
//! class, not across host classes.

use serde::{Deserialize, Serialize};
use tch::Kind;

/// The number format of the training's matrix products (the weights stay f32).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum MatmulKind {
    Bf16,
    F32,
}

impl MatmulKind {
    /// The rule: bf16 where the CPU has bf16 matrix units, f32 everywhere else.
    pub fn for_cpu(has_bf16_matrix_units: bool) -> Self {
        if has_bf16_matrix_units { Self::Bf16 } else { Self::F32 }
    }

    /// What the CPU this process runs on should use.
    pub fn for_this_cpu() -> Self {
        Self::for_cpu(crate::cpu_features::has_bf16_matrix_units())
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
    use crate::cpu_features::flags_have_bf16_matrix_units;

    // /proc/cpuinfo flag lines of the two host classes this project is built on (trimmed to
    // the flags that matter plus neighbours that share prefixes).
    const SAPPHIRE_RAPIDS: &str = "fpu sse2 avx2 avx512f avx512_bf16 avx512_fp16 amx_bf16 amx_tile amx_int8";
    const COOPER_LAKE_LIKE: &str = "fpu sse2 avx2 avx512f avx512_bf16 avx512_vnni";

    #[test]
    fn bf16_only_with_matrix_units() {
        assert_eq!(MatmulKind::for_cpu(flags_have_bf16_matrix_units(SAPPHIRE_RAPIDS)), MatmulKind::Bf16);
        assert_eq!(MatmulKind::for_cpu(flags_have_bf16_matrix_units(COOPER_LAKE_LIKE)), MatmulKind::F32);
        assert_eq!(MatmulKind::for_cpu(flags_have_bf16_matrix_units("")), MatmulKind::F32);
    }

    #[test]
    fn names_round_trip() {
        for kind in [MatmulKind::Bf16, MatmulKind::F32] {
            assert_eq!(kind.name().parse::<MatmulKind>(), Ok(kind));
        }
        assert!("f16".parse::<MatmulKind>().is_err());
    }
}
