//! The target's last states over the training stream, computed once for a long distillation.
//!
//! Distilling the draft runs the target on every batch to get the distributions the draft
//! imitates, and that pass is most of a step: for the demo pair the target's forward pass
//! costs more than the draft's whole step, forward and backward (BENCHMARKS.md). A
//! distillation that sees the corpus several times pays it again on every pass.
//! [`TeacherStates`] runs the target once over the stream cut into the windows
//! [`Windows::aligned`](crate::train::Windows::aligned) draws, keeps each position's
//! last-layer states (after the final norm, in f16), and a step then runs only the target's
//! vocabulary head on them ([`TrainableLlama::head`]).
//!
//! What changes: the windows start at multiples of the window's length instead of
//! anywhere, and the states are rounded to f16 (relative error 2⁻¹¹ a component), so the
//! target's logits differ from an uncached pass's in their fourth significant digit. It
//! holds `tokens × hidden × 2` bytes (2.3 GB for the shipped preset's 2.96 M tokens at
//! hidden 384) on the training device.

use tch::{Device, Kind, Tensor};

use crate::error::Result;
use crate::net::TrainableLlama;
use crate::progress::Progress;
use crate::train::{Batch, aligned_count, push_window};

/// The target's states for each aligned window of a stream: `[windows, len, hidden]`.
#[derive(Debug)]
pub struct TeacherStates {
    states: Tensor,
    len: usize,
}

/// Windows of the stream the target runs on at once while the states are computed.
const WINDOWS_PER_PASS: usize = 8;

impl TeacherStates {
    /// Runs `target` over every aligned window of `len` tokens of `stream` on `device`, with
    /// `compute` matmuls, reporting each pass to `progress` as a step.
    pub fn compute(
        target: &TrainableLlama,
        stream: &[u32],
        len: usize,
        compute: Kind,
        device: Device,
        progress: &mut dyn Progress,
    ) -> Result<Self> {
        let _no_grad = tch::no_grad_guard();
        let windows = aligned_count(stream.len(), len);
        let passes = windows.div_ceil(WINDOWS_PER_PASS);
        progress.stage("running the target over the corpus once", passes);
        let started = std::time::Instant::now();
        let mut parts = Vec::with_capacity(passes);
        for pass in 0..passes {
            let first = pass * WINDOWS_PER_PASS;
            let count = WINDOWS_PER_PASS.min(windows - first);
            let mut ids = Vec::with_capacity(count * len);
            for window in first..first + count {
                push_window(stream, window * len, len, &mut ids);
            }
            let ids = Tensor::from_slice(&ids).f_view([count as i64, len as i64])?.f_to_device(device)?;
            parts.push(target.last_states(&ids, compute)?.f_to_kind(Kind::Half)?);
            let elapsed = started.elapsed().as_secs_f64().max(1e-9);
            progress.step(pass + 1, None, ((first + count) * len) as f64 / elapsed);
        }
        Ok(Self { states: Tensor::f_cat(&parts, 0)?, len })
    }

    /// The windows it holds.
    pub fn windows(&self) -> usize {
        self.states.size()[0] as usize
    }

    /// The target's logits `[batch, len, vocab]` for `batch`, whose windows must come from
    /// [`Windows::aligned`](crate::train::Windows::aligned) over the same stream and length.
    pub fn logits(&self, target: &TrainableLlama, batch: &Batch, compute: Kind) -> Result<Tensor> {
        let _no_grad = tch::no_grad_guard();
        let mut rows = Vec::with_capacity(batch.starts.len());
        for &start in &batch.starts {
            if start % self.len != 0 || start / self.len >= self.windows() {
                return Err(crate::DemoError::InvalidInput(format!(
                    "a window at {start} is not one of the {} the target's states were computed for",
                    self.windows()
                )));
            }
            rows.push((start / self.len) as i64);
        }
        let index = Tensor::from_slice(&rows).f_to_device(self.states.device())?;
        let states = self.states.f_index_select(0, &index)?.f_to_kind(Kind::Float)?;
        target.head(&states, compute)
    }
}

#[cfg(test)]
mod tests {
    use tch::nn::VarStore;

    use super::*;
    use crate::progress::Quiet;
    use crate::spec::Preset;
    use crate::train::Windows;

    #[test]
    fn cached_states_give_the_targets_logits_for_each_drawn_window() {
        tch::manual_seed(3);
        let spec = Preset::Tiny.spec();
        let vs = VarStore::new(Device::Cpu);
        let target = TrainableLlama::new(&vs.root(), &spec.llama_config(spec.target)).unwrap();
        let len = spec.context;
        // 5 windows and a partial one: the partial one has no label after it, so it is not drawn.
        let stream: Vec<u32> = (0..(5 * len + 7) as u32).map(|i| (i * 7 + i / 3) % spec.vocab_size as u32).collect();
        let states = TeacherStates::compute(&target, &stream, len, Kind::Float, Device::Cpu, &mut Quiet).unwrap();
        assert_eq!(states.windows(), 5);
        let mut windows = Windows::aligned(&stream, len, 6, 11);
        let mut seen = std::collections::HashSet::new();
        for _ in 0..4 {
            let batch = windows.next_batch().unwrap();
            let cached = states.logits(&target, &batch, Kind::Float).unwrap();
            let ids = batch.ids.narrow(1, 0, len as i64);
            let direct = target.forward(&ids, Kind::Float).unwrap();
            let worst = f64::try_from((&cached - &direct).abs().max()).unwrap();
            let scale = f64::try_from(direct.abs().max()).unwrap();
            assert!(worst <= 2e-3 * scale.max(1.0), "cached logits off by {worst} (logits up to {scale})");
            for (row, &start) in batch.starts.iter().enumerate() {
                assert_eq!(start % len, 0);
                let first = i64::try_from(batch.ids.get(row as i64).get(0)).unwrap();
                assert_eq!(first, i64::from(stream[start]), "row {row} is not the window at {start}");
                seen.insert(start);
            }
        }
        assert!(seen.len() > 2, "the windows drawn do not vary: {seen:?}");
        let stray = Batch { ids: Tensor::zeros([1, len as i64 + 1], (Kind::Int64, Device::Cpu)), starts: vec![3] };
        assert!(states.logits(&target, &stray, Kind::Float).is_err(), "an unaligned window was scored");
    }
}
