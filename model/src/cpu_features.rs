//! What the CPU can do fast, read from its feature flags (Linux `/proc/cpuinfo`).
//!
//! bf16 matrix products pay on a CPU only with matrix units for them (Intel AMX: `amx_bf16`);
//! `avx512_bf16` alone converts and dots pairs, and a bf16 matmul then runs no faster than f32.

/// Whether the `flags` line of a CPU names bf16 matrix units.
pub fn flags_have_bf16_matrix_units(flags: &str) -> bool {
    flags.split_whitespace().any(|flag| flag == "amx_bf16")
}

/// Whether this machine's CPU has bf16 matrix units; false where it cannot be read.
pub fn has_bf16_matrix_units() -> bool {
    let Ok(cpuinfo) = std::fs::read_to_string("/proc/cpuinfo") else { return false };
    cpuinfo
        .lines()
        .find(|line| line.starts_with("flags"))
        .and_then(|line| line.split_once(':'))
        .is_some_and(|(_, flags)| flags_have_bf16_matrix_units(flags))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_amx_bf16_flag_counts() {
        assert!(flags_have_bf16_matrix_units("avx512_bf16 amx_bf16 amx_tile"));
        assert!(!flags_have_bf16_matrix_units("avx512_bf16 amx_tile amx_int8"));
        assert!(!flags_have_bf16_matrix_units("avx512_bf16x"));
    }
}
