//! `specd logits`: score tokens with a model and print the logits of every position.
//!
//! Row `i` of the output scores the token that follows input token `i`, which is what the
//! target node computes for a speculative block. `--model` takes a Hugging Face checkpoint
//! directory (Llama, Mistral, Qwen2, Qwen3, Gemma 3 text) or a table-model `.json` file (format in
//! `specd_model::table`).

use std::path::PathBuf;

use std::io::Write;

use specd_model::{DType, DeviceSpec, Engine, LoadOptions, Logits, ModelError, ModelInfo, ModelWorker, load_model};

use crate::cli_error::invalid;
use crate::serve::{parse_device, parse_dtype, parse_engine};

/// Score a run of tokens with a model: logits for every position, in one forward pass.
#[derive(Debug, clap::Args)]
pub struct LogitsArgs {
    /// Checkpoint directory (config.json, safetensors, tokenizer.json) or table-model .json.
    #[arg(long, env = "SPECD_MODEL")]
    pub model: PathBuf,

    /// Token ids, comma-separated.
    #[arg(
        long,
        env = "SPECD_TOKENS",
        value_delimiter = ',',
        num_args = 1..,
        conflicts_with = "text",
        required_unless_present = "text"
    )]
    pub tokens: Option<Vec<u32>>,

    /// Text to encode with the model's tokenizer (special tokens added as transformers does).
    #[arg(long, env = "SPECD_TEXT")]
    pub text: Option<String>,

    /// cpu or cuda:N.
    #[arg(long, env = "SPECD_DEVICE", default_value = "cpu", value_parser = parse_device)]
    pub device: DeviceSpec,

    /// f32, f16, bf16 or f64 (logits are printed as f32 in every case).
    #[arg(long, env = "SPECD_DTYPE", default_value = "f32", value_parser = parse_dtype)]
    pub dtype: DType,

    /// What computes the pass: auto, libtorch or host (see `specd target --help`).
    #[arg(long, env = "SPECD_ENGINE", default_value = "auto", value_parser = parse_engine)]
    pub engine: Engine,

    /// Print `{"tokens": [...], "logits": [[...], ...]}` instead of a summary.
    #[arg(long, env = "SPECD_JSON")]
    pub json: bool,
}

/// Runs the subcommand.
pub fn run(args: &LogitsArgs) -> anyhow::Result<()> {
    let opts = LoadOptions { device: args.device, dtype: args.dtype, engine: args.engine, ..LoadOptions::default() };
    let path = args.model.clone();
    let handle = ModelWorker::spawn("specd-logits", 1, move || load_model(&path, &opts))
        .map_err(|e| user_error(e, "cannot load the model"))?;
    let tokens = match (&args.tokens, &args.text) {
        (Some(t), _) => t.clone(),
        (None, Some(text)) => {
            handle.encode_blocking(text.clone()).map_err(|e| user_error(e, "cannot encode --text"))?
        }
        (None, None) => return Err(invalid("pass --tokens or --text")),
    };
    if tokens.is_empty() {
        return Err(invalid("no tokens to score"));
    }
    let session =
        handle.open_session_blocking(Some(tokens.len())).map_err(|e| user_error(e, "cannot open a session"))?;
    let logits = handle.forward_blocking(session, tokens.clone()).map_err(|e| user_error(e, "forward pass failed"))?;
    handle.release_blocking(session)?;
    let mut out = std::io::stdout().lock();
    let written = if args.json {
        let value = serde_json::json!({ "tokens": tokens, "logits": logits.to_rows() });
        writeln!(out, "{value}")
    } else {
        summary(&mut out, handle.info(), args, &tokens, &logits)
    };
    match written {
        Err(e) if e.kind() != std::io::ErrorKind::BrokenPipe => Err(e.into()),
        _ => Ok(()),
    }
}

fn summary(
    out: &mut impl Write,
    info: &ModelInfo,
    args: &LogitsArgs,
    tokens: &[u32],
    logits: &Logits,
) -> std::io::Result<()> {
    writeln!(
        out,
        "{} ({}), vocab {}, {} positions on {} {} ({} engine)",
        info.name,
        info.architecture,
        info.vocab_size,
        logits.rows(),
        args.device,
        info.dtype,
        info.engine
    )?;
    for (i, row) in logits.iter_rows().enumerate() {
        let mut top: Vec<(usize, f32)> = row.iter().copied().enumerate().collect();
        top.sort_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0)));
        let best: Vec<String> = top.iter().take(5).map(|(id, l)| format!("{id}:{l:.4}")).collect();
        writeln!(out, "pos {i} token {} -> top {}", tokens[i], best.join(" "))?;
    }
    Ok(())
}

/// Bad input (token ids, text, capacity) exits 2; everything else keeps its cause chain.
fn user_error(e: ModelError, what: &str) -> anyhow::Error {
    match e {
        ModelError::InvalidInput(_)
        | ModelError::ContextOverflow { .. }
        | ModelError::Device(_)
        | ModelError::MissingFile { .. }
        | ModelError::UnsupportedArchitecture { .. } => invalid(format!("{what}: {e}")),
        other => anyhow::Error::new(other).context(what.to_owned()),
    }
}
