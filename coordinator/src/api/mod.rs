//! The coordinator's faces to its clients: the gRPC `Generation` service and the
//! OpenAI-compatible HTTP API over it, with what both check before a generation starts.
//!
//! - [`grpc`]: the `specd.v1.Generation` service; one session actor per request and a
//!   registry of generations in flight;
//! - [`http`]: `/v1/completions`, `/v1/chat/completions`, `/v1/models`, `/health` (axum);
//! - [`admission`]: bearer token, the limit of generations in flight, client deadlines.

pub mod admission;
pub mod grpc;
pub mod http;
