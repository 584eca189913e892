//! Which engine computes a checkpoint's passes: what `--engine auto` resolves to.
//!
//! libtorch runs every family on a CPU or a GPU, and its matmuls win as soon as a model is
//! large enough to fill them. The host engine ([`crate::host`]) runs the plain Llama family
//! in `f32` on one CPU thread without libtorch's cost per operation, which is most of a
//! tiny draft's step. `auto` picks the host engine for a CPU model of at most
//! [`HOST_ENGINE_MAX_PARAMETERS`] that it can run, loaded with `--dtype f32` or `auto`,
//! libtorch otherwise. (`auto` on a CPU with AMX means bf16 on libtorch; a small draft's
//! steps measured faster in f32 than in bf16 there, as they are per-operation overhead.)

use crate::config::LlamaConfig;
use crate::engine::Engine;
use crate::error::{ModelError, Result};
use crate::host::host_refuses;
use crate::options::LoadOptions;

/// The largest model `--engine auto` runs on the host engine: past it libtorch's matmuls
/// win, on blocks first (the figures are in BENCHMARKS.md, "Where `auto` stops").
pub const HOST_ENGINE_MAX_PARAMETERS: u64 = 4_000_000;

// The choice lives apart from the names: the engines name themselves with `Engine` and
// `LoadOptions` carries one, while the choice asks the host engine what it refuses.
impl Engine {
    /// The engine `auto` resolves to for `cfg` loaded with `opts`; a concrete choice stays,
    /// and `host` for a model it cannot run is an error that says why.
    pub fn resolve(self, cfg: &LlamaConfig, opts: &LoadOptions) -> Result<Self> {
        let refusal = host_refuses(cfg, opts);
        match self {
            Self::Libtorch => Ok(Self::Libtorch),
            Self::Host => match refusal {
                None => Ok(Self::Host),
                Some(why) => Err(ModelError::InvalidInput(format!("--engine host: {why}; use --engine libtorch"))),
            },
            Self::Auto if refusal.is_none() && cfg.num_parameters() <= HOST_ENGINE_MAX_PARAMETERS => Ok(Self::Host),
            Self::Auto => Ok(Self::Libtorch),
        }
    }
}
