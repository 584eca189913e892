//! Opening a model from a path: a table file, or a checkpoint directory on the engine
//! [`crate::engine_choice`] picks for it.

use std::path::Path;
use std::sync::OnceLock;

use crate::checksums::verify_checksums;
use crate::config::LlamaConfig;
use crate::engine::Engine;
use crate::error::{ModelError, Result};
use crate::host::HostLlama;
use crate::language_model::LanguageModel;
use crate::libtorch::LlamaModel;
use crate::options::LoadOptions;
use crate::table::TableModel;

/// A model that can move to its worker thread.
pub type BoxedModel = Box<dyn LanguageModel + Send>;

/// Opens `path`: a directory is a Hugging Face checkpoint (checked against its `SHA256SUMS`
/// first, when it has one), a `.json` file a table model.
pub fn load_model(path: &Path, opts: &LoadOptions) -> Result<BoxedModel> {
    set_model_thread_count(opts.threads);
    if path.is_dir() {
        let checked = verify_checksums(path)?;
        if checked > 0 {
            tracing::info!(files = checked, dir = %path.display(), "checkpoint files match SHA256SUMS");
        }
        match opts.engine.resolve(&LlamaConfig::from_dir(path)?, opts)? {
            Engine::Host => Ok(Box::new(HostLlama::load(path, opts)?)),
            _ => Ok(Box::new(LlamaModel::load(path, opts)?)),
        }
    } else if path.is_file() {
        // A fraction of the free memory is measured after warm-up (`set_memory_budget`).
        let table = TableModel::load(path, opts.kv_budget.without_measuring())?;
        Ok(Box::new(table.with_logits_in_tensors(opts.logits_on_device)))
    } else {
        Err(ModelError::MissingFile {
            path: path.to_owned(),
            what: "expected a checkpoint directory or a table model .json file".into(),
        })
    }
}

/// Gives the calling thread (the model's) its own libtorch thread count: `threads`, or
/// libtorch's default (one per core, or `OMP_NUM_THREADS`). libtorch keeps a process-wide
/// count that a thread adopts the first time it asks for one, so in one process (`specd up`)
/// the draft's count of 1, set first, would make the target single-threaded too
/// (BENCHMARKS.md). Asking first fixes this thread's count before it is set, and OpenMP
/// keeps it per thread from then on.
fn set_model_thread_count(threads: Option<usize>) {
    // Read before any model thread sets a count: later the process-wide count is whatever
    // the last model set.
    static DEFAULT: OnceLock<i32> = OnceLock::new();
    let default = *DEFAULT.get_or_init(tch::get_num_threads);
    let _ = tch::get_num_threads();
    let threads = threads.map_or(default, |t| i32::try_from(t).unwrap_or(i32::MAX));
    tch::set_num_threads(threads.max(1));
}
