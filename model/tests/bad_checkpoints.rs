//! Bad checkpoints give typed errors naming the file and tensor, never a panic.

mod common;

use std::path::{Path, PathBuf};

use anyhow::Result;
use common::{cpu_f32, fixture};
use specd_model::{DType, DeviceSpec, LanguageModel, LlamaModel, LoadOptions, ModelError, load_model};

/// A private copy of a fixture that the test may damage; removed on drop.
struct Scratch(PathBuf);

impl std::ops::Deref for Scratch {
    type Target = Path;
    fn deref(&self) -> &Path {
        &self.0
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn copy_fixture(name: &str, tag: &str) -> Result<Scratch> {
    let dst = common::workspace_root().join("target/fixtures/scratch").join(format!("{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dst);
    std::fs::create_dir_all(&dst)?;
    for entry in std::fs::read_dir(fixture(name))? {
        let entry = entry?;
        std::fs::copy(entry.path(), dst.join(entry.file_name()))?;
    }
    Ok(Scratch(dst))
}

fn edit_config(dir: &Path, key: &str, value: serde_json::Value) -> Result<()> {
    let path = dir.join("config.json");
    let mut cfg: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&path)?)?;
    cfg[key] = value;
    std::fs::write(path, serde_json::to_string(&cfg)?)?;
    Ok(())
}

fn load_err(dir: &Path) -> ModelError {
    LlamaModel::load(dir, &cpu_f32()).expect_err("loading should fail")
}

#[test]
fn missing_weights_file() -> Result<()> {
    let dir = copy_fixture("llama_tied", "noweights")?;
    std::fs::remove_file(dir.join("model.safetensors"))?;
    let err = load_err(&dir);
    assert!(matches!(&err, ModelError::MissingFile { path, .. } if path.ends_with("model.safetensors")), "{err}");
    Ok(())
}

#[test]
fn missing_config_and_missing_path() -> Result<()> {
    let dir = copy_fixture("llama_tied", "noconfig")?;
    std::fs::remove_file(dir.join("config.json"))?;
    assert!(matches!(load_err(&dir), ModelError::MissingFile { path, .. } if path.ends_with("config.json")));
    let err = load_model(&dir.join("nope"), &cpu_f32()).err().expect("no such path");
    assert!(matches!(err, ModelError::MissingFile { .. }), "{err}");
    Ok(())
}

#[test]
fn missing_shard() -> Result<()> {
    let dir = copy_fixture("mistral_sharded", "noshard")?;
    std::fs::remove_file(dir.join("model-00003-of-00005.safetensors"))?;
    let err = load_err(&dir);
    assert!(
        matches!(&err, ModelError::MissingFile { path, .. } if path.ends_with("model-00003-of-00005.safetensors")),
        "{err}"
    );
    Ok(())
}

#[test]
fn missing_tensor_is_named() -> Result<()> {
    let dir = copy_fixture("llama_gqa_untied", "notensor")?;
    let path = dir.join("model.safetensors");
    let bytes = std::fs::read(&path)?;
    let st = safetensors::SafeTensors::deserialize(&bytes)?;
    let kept: Vec<_> = st.tensors().into_iter().filter(|(n, _)| n != "lm_head.weight").collect();
    safetensors::serialize_to_file(kept, None, &path)?;
    let err = load_err(&dir);
    assert!(
        matches!(&err, ModelError::MissingTensor { tensor, path } if tensor == "lm_head.weight" && path.ends_with("model.safetensors")),
        "{err}"
    );
    assert!(err.to_string().contains("lm_head.weight"));
    Ok(())
}

#[test]
fn wrong_shape_is_named() -> Result<()> {
    let dir = copy_fixture("qwen2", "shape")?;
    edit_config(&dir, "intermediate_size", 40.into())?;
    let err = load_err(&dir);
    match &err {
        ModelError::TensorShape { tensor, expected, found, path } => {
            assert_eq!(tensor, "model.layers.0.mlp.gate_proj.weight");
            assert_eq!(expected, &vec![40, 32]);
            assert_eq!(found, &vec![48, 32]);
            assert!(path.ends_with("model.safetensors"));
        }
        other => panic!("expected TensorShape, got {other}"),
    }
    Ok(())
}

#[test]
fn unknown_model_type() -> Result<()> {
    let dir = copy_fixture("llama_tied", "arch")?;
    edit_config(&dir, "model_type", "gpt2".into())?;
    let err = load_err(&dir);
    assert!(
        matches!(&err, ModelError::UnsupportedArchitecture { found, path } if found.contains("gpt2") && path.ends_with("config.json")),
        "{err}"
    );
    edit_config(&dir, "model_type", "llama".into())?;
    edit_config(&dir, "architectures", serde_json::json!(["GPT2LMHeadModel"]))?;
    assert!(matches!(load_err(&dir), ModelError::UnsupportedArchitecture { .. }));
    Ok(())
}

#[test]
fn invalid_config_values() -> Result<()> {
    let dir = copy_fixture("llama_tied", "badcfg")?;
    edit_config(&dir, "num_key_value_heads", 3.into())?;
    assert!(matches!(load_err(&dir), ModelError::InvalidFile { .. }));
    edit_config(&dir, "num_key_value_heads", 4.into())?;
    edit_config(&dir, "rope_parameters", serde_json::json!({"rope_type": "dynamic", "factor": 2.0}))?;
    let err = load_err(&dir);
    assert!(matches!(&err, ModelError::InvalidFile { message, .. } if message.contains("dynamic")), "{err}");
    edit_config(&dir, "rope_parameters", serde_json::json!({"rope_type": "default", "rope_theta": 10000.0}))?;
    edit_config(&dir, "vocab_size", (1u64 << 40).into())?;
    let err = load_err(&dir);
    assert!(matches!(&err, ModelError::InvalidFile { message, .. } if message.contains("vocab_size")), "{err}");
    std::fs::write(dir.join("config.json"), "{not json")?;
    assert!(matches!(load_err(&dir), ModelError::InvalidFile { .. }));
    Ok(())
}

#[test]
fn corrupt_safetensors() -> Result<()> {
    let dir = copy_fixture("llama_tied", "corrupt")?;
    std::fs::write(dir.join("model.safetensors"), b"garbage")?;
    assert!(matches!(load_err(&dir), ModelError::InvalidFile { path, .. } if path.ends_with("model.safetensors")));
    Ok(())
}

#[test]
fn an_unsupported_dtype_is_named_and_an_unused_tensor_refused() -> Result<()> {
    use safetensors::{Dtype, tensor::TensorView};
    let dir = copy_fixture("llama_gqa_untied", "dtype")?;
    let path = dir.join("model.safetensors");
    let original = std::fs::read(&path)?;
    let counter = [0u8; 8];
    let ints = vec![0u8; 96 * 32 * 4];
    let write = |replace_head: bool| -> Result<()> {
        let st = safetensors::SafeTensors::deserialize(&original)?;
        let mut views: Vec<(String, TensorView<'_>)> =
            st.tensors().into_iter().filter(|(n, _)| !(replace_head && n == "lm_head.weight")).collect();
        views.push(("model.extra_counter".into(), TensorView::new(Dtype::I64, vec![1], &counter)?));
        if replace_head {
            views.push(("lm_head.weight".into(), TensorView::new(Dtype::I32, vec![96, 32], &ints)?));
        }
        safetensors::serialize_to_file(views, None, &path)?;
        Ok(())
    };
    // An unrelated integer tensor is not used: refused by name, loaded when allowed.
    write(false)?;
    let err = load_err(&dir);
    assert!(matches!(&err, ModelError::UnusedTensors { tensors, .. } if tensors == &["model.extra_counter"]), "{err}");
    LlamaModel::load(&dir, &LoadOptions { allow_unused_weights: true, ..cpu_f32() })?;
    // A needed tensor in an unsupported dtype is a typed error naming it.
    write(true)?;
    let err = load_err(&dir);
    assert!(
        matches!(&err, ModelError::TensorDtype { tensor, dtype, .. } if tensor == "lm_head.weight" && dtype == "I32"),
        "{err}"
    );
    Ok(())
}

/// Rewrites `dir/model.safetensors` with `extra` tensors (name, source tensor to copy) added.
fn add_tensors(dir: &Path, extra: &[(&str, &str)]) -> Result<()> {
    let path = dir.join("model.safetensors");
    let original = std::fs::read(&path)?;
    let st = safetensors::SafeTensors::deserialize(&original)?;
    let mut views = st.tensors();
    for (name, source) in extra {
        let view = st.tensor(source)?;
        views.push(((*name).to_owned(), view));
    }
    safetensors::serialize_to_file(views, None, &path)?;
    Ok(())
}

fn first_logits(dir: &Path, opts: &LoadOptions) -> Result<Vec<f32>> {
    let mut m = LlamaModel::load(dir, opts)?;
    let s = m.open_session(None)?;
    Ok(m.forward(s, &[1, 17, 5])?.as_slice().to_vec())
}

/// A bias the config does not declare, or a layer past `num_hidden_layers`, would change
/// what the checkpoint computes: the load names them, and loads without them only when told.
#[test]
fn unused_tensors_are_refused_by_name_unless_allowed() -> Result<()> {
    let clean = first_logits(&fixture("llama_tied"), &cpu_f32())?;
    let dir = copy_fixture("llama_tied", "unused")?;
    add_tensors(
        &dir,
        &[
            ("model.layers.0.self_attn.o_proj.bias", "model.norm.weight"),
            ("model.layers.2.mlp.down_proj.weight", "model.layers.1.mlp.down_proj.weight"),
            // transformers skips these too: old checkpoints stored RoPE frequencies per layer.
            ("model.layers.0.self_attn.rotary_emb.inv_freq", "model.norm.weight"),
        ],
    )?;
    let err = load_err(&dir);
    match &err {
        ModelError::UnusedTensors { tensors, path } => {
            assert_eq!(tensors, &["model.layers.0.self_attn.o_proj.bias", "model.layers.2.mlp.down_proj.weight"]);
            assert!(path.ends_with("model.safetensors"));
        }
        other => panic!("expected UnusedTensors, got {other}"),
    }
    let message = err.to_string();
    assert!(message.contains("model.layers.2.mlp.down_proj.weight") && message.contains("--allow-unused-weights"));
    let allowed = first_logits(&dir, &LoadOptions { allow_unused_weights: true, ..cpu_f32() })?;
    assert_eq!(allowed, clean, "allowed, the unused tensors are skipped");
    Ok(())
}

/// transformers' MistralConfig windows a config that has no `sliding_window` key (its
/// default, which the fixture generator reads from transformers); `null` means no window.
#[test]
fn a_mistral_config_without_the_window_key_gets_transformers_default() -> Result<()> {
    let defaults: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(common::fixtures_dir().join("defaults.json"))?)?;
    let expected = defaults["mistral_sliding_window"].as_u64().map(|w| w as usize);
    assert!(expected.is_some(), "transformers gives Mistral a window by default");
    let dir = copy_fixture("mistral_window", "nowindow")?;
    let path = dir.join("config.json");
    let mut cfg: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&path)?)?;
    cfg.as_object_mut().expect("config is an object").remove("sliding_window");
    std::fs::write(&path, serde_json::to_string(&cfg)?)?;
    assert_eq!(LlamaModel::load(&dir, &cpu_f32())?.config().sliding_window, expected);
    edit_config(&dir, "sliding_window", serde_json::Value::Null)?;
    assert_eq!(LlamaModel::load(&dir, &cpu_f32())?.config().sliding_window, None);
    Ok(())
}

/// `--dtype auto`: the checkpoint's dtype on a GPU, f32 on a CPU without bf16 matrix units
/// and bf16 on one with them; an explicit dtype is kept.
#[test]
fn dtype_auto_resolves_by_device_and_cpu() -> Result<()> {
    let m = LlamaModel::load(&fixture("llama_tied"), &LoadOptions { dtype: DType::Auto, ..cpu_f32() })?;
    assert_eq!(m.config().checkpoint_dtype, Some(DType::F32), "config.json's dtype is read");
    let cpu = if specd_model::cpu_features::has_bf16_matrix_units() { DType::Bf16 } else { DType::F32 };
    assert_eq!(m.dtype(), cpu);
    assert_eq!(m.info().dtype, cpu);
    assert_eq!(DType::Auto.resolve(DeviceSpec::Cpu, Some(DType::F16)), cpu, "a CPU ignores the checkpoint's dtype");
    assert_eq!(DType::Auto.resolve(DeviceSpec::Cuda(0), Some(DType::Bf16)), DType::Bf16);
    assert_eq!(DType::Auto.resolve(DeviceSpec::Cuda(0), None), DType::F32);
    assert_eq!(DType::F16.resolve(DeviceSpec::Cpu, Some(DType::Bf16)), DType::F16);
    assert_eq!("auto".parse::<DType>()?, DType::Auto);
    Ok(())
}
