//! What the CPU can do fast with bfloat16, read from its feature flags (Linux `/proc/cpuinfo`).
//!
//! Two levels matter:
//! - bf16 **instructions** (`avx512_bf16`, or AMX's `amx_bf16`): the CPU converts and dots bf16
//!   pairs in hardware. Without them libtorch emulates bf16 arithmetic, which is slower than
//!   f32.
//! - bf16 **matrix units** (Intel AMX, `amx_bf16`): a pass over a few tokens costs about what
//!   one token costs, and bf16 serving keeps up with f32 one token at a time.

/// Whether a CPU `flags` line names bf16 matrix units (AMX).
pub fn flags_have_bf16_matrix_units(flags: &str) -> bool {
    flags.split_whitespace().any(|flag| flag == "amx_bf16")
}

/// Whether a CPU `flags` line names bf16 dot-product instructions (AVX-512 BF16 or AMX).
pub fn flags_have_bf16_instructions(flags: &str) -> bool {
    flags.split_whitespace().any(|flag| flag == "avx512_bf16" || flag == "amx_bf16")
}

/// This machine's CPU flags; empty where they cannot be read.
pub fn cpu_flags() -> String {
    std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|info| {
            info.lines()
                .find(|line| line.starts_with("flags"))
                .and_then(|line| line.split_once(':'))
                .map(|(_, flags)| flags.to_owned())
        })
        .unwrap_or_default()
}

/// Whether this machine's CPU has bf16 matrix units (AMX).
pub fn has_bf16_matrix_units() -> bool {
    flags_have_bf16_matrix_units(&cpu_flags())
}

/// Whether this machine's CPU has bf16 instructions (AVX-512 BF16 or AMX).
pub fn has_bf16_instructions() -> bool {
    flags_have_bf16_instructions(&cpu_flags())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_level_reads_its_own_flags() {
        let sapphire_rapids = "avx2 avx512f avx512_bf16 amx_bf16 amx_tile amx_int8";
        let zen4 = "avx2 avx512f avx512_bf16 avx_vnni";
        let zen3 = "avx2 fma";
        assert!(flags_have_bf16_matrix_units(sapphire_rapids) && flags_have_bf16_instructions(sapphire_rapids));
        assert!(!flags_have_bf16_matrix_units(zen4) && flags_have_bf16_instructions(zen4));
        assert!(!flags_have_bf16_matrix_units(zen3) && !flags_have_bf16_instructions(zen3));
        assert!(!flags_have_bf16_instructions("avx512_bf16x amx_tile"));
    }
}
