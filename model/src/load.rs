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
}

/// A model that can move to its worker thread.
pub type BoxedModel = Box<dyn LanguageModel + Send>;

/// Opens `path`: a directory is a Hugging Face checkpoint, a `.json` file a table model.
pub fn load_model(path: &Path, opts: &LoadOptions) -> Result<BoxedModel> {
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
