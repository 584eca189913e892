//! The optimisation loop both models share: seeded windows of the token stream, AdamW with
//! warm-up and cosine decay, gradient clipping, progress reports, and checkpoints that a
//! stopped build resumes from.

use std::time::Instant;

use tch::nn;
use tch::{Kind, Tensor};

use crate::adamw::{AdamW, AdamWConfig};
use crate::checkpoint::{StageCheckpoint, TrainingPosition};
use crate::error::Result;
use crate::progress::Progress;

/// Draws training windows from one token stream with a seeded generator, so a seed fixes
/// the data order.
#[derive(Debug)]
pub struct Windows<'a> {
    stream: &'a [u32],
    len: usize,
    batch: usize,
    state: u64,
    /// Windows start only at multiples of `len` (see [`Windows::aligned`]).
    aligned: bool,
}

/// A batch of windows and where each starts in the stream.
#[derive(Debug)]
pub struct Batch {
    /// `[batch, len + 1]` int64 ids.
    pub ids: Tensor,
    /// The stream offset of each row's first token.
    pub starts: Vec<usize>,
}

impl<'a> Windows<'a> {
    /// Windows of `len` tokens plus the one after each (the last label), starting anywhere.
    pub fn new(stream: &'a [u32], len: usize, batch: usize, seed: u64) -> Self {
        Self { stream, len, batch, state: seed ^ 0x9e37_79b9_7f4a_7c15, aligned: false }
    }

    /// As [`Windows::new`], each window one of the [`aligned_count`] that start at a multiple
    /// of `len`: the windows whose target states [`crate::teacher::TeacherStates`] holds.
    pub fn aligned(stream: &'a [u32], len: usize, batch: usize, seed: u64) -> Self {
        Self { aligned: true, ..Self::new(stream, len, batch, seed) }
    }

    /// The generator's state: the windows drawn after [`restore_state`](Self::restore_state)
    /// with it are the ones that would have followed.
    pub fn state(&self) -> u64 {
        self.state
    }

    pub fn restore_state(&mut self, state: u64) {
        self.state = state;
    }

    fn next_u64(&mut self) -> u64 {
        // splitmix64: tiny, and the same on every platform.
        self.state = self.state.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.state;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// The next `batch` windows.
    pub fn next_batch(&mut self) -> Result<Batch> {
        let span = self.len + 1;
        let mut ids = Vec::with_capacity(self.batch * span);
        let mut starts = Vec::with_capacity(self.batch);
        for _ in 0..self.batch {
            let start = if self.aligned {
                (self.next_u64() % aligned_count(self.stream.len(), self.len) as u64) as usize * self.len
            } else {
                (self.next_u64() % self.stream.len().saturating_sub(span).max(1) as u64) as usize
            };
            push_window(self.stream, start, span, &mut ids);
            starts.push(start);
        }
        Ok(Batch { ids: Tensor::from_slice(&ids).f_view([self.batch as i64, span as i64])?, starts })
    }
}

/// Appends the `span` tokens of `stream` from `start` to `ids`; a window that runs past the
/// stream's end repeats its last token rather than failing.
pub(crate) fn push_window(stream: &[u32], start: usize, span: usize, ids: &mut Vec<i64>) {
    let window = &stream[start.min(stream.len())..(start + span).min(stream.len())];
    ids.extend(window.iter().map(|&t| i64::from(t)));
    ids.extend(std::iter::repeat_n(ids.last().copied().unwrap_or(0), span - window.len()));
}

/// How many windows of `len` tokens and a label start at multiples of `len` in a stream of
/// `stream_len` tokens: at least one (a short stream's window repeats its last token).
pub fn aligned_count(stream_len: usize, len: usize) -> usize {
    (stream_len.saturating_sub(1) / len.max(1)).max(1)
}

/// Learning rate at `step` of `steps`: linear warm-up over the first 5% (at least one
/// step), then cosine decay to a tenth of the peak.
pub fn learning_rate(step: usize, steps: usize, peak: f64) -> f64 {
    let warmup = (steps / 20).max(1);
    if step < warmup {
        return peak * (step + 1) as f64 / warmup as f64;
    }
    let progress = (step - warmup) as f64 / (steps - warmup).max(1) as f64;
    peak * (0.1 + 0.9 * 0.5 * (1.0 + (std::f64::consts::PI * progress).cos()))
}

/// Runs `steps` AdamW steps on the variables of `vs`; `loss` maps a batch `[B, T + 1]` to a
/// scalar. With a checkpoint, training resumes from it when it holds this stage, and saves
/// to it as it goes. Returns the mean loss of the last tenth of the steps.
pub fn optimise(
    vs: &nn::VarStore,
    steps: usize,
    peak_lr: f64,
    windows: &mut Windows<'_>,
    progress: &mut dyn Progress,
    mut checkpoint: Option<&mut StageCheckpoint>,
    mut loss: impl FnMut(&Batch) -> Result<Tensor>,
) -> Result<f64> {
    let mut optimiser = AdamW::new(vs, AdamWConfig::default())?;
    let mut position = TrainingPosition { steps_done: 0, windows_state: windows.state(), tail_sum: 0.0, tail_steps: 0 };
    if let Some(checkpoint) = checkpoint.as_deref()
        && let Some(saved) = checkpoint.restore(vs, &mut optimiser)?
        && saved.steps_done <= steps
    {
        position = saved;
        windows.restore_state(saved.windows_state);
        progress.note(&format!("resuming at step {} of {steps} from {}", saved.steps_done, checkpoint.dir().display()));
    }
    let started = Instant::now();
    let resumed_at = position.steps_done;
    let tokens_per_step = (windows.batch * windows.len) as f64;
    let tail_from = steps - (steps / 10).max(1).min(steps);
    for step in position.steps_done..steps {
        let batch = windows.next_batch()?;
        let batch = Batch { ids: batch.ids.f_to_device(vs.device())?, ..batch };
        let l = loss(&batch)?;
        optimiser.zero_grad();
        l.f_backward()?;
        optimiser.step(learning_rate(step, steps, peak_lr))?;
        let value = l.f_double_value(&[])?;
        if step >= tail_from {
            position.tail_sum += value;
            position.tail_steps += 1;
        }
        position.steps_done = step + 1;
        position.windows_state = windows.state();
        if let Some(checkpoint) = checkpoint.as_deref_mut()
            && step + 1 < steps
        {
            checkpoint.maybe_save(vs, &optimiser, position)?;
        }
        let elapsed = started.elapsed().as_secs_f64().max(1e-9);
        progress.step(step + 1, Some(value), tokens_per_step * (step + 1 - resumed_at) as f64 / elapsed);
    }
    Ok(position.tail_sum / position.tail_steps.max(1) as f64)
}

/// Mean next-token cross-entropy of `logits` `[B, T, V]` against `labels` `[B, T]`.
pub fn next_token_loss(logits: &Tensor, labels: &Tensor) -> Result<Tensor> {
    let v = logits.size()[2];
    Ok(logits.f_view([-1, v])?.f_cross_entropy_loss(
        &labels.f_reshape([-1])?,
        None::<Tensor>,
        tch::Reduction::Mean,
        -100,
        0.0,
    )?)
}

/// Mean cross-entropy of the student's logits against the teacher's distributions, i.e.
/// KL(p_teacher ‖ q_student) plus the teacher's entropy: minimising it makes q imitate p,
/// which is what acceptance Σ min(p, q) rewards.
pub fn distillation_loss(student: &Tensor, teacher: &Tensor) -> Result<Tensor> {
    let p = teacher.f_softmax(-1, Kind::Float)?;
    let log_q = student.f_log_softmax(-1, Kind::Float)?;
    Ok(p.f_mul(&log_q)?.f_sum_dim_intlist(-1, false, Kind::Float)?.f_mean(Kind::Float)?.f_neg()?)
}
