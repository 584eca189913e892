//! Writes one model of the pair as a Hugging Face checkpoint directory that transformers and
//! [`specd_model::LlamaModel::load`] both read: `config.json`, `generation_config.json`,
//! `model.safetensors`, `tokenizer.json`, `tokenizer_config.json`; a build's stage adds the
//! key it was built from, a shipped model its `SHA256SUMS`.

use std::path::{Path, PathBuf};

use serde_json::{Value, json};
use specd_model::LlamaConfig;
use specd_model::checksums::{CHECKSUMS_FILE, sha256_of};
use tch::nn::VarStore;
use tch::{Kind, Tensor};

use crate::error::{DemoError, Result};
use crate::spec::END_OF_TEXT_STR;

/// The file that records which build a stage directory holds.
pub const BUILD_FILE: &str = "specd-build.json";

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> DemoError + '_ {
    move |source| DemoError::Io { path: path.to_owned(), source }
}

pub fn write_json(path: &Path, value: &Value) -> Result<()> {
    let text = serde_json::to_string_pretty(value).unwrap_or_default();
    std::fs::write(path, text + "\n").map_err(io(path))
}

/// The number format a checkpoint's weights are written in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WeightsFormat {
    F32,
    /// Half the bytes; what the shipped target is stored as.
    Bf16,
}

impl WeightsFormat {
    fn kind(self) -> Kind {
        match self {
            Self::F32 => Kind::Float,
            Self::Bf16 => Kind::BFloat16,
        }
    }

    /// The name transformers reads in `config.json`'s `torch_dtype`.
    fn torch_dtype(self) -> &'static str {
        match self {
            Self::F32 => "float32",
            Self::Bf16 => "bfloat16",
        }
    }
}

pub(crate) fn config_json(cfg: &LlamaConfig, format: WeightsFormat) -> Value {
    json!({
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "vocab_size": cfg.vocab_size,
        "hidden_size": cfg.hidden_size,
        "intermediate_size": cfg.intermediate_size,
        "num_hidden_layers": cfg.num_hidden_layers,
        "num_attention_heads": cfg.num_attention_heads,
        "num_key_value_heads": cfg.num_key_value_heads,
        "head_dim": cfg.head_dim,
        "hidden_act": "silu",
        "max_position_embeddings": cfg.max_position_embeddings,
        "rms_norm_eps": cfg.rms_norm_eps,
        "rope_theta": cfg.rope_theta,
        "rope_parameters": {"rope_type": "default", "rope_theta": cfg.rope_theta},
        "tie_word_embeddings": cfg.tie_word_embeddings,
        "attention_bias": false,
        "mlp_bias": false,
        "bos_token_id": cfg.bos_token_id,
        "eos_token_id": cfg.eos_token_ids.first(),
        "torch_dtype": format.torch_dtype(),
    })
}

/// How a checkpoint directory is written: a build's stage (f32, with the key it was built
/// from) or a shipped model (its own number format, with `SHA256SUMS` checked at load).
#[derive(Debug, Clone, Copy)]
pub enum CheckpointKind<'a> {
    Stage { build: &'a Value },
    Shipped { format: WeightsFormat },
}

/// Writes the checkpoint into `dir` (created or replaced whole: files go to a sibling
/// temporary directory first, so an interrupted build never leaves half a model).
pub fn write_checkpoint(
    dir: &Path,
    cfg: &LlamaConfig,
    vs: &VarStore,
    tokenizer_json: &Path,
    kind: CheckpointKind<'_>,
) -> Result<()> {
    let format = match kind {
        CheckpointKind::Stage { .. } => WeightsFormat::F32,
        CheckpointKind::Shipped { format } => format,
    };
    let tmp = temporary_sibling(dir);
    let _ = std::fs::remove_dir_all(&tmp);
    std::fs::create_dir_all(&tmp).map_err(io(&tmp))?;
    write_json(&tmp.join("config.json"), &config_json(cfg, format))?;
    write_json(
        &tmp.join("generation_config.json"),
        &json!({"bos_token_id": cfg.bos_token_id, "eos_token_id": cfg.eos_token_ids, "do_sample": true}),
    )?;
    write_json(
        &tmp.join("tokenizer_config.json"),
        &json!({
            "tokenizer_class": "PreTrainedTokenizerFast",
            "bos_token": END_OF_TEXT_STR,
            "eos_token": END_OF_TEXT_STR,
            "model_max_length": cfg.max_position_embeddings,
            "clean_up_tokenization_spaces": false,
        }),
    )?;
    let tok_dst = tmp.join("tokenizer.json");
    std::fs::copy(tokenizer_json, &tok_dst).map_err(io(tokenizer_json))?;
    write_weights_as(vs, &tmp.join("model.safetensors"), format)?;
    match kind {
        CheckpointKind::Stage { build } => write_json(&tmp.join(BUILD_FILE), build)?,
        CheckpointKind::Shipped { .. } => write_checksums(&tmp)?,
    }
    replace_dir(&tmp, dir)
}

/// Lists every file of `dir` with its SHA-256 in `dir/SHA256SUMS`, as `sha256sum` writes it
/// (so `sha256sum -c SHA256SUMS` checks it too), in name order.
pub fn write_checksums(dir: &Path) -> Result<()> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .map_err(io(dir))?
        .flatten()
        .filter(|e| e.file_type().is_ok_and(|t| t.is_file()))
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n != CHECKSUMS_FILE)
        .collect();
    names.sort();
    let mut text = String::new();
    for name in names {
        let path = dir.join(&name);
        let digest = sha256_of(&path).map_err(io(&path))?;
        text.push_str(&format!("{digest}  {name}\n"));
    }
    let list = dir.join(CHECKSUMS_FILE);
    std::fs::write(&list, text).map_err(io(&list))
}

/// Writes the variables of `vs` to one safetensors file, in name order and from the host: a
/// model trained on a GPU is written like one trained here.
pub fn write_weights(vs: &VarStore, path: &Path) -> Result<()> {
    write_weights_as(vs, path, WeightsFormat::F32)
}

fn write_weights_as(vs: &VarStore, path: &Path, format: WeightsFormat) -> Result<()> {
    let mut named: Vec<(String, Tensor)> = vs
        .variables()
        .into_iter()
        .map(|(name, t)| Ok((name, t.f_to_device(tch::Device::Cpu)?.f_to_kind(format.kind())?.f_contiguous()?)))
        .collect::<Result<_>>()?;
    named.sort_by(|a, b| a.0.cmp(&b.0));
    Tensor::write_safetensors(&named, path)?;
    Ok(())
}

/// Moves `from` to `to`, replacing what was there.
pub fn replace_dir(from: &Path, to: &Path) -> Result<()> {
    if to.exists() {
        std::fs::remove_dir_all(to).map_err(io(to))?;
    }
    std::fs::rename(from, to).map_err(io(to))
}

pub fn temporary_sibling(dir: &Path) -> PathBuf {
    let name = dir.file_name().map_or_else(|| "stage".into(), |n| n.to_string_lossy().into_owned());
    dir.with_file_name(format!(".{name}.tmp{}", std::process::id()))
}

/// The build record of a stage directory, if it has one that parses.
pub fn read_build(dir: &Path) -> Option<Value> {
    let text = std::fs::read_to_string(dir.join(BUILD_FILE)).ok()?;
    serde_json::from_str(&text).ok()
}

/// Loads exported weights back into a store declared with the same shape (a cached stage).
pub fn read_weights(vs: &VarStore, dir: &Path) -> Result<()> {
    read_weights_file(vs, &dir.join("model.safetensors"))
}

/// Loads weights [`write_weights`] wrote into a store declared with the same shape.
pub fn read_weights_file(vs: &VarStore, path: &Path) -> Result<()> {
    let _no_grad = tch::no_grad_guard();
    vs.read_safetensors(path)?;
    Ok(())
}
