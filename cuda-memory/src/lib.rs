//! `specd-cuda-memory`: how much memory a CUDA device has free, asked of the CUDA runtime
//! itself (`cudaMemGetInfo`), for the KV budget of a node whose model is on a GPU.
//!
//! tch exposes no memory query, and `nvidia-smi`, the other way to ask, is missing from many
//! images. A CUDA build of libtorch links the CUDA runtime (`libcudart.so.13` for the pip
//! torch 2.11 cu130 wheel), so a process that runs a model on a GPU has it loaded already;
//! [`CudaRuntime::open`] takes that library (device numbers, `CUDA_VISIBLE_DEVICES` and
//! contexts are then libtorch's) before it looks for one on the loader's path.
//!
//! This is the one crate of the workspace that may use `unsafe`: calling a C function
//! through a pointer found at run time is something the compiler cannot check. The
//! workspace forbids it everywhere else; here the lints deny it in every file but
//! `runtime`, whose blocks each say why their call is sound.
//!
//! - `runtime`: the library opened and the calls made to it ([`CudaRuntime`]);
//! - `memory`: what a query returns ([`DeviceMemory`]);
//! - `error`: the crate's one error type ([`CudaMemoryError`]).

mod error;
mod memory;
mod runtime;

use std::sync::OnceLock;

pub use error::CudaMemoryError;
pub use memory::DeviceMemory;
pub use runtime::{CudaRuntime, SONAMES};

/// Free and total bytes of CUDA device `index`, numbered as libtorch numbers devices (among
/// those `CUDA_VISIBLE_DEVICES` leaves), from the process's CUDA runtime (opened once).
///
/// The runtime answers for the calling thread's current device, so `index` is made current
/// for the query and the thread's own device current again after it (`cudaGetDevice`,
/// `cudaSetDevice`): a model thread's device is left as libtorch left it. Making a device
/// current creates its context where the process has none yet (hundreds of MiB of device
/// memory), so call this where the device is in use already: a node calls it on its model's
/// thread, once the model is loaded and warmed up there.
pub fn device_memory(index: usize) -> Result<DeviceMemory, CudaMemoryError> {
    static RUNTIME: OnceLock<Result<CudaRuntime, CudaMemoryError>> = OnceLock::new();
    RUNTIME.get_or_init(CudaRuntime::open).as_ref().map_err(Clone::clone)?.device_memory(index)
}
