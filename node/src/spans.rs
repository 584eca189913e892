//! The node-side spans of a request's trace: each is a child of the coordinator's span that
//! caused it (its round span for Propose and Verify, the request span for the rest), carried
//! over by `specd-telemetry`'s propagation.

use std::collections::HashMap;

use specd_telemetry::propagation::{extract_from_map, extract_from_metadata, set_remote_parent};
use tonic::metadata::MetadataMap;
use tracing::Span;

/// The span of one Propose or Verify (`operation`), from the round message's trace context.
pub fn round_span(
    operation: &'static str,
    session_id: &str,
    round: u32,
    trace_context: &HashMap<String, String>,
) -> Span {
    let span = tracing::info_span!("node_round", otel.name = operation, session = %session_id, round);
    set_remote_parent(&span, extract_from_map(trace_context));
    span
}

/// The span of a unary call (`operation`), from its gRPC metadata.
pub fn rpc_span(operation: &'static str, metadata: &MetadataMap) -> Span {
    let span = tracing::info_span!("node_rpc", otel.name = operation);
    set_remote_parent(&span, extract_from_metadata(metadata));
    span
}
