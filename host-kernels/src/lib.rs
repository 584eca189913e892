//! specd-host-kernels: the arithmetic of the host engine, fast on whatever CPU runs it.
//!
//! A draft on a CPU node decodes one token, or scores a few, per pass: each linear layer is a
//! matrix–vector product over weights that stream from memory, so the pass is bounded by
//! how many bytes of weights it reads and how many vector lanes and cores read them.
//!
//! - [`isa`]: the instruction sets a kernel is compiled for (AVX-512, AVX2 with FMA, or the
//!   build's baseline) and the one this CPU runs, read at run time. It is the only module
//!   with `unsafe` besides `pool` and `bf16_pairs`: calling a function compiled for a
//!   feature after checking the feature, and the cache prefetch hint the loops give ahead of
//!   their weights.
//! - [`packed`]: [`PackedMatrix`], a linear layer's weight cut into panels of [`BLOCK`]
//!   outputs, stored as `f32` or as `bf16` (half the bytes; exact for a bf16 checkpoint), or
//!   as bf16 input pairs multiplied with bf16-rounded inputs (twice the products an
//!   instruction where the CPU has bf16 instructions).
//! - `loops` (private): the loops themselves, written once and compiled per instruction set.
//! - `bf16_pairs` (private): the linear loop over pair panels, with `vdpbf16ps` where the
//!   CPU has it; its `unsafe` loads and stores the vectors the intrinsics take.
//! - `exponentials` (private): `eˣ` as a polynomial that vectorises, and the softmax and
//!   gated activations built on it.
//! - `error`: [`KernelError`].
//! - `pool` (private): `HotPool`, the threads a pass's parallel steps run on with the
//!   calling thread, spinning between steps rather than sleeping; its one `unsafe` lets
//!   them call a closure borrowed from the caller's stack.
//! - [`kernels`]: [`Kernels`], an instruction set and a pool, with the operations a pass
//!   calls.

mod bf16_pairs;
mod error;
mod exponentials;
pub mod isa;
pub mod kernels;
mod loops;
pub mod packed;
mod pool;

pub use error::KernelError;
pub use isa::Isa;
pub use kernels::{Kernels, LinearScratch};
pub use packed::{BLOCK, PackedMatrix, WeightFormat, bf16_exact, bf16_value, from_bf16, to_bf16};
