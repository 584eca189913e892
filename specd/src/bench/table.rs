//! The human-readable form of a single-client `specd bench` report.

/// Prints the report of [`super::report::single_client`] as a table.
pub(super) fn print_table(report: &serde_json::Value) -> std::io::Result<()> {
    let f = |key: &str| report[key].as_f64().unwrap_or(f64::NAN);
    let s = &report["speedup"];
    let g = |key: &str| s[key].as_f64().unwrap_or(f64::NAN);
    outln!(
        "{} prompts × {} passes, {} new tokens each, T = {}, γ = {} (mean {:.2})",
        report["prompts"],
        report["repeat"],
        report["max_new_tokens"],
        report["temperature"],
        report["gamma"],
        f("mean_gamma")
    );
    outln!(
        "target-only   {:>8.1} tokens/s  ({:.2} ms per pass)",
        f("target_only_tokens_per_s"),
        f("target_only_pass_ms")
    );
    outln!(
        "speculative   {:>8.1} tokens/s  ({:.2} tokens per round, verify pass {:.2} ms, draft step {:.2} ms)",
        f("speculative_tokens_per_s"),
        f("mean_tokens_per_round"),
        f("verify_pass_ms"),
        f("draft_step_ms")
    );
    let overhead = &report["round_overhead_ms"];
    outln!(
        "per round     {:.3} ms target-only, {:.3} ms speculative outside the models (RPCs, hand-offs, the rule)",
        overhead["target_only"].as_f64().unwrap_or(f64::NAN),
        overhead["speculative"].as_f64().unwrap_or(f64::NAN)
    );
    outln!("speedup       {:.2}× median ({:.2}–{:.2})", g("median"), g("min"), g("max"));
    let d = &report["decode_speedup"];
    let first = &report["first_round_ms"];
    outln!(
        "after the first round {:.2}× median ({:.2}–{:.2}); first round {:.1} ms target-only, {:.1} ms speculative (it also runs the prompt)",
        d["median"].as_f64().unwrap_or(f64::NAN),
        d["min"].as_f64().unwrap_or(f64::NAN),
        d["max"].as_f64().unwrap_or(f64::NAN),
        first["target_only"].as_f64().unwrap_or(f64::NAN),
        first["speculative"].as_f64().unwrap_or(f64::NAN)
    );
    if report["network"] == "netns" {
        outln!(
            "network       namespaces, RTT draft ↔ coordinator {} ms, coordinator ↔ target {} ms;  {:.0} wire bytes per round",
            f("rtt_ms"),
            f("target_rtt_ms"),
            f("wire_bytes_per_round")
        );
        let role = &report["wire_bytes_per_round_by_role"];
        let b = |who: &str, way: &str| role[who][way].as_f64().unwrap_or(f64::NAN);
        outln!(
            "wire bytes    per round: draft {:.0} sent / {:.0} received, target {:.0} sent / {:.0} received",
            b("draft", "sent"),
            b("draft", "received"),
            b("target", "sent"),
            b("target", "received")
        );
    }
    outln!(
        "acceptance α  {:.3};  bound (1−α^(γ+1))/((1−α)(γc+1)) = {:.2}× with c = {:.3};  measured / bound = {:.2} ({:.2} after the first round)",
        f("alpha"),
        f("bound"),
        f("c"),
        f("efficiency"),
        f("decode_efficiency")
    );
    outln!(
        "a verify pass costs {:.2} target-only passes; with that cost the bound is {:.2}×",
        f("verify_cost_ratio"),
        f("bound_with_measured_verify")
    );
    let per_round = &report["tokens_per_round"];
    if per_round["drafted_rounds"].as_u64().unwrap_or(0) > 0 {
        let e = |key: &str| per_round[key].as_f64().unwrap_or(f64::NAN);
        outln!(
            "tokens per drafted round in expectation on these drafts: token verification {:.3}, block {:.3} ({:.3}×); {} ran",
            e("expected_token"),
            e("expected_block"),
            e("block_over_token"),
            per_round["verification"].as_str().unwrap_or("?")
        );
    }
    let agreement = &report["greedy_agreement"];
    if let Some(identical) = agreement["identical_fraction"].as_f64() {
        outln!(
            "greedy outputs identical to target-only: {:.0}% of {} requests ({:.1}% of tokens before a first difference; {})",
            100.0 * identical,
            agreement["pairs"],
            100.0 * agreement["common_prefix_fraction"].as_f64().unwrap_or(f64::NAN),
            report["dtype"].as_str().unwrap_or("dtype of the endpoint's nodes")
        );
    }
    if let Some(by) = report["by_proposer"].as_object().filter(|by| by.keys().any(|k| k != "model")) {
        let parts: Vec<String> = by.iter().map(|(k, t)| format!("{k} {}/{}", t["accepted"], t["proposed"])).collect();
        outln!(
            "accepted/proposed by proposer: {}; {} rounds proposed nothing",
            parts.join(", "),
            report["empty_proposals"]
        );
    }
    if report["optimistic_attempts"].as_u64().unwrap_or(0) > 0 {
        outln!(
            "optimistic drafting: {:.1}% of rounds served from a block drafted ahead, {:.1}% from one pushed (no wait)",
            100.0 * f("optimistic_hit_rate"),
            100.0 * f("optimistic_pushed_rate")
        );
    }
    Ok(())
}
