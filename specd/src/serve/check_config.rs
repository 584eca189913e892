//! `--check-config`: validate every flag, the model's config and the TLS files without
//! starting anything, and say in one line what would run.

use std::net::SocketAddr;
use std::path::Path;

use clap::Args;
use specd_model::{LlamaConfig, TableModel};
use specd_node::NodeConfig;

use super::service_options::{MetricsOptions, ServiceArgs, TelemetryArgs};
use crate::cli_error::invalid;

/// `--check-config`: validate and exit. Deliberately without an environment variable: a
/// stray `SPECD_CHECK_CONFIG` in a ConfigMap would stop every pod at once.
#[derive(Debug, Clone, Args)]
pub struct CheckArgs {
    /// Validate every flag and environment variable (addresses, numbers, TLS files, the
    /// model's config.json or table file; the weights are not loaded), print one line and
    /// exit: 0 when valid, 2 with the problem otherwise. Starts nothing.
    #[arg(long)]
    pub(super) check_config: bool,
}

/// What `--check-config` says about a model path: a checkpoint directory whose config.json
/// parses and names a supported architecture, with weights beside it; or a table-model
/// file that loads. The weights themselves are not read.
pub(super) fn check_model(path: &Path) -> anyhow::Result<String> {
    let bad = |why: String| invalid(format!("model {}: {why}", path.display()));
    if path.is_dir() {
        let config = LlamaConfig::from_dir(path).map_err(|e| bad(e.to_string()))?;
        let weights = ["model.safetensors", "model.safetensors.index.json"];
        if !weights.iter().any(|w| path.join(w).is_file()) {
            return Err(bad(format!("neither {} nor {} is there", weights[0], weights[1])));
        }
        let tokenizer = if path.join("tokenizer.json").is_file() { "" } else { ", no tokenizer.json" };
        Ok(format!(
            "{} ({:?}, vocabulary {}, context {}{tokenizer})",
            path.display(),
            config.architecture,
            config.vocab_size,
            config.max_position_embeddings
        ))
    } else if path.is_file() {
        TableModel::load(path, None).map_err(|e| bad(e.to_string()))?;
        Ok(format!("{} (table model)", path.display()))
    } else {
        Err(bad("no such file or directory (a checkpoint directory or a table-model .json)".into()))
    }
}

/// Where traces go, for `--check-config`; an endpoint that is not an http(s) URL is invalid.
pub(super) fn traces_summary(telemetry: &TelemetryArgs) -> anyhow::Result<String> {
    let from_env = std::env::var("OTEL_EXPORTER_OTLP_ENDPOINT").ok().filter(|e| !e.is_empty());
    let Some(endpoint) = telemetry.endpoint().or(from_env) else { return Ok(String::new()) };
    let uri: tonic::transport::Uri =
        endpoint.parse().map_err(|e| invalid(format!("OTLP endpoint {endpoint:?} is not a URL: {e}")))?;
    if !matches!(uri.scheme_str(), Some("http" | "https")) || uri.host().is_none() {
        return Err(invalid(format!("OTLP endpoint {endpoint:?}: expected http://HOST:PORT or https://HOST:PORT")));
    }
    Ok(format!(", traces to {endpoint}"))
}

pub(super) fn metrics_summary(metrics: &MetricsOptions) -> String {
    metrics.metrics_listen.map(|a| format!(", metrics on {a}")).unwrap_or_default()
}

/// A node's `--dtype`, and what it resolves to at load where that is already known here (a
/// draft's `auto` on a CPU that multiplies bf16 pairs).
pub(super) fn shown_dtype(role: &str, config: &NodeConfig) -> String {
    let loaded = specd_node::node::load_dtype(role, config);
    if loaded == config.dtype { config.dtype.to_string() } else { format!("{} ({loaded} on this CPU)", config.dtype) }
}

/// `--check-config` of a node role: everything but loading the weights.
pub(super) fn check_node(
    role: &str,
    listen: SocketAddr,
    config: &NodeConfig,
    service: &ServiceArgs,
) -> anyhow::Result<()> {
    // An empty path: a draft whose proposer needs no model.
    let model = if config.model.as_os_str().is_empty() { "none".to_owned() } else { check_model(&config.model)? };
    let traces = traces_summary(&service.telemetry)?;
    let tls = if service.tls.tls_client_ca.is_some() {
        ", mutual TLS"
    } else if service.tls.tls_cert.is_some() {
        ", TLS"
    } else {
        ""
    };
    outln!(
        "config ok: {role} on {listen}{tls}, model {model}, {} {}{}{traces}",
        config.device,
        shown_dtype(role, config),
        metrics_summary(&service.metrics)
    );
    Ok(())
}
