//! AdamW (Loshchilov and Hutter 2019) with gradient-norm clipping, over a `VarStore`'s
//! variables, with its moments kept where a checkpoint can save and restore them.
//!
//! tch's optimiser (libtorch's `torch::optim::AdamW` behind a C handle) does the same
//! arithmetic but exposes no state: a build resumed from its weights alone would restart the
//! moments and differ from one that was never interrupted. These few tensor operations keep
//! a resumed build's bytes equal to an uninterrupted one's.

use std::collections::BTreeMap;
use std::path::Path;

use tch::nn::VarStore;
use tch::{Kind, Tensor};

use crate::error::{DemoError, Result};

/// The hyper-parameters every model of the pair trains with.
#[derive(Debug, Clone, Copy)]
pub struct AdamWConfig {
    pub beta1: f64,
    pub beta2: f64,
    pub eps: f64,
    pub weight_decay: f64,
    /// The gradients' joint L2 norm is scaled down to this when above it.
    pub max_grad_norm: f64,
}

impl Default for AdamWConfig {
    fn default() -> Self {
        Self { beta1: 0.9, beta2: 0.95, eps: 1e-8, weight_decay: 0.1, max_grad_norm: 1.0 }
    }
}

/// One trainable variable and its two moments.
#[derive(Debug)]
struct Slot {
    param: Tensor,
    first: Tensor,
    second: Tensor,
}

/// The optimiser: variables in name order, so that every build visits them alike.
#[derive(Debug)]
pub struct AdamW {
    config: AdamWConfig,
    slots: BTreeMap<String, Slot>,
    /// Steps taken so far (the bias corrections' exponent).
    steps: u64,
}

const FIRST: &str = "first.";
const SECOND: &str = "second.";

impl AdamW {
    /// Zero moments for every trainable variable of `vs`.
    pub fn new(vs: &VarStore, config: AdamWConfig) -> Result<Self> {
        let mut slots = BTreeMap::new();
        for (name, param) in vs.variables() {
            if !param.requires_grad() {
                continue;
            }
            let first = param.f_zeros_like()?;
            let second = param.f_zeros_like()?;
            slots.insert(name, Slot { param, first, second });
        }
        Ok(Self { config, slots, steps: 0 })
    }

    pub fn steps(&self) -> u64 {
        self.steps
    }

    /// Clears the gradients before the next backward pass.
    pub fn zero_grad(&mut self) {
        for slot in self.slots.values_mut() {
            slot.param.zero_grad();
        }
    }

    /// Clips the gradients' joint norm, then takes one step at learning rate `lr`.
    pub fn step(&mut self, lr: f64) -> Result<()> {
        let _no_grad = tch::no_grad_guard();
        let c = self.config;
        let grads: Vec<Option<Tensor>> = self
            .slots
            .values()
            .map(|s| {
                let g = s.param.grad();
                g.defined().then_some(g)
            })
            .collect();
        let norms: Vec<Tensor> = grads.iter().flatten().map(|g| g.f_norm()).collect::<std::result::Result<_, _>>()?;
        if norms.is_empty() {
            return Ok(());
        }
        let total = Tensor::f_stack(&norms, 0)?.f_norm()?.f_double_value(&[])?;
        let clip = c.max_grad_norm / (total + 1e-6);
        self.steps += 1;
        let t = self.steps as i32;
        let correction1 = 1.0 - c.beta1.powi(t);
        let correction2 = 1.0 - c.beta2.powi(t);
        for (slot, grad) in self.slots.values_mut().zip(grads) {
            let Some(mut grad) = grad else { continue };
            if clip < 1.0 {
                let _ = grad.f_mul_scalar_(clip)?;
            }
            let _ = slot.first.f_lerp_(&grad, 1.0 - c.beta1)?;
            let _ = slot.second.f_mul_scalar_(c.beta2)?;
            let _ = slot.second.f_addcmul_(&grad.f_mul_scalar(1.0 - c.beta2)?, &grad)?;
            let _ = slot.param.f_mul_scalar_(1.0 - lr * c.weight_decay)?;
            let denominator = slot.second.f_div_scalar(correction2)?.f_sqrt()?.f_add_scalar(c.eps)?;
            let update = slot.first.f_div(&denominator)?.f_mul_scalar(lr / correction1)?;
            let _ = slot.param.f_sub_(&update)?;
        }
        Ok(())
    }

    /// Writes both moments of every variable to one safetensors file.
    pub fn save(&self, path: &Path) -> Result<()> {
        let mut named = Vec::with_capacity(2 * self.slots.len());
        for (name, slot) in &self.slots {
            named.push((format!("{FIRST}{name}"), slot.first.f_to_device(tch::Device::Cpu)?));
            named.push((format!("{SECOND}{name}"), slot.second.f_to_device(tch::Device::Cpu)?));
        }
        Tensor::write_safetensors(&named, path)?;
        Ok(())
    }

    /// Restores the moments [`save`](Self::save) wrote and the step count they were taken at;
    /// a file that lacks a variable, or holds one of another shape, is refused.
    pub fn restore(&mut self, path: &Path, steps: u64) -> Result<()> {
        let _no_grad = tch::no_grad_guard();
        let mut saved: BTreeMap<String, Tensor> = Tensor::read_safetensors(path)?.into_iter().collect();
        let refuse = |what: String| DemoError::Checkpoint { path: path.to_owned(), message: what };
        for (name, slot) in &mut self.slots {
            for (prefix, moment) in [(FIRST, &mut slot.first), (SECOND, &mut slot.second)] {
                let key = format!("{prefix}{name}");
                let value = saved.remove(&key).ok_or_else(|| refuse(format!("no {key}")))?;
                if value.size() != moment.size() || value.kind() != Kind::Float {
                    return Err(refuse(format!(
                        "{key} is {:?} {:?}, not {:?}",
                        value.kind(),
                        value.size(),
                        moment.size()
                    )));
                }
                moment.f_copy_(&value)?;
            }
        }
        self.steps = steps;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tch::nn::OptimizerConfig;

    /// A store with one 3×4 variable whose values follow from `seed` (not from libtorch's
    /// global generator, which tests running in parallel would share).
    fn store(seed: i64) -> (VarStore, Tensor) {
        let vs = VarStore::new(tch::Device::Cpu);
        let values: Vec<f32> = (0..12).map(|i| ((seed * 12 + i) as f32 * 0.7).sin()).collect();
        let w = vs.root().var_copy("w", &Tensor::from_slice(&values).view([3, 4]));
        (vs, w)
    }

    fn loss(w: &Tensor, scale: f64) -> Tensor {
        (w * w * scale).sin().sum(Kind::Float)
    }

    #[test]
    fn matches_libtorchs_adamw_step_for_step() {
        // libtorch's AdamW (through tch) is the reference: the same clipping, moments, bias
        // corrections and decoupled weight decay, so the two trajectories agree closely.
        let (ours_vs, ours_w) = store(3);
        let (ref_vs, ref_w) = store(3);
        let c = AdamWConfig::default();
        let mut ours = AdamW::new(&ours_vs, c).unwrap();
        let mut reference =
            tch::nn::AdamW { beta1: c.beta1, beta2: c.beta2, wd: c.weight_decay, eps: c.eps, amsgrad: false }
                .build(&ref_vs, 1e-2)
                .unwrap();
        for step in 0..20 {
            // Large early gradients (scale 50) so that clipping is exercised too.
            let scale = if step < 5 { 50.0 } else { 1.0 };
            let lr = 1e-2 * (1.0 + step as f64 / 10.0);
            ours.zero_grad();
            loss(&ours_w, scale).backward();
            ours.step(lr).unwrap();
            reference.set_lr(lr);
            reference.zero_grad();
            loss(&ref_w, scale).backward();
            reference.clip_grad_norm(c.max_grad_norm);
            reference.step();
        }
        let diff = (&ours_w - &ref_w).abs().max().double_value(&[]);
        assert!(diff < 1e-5, "max |Δw| {diff}");
        let moved = (&ours_w - &store(3).1).abs().max().double_value(&[]);
        assert!(moved > 1e-2, "the steps moved the weights ({moved})");
    }

    #[test]
    fn a_restored_optimiser_continues_as_if_never_stopped() {
        let dir = std::env::temp_dir().join(format!("specd-adamw-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("moments.safetensors");
        let run = |steps: std::ops::Range<usize>, opt: &mut AdamW, w: &Tensor| {
            for step in steps {
                opt.zero_grad();
                loss(w, 1.0 + step as f64).backward();
                opt.step(1e-2).unwrap();
            }
        };
        let (straight_vs, straight_w) = store(5);
        let mut straight = AdamW::new(&straight_vs, AdamWConfig::default()).unwrap();
        run(0..8, &mut straight, &straight_w);

        let (first_vs, first_w) = store(5);
        let mut first = AdamW::new(&first_vs, AdamWConfig::default()).unwrap();
        run(0..4, &mut first, &first_w);
        first.save(&path).unwrap();
        let (resumed_vs, resumed_w) = store(99);
        tch::no_grad(|| resumed_w.shallow_clone().copy_(&first_w));
        let mut resumed = AdamW::new(&resumed_vs, AdamWConfig::default()).unwrap();
        resumed.restore(&path, first.steps()).unwrap();
        run(4..8, &mut resumed, &resumed_w);
        assert!(resumed_w.equal(&straight_w), "bit for bit");

        // Without the moments (a fresh optimiser on the same weights) it is not the same, so
        // the comparison above can fail.
        let (fresh_vs, fresh_w) = store(99);
        tch::no_grad(|| fresh_w.shallow_clone().copy_(&first_w));
        let mut fresh = AdamW::new(&fresh_vs, AdamWConfig::default()).unwrap();
        run(4..8, &mut fresh, &fresh_w);
        assert!(!fresh_w.equal(&straight_w));
        let _ = std::fs::remove_dir_all(dir);
    }
}
