//! specd-node: what the draft and target roles share, so that each role's crate holds only
//! its own round work (`propose` or `verify`) and its service.
//!
//! - [`node`]: [`Node`] (a model on its worker thread, the open sessions, `NodeInfo`),
//!   [`NodeConfig`] (with the metrics the node samples) and the per-session [`SessionState`]
//!   (with the draft's [`Lookahead`], its block drafted ahead);
//! - [`block_masks`]: [`BlockMasks`], how a constrained block's rows are masked (a wrong
//!   way kept for the law audit's power);
//! - [`constraint`]: [`FollowedConstraint`], a session's output constraint kept on its
//!   committed output, and the masks of a block's rows;
//! - [`distributions`]: [`Distributions`], where a node turns logits into distributions
//!   (the host, or the model's device with `specd-device-sampling`);
//! - [`node_model`]: a model handle with a registry of sessions of any state type, and the
//!   snapshot/run/store pattern that keeps a failed job from corrupting a session;
//! - [`registry`]: the open sessions by the coordinator's session id;
//! - [`history`]: a session's token history and how it follows the coordinator's rollback
//!   points;
//! - [`round_stream`]: a session's rounds served on one long-lived stream;
//! - [`spans`]: the node-side spans of a request's trace;
//! - [`faults`]: [`NodeFaults`], what a test tells a node to do wrong (nothing without the
//!   `testing` feature);
//! - [`error`]: [`NodeError`] and its one table of gRPC status codes; [`NodeServeError`].

pub mod block_masks;
pub mod constraint;
pub mod distributions;
pub mod error;
pub mod faults;
pub mod history;
pub mod node;
pub mod node_model;
pub mod registry;
pub mod round_stream;
pub mod spans;

pub use block_masks::BlockMasks;
pub use constraint::FollowedConstraint;
pub use distributions::Distributions;
pub use error::{NodeError, NodeServeError};
pub use faults::NodeFaults;
pub use history::{CatchUp, SessionHistory};
pub use node::{Lookahead, Node, NodeConfig, SessionState};
pub use node_model::{NodeModel, NodeSessionError, NodeSessionState};
pub use registry::{RegistryError, SessionRegistry};
pub use round_stream::{ReplySender, ReplyStream, serve_rounds, serve_rounds_lending};
