//! Which engine computes a checkpoint's passes: what `--engine auto` resolves to.
//!
//! libtorch runs every family on a CPU or a GPU. The host engine ([`crate::host`]) runs the
//! Llama family on the CPU without libtorch's cost per operation. Which is faster on a CPU
//! depends on the model's size and dtype, the CPU's vector and matrix units (libtorch's
//! bf16 matmuls use AMX where there is one) and the threads, so `auto` does not guess: where
//! both engines can run the model, [`crate::load_model`] loads each in turn, times the
//! same short run of passes on each ([`time_passes`]: the shapes a node's rounds run), and
//! keeps the faster ([`PassTimes::faster`]). Elsewhere `auto` is libtorch.

use std::time::{Duration, Instant};

use crate::config::LlamaConfig;
use crate::device::DeviceSpec;
use crate::engine::Engine;
use crate::error::{ModelError, Result};
use crate::host::host_refuses;
use crate::language_model::LanguageModel;
use crate::options::LoadOptions;

/// What loading a checkpoint with an `--engine` does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EngineDecision {
    /// Load on this engine.
    Use(Engine),
    /// Both engines can run it here: time each and keep the faster.
    Measure,
}

// The choice lives apart from the names: the engines name themselves with `Engine` and
// `LoadOptions` carries one, while the choice asks the host engine what it refuses.
impl Engine {
    /// What loading `cfg` with `opts` on this engine does: a concrete choice stays, and
    /// `host` for a model it cannot run is an error that says why; `auto` measures where
    /// the host engine can run the model and is libtorch elsewhere.
    pub fn decide(self, cfg: &LlamaConfig, opts: &LoadOptions) -> Result<EngineDecision> {
        let refusal = host_refuses(cfg, opts);
        match self {
            Self::Libtorch => Ok(EngineDecision::Use(Self::Libtorch)),
            Self::Host => match refusal {
                None => Ok(EngineDecision::Use(Self::Host)),
                Some(why) => Err(ModelError::InvalidInput(format!("--engine host: {why}; use --engine libtorch"))),
            },
            Self::Auto if refusal.is_none() && opts.device == DeviceSpec::Cpu => Ok(EngineDecision::Measure),
            Self::Auto => Ok(EngineDecision::Use(Self::Libtorch)),
        }
    }
}

/// Why the host engine cannot run a model, if it cannot (for rules that place a model, such
/// as where `specd up` puts a draft).
pub use crate::host::host_refuses as host_engine_refuses;

/// The same run of passes timed on each engine.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PassTimes {
    pub host: Duration,
    pub libtorch: Duration,
}

impl PassTimes {
    /// The engine that ran the passes sooner (the host engine on a tie: it needs no
    /// libtorch threads).
    pub fn faster(&self) -> Engine {
        if self.host <= self.libtorch { Engine::Host } else { Engine::Libtorch }
    }
}

/// Tokens of the prompt the timed passes follow.
const PROMPT: usize = 16;
/// Tokens of the block: a verify pass of γ = 4.
const BLOCK: usize = 5;
/// Timed repetitions; the median counts.
const REPEATS: usize = 5;

/// The median time of one decode step and one block of [`BLOCK`] tokens after a short
/// prompt, each rolled back after it runs, once the first of them has warmed the model up:
/// what a draft's and a target's rounds cost, in one figure.
pub fn time_passes(model: &mut dyn LanguageModel) -> Result<Duration> {
    let vocab = model.info().vocab_size as u32;
    let tokens: Vec<u32> = (0..(PROMPT + BLOCK) as u32).map(|i| (i * 7919 + 3) % vocab.max(1)).collect();
    let session = model.open_session(Some(PROMPT + BLOCK))?;
    let timed = (|| {
        model.forward_last(session, &tokens[..PROMPT], 1)?;
        let mut once = || -> Result<Duration> {
            let start = Instant::now();
            model.forward_last(session, &tokens[PROMPT..PROMPT + 1], 1)?;
            model.truncate(session, PROMPT)?;
            model.forward_last(session, &tokens[PROMPT..], BLOCK)?;
            model.truncate(session, PROMPT)?;
            Ok(start.elapsed())
        };
        once()?;
        let mut times = (0..REPEATS).map(|_| once()).collect::<Result<Vec<_>>>()?;
        times.sort();
        Ok(times[REPEATS / 2])
    })();
    model.release(session)?;
    timed
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_faster_engine_is_kept_and_a_tie_goes_to_the_host_engine() {
        let ms = Duration::from_millis;
        assert_eq!(PassTimes { host: ms(2), libtorch: ms(3) }.faster(), Engine::Host);
        assert_eq!(PassTimes { host: ms(3), libtorch: ms(2) }.faster(), Engine::Libtorch);
        assert_eq!(PassTimes { host: ms(2), libtorch: ms(2) }.faster(), Engine::Host);
    }
}
