//! What the host CPU can do with bfloat16, read from `/proc/cpuinfo`, for the choices that
//! depend on it (the default dtype of a CPU model, the demo's training matmuls).
//!
//! Two levels matter:
//! - bf16 **instructions** (`avx512_bf16`, or AMX's `amx_bf16`): the CPU converts and dots bf16
//!   pairs in hardware. Without them libtorch emulates bf16 arithmetic, slower than f32.
//! - bf16 **matrix units** (x86 AMX, `amx_bf16`): bf16 matmuls outrun f32 ones by far, and a
//!   pass over a few tokens costs about what one token costs.

use std::sync::OnceLock;

fn cpuinfo() -> &'static str {
    static INFO: OnceLock<String> = OnceLock::new();
    INFO.get_or_init(|| std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default())
}

/// The first `flags` line of a `/proc/cpuinfo` text, split into flags.
fn flags(cpuinfo: &str) -> impl Iterator<Item = &str> {
    cpuinfo
        .lines()
        .find_map(|line| {
            let (key, value) = line.split_once(':')?;
            (key.trim() == "flags").then_some(value)
        })
        .unwrap_or("")
        .split_whitespace()
}

/// The CPU's `model name` in `/proc/cpuinfo` (as in "AMD EPYC 7B13"), for records of where a
/// figure was measured; `None` where there is none.
pub fn cpu_model_name() -> Option<String> {
    cpuinfo().lines().find_map(|line| {
        let (key, value) = line.split_once(':')?;
        (key.trim() == "model name").then(|| value.trim().to_owned())
    })
}

/// Whether the CPU has bfloat16 matrix units (x86 AMX: the `amx_bf16` flag), on which bf16
/// matmuls outrun f32 ones. Without them (AVX-512 BF16 alone converts and dots vectors)
/// libtorch's bf16 serving passes are slower than its f32 ones. `false` where
/// `/proc/cpuinfo` cannot be read or has no x86 flags.
pub fn has_bf16_matrix_units() -> bool {
    cpuinfo_has_bf16_matrix_units(cpuinfo())
}

/// [`has_bf16_matrix_units`] of a `/proc/cpuinfo` text: whether its first `flags` line
/// lists `amx_bf16`.
pub fn cpuinfo_has_bf16_matrix_units(cpuinfo: &str) -> bool {
    flags(cpuinfo).any(|flag| flag == "amx_bf16")
}

/// Whether the host engine multiplies bf16 pairs in one instruction on this CPU (AVX-512
/// BF16, read from the CPU itself as the host engine's kernels read it): there it stores bf16
/// weights as pairs and rounds each linear layer's inputs to bf16, and a bf16 pass takes about
/// half the products' time of an f32 one.
pub fn host_multiplies_bf16_pairs() -> bool {
    specd_host_kernels::Isa::detect().multiplies_bf16_pairs()
}

/// Whether the CPU has bfloat16 instructions (AVX-512 BF16 or AMX), without which libtorch
/// emulates bf16 arithmetic.
pub fn has_bf16_instructions() -> bool {
    cpuinfo_has_bf16_instructions(cpuinfo())
}

/// [`has_bf16_instructions`] of a `/proc/cpuinfo` text.
pub fn cpuinfo_has_bf16_instructions(cpuinfo: &str) -> bool {
    flags(cpuinfo).any(|flag| flag == "avx512_bf16" || flag == "amx_bf16")
}

#[cfg(test)]
mod tests {
    use super::*;

    const AVX512_BF16_ONLY: &str = "processor\t: 0\nvendor_id\t: GenuineIntel\nflags\t\t: fpu sse2 avx2 avx512f avx512_bf16 avx512_vnni\nbugs\t\t: spectre_v1\n";
    const SAPPHIRE_RAPIDS: &str = "processor\t: 0\nflags\t\t: fpu avx512f avx512_bf16 amx_bf16 amx_tile amx_int8\n";
    const ZEN3: &str = "processor\t: 0\nflags\t\t: fpu sse2 avx2 fma\n";

    #[test]
    fn amx_bf16_is_a_matrix_unit_and_avx512_bf16_is_not() {
        assert!(!cpuinfo_has_bf16_matrix_units(AVX512_BF16_ONLY));
        assert!(cpuinfo_has_bf16_matrix_units(SAPPHIRE_RAPIDS));
        // Only whole flags count, and only on the flags line.
        assert!(!cpuinfo_has_bf16_matrix_units("flags\t: amx_bf16x amx_tile\nbugs\t: amx_bf16\n"));
        assert!(!cpuinfo_has_bf16_matrix_units("Features\t: fp asimd bf16 i8mm\n"));
        assert!(!cpuinfo_has_bf16_matrix_units(""));
    }

    #[test]
    fn bf16_instructions_come_with_avx512_bf16_or_amx() {
        assert!(cpuinfo_has_bf16_instructions(AVX512_BF16_ONLY));
        assert!(cpuinfo_has_bf16_instructions(SAPPHIRE_RAPIDS));
        assert!(!cpuinfo_has_bf16_instructions(ZEN3));
        assert!(!cpuinfo_has_bf16_instructions("flags\t: avx512_bf16x\nbugs\t: avx512_bf16\n"));
    }

    #[test]
    fn this_host_is_read_like_its_cpuinfo() {
        let info = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
        assert_eq!(has_bf16_matrix_units(), cpuinfo_has_bf16_matrix_units(&info));
        assert_eq!(has_bf16_instructions(), cpuinfo_has_bf16_instructions(&info));
    }
}
