//! Half-precision runs load the same checkpoint and stay close to f32.

mod common;

use anyhow::Result;
use specd_model::{DType, LanguageModel, LlamaModel, LoadOptions};

#[test]
fn f16_and_bf16_track_f32() -> Result<()> {
    let r = common::reference("llama_gqa_untied")?;
    for (dtype, tol) in [(DType::Bf16, 0.5f32), (DType::F16, 0.1)] {
        let opts = LoadOptions { dtype, ..common::cpu_f32() };
        let mut m = LlamaModel::load(&common::fixture("llama_gqa_untied"), &opts)?;
        assert_eq!(m.dtype(), dtype);
        assert_eq!(m.info().kv_bytes_per_token, 2 * 2 * 2 * 8 * 2);
        let s = m.open_session(None)?;
        let l = m.forward(s, &r.tokens)?;
        let diff = common::max_abs_diff(&l.to_rows(), &r.logits);
        eprintln!("{dtype}: max |Δlogit| vs f32 reference = {diff}");
        assert!(diff < tol, "{dtype}: {diff}");
        assert!(l.as_slice().iter().all(|x| x.is_finite()));
    }
    Ok(())
}

#[test]
fn device_and_dtype_strings() {
    use specd_model::DeviceSpec;
    assert_eq!("cpu".parse::<DeviceSpec>().unwrap(), DeviceSpec::Cpu);
    assert_eq!("cuda:1".parse::<DeviceSpec>().unwrap(), DeviceSpec::Cuda(1));
    assert_eq!("cuda".parse::<DeviceSpec>().unwrap(), DeviceSpec::Cuda(0));
    assert!("gpu".parse::<DeviceSpec>().is_err());
    assert!("cuda:x".parse::<DeviceSpec>().is_err());
    assert_eq!("bf16".parse::<DType>().unwrap(), DType::Bf16);
    assert!("f8".parse::<DType>().is_err());
    assert_eq!(DeviceSpec::Cuda(3).to_string(), "cuda:3");
    if !tch::Cuda::is_available() {
        assert!(DeviceSpec::Cuda(0).to_device().is_err());
    }
}

/// Half precision on a CPU builds a kernel per pass length on first use; `warm_up` runs each
/// length once at start, leaves no session behind and changes no result. f32 builds none, so
/// it runs nothing. (Whether kernels were built shows only in time, which tests do not assert.)
#[test]
fn warm_up_runs_every_length_in_half_precision_only_and_leaves_nothing_behind() -> Result<()> {
    let r = common::reference("llama_gqa_untied")?;
    let opts = LoadOptions { dtype: DType::Bf16, ..common::cpu_f32() };
    let path = common::fixture("llama_gqa_untied");
    let (mut warmed, mut cold) = (LlamaModel::load(&path, &opts)?, LlamaModel::load(&path, &opts)?);
    assert_eq!(warmed.warm_up(9)?, 9);
    assert_eq!(warmed.open_sessions(), 0);
    assert_eq!(warmed.memory_in_use().0, 0);
    let (a, b) = (warmed.open_session(None)?, cold.open_session(None)?);
    assert_eq!(warmed.forward(a, &r.tokens)?.as_slice(), cold.forward(b, &r.tokens)?.as_slice());

    let mut f32_model = LlamaModel::load(&path, &common::cpu_f32())?;
    assert_eq!(f32_model.warm_up(9)?, 0);
    Ok(())
}
