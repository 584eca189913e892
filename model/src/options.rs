//! How to load a model: device, dtype, KV budget, threads, engine and attention, as both engines and
//! the table model read them.

use crate::attention::AttentionOptions;
use crate::device::{DType, DeviceSpec};
use crate::engine::Engine;
use crate::kv_budget::KvBudget;

/// How to load a model.
#[derive(Debug, Clone, Default)]
pub struct LoadOptions {
    /// Device for weights and caches.
    pub device: DeviceSpec,
    /// Dtype for weights and caches ([`DType::Auto`]: see [`DType::resolve`]).
    pub dtype: DType,
    /// Upper bound on the bytes of KV cache held by all open sessions. A fixed number applies
    /// from load; a fraction of the free memory is measured by the node after warm-up and
    /// set with [`crate::LanguageModel::set_memory_budget`].
    pub kv_budget: KvBudget,
    /// libtorch intra-op threads of the thread that loads and runs the model (`None`:
    /// libtorch's default, one per core). Small models run faster on one: their operations
    /// are too short to split, and on a busy machine waiting for a second thread costs more
    /// than it saves.
    pub threads: Option<usize>,
    /// Load a checkpoint even when it holds tensors the model does not use (by default an
    /// error naming them: [`crate::ModelError::UnusedTensors`]).
    pub allow_unused_weights: bool,
    /// Forward passes return their logits where they were computed
    /// instead of copying every row to the host ([`crate::Logits::from_tensor`]): for a node that builds its distributions
    /// with libtorch on the model's device (`--distributions device`). A table model puts
    /// its rows in a CPU tensor then ([`crate::TableModel::with_logits_in_tensors`]).
    pub logits_on_device: bool,
    /// What computes a checkpoint's passes ([`Engine::resolve`]); a table model ignores it.
    pub engine: Engine,
    /// How the libtorch engine attends: key lengths and kernel ([`AttentionOptions`]); the
    /// host engine and a table model ignore it.
    pub attention: AttentionOptions,
}
