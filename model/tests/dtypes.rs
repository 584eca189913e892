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
