//! What the coordinator hands to `specd-telemetry`: a round's sample and a finish reason.
//! The session actor records through these so that its own code changes by a line or two.

use specd_proto::v1::FinishReason;
use specd_telemetry::{FinishReason as FinishLabel, RequestMetrics, RoundSample};

use crate::session::round::RoundReport;
use crate::session::round_report::source_name;

/// Records a finished round of which `emitted` tokens go to the client now.
pub fn round(metrics: Option<&RequestMetrics>, report: &RoundReport, emitted: usize) {
    if let Some(metrics) = metrics {
        let sample = RoundSample {
            gamma: report.gamma,
            accepted: report.outcome.accepted,
            draft_ns: report.draft_ns,
            verify_ns: report.verify_ns,
            wall_ns: report.wall_ns,
            optimistic_attempt: report.optimistic_attempt,
            optimistic_hit: report.optimistic_hit,
            sources: report.sources.iter().map(|&source| source_name(source)).collect(),
            empty_proposal: report.empty_proposal(),
        };
        metrics.round(&sample, emitted);
    }
}

/// Records how a generation ended (`None`: it failed); only the first call counts.
pub fn finished(metrics: Option<&RequestMetrics>, reason: Option<FinishReason>) {
    let Some(metrics) = metrics else { return };
    metrics.finish(match reason {
        Some(FinishReason::Length) => FinishLabel::Length,
        Some(FinishReason::Eos) => FinishLabel::Eos,
        Some(FinishReason::Stop) => FinishLabel::Stop,
        Some(FinishReason::Cancelled) => FinishLabel::Cancelled,
        Some(FinishReason::Unspecified) | None => FinishLabel::Error,
    });
}
