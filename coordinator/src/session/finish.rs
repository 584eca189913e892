//! How a generation that ran to its end is recorded: its log line and its span's attributes.

use std::time::Duration;

use specd_proto::v1::FinishReason;
use specd_telemetry::attributes;
use tracing_opentelemetry::OpenTelemetrySpanExt;

use crate::policy::AdaptiveGamma;
use crate::request::GenerationSpec;
use crate::session::stats::Stats;

/// The generation `session_id` of `spec` ended for `finish` with `completion_tokens`
/// generated.
pub fn record_finished(
    session_id: &str,
    spec: &GenerationSpec,
    finish: FinishReason,
    completion_tokens: usize,
    stats: &Stats,
    adaptive: Option<&AdaptiveGamma>,
) {
    tracing::info!(
        session = %session_id,
        request = %spec.request_id,
        finish = ?finish,
        completion_tokens,
        rounds = stats.rounds,
        accepted = stats.accepted_tokens,
        drafted = stats.draft_tokens,
        draft_ms = Duration::from_nanos(stats.draft_ns).as_secs_f64() * 1e3,
        verify_ms = Duration::from_nanos(stats.verify_ns).as_secs_f64() * 1e3,
        adaptive = adaptive.map(AdaptiveGamma::summary),
        "generation finished"
    );
    let span = tracing::Span::current();
    span.set_attribute(attributes::RESPONSE_FINISH_REASONS, attributes::finish_reasons(finish_name(finish)));
    span.set_attribute(attributes::USAGE_OUTPUT_TOKENS, completion_tokens as i64);
    span.set_attribute(attributes::ROUNDS, stats.rounds as i64);
}

/// The finish reason as the span records it.
fn finish_name(reason: FinishReason) -> &'static str {
    match reason {
        FinishReason::Length => "length",
        FinishReason::Eos => "eos",
        FinishReason::Stop => "stop",
        FinishReason::Cancelled => "cancelled",
        FinishReason::Unspecified => "unspecified",
    }
}
