//! The flags only a draft node has: how its model runs where one process starts both nodes,
//! and what it proposes with.

use std::path::PathBuf;

use clap::Args;
use specd_draft_node::proposer::{MatchSpan, ProposerConfig, ProposerKind};
use specd_model::{DType, DeviceSpec, Engine};
use specd_node::NodeConfig;

use super::draft_placement::{DraftPlacement, DraftSize, PlacementFlags, place_draft};
use super::flag_values::{parse_device, parse_dtype, parse_engine};
use crate::cli_error::invalid;

/// How the draft model runs where one process starts both nodes (`specd up`, `specd bench
/// --embedded` and `--netns`); the other node flags apply to both.
#[derive(Debug, Clone, Args)]
pub struct DraftOptions {
    /// Where the draft model runs: cpu or cuda:N. Default: beside a CUDA target (--device
    /// cuda:N) a small draft runs on the CPU, on the host engine unless --draft-engine says
    /// otherwise, and leaves the GPU to the target (small: a checkpoint of a family the host
    /// engine runs, of at most 4 M parameters, or a table model); a larger draft runs on the target's device, and so does every
    /// draft beside a CPU target.
    #[arg(long, env = "SPECD_DRAFT_DEVICE", value_parser = parse_device)]
    pub(crate) draft_device: Option<DeviceSpec>,
    /// Threads of the draft model. Default: the target's (--threads, one per core), since a
    /// round drafts and then verifies and the two models take turns on the same cores; 1 for
    /// a draft on libtorch (--draft-engine libtorch), whose operations are too short to split.
    #[arg(long, env = "SPECD_DRAFT_THREADS")]
    pub(crate) draft_threads: Option<usize>,
    /// dtype of the draft model. Default: --dtype where the draft runs on the target's
    /// device, auto where it runs on another (--dtype is then the target's). A draft's auto
    /// on a CPU with AVX-512 BF16 is bf16 unless it runs on libtorch (see --dtype).
    #[arg(long, env = "SPECD_DRAFT_DTYPE", value_parser = parse_dtype)]
    pub(crate) draft_dtype: Option<DType>,
    /// What computes the draft's passes; see --engine. Default: host for a small draft
    /// --draft-device's default puts on the CPU, --engine where the draft runs on the
    /// target's device, auto where it runs on another.
    #[arg(long, env = "SPECD_DRAFT_ENGINE", value_parser = parse_engine)]
    pub(crate) draft_engine: Option<Engine>,
}

/// The draft node's own settings where one process starts both nodes, resolved: where and
/// how its model runs, and its threads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct DraftSettings {
    pub(crate) placement: DraftPlacement,
    /// `None`: the node's default, one per core.
    pub(crate) threads: Option<usize>,
}

impl DraftOptions {
    /// The draft's settings beside the shared node configuration `shared` (the target's
    /// device, dtype and engine, and the draft model's path, read only when the placement
    /// depends on its size).
    pub(crate) fn settings(&self, shared: &NodeConfig) -> DraftSettings {
        let flags = PlacementFlags {
            device: shared.device,
            dtype: shared.dtype,
            engine: shared.engine,
            draft_device: self.draft_device,
            draft_dtype: self.draft_dtype,
            draft_engine: self.draft_engine,
        };
        let size = || DraftSize::of(&shared.model, self.draft_dtype.unwrap_or(DType::Auto));
        let placement = place_draft(flags, size);
        DraftSettings { placement, threads: draft_threads(self.draft_threads, placement.engine, shared.threads) }
    }

    /// The draft node's configuration: the shared node options with the draft's own.
    pub(crate) fn apply(&self, mut config: NodeConfig) -> NodeConfig {
        let DraftSettings { placement, threads } = self.settings(&config);
        config.threads = threads;
        config.device = placement.device;
        config.dtype = placement.dtype;
        config.engine = placement.engine;
        config
    }
}

/// What a draft node proposes with (`specd draft`, `specd up`, `specd bench`).
#[derive(Debug, Clone, Args)]
pub struct ProposerOptions {
    /// model (the draft model samples), ngram (prompt lookup: copies what followed the
    /// longest match of the last tokens in the prompt and output; no model), suffix (the
    /// most frequent continuation over recent sessions and this one; no model), or
    /// model+ngram (a match proposes; the model where there is none).
    #[arg(long, env = "SPECD_PROPOSER", default_value = "model", value_parser = parse_proposer)]
    pub(crate) proposer: ProposerKind,
    /// Shortest n-gram match that proposes (ngram, suffix, model+ngram).
    #[arg(long, env = "SPECD_NGRAM_MIN", default_value_t = 2)]
    pub(crate) ngram_min: usize,
    /// Longest n-gram match tried first (at most 32).
    #[arg(long, env = "SPECD_NGRAM_MAX", default_value_t = 4)]
    pub(crate) ngram_max: usize,
    /// Tokens of finished sessions the suffix proposer's index holds. Its memory: up to
    /// this × ngram-max contexts of up to ngram-max tokens each (at most about 580 bytes a
    /// token at the default ngram-max 4, so 145 MiB at the default budget). Sessions with
    /// the request's seed are left out of its proposals.
    #[arg(long, env = "SPECD_SUFFIX_BUDGET_TOKENS", default_value_t = 1 << 18)]
    pub(crate) suffix_budget_tokens: usize,
}

fn parse_proposer(s: &str) -> Result<ProposerKind, String> {
    s.parse()
}

impl ProposerOptions {
    pub(crate) fn config(&self) -> anyhow::Result<ProposerConfig> {
        let span =
            MatchSpan::new(self.ngram_min, self.ngram_max).map_err(|e| invalid(format!("--ngram-min/max: {e}")))?;
        if self.suffix_budget_tokens == 0 {
            return Err(invalid("--suffix-budget-tokens must be at least 1"));
        }
        Ok(ProposerConfig { kind: self.proposer, span, suffix_budget_tokens: self.suffix_budget_tokens })
    }
}

/// The draft model a proposer needs: required for `model` and `model+ngram`, not read
/// otherwise (an empty path stands for none).
pub(super) fn draft_model_path(flag: &str, model: Option<&PathBuf>, proposer: ProposerKind) -> anyhow::Result<PathBuf> {
    match model {
        // A model that would never be loaded is a mistake worth saying, not ignoring.
        Some(path) if !proposer.needs_model() => Err(invalid(format!(
            "--proposer {proposer} drafts without a model, so {flag} {} would be ignored: remove it, or use \
             --proposer model+ngram to draft with both",
            path.display()
        ))),
        Some(path) => Ok(path.clone()),
        None if proposer.needs_model() => Err(invalid(format!("{flag} is required with --proposer {proposer}"))),
        None => Ok(PathBuf::new()),
    }
}

/// The draft model's threads: `flag` (--draft-threads) if given, else 1 on libtorch and the
/// target's `target_threads` otherwise (`None`: the node's default, one per core).
fn draft_threads(flag: Option<usize>, engine: Engine, target_threads: Option<usize>) -> Option<usize> {
    flag.or(match engine {
        Engine::Libtorch => Some(1),
        Engine::Host | Engine::Auto => target_threads,
    })
}

#[cfg(test)]
mod tests {
    use specd_model::Engine;

    #[test]
    fn the_draft_takes_the_targets_threads_unless_on_libtorch_or_told() {
        use super::draft_threads;
        assert_eq!(draft_threads(None, Engine::Host, None), None);
        assert_eq!(draft_threads(None, Engine::Auto, Some(3)), Some(3));
        assert_eq!(draft_threads(None, Engine::Libtorch, Some(3)), Some(1));
        assert_eq!(draft_threads(Some(2), Engine::Libtorch, None), Some(2));
        assert_eq!(draft_threads(Some(1), Engine::Host, Some(4)), Some(1));
    }

    #[test]
    fn a_draft_model_a_model_less_proposer_would_ignore_is_refused() {
        use specd_draft_node::proposer::ProposerKind;
        let model = std::path::PathBuf::from("m");
        let err = super::draft_model_path("--model", Some(&model), ProposerKind::Ngram).unwrap_err().to_string();
        assert!(err.contains("--proposer ngram drafts without a model") && err.contains("--model m"), "{err}");
        assert_eq!(super::draft_model_path("--model", Some(&model), ProposerKind::ModelNgram).unwrap(), model);
        assert!(super::draft_model_path("--model", None, ProposerKind::Model).is_err());
        assert_eq!(super::draft_model_path("--model", None, ProposerKind::Suffix).unwrap(), std::path::PathBuf::new());
    }
}
