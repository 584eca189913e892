//! A training stage saved part-way, so that a long build (hours on a CPU) resumes where it
//! stopped (a killed process, a machine that went away) and still writes the bytes an
//! uninterrupted build would: the weights, the optimiser's moments, the data order's
//! generator and the loss tail are all saved, and nothing else carries state between steps.
//!
//! A stage's checkpoint lives beside its finished directory (`OUT/.target.partial` for
//! `OUT/target`) with the stage's key, and is used only while that key matches. Each save
//! writes its tensors to a new subdirectory named by the step, then renames a new
//! `position.json` over the old one (the step that is switched to at once), then removes the
//! older subdirectories: a process killed at any moment leaves the last complete checkpoint.
//! The checkpoint is removed once the stage is finished.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};
use serde_json::Value;
use tch::nn::VarStore;

use crate::adamw::AdamW;
use crate::error::{DemoError, Result};
use crate::export;

const WEIGHTS: &str = "model.safetensors";
const MOMENTS: &str = "moments.safetensors";
const POSITION: &str = "position.json";

/// Where training stood after a step: what the next step needs that the weights and moments
/// do not hold.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct TrainingPosition {
    /// Steps finished; the next one is this (0-based).
    pub steps_done: usize,
    /// The data order's generator ([`crate::train::Windows`]).
    pub windows_state: u64,
    /// Sum and count of the losses in the last tenth of the steps so far.
    pub tail_sum: f64,
    pub tail_steps: usize,
}

#[derive(Debug, Serialize, Deserialize)]
struct PositionFile {
    key: Value,
    position: TrainingPosition,
    optimiser_steps: u64,
}

/// One stage's checkpoint and how often to write it.
#[derive(Debug)]
pub struct StageCheckpoint {
    dir: PathBuf,
    key: Value,
    every: Duration,
    last_saved: Instant,
}

impl StageCheckpoint {
    /// The checkpoint of the stage finished into `stage_dir`, built with `key`, saved at most
    /// once per `every` (zero: after every step).
    pub fn new(stage_dir: &Path, key: &Value, every: Duration) -> Self {
        let name = stage_dir.file_name().map_or_else(|| "stage".into(), |n| n.to_string_lossy().into_owned());
        Self {
            dir: stage_dir.with_file_name(format!(".{name}.partial")),
            key: key.clone(),
            every,
            last_saved: Instant::now(),
        }
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Restores `vs` and `optimiser` from a checkpoint of this stage's key and returns where
    /// it stood; `None` (training starts over) when there is none, or one of another key.
    pub fn restore(&self, vs: &VarStore, optimiser: &mut AdamW) -> Result<Option<TrainingPosition>> {
        let Ok(text) = std::fs::read_to_string(self.dir.join(POSITION)) else { return Ok(None) };
        let file: PositionFile = serde_json::from_str(&text).map_err(|e| DemoError::Checkpoint {
            path: self.dir.join(POSITION),
            message: format!("unreadable ({e}); delete {} to start the stage over", self.dir.display()),
        })?;
        if file.key != self.key {
            return Ok(None);
        }
        let tensors = self.dir.join(file.position.steps_done.to_string());
        export::read_weights_file(vs, &tensors.join(WEIGHTS))?;
        optimiser.restore(&tensors.join(MOMENTS), file.optimiser_steps)?;
        Ok(Some(file.position))
    }

    /// Saves when `every` has passed since the last save (or since the stage began).
    pub fn maybe_save(&mut self, vs: &VarStore, optimiser: &AdamW, position: TrainingPosition) -> Result<bool> {
        if self.last_saved.elapsed() < self.every {
            return Ok(false);
        }
        let io = |path: &Path| {
            let path = path.to_owned();
            move |source| DemoError::Io { path, source }
        };
        let name = position.steps_done.to_string();
        let tensors = self.dir.join(&name);
        let _ = std::fs::remove_dir_all(&tensors);
        std::fs::create_dir_all(&tensors).map_err(io(&tensors))?;
        export::write_weights(vs, &tensors.join(WEIGHTS))?;
        optimiser.save(&tensors.join(MOMENTS))?;
        let file = PositionFile { key: self.key.clone(), position, optimiser_steps: optimiser.steps() };
        let staged = self.dir.join(format!(".{POSITION}.tmp"));
        export::write_json(&staged, &serde_json::to_value(&file).unwrap_or_default())?;
        std::fs::rename(&staged, self.dir.join(POSITION)).map_err(io(&self.dir))?;
        // Older steps' tensors are no longer pointed at.
        for entry in std::fs::read_dir(&self.dir).map_err(io(&self.dir))?.flatten() {
            let is_old_step = entry.file_name().to_str().is_some_and(|n| n != name && n.parse::<usize>().is_ok());
            if is_old_step {
                let _ = std::fs::remove_dir_all(entry.path());
            }
        }
        self.last_saved = Instant::now();
        Ok(true)
    }

    /// Removes the checkpoint once its stage is finished.
    pub fn remove(&self) -> Result<()> {
        match std::fs::remove_dir_all(&self.dir) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                Err(DemoError::Io { path: self.dir.clone(), source: e })
            }
            _ => Ok(()),
        }
    }
}
