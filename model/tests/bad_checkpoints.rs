//! Bad checkpoints give typed errors naming the file and tensor, never a panic.

mod common;

use std::path::{Path, PathBuf};

use anyhow::Result;
use common::{cpu_f32, fixture};
use specd_model::{LlamaModel, ModelError, load_model};

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
    edit_config(&dir, "rope_parameters", serde_json::json!({"rope_type": "yarn", "factor": 2.0}))?;
    let err = load_err(&dir);
    assert!(matches!(&err, ModelError::InvalidFile { message, .. } if message.contains("yarn")), "{err}");
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
fn unsupported_dtype_fails_only_when_the_tensor_is_needed() -> Result<()> {
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
    // An unrelated integer tensor is ignored.
    write(false)?;
    LlamaModel::load(&dir, &cpu_f32())?;
    // A needed tensor in an unsupported dtype is a typed error naming it.
    write(true)?;
    let err = load_err(&dir);
    assert!(
        matches!(&err, ModelError::TensorDtype { tensor, dtype, .. } if tensor == "lm_head.weight" && dtype == "I32"),
        "{err}"
    );
    Ok(())
}
