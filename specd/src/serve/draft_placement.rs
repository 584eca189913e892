//! Where the draft model runs when one process starts both nodes (`specd up`, `specd bench
//! --embedded` and `--netns`). Beside a CUDA target a small draft belongs on the CPU's host
//! engine: on the GPU its pass would be launch-bound, a few hundred launches that each cost
//! more than the work in them, and it would share the GPU with the target; on the CPU it
//! costs a fraction of that and the GPU is the target's alone, which is the split between
//! two machines this project is about, on one box. A larger draft stays with the target.

use std::path::Path;

use specd_model::engine_choice::host_engine_refuses;
use specd_model::{DType, DeviceSpec, Engine, LlamaConfig, LoadOptions};

/// What the rule knows of the draft model.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum DraftSize {
    /// A model the host engine runs, of at most [`CPU_DRAFT_MAX_PARAMETERS`], or a table
    /// model.
    Small,
    /// Anything else: larger, a family only libtorch runs, or no model it can read (its
    /// load then says why).
    Large,
}

/// The largest draft moved off a CUDA target's GPU onto the CPU's host engine. A draft this
/// small costs a GPU a few hundred kernel launches a pass, each worth more than its work,
/// and costs the host engine well under a millisecond; a larger one keeps the GPU's speed.
pub(crate) const CPU_DRAFT_MAX_PARAMETERS: u64 = 4_000_000;

impl DraftSize {
    /// The size of the draft at `model` loaded in `dtype` on the CPU.
    pub(crate) fn of(model: &Path, dtype: DType) -> Self {
        if model.is_file() {
            return Self::Small;
        }
        let Ok(cfg) = LlamaConfig::from_dir(model) else {
            return Self::Large;
        };
        let on_the_cpu = LoadOptions { device: DeviceSpec::Cpu, dtype, ..LoadOptions::default() };
        if host_engine_refuses(&cfg, &on_the_cpu).is_none() && cfg.num_parameters() <= CPU_DRAFT_MAX_PARAMETERS {
            Self::Small
        } else {
            Self::Large
        }
    }
}

/// The flags the rule reads: the shared node flags (the target's) and the draft's own.
#[derive(Debug, Clone, Copy)]
pub(crate) struct PlacementFlags {
    /// `--device`.
    pub(crate) device: DeviceSpec,
    /// `--dtype`.
    pub(crate) dtype: DType,
    /// `--engine`.
    pub(crate) engine: Engine,
    /// `--draft-device`.
    pub(crate) draft_device: Option<DeviceSpec>,
    /// `--draft-dtype`.
    pub(crate) draft_dtype: Option<DType>,
    /// `--draft-engine`.
    pub(crate) draft_engine: Option<Engine>,
}

/// Where the draft runs, in what dtype and on what engine.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct DraftPlacement {
    pub(crate) device: DeviceSpec,
    pub(crate) dtype: DType,
    pub(crate) engine: Engine,
}

/// The draft's placement: an explicit `--draft-device` wins; else beside a CUDA target a
/// small draft goes to the CPU, on the host engine unless `--draft-engine` says otherwise,
/// and any other draft to the target's device. `size` is asked only for that choice.
///
/// A draft on the target's device takes `--dtype` and `--engine` unless its own flags say
/// otherwise; one on another device takes `auto` for both, since those flags are then the
/// target's (a bf16 GPU target says nothing about a CPU draft).
pub(crate) fn place_draft(flags: PlacementFlags, size: impl FnOnce() -> DraftSize) -> DraftPlacement {
    let moved_to_the_cpu =
        flags.draft_device.is_none() && matches!(flags.device, DeviceSpec::Cuda(_)) && size() == DraftSize::Small;
    let device = match flags.draft_device {
        Some(device) => device,
        None if moved_to_the_cpu => DeviceSpec::Cpu,
        None => flags.device,
    };
    let beside_the_target = device == flags.device;
    let engine = flags.draft_engine.unwrap_or(if moved_to_the_cpu {
        Engine::Host
    } else if beside_the_target {
        flags.engine
    } else {
        Engine::Auto
    });
    let dtype = flags.draft_dtype.unwrap_or(if beside_the_target { flags.dtype } else { DType::Auto });
    DraftPlacement { device, dtype, engine }
}

#[cfg(test)]
mod tests {
    use super::*;

    const CUDA: DeviceSpec = DeviceSpec::Cuda(0);

    fn flags(device: DeviceSpec) -> PlacementFlags {
        PlacementFlags {
            device,
            dtype: DType::Bf16,
            engine: Engine::Auto,
            draft_device: None,
            draft_dtype: None,
            draft_engine: None,
        }
    }

    fn unread() -> DraftSize {
        panic!("the draft's size was read though nothing depends on it")
    }

    #[test]
    fn beside_a_cuda_target_a_small_draft_runs_on_the_cpu_host_engine() {
        let placed = place_draft(flags(CUDA), || DraftSize::Small);
        assert_eq!(placed, DraftPlacement { device: DeviceSpec::Cpu, dtype: DType::Auto, engine: Engine::Host });
        // --draft-engine and --draft-dtype still say how it runs there.
        let own = PlacementFlags { draft_engine: Some(Engine::Libtorch), draft_dtype: Some(DType::F32), ..flags(CUDA) };
        let placed = place_draft(own, || DraftSize::Small);
        assert_eq!(placed, DraftPlacement { device: DeviceSpec::Cpu, dtype: DType::F32, engine: Engine::Libtorch });
    }

    #[test]
    fn beside_a_cuda_target_a_large_draft_shares_its_device() {
        let placed = place_draft(flags(DeviceSpec::Cuda(1)), || DraftSize::Large);
        assert_eq!(placed, DraftPlacement { device: DeviceSpec::Cuda(1), dtype: DType::Bf16, engine: Engine::Auto });
    }

    #[test]
    fn with_a_cpu_target_the_draft_stays_on_the_cpu_as_configured() {
        let placed = place_draft(flags(DeviceSpec::Cpu), unread);
        assert_eq!(placed, DraftPlacement { device: DeviceSpec::Cpu, dtype: DType::Bf16, engine: Engine::Auto });
    }

    #[test]
    fn an_explicit_draft_device_wins_without_reading_the_draft() {
        let own = |device| PlacementFlags { draft_device: Some(device), ..flags(CUDA) };
        let placed = place_draft(own(CUDA), unread);
        assert_eq!(placed, DraftPlacement { device: CUDA, dtype: DType::Bf16, engine: Engine::Auto });
        // On the CPU by choice: --dtype and --engine are the target's, so auto for both.
        let target = PlacementFlags { engine: Engine::Libtorch, ..own(DeviceSpec::Cpu) };
        let placed = place_draft(target, unread);
        assert_eq!(placed, DraftPlacement { device: DeviceSpec::Cpu, dtype: DType::Auto, engine: Engine::Auto });
        // And a small draft can be put on the GPU.
        let placed =
            place_draft(PlacementFlags { draft_device: Some(DeviceSpec::Cuda(1)), ..flags(DeviceSpec::Cpu) }, unread);
        assert_eq!(placed.device, DeviceSpec::Cuda(1));
    }

    #[test]
    fn small_is_what_the_auto_engine_rule_runs_on_the_host() {
        let dir = std::env::temp_dir().join(format!("specd-draft-size-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let config = |hidden: usize, layers: usize| {
            serde_json::json!({
                "architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": 1000,
                "hidden_size": hidden, "intermediate_size": 4 * hidden, "num_hidden_layers": layers,
                "num_attention_heads": 4, "num_key_value_heads": 2, "max_position_embeddings": 512,
                "rms_norm_eps": 1e-5, "tie_word_embeddings": true,
            })
        };
        std::fs::write(dir.join("config.json"), config(128, 2).to_string()).unwrap();
        assert_eq!(DraftSize::of(&dir, DType::Auto), DraftSize::Small);
        assert_eq!(DraftSize::of(&dir, DType::Bf16), DraftSize::Small);
        // The host engine does not store weights in f16.
        assert_eq!(DraftSize::of(&dir, DType::F16), DraftSize::Large);
        std::fs::write(dir.join("config.json"), config(1024, 8).to_string()).unwrap();
        assert_eq!(DraftSize::of(&dir, DType::Auto), DraftSize::Large);
        let table = dir.join("table.json");
        std::fs::write(&table, "{}").unwrap();
        assert_eq!(DraftSize::of(&table, DType::Auto), DraftSize::Small);
        assert_eq!(DraftSize::of(&dir.join("missing"), DType::Auto), DraftSize::Large);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
