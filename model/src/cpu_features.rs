//! What the host CPU can do, read from `/proc/cpuinfo`, for choices that depend on it (the
//! default dtype of a CPU model).

use std::sync::OnceLock;

/// Whether the CPU has bfloat16 matrix units (x86 AMX: the `amx_bf16` flag), on which bf16
/// matmuls outrun f32 ones. Without them (AVX-512 BF16 alone converts and dots vectors)
/// libtorch's bf16 matmuls are slower than its f32 ones. Read once; `false` where
/// `/proc/cpuinfo` cannot be read or has no x86 flags.
pub fn has_bf16_matrix_units() -> bool {
    static HAS: OnceLock<bool> = OnceLock::new();
    *HAS.get_or_init(|| std::fs::read_to_string("/proc/cpuinfo").is_ok_and(|info| cpuinfo_has_bf16_matrix_units(&info)))
}

/// [`has_bf16_matrix_units`] of a `/proc/cpuinfo` text: whether its first `flags` line
/// lists `amx_bf16`.
pub fn cpuinfo_has_bf16_matrix_units(cpuinfo: &str) -> bool {
    cpuinfo
        .lines()
        .find_map(|line| {
            let (key, value) = line.split_once(':')?;
            (key.trim() == "flags").then_some(value)
        })
        .is_some_and(|flags| flags.split_whitespace().any(|flag| flag == "amx_bf16"))
}

#[cfg(test)]
mod tests {
    use super::*;

    const AVX512_BF16_ONLY: &str = "processor\t: 0\nvendor_id\t: GenuineIntel\nflags\t\t: fpu sse2 avx2 avx512f avx512_bf16 avx512_vnni\nbugs\t\t: spectre_v1\n";
    const SAPPHIRE_RAPIDS: &str = "processor\t: 0\nflags\t\t: fpu avx512f avx512_bf16 amx_bf16 amx_tile amx_int8\n";

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
    fn this_host_is_read_like_its_cpuinfo() {
        let info = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
        assert_eq!(has_bf16_matrix_units(), cpuinfo_has_bf16_matrix_units(&info));
    }
}
