//! `specd target`, `specd draft`, `specd coordinator` and `specd up`: the roles as servers.
//!
//! Each prints `listening on HOST:PORT` once it is ready to take requests (model loaded,
//! peers connected) and stops cleanly on Ctrl-C or SIGTERM. With `--metrics-listen` each
//! also serves Prometheus metrics at `GET /metrics` (`specd up`: all three roles on one).

mod check_config;
mod child_args;
mod coordinator;
mod coordinator_options;
mod draft;
mod draft_options;
mod draft_placement;
mod flag_values;
mod loopback;
mod node_options;
mod runtime;
mod service_options;
mod shared_budget;
mod shutdown;
mod target;
mod up;

pub use coordinator::{CoordinatorArgs, run_coordinator};
pub use draft::{DraftArgs, run_draft};
pub use target::{TargetArgs, run_target};
pub use up::{UpArgs, run_up};

// What other subcommands share with the roles: `bench` starts nodes and a coordinator with
// the same flags, `delay-proxy` listens and stops as a role does, `logits` and `models` load
// models.
pub(crate) use coordinator_options::PolicyOptions;
pub(crate) use draft_options::{DraftOptions, ProposerOptions};
pub(crate) use flag_values::{
    GammaFlag, RoundTransport, parse_device, parse_dtype, parse_engine, parse_gamma, parse_on_off, parse_tree,
};
pub(crate) use loopback::LoopbackNodes;
pub(crate) use node_options::NodeOptions;
pub(crate) use runtime::bind;
pub(crate) use shutdown::shutdown_signal;
