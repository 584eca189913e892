//! The JSON report of a single-client measurement: rates, speedups, acceptance, per-round
//! costs, wire bytes, and the analytic bound next to what was measured.

use serde_json::json;

use super::args::BenchArgs;
use super::statistics::{median, spread};
use super::totals::{Measurement, PassRates, Totals};
use crate::serve::GammaFlag;

/// (1 − α^(γ+1)) / ((1 − α)(γc + 1)), Leviathan et al. (2023) Theorem 3.8, for a real γ
/// (the mean of an adaptive schedule); γ + 1 at α = 1. It counts tokens as token
/// verification commits them; block verification (the default) commits at least as many, so
/// a measured speedup may exceed it by that margin.
fn analytic_bound(alpha: f64, gamma: f64, c: f64) -> f64 {
    let tokens = if alpha >= 1.0 { gamma + 1.0 } else { (1.0 - alpha.powf(gamma + 1.0)) / (1.0 - alpha) };
    tokens / (gamma * c + 1.0)
}

/// The report of `measurement`, taken at `endpoint` over `prompts` prompts.
pub(super) fn single_client(
    args: &BenchArgs,
    endpoint: &str,
    prompts: usize,
    measurement: &Measurement,
) -> serde_json::Value {
    let (base_all, spec_all) = (&measurement.target_only, &measurement.speculative);
    // A pass whose ratio is not a finite number is left out of the spread, as it is null in
    // that pass's entry of `runs`.
    let ratios: Vec<f64> = measurement.passes.iter().map(PassRates::speedup).filter(|r| r.is_finite()).collect();
    let decode_ratios: Vec<f64> =
        measurement.passes.iter().map(PassRates::decode_speedup).filter(|r| r.is_finite()).collect();
    let whole = &spec_all.whole;
    // α and per-round costs from the rounds after each request's first, which also runs the
    // prompt through the models: the decoding steps the bound is made of.
    let (base_decode, spec_decode) = (&base_all.decode, &spec_all.decode);
    let alpha =
        if spec_decode.evaluated == 0 { 0.0 } else { spec_decode.acceptance_sum / spec_decode.evaluated as f64 };
    let mean_gamma = spec_decode.per_round(spec_decode.draft_tokens as f64);
    let draft_step_ms = if spec_decode.draft_tokens == 0 {
        0.0
    } else {
        spec_decode.draft_ns as f64 / spec_decode.draft_tokens as f64 / 1e6
    };
    let target_pass_ms = base_decode.per_round(base_decode.verify_ns as f64) / 1e6;
    let verify_pass_ms = spec_decode.per_round(spec_decode.verify_ns as f64) / 1e6;
    let c = if target_pass_ms > 0.0 { draft_step_ms / target_pass_ms } else { 0.0 };
    let bound = analytic_bound(alpha, mean_gamma, c);
    let speedup_median = median(&ratios);
    let decode_median = median(&decode_ratios);
    // The bound prices a verify pass like one target step; on a CPU a pass over γ + 1 tokens
    // costs more. The same accounting with the measured verify pass says how much of the gap
    // to the bound that explains (the rest is network, hand-offs and the client).
    let tokens_per_round = spec_decode.per_round(spec_decode.tokens as f64);
    let round_ms = mean_gamma * draft_step_ms + verify_pass_ms;
    let bound_measured_verify = if round_ms > 0.0 { tokens_per_round * target_pass_ms / round_ms } else { 0.0 };
    // What a round costs beyond the nodes' own model time: the RPCs, the hand-offs between
    // threads on both sides, and the rule.
    let overhead_ms =
        |t: &Totals| t.per_round(t.round_wall_ns.saturating_sub(t.draft_ns).saturating_sub(t.verify_ns) as f64) / 1e6;
    let runs: Vec<serde_json::Value> = measurement.passes.iter().map(pass_report).collect();
    json!({
        "endpoint": endpoint,
        "prompts": prompts,
        "repeat": args.repeat,
        "max_new_tokens": args.max_new_tokens,
        "temperature": args.temperature,
        "gamma": match args.gamma { GammaFlag::Fixed(g) => json!(g), GammaFlag::Auto => json!("auto") },
        "mean_gamma": mean_gamma,
        "target_only_tokens_per_s": base_all.whole.tokens_per_s(),
        "speculative_tokens_per_s": whole.tokens_per_s(),
        "speedup": spread(&ratios, whole.tokens_per_s() / base_all.whole.tokens_per_s()),
        // The same after each request's first round, and that round's time.
        "decode_speedup": spread(&decode_ratios, spec_decode.tokens_per_s() / base_decode.tokens_per_s()),
        "first_round_ms": { "target_only": base_all.first_round_ms(), "speculative": spec_all.first_round_ms() },
        "alpha": alpha,
        "mean_tokens_per_round": tokens_per_round,
        // After the first rounds: measured tokens per round (target-only rounds of an
        // adaptive γ included), and per drafted round what token and block verification
        // commit in expectation on the very drafts of this run.
        "tokens_per_round": spec_decode.tokens_per_round(),
        "draft_step_ms": draft_step_ms,
        "verify_pass_ms": verify_pass_ms,
        "target_only_pass_ms": target_pass_ms,
        "round_overhead_ms": { "target_only": overhead_ms(base_decode), "speculative": overhead_ms(spec_decode) },
        "c": c,
        "bound": bound,
        "efficiency": if bound > 0.0 { speedup_median / bound } else { 0.0 },
        "decode_efficiency": if bound > 0.0 { decode_median / bound } else { 0.0 },
        "verify_cost_ratio": if target_pass_ms > 0.0 { verify_pass_ms / target_pass_ms } else { 0.0 },
        "bound_with_measured_verify": bound_measured_verify,
        "wire_bytes_per_round": whole.per_round(whole.wire_bytes as f64),
        "wire_bytes_per_round_by_role": {
            "draft": {
                "sent": whole.per_round(whole.wire_bytes_by_role[0] as f64),
                "received": whole.per_round(whole.wire_bytes_by_role[1] as f64),
            },
            "target": {
                "sent": whole.per_round(whole.wire_bytes_by_role[2] as f64),
                "received": whole.per_round(whole.wire_bytes_by_role[3] as f64),
            },
        },
        // What proposed the candidates: a target that loops on its own output makes n-gram
        // drafting look good for the wrong reason, so matches in the prompt and in the output
        // are counted apart.
        "proposer": args.proposer_name(),
        "by_proposer": whole.by_proposer.iter().map(|(k, (proposed, accepted))| {
            (k.clone(), json!({ "proposed": proposed, "accepted": accepted }))
        }).collect::<serde_json::Map<_, _>>(),
        "empty_proposals": whole.empty_proposals,
        "optimistic_attempts": whole.optimistic_attempts,
        "optimistic_hit_rate": if whole.optimistic_attempts == 0 {
            0.0
        } else {
            whole.optimistic_hits as f64 / whole.optimistic_attempts as f64
        },
        "optimistic_pushed_rate": if whole.optimistic_attempts == 0 {
            0.0
        } else {
            whole.optimistic_pushed as f64 / whole.optimistic_attempts as f64
        },
        // Only greedy outputs are comparable: sampled ones draw different random numbers.
        "greedy_agreement": if args.temperature == 0.0 { measurement.agreement.report() } else { serde_json::Value::Null },
        "dtype": args.dtype_label(),
        "openmp_wait": args.openmp_wait(),
        "runs": runs,
    })
}

/// One pass's entry in the report's `runs`.
fn pass_report(pass: &PassRates) -> serde_json::Value {
    json!({
        "target_only_tokens_per_s": pass.target_only_tokens_per_s,
        "speculative_tokens_per_s": pass.speculative_tokens_per_s,
        "speedup": pass.speedup(),
        "decode_target_only_tokens_per_s": pass.decode_target_only_tokens_per_s,
        "decode_speculative_tokens_per_s": pass.decode_speculative_tokens_per_s,
        "decode_speedup": pass.decode_speedup(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bound_matches_the_papers_closed_form() {
        // α = 0.8, γ = 4, c = 0.05: expected tokens 1 + α + … + α⁴ = 3.3616, over γc + 1 = 1.2.
        assert!((analytic_bound(0.8, 4.0, 0.05) - 3.3616 / 1.2).abs() < 1e-12);
        assert_eq!(analytic_bound(0.5, 0.0, 0.3), 1.0);
    }
}
