//! Opening a model from a path: a checkpoint directory or a table file.

use std::path::Path;

use crate::device::{DType, DeviceSpec};
use crate::error::{ModelError, Result};
use crate::language_model::LanguageModel;
use crate::llama::LlamaModel;
use crate::table::TableModel;

/// How to load a model.
#[derive(Debug, Clone, Default)]
pub struct LoadOptions {
    /// Device for weights and caches.
    pub device: DeviceSpec,
    /// Dtype for weights and caches.
    pub dtype: DType,
    /// Upper bound on the bytes of KV cache held by all open sessions (`None`: unbounded).
    pub memory_budget: Option<u64>,
    /// libtorch intra-op threads of the thread that loads and runs the model (`None`:
    /// libtorch's default, one per core). Small models run faster on one: their operations
    /// are too short to split, and on a busy machine waiting for a second thread costs more
    /// than it saves.
    pub threads: Option<usize>,
}

/// A model that can move to its worker thread.
pub type BoxedModel = Box<dyn LanguageModel + Send>;

/// Opens `path`: a directory is a Hugging Face checkpoint, a `.json` file a table model.
pub fn load_model(path: &Path, opts: &LoadOptions) -> Result<BoxedModel> {
    if let Some(threads) = opts.threads {
        // Per calling thread (OpenMP's thread-count setting is): this is the model's thread.
        tch::set_num_threads(i32::try_from(threads.max(1)).unwrap_or(i32::MAX));
    }
    if path.is_dir() {
        Ok(Box::new(LlamaModel::load(path, opts)?))
    } else if path.is_file() {
        Ok(Box::new(TableModel::load(path, opts.memory_budget)?))
    } else {
        Err(ModelError::MissingFile {
            path: path.to_owned(),
            what: "expected a checkpoint directory or a table model .json file".into(),
        })
    }
}
