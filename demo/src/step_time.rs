//! How long one optimiser step takes, for turning `specd models demo --minutes` into step
//! counts.

use std::time::Instant;

use specd_model::DeviceSpec;
use tch::nn::VarStore;

use crate::error::Result;
use crate::matmul::MatmulKind;
use crate::net::TrainableLlama;
use crate::progress::Quiet;
use crate::spec::{DemoSpec, Shape};
use crate::train::{Windows, distillation_loss, next_token_loss, optimise};

/// Seconds one optimiser step of `shape` takes on `device`, for turning `--minutes` into
/// steps (each step ends by reading its loss back, so a GPU step is timed to its end).
pub fn seconds_per_step(
    spec: &DemoSpec,
    shape: Shape,
    with_teacher: Option<Shape>,
    matmul: MatmulKind,
    device: DeviceSpec,
) -> Result<f64> {
    let device = device.to_device()?;
    let compute = matmul.kind();
    let stream: Vec<u32> = (0..(spec.context * 4) as u32).map(|i| i % spec.vocab_size as u32).collect();
    let vs = VarStore::new(device);
    let model = TrainableLlama::new(&vs.root(), &spec.llama_config(shape))?;
    let teacher_vs = VarStore::new(device);
    let teacher = with_teacher.map(|s| TrainableLlama::new(&teacher_vs.root(), &spec.llama_config(s))).transpose()?;
    let t = spec.context as i64;
    let mut windows = Windows::new(&stream, spec.context, spec.batch, 0);
    let mut time_one = || -> Result<f64> {
        let started = Instant::now();
        optimise(&vs, 1, 1e-4, &mut windows, &mut Quiet, None, |batch| {
            let ids = batch.ids.f_narrow(1, 0, t)?;
            let logits = model.forward(&ids, compute)?;
            match &teacher {
                Some(teacher) => {
                    let p = {
                        let _no_grad = tch::no_grad_guard();
                        teacher.forward(&ids, compute)?
                    };
                    distillation_loss(&logits, &p)
                }
                None => next_token_loss(&logits, &batch.ids.f_narrow(1, 1, t)?),
            }
        })?;
        Ok(started.elapsed().as_secs_f64())
    };
    time_one()?; // warm-up: allocator and kernel selection
    time_one()
}
