//! Writes one model of the pair as a Hugging Face checkpoint directory that transformers and
//! [`specd_model::LlamaModel::load`] both read: `config.json`, `generation_config.json`,
//! `model.safetensors`, `tokenizer.json`, `tokenizer_config.json`.

use std::path::{Path, PathBuf};

use serde_json::{Value, json};
use specd_model::LlamaConfig;
use tch::Tensor;
use tch::nn::VarStore;

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

fn config_json(cfg: &LlamaConfig) -> Value {
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
        "torch_dtype": "float32",
    })
}

/// Writes the checkpoint into `dir` (created or replaced whole: files go to a sibling
/// temporary directory first, so an interrupted build never leaves half a model).
pub fn write_checkpoint(
    dir: &Path,
    cfg: &LlamaConfig,
    vs: &VarStore,
    tokenizer_json: &Path,
    build: &Value,
) -> Result<()> {
    let tmp = temporary_sibling(dir);
    let _ = std::fs::remove_dir_all(&tmp);
    std::fs::create_dir_all(&tmp).map_err(io(&tmp))?;
    write_json(&tmp.join("config.json"), &config_json(cfg))?;
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
    write_weights(vs, &tmp.join("model.safetensors"))?;
    write_json(&tmp.join(BUILD_FILE), build)?;
    replace_dir(&tmp, dir)
}

/// Writes the variables of `vs` to one safetensors file, in name order and from the host: a
/// model trained on a GPU is written like one trained here.
pub fn write_weights(vs: &VarStore, path: &Path) -> Result<()> {
    let mut named: Vec<(String, Tensor)> = vs
        .variables()
        .into_iter()
        .map(|(name, t)| Ok((name, t.f_to_device(tch::Device::Cpu)?.f_contiguous()?)))
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
