//! Span attribute names. GenAI semantic-convention names where one exists (the
//! `opentelemetry-semantic-conventions` crate marks them deprecated or experimental, so they
//! are spelled out here once), `specd.*` for the speculative round.

pub const OPERATION_NAME: &str = "gen_ai.operation.name";
pub const REQUEST_MODEL: &str = "gen_ai.request.model";
pub const REQUEST_TEMPERATURE: &str = "gen_ai.request.temperature";
pub const REQUEST_TOP_P: &str = "gen_ai.request.top_p";
pub const REQUEST_TOP_K: &str = "gen_ai.request.top_k";
pub const REQUEST_MAX_TOKENS: &str = "gen_ai.request.max_tokens";
pub const REQUEST_SEED: &str = "gen_ai.request.seed";
pub const USAGE_INPUT_TOKENS: &str = "gen_ai.usage.input_tokens";
pub const USAGE_OUTPUT_TOKENS: &str = "gen_ai.usage.output_tokens";
pub const RESPONSE_FINISH_REASONS: &str = "gen_ai.response.finish_reasons";

pub const REQUEST_ID: &str = "specd.request_id";
pub const SESSION_ID: &str = "specd.session_id";
pub const DRAFT_MODEL: &str = "specd.draft.model";
pub const ROUNDS: &str = "specd.rounds";

pub const ROUND_INDEX: &str = "specd.round.index";
pub const ROUND_GAMMA: &str = "specd.round.gamma";
pub const ROUND_ACCEPTED: &str = "specd.round.accepted";
pub const ROUND_EMITTED: &str = "specd.round.emitted";
pub const ROUND_OPTIMISTIC_HIT: &str = "specd.round.optimistic_hit";
pub const ROUND_DRAFT_NS: &str = "specd.round.draft_ns";
pub const ROUND_VERIFY_NS: &str = "specd.round.verify_ns";
pub const ROUND_NETWORK_NS: &str = "specd.round.network_ns";
pub const ROUND_WIRE_BYTES_SENT: &str = "specd.round.wire_bytes_sent";
pub const ROUND_WIRE_BYTES_RECEIVED: &str = "specd.round.wire_bytes_received";

/// The node-side spans of a round.
pub const NODE_MODEL_NS: &str = "specd.node.model_ns";
pub const NODE_TOKENS: &str = "specd.node.tokens";

/// The value of [`RESPONSE_FINISH_REASONS`] for one generation.
pub fn finish_reasons(reason: &str) -> opentelemetry::Value {
    opentelemetry::Value::Array(opentelemetry::Array::String(vec![reason.to_owned().into()]))
}

/// Marks `span` as failed, with `message` as its status description.
pub fn set_error(span: &tracing::Span, message: String) {
    use tracing_opentelemetry::OpenTelemetrySpanExt as _;
    span.set_status(opentelemetry::trace::Status::error(message));
}
