//! Opening a model from a path: a table file, or a checkpoint directory on the engine
//! [`crate::engine_choice`] picks for it.

use std::path::Path;
use std::sync::{Mutex, OnceLock, PoisonError};

use crate::checksums::verify_checksums;
use crate::config::LlamaConfig;
use crate::engine::Engine;
use crate::engine_choice::{EngineDecision, PassTimes, time_passes};
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
        match opts.engine.decide(&LlamaConfig::from_dir(path)?, opts)? {
            EngineDecision::Use(Engine::Host) => Ok(Box::new(HostLlama::load(path, opts)?)),
            EngineDecision::Use(_) => Ok(Box::new(LlamaModel::load(path, opts)?)),
            EngineDecision::Measure => load_the_faster(path, opts),
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

/// Loads the checkpoint on each engine in turn, times the same passes on each, and keeps
/// the faster. One model is held at a time: libtorch is timed and dropped, then the host
/// engine, which is kept if it won; otherwise libtorch is loaded again.
///
/// One measurement runs at a time in a process: `specd up` loads its draft and its target
/// at once, and a pass timed while the other model's threads spin on the same cores would
/// decide by the overlap, not by the engines.
fn load_the_faster(path: &Path, opts: &LoadOptions) -> Result<BoxedModel> {
    static MEASURING: Mutex<()> = Mutex::new(());
    let _one_at_a_time = MEASURING.lock().unwrap_or_else(PoisonError::into_inner);
    // libtorch goes first so that the host engine, which wins on most CPUs, is kept as
    // timed instead of loaded a second time. A host
    // engine that fails to load or to time (a context too short for the timed passes, say)
    // leaves the choice to libtorch rather than failing the load, and a libtorch that fails
    // to time leaves it to the host engine.
    let torch_time = time_passes(&mut LlamaModel::load(path, opts)?);
    let host = HostLlama::load(path, opts).and_then(|mut host| Ok((time_passes(&mut host)?, host)));
    let chosen = match (&host, &torch_time) {
        (Ok((host, _)), Ok(torch)) => {
            let times = PassTimes { host: *host, libtorch: *torch };
            let chosen = times.faster();
            tracing::info!(
                model = %path.display(),
                host_ms = times.host.as_secs_f64() * 1e3,
                libtorch_ms = times.libtorch.as_secs_f64() * 1e3,
                "--engine auto: the {chosen} engine ran the timed passes faster"
            );
            chosen
        }
        (Err(e), _) => {
            tracing::warn!(model = %path.display(), "--engine auto: the host engine could not be timed ({e}); libtorch");
            Engine::Libtorch
        }
        (_, Err(e)) => {
            tracing::warn!(model = %path.display(), "--engine auto: libtorch could not be timed ({e}); the host engine");
            Engine::Host
        }
    };
    match (chosen, host) {
        (Engine::Host, Ok((_, host))) => Ok(Box::new(host)),
        (_, host) => {
            drop(host);
            Ok(Box::new(LlamaModel::load(path, opts)?))
        }
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
