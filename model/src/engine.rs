//! `--engine auto|libtorch|host`: the names of what computes a checkpoint's forward passes.
//! What `auto` resolves to is [`crate::engine_choice`]'s.

use std::fmt;
use std::str::FromStr;

use crate::error::{ModelError, Result};

/// What computes a model's passes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Engine {
    /// On the CPU, whichever engine runs the model faster, measured at load where the host
    /// engine can run it; libtorch elsewhere.
    #[default]
    Auto,
    Libtorch,
    Host,
}

impl Engine {
    pub fn name(self) -> &'static str {
        match self {
            Self::Auto => "auto",
            Self::Libtorch => "libtorch",
            Self::Host => "host",
        }
    }
}

impl FromStr for Engine {
    type Err = ModelError;

    fn from_str(s: &str) -> Result<Self> {
        match s {
            "auto" => Ok(Self::Auto),
            "libtorch" => Ok(Self::Libtorch),
            "host" => Ok(Self::Host),
            _ => Err(ModelError::InvalidInput(format!("unknown engine {s:?} (expected auto, libtorch or host)"))),
        }
    }
}

impl fmt::Display for Engine {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}
