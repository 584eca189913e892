//! What a query returns.

/// A CUDA device's memory as the runtime reports it (`cudaMemGetInfo`). Free memory is the
/// device's, for every process: what other processes and libtorch's caching allocator hold
/// (freed tensors it keeps for reuse included) is not free.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DeviceMemory {
    pub free_bytes: u64,
    pub total_bytes: u64,
}
