//! Parsers of flag values that the roles share with other subcommands (`bench`, `logits`,
//! `models`): a device, a dtype, an engine, attention's key lengths and kernel, a draft length, on or off,
//! how rounds reach nodes in the same process.

use specd_coordinator::TreeSetting;
use specd_model::{AttentionKernel, DType, DeviceSpec, Engine, KeyLengths, ModelError};

pub(crate) fn parse_device(s: &str) -> Result<DeviceSpec, String> {
    s.parse().map_err(|e: ModelError| e.to_string())
}

pub(crate) fn parse_dtype(s: &str) -> Result<DType, String> {
    s.parse().map_err(|e: ModelError| e.to_string())
}

pub(crate) fn parse_engine(s: &str) -> Result<Engine, String> {
    s.parse().map_err(|e: ModelError| e.to_string())
}

pub(crate) fn parse_key_lengths(s: &str) -> Result<KeyLengths, String> {
    s.parse().map_err(|e: ModelError| e.to_string())
}

pub(crate) fn parse_attention_kernel(s: &str) -> Result<AttentionKernel, String> {
    s.parse().map_err(|e: ModelError| e.to_string())
}

/// `--gamma`: `auto` or a number.
#[derive(Debug, Clone, Copy)]
pub enum GammaFlag {
    Auto,
    Fixed(u32),
}

pub(crate) fn parse_gamma(s: &str) -> Result<GammaFlag, String> {
    if s == "auto" {
        return Ok(GammaFlag::Auto);
    }
    s.parse().map(GammaFlag::Fixed).map_err(|_| format!("{s:?} is neither `auto` nor a whole number"))
}

/// `off`, `auto` or children per depth, `W1,W2,...`.
pub(crate) fn parse_tree(s: &str) -> Result<TreeSetting, String> {
    match s {
        "off" => Ok(TreeSetting::Off),
        "auto" => Ok(TreeSetting::Auto),
        shape => shape.parse().map(TreeSetting::Shape).map_err(|e| format!("{e} (or `off`, `auto`)")),
    }
}

/// `on` or `off`.
pub(crate) fn parse_on_off(s: &str) -> Result<bool, String> {
    match s {
        "on" | "true" | "1" => Ok(true),
        "off" | "false" | "0" => Ok(false),
        other => Err(format!("{other:?}: expected on or off")),
    }
}

/// How a coordinator in this process sends its round streams to these nodes
/// (`--round-transport`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum RoundTransport {
    /// Handed over on channels through the nodes' handles (`specd_proto::in_process`): no
    /// encoding, HTTP/2 or socket in between.
    #[default]
    InProcess,
    /// Over loopback gRPC, as to nodes on other machines.
    Grpc,
}

impl RoundTransport {
    /// How `--check-config` says it.
    pub fn summary(self) -> &'static str {
        match self {
            Self::InProcess => "in process",
            Self::Grpc => "over loopback gRPC",
        }
    }
}
