//! The coordinator's flags: its policy (γ, truncation, admission, tokenizer), its HTTP API,
//! and how it reaches TLS nodes.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use clap::Args;
use specd_coordinator::{
    Admission, CoordinatorConfig, CoordinatorTls, Discovery, GammaChoice, HttpConfig, InProcessNodes, RuleVariant,
    ToolCallFormat, TreeSetting,
};
use specd_proto::tls::ClientTls;
use specd_sampling::{MAX_GAMMA, Truncation, Verification};
use tokio::net::TcpListener;

use super::flag_values::{GammaFlag, parse_gamma, parse_on_off, parse_tree};
use super::runtime::bind;
use crate::cli_error::invalid;

/// Options of the coordinator's policy.
#[derive(Debug, Clone, Args)]
pub struct PolicyOptions {
    /// Draft length when a request does not set one: `auto` (adaptive, per session, from
    /// measured acceptance and costs; 0 when drafting does not pay) or a fixed γ (0:
    /// target-only).
    #[arg(long, env = "SPECD_GAMMA", default_value = "auto", value_parser = parse_gamma)]
    gamma: GammaFlag,
    /// The largest γ the adaptive policy may choose.
    #[arg(long, env = "SPECD_MAX_GAMMA", default_value_t = 8)]
    max_gamma: u32,
    /// How the target's pass judges a drafted block: `block` judges it as a whole (Sun et al.,
    /// ICLR 2025) and accepts, in expectation, at least as many candidates from the same pass
    /// as `token`, which stops at the first rejected candidate. Both keep the target's output
    /// law exactly, and greedy output is the same under both.
    #[arg(long, env = "SPECD_VERIFY", default_value = "block")]
    verify: Verification,
    /// Draft trees instead of chains: `W1,W2,...` children under every node at each depth
    /// (`3,1,1`: three alternatives for the next token, each continued by one), `auto` (each
    /// session measures a tree with two alternatives at its first position against the chain,
    /// in tokens per millisecond, and drafts the better), or `off`. One target pass scores
    /// every node, and an exact rule (recursive rejection sampling, docs/rule.md) picks a
    /// path, so the output law is unchanged. A round's depth is capped by its γ; rounds that
    /// ask for log-probabilities, and drafts without a model, use chains; with trees on, no
    /// block is drafted ahead (`--optimistic` is ignored). A tree pays where a
    /// pass over more positions costs little more than one (a GPU, or a slow network between
    /// the nodes); on a CPU a chain usually wins.
    #[arg(long, env = "SPECD_TREE", default_value = "off", value_parser = parse_tree)]
    tree: TreeSetting,
    /// max_new_tokens when a request does not set one.
    #[arg(long, env = "SPECD_MAX_NEW_TOKENS", default_value_t = 256)]
    max_new_tokens: u32,
    /// The draft keeps the smallest set of tokens holding 1 - epsilon of q's mass ...
    #[arg(long, env = "SPECD_TRUNCATION_EPSILON", default_value_t = 1e-4)]
    truncation_epsilon: f64,
    /// ... but at most this many (sparse wire format).
    #[arg(long, env = "SPECD_TRUNCATION_MAX_ENTRIES", default_value_t = 64)]
    truncation_max_entries: usize,
    /// Clients must send `authorization: Bearer <token>` (health and reflection stay open).
    #[arg(long, env = "SPECD_API_TOKEN", hide_env_values = true)]
    api_token: Option<String>,
    /// Generations in flight at once; more are refused with RESOURCE_EXHAUSTED (0: no limit).
    #[arg(long, env = "SPECD_MAX_GENERATIONS", default_value_t = 512)]
    max_generations: usize,
    /// Deadline of each call to a node, and of connecting to one, in seconds.
    #[arg(long, env = "SPECD_NODE_TIMEOUT_S", default_value_t = 30.0)]
    node_timeout_s: f64,
    /// Optimistic drafting: `on` asks the draft to draft each next block while the target
    /// verifies this one (guessing every candidate accepted and the bonus token); a right
    /// guess saves the next round its draft time. Exact either way. Off by default: it pays
    /// when the draft has cores of its own (another machine or pod); when draft and target
    /// share cores (`specd up` on a small machine) the work drafted ahead slows the verify.
    #[arg(long, env = "SPECD_OPTIMISTIC", default_value = "off", value_parser = parse_on_off, action = clap::ArgAction::Set)]
    optimistic: bool,
    /// The model directory whose tokenizer.json (and tokenizer_config.json's chat template,
    /// generation_config.json) the coordinator uses; unset: the target node sends its own when
    /// the coordinator connects.
    #[arg(long, env = "SPECD_TOKENIZER")]
    tokenizer: Option<PathBuf>,
    /// `auto`: the model's generation_config.json (temperature, top_p, top_k,
    /// repetition_penalty, do_sample) supplies the defaults of what a request leaves unset, as
    /// in transformers and vLLM; `none`: specd's own defaults (T = 1, no truncation).
    #[arg(long, env = "SPECD_GENERATION_CONFIG", default_value = "auto", value_parser = parse_generation_config)]
    generation_config: bool,
}

/// `auto` or `none`.
fn parse_generation_config(s: &str) -> Result<bool, String> {
    match s {
        "auto" => Ok(true),
        "none" => Ok(false),
        other => Err(format!("{other:?}: expected auto or none")),
    }
}

impl PolicyOptions {
    /// The defaults `specd coordinator` starts with (and the `SPECD_*` variables set).
    pub(crate) fn defaults() -> anyhow::Result<Self> {
        #[derive(clap::Parser)]
        struct Only {
            #[command(flatten)]
            policy: PolicyOptions,
        }
        Ok(<Only as clap::Parser>::try_parse_from(["specd"])?.policy)
    }

    pub(crate) fn config(&self, targets: Vec<String>, drafts: Vec<String>) -> anyhow::Result<CoordinatorConfig> {
        if self.max_new_tokens == 0 {
            return Err(invalid("--max-new-tokens must be at least 1"));
        }
        let gamma = match self.gamma {
            GammaFlag::Fixed(g) if g > MAX_GAMMA => {
                return Err(invalid(format!("--gamma {g} is above the maximum {MAX_GAMMA}")));
            }
            GammaFlag::Fixed(g) => GammaChoice::Fixed(g),
            GammaFlag::Auto if self.max_gamma > MAX_GAMMA => {
                return Err(invalid(format!("--max-gamma {} is above the maximum {MAX_GAMMA}", self.max_gamma)));
            }
            GammaFlag::Auto => GammaChoice::Adaptive { max: self.max_gamma },
        };
        let truncation = Truncation::new(self.truncation_epsilon, self.truncation_max_entries)
            .map_err(|e| invalid(format!("--truncation-*: {e}")))?;
        if !(self.node_timeout_s.is_finite() && self.node_timeout_s > 0.0) {
            return Err(invalid(format!("--node-timeout-s {} must be positive", self.node_timeout_s)));
        }
        Ok(CoordinatorConfig {
            targets,
            drafts,
            default_gamma: gamma,
            default_max_new_tokens: self.max_new_tokens,
            truncation,
            node_timeout: Duration::from_secs_f64(self.node_timeout_s),
            rule: RuleVariant::Exact,
            verification: self.verify,
            optimistic: self.optimistic,
            tree: self.tree.clone(),
            tls: CoordinatorTls::default(),
            admission: Admission {
                api_token: self.api_token.clone().filter(|t| !t.is_empty()),
                max_generations: (self.max_generations > 0).then_some(self.max_generations),
            },
            metrics: None,
            discovery: Discovery::default(),
            tokenizer: self.tokenizer.clone(),
            generation_config: self.generation_config,
            in_process: InProcessNodes::default(),
        })
    }
}

/// The OpenAI-compatible HTTP API of a coordinator.
#[derive(Debug, Clone, Args)]
pub struct HttpOptions {
    /// Where to serve the OpenAI-compatible HTTP API (/v1/completions, /v1/chat/completions,
    /// /v1/models, /health), or `off`. `specd up` serves it on 127.0.0.1:8000 by default.
    #[arg(long, env = "SPECD_HTTP_LISTEN", value_parser = parse_http_listen)]
    http_listen: Option<HttpListen>,
    /// The model name HTTP clients must send; unset: the target model directory's name.
    #[arg(long, env = "SPECD_SERVED_MODEL_NAME")]
    served_model_name: Option<String>,
    /// The syntax the model writes tool calls in, for chat requests with `tools`: hermes
    /// (`<tool_call>` JSON, Qwen2.5), llama3 (`{"name", "parameters"}`, Llama 3.1) or mistral
    /// (`[TOOL_CALLS]`), or `auto`: the one the model's chat template shows.
    #[arg(long, env = "SPECD_TOOL_CALL_FORMAT", default_value = "auto", value_parser = parse_tool_call_format)]
    tool_call_format: ToolCallFormatChoice,
}

/// `--tool-call-format`: a format, or `auto` (`None`).
#[derive(Debug, Clone, Copy)]
pub struct ToolCallFormatChoice(Option<ToolCallFormat>);

fn parse_tool_call_format(s: &str) -> Result<ToolCallFormatChoice, String> {
    match s {
        "auto" => Ok(ToolCallFormatChoice(None)),
        _ => s.parse().map(|f| ToolCallFormatChoice(Some(f))).map_err(|e| format!("{e} or auto")),
    }
}

/// `--http-listen`: an address, or `off`.
#[derive(Debug, Clone, Copy)]
pub struct HttpListen(Option<SocketAddr>);

fn parse_http_listen(s: &str) -> Result<HttpListen, String> {
    match s {
        "off" => Ok(HttpListen(None)),
        _ => s.parse().map(|a| HttpListen(Some(a))).map_err(|e| format!("{s:?}: {e} (expected HOST:PORT or off)")),
    }
}

impl HttpOptions {
    /// The address to serve on: the flag's, else `default`.
    fn address(&self, default: Option<SocketAddr>) -> Option<SocketAddr> {
        self.http_listen.map_or(default, |l| l.0)
    }

    /// Binds the HTTP API's address, if any, and says where it is.
    pub(super) async fn bind(&self, default: Option<SocketAddr>) -> anyhow::Result<Option<(TcpListener, HttpConfig)>> {
        let Some(addr) = self.address(default) else { return Ok(None) };
        let listener = bind(addr).await?;
        let config =
            HttpConfig { served_model_name: self.served_model_name.clone(), tool_call_format: self.tool_call_format.0 };
        Ok(Some((listener, config)))
    }

    pub(super) fn summary(&self, default: Option<SocketAddr>) -> String {
        self.address(default).map(|a| format!(", HTTP API on {a}")).unwrap_or_default()
    }
}

/// Says where the HTTP API answers, before `listening on` (which tests and scripts wait for).
pub(super) fn announce_http(http: Option<&(TcpListener, HttpConfig)>) -> anyhow::Result<()> {
    if let Some((listener, _)) = http {
        outln!("OpenAI-compatible HTTP API on http://{}/v1", listener.local_addr()?);
    }
    Ok(())
}

/// How the coordinator reaches TLS nodes (`https://` URLs).
#[derive(Debug, Clone, Args)]
pub struct NodeTlsArgs {
    /// PEM CA that signed the nodes' certificates; turns TLS to the nodes on.
    #[arg(long, env = "SPECD_NODE_TLS_CA")]
    node_tls_ca: Option<PathBuf>,
    /// PEM client certificate for nodes that require mutual TLS; with --node-tls-key.
    #[arg(long, env = "SPECD_NODE_TLS_CERT")]
    node_tls_cert: Option<PathBuf>,
    /// PEM private key of --node-tls-cert.
    #[arg(long, env = "SPECD_NODE_TLS_KEY")]
    node_tls_key: Option<PathBuf>,
    /// Name the nodes' certificates carry, when it is not the host of their URLs.
    #[arg(long, env = "SPECD_NODE_TLS_DOMAIN")]
    node_tls_domain: Option<String>,
}

impl NodeTlsArgs {
    pub(super) fn tls(&self) -> anyhow::Result<ClientTls> {
        let tls = ClientTls {
            ca: self.node_tls_ca.clone(),
            cert: self.node_tls_cert.clone(),
            key: self.node_tls_key.clone(),
            domain: self.node_tls_domain.clone(),
        };
        tls.config("check").map_err(|e| invalid(e.to_string()))?;
        Ok(tls)
    }
}
