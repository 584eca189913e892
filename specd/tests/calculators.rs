//! `specd rule` and `specd cost` as a user runs them: numbers, JSON shape, errors, exit codes.

use std::process::{Command, Output};

use serde_json::Value;

fn specd(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_specd")).args(args).env_remove("SPECD_JSON").output().expect("specd runs")
}

fn json(args: &[&str]) -> Value {
    let out = specd(args);
    assert!(out.status.success(), "{args:?}: {}", String::from_utf8_lossy(&out.stderr));
    serde_json::from_slice(&out.stdout).expect("one JSON object")
}

fn floats(v: &Value) -> Vec<f64> {
    v.as_array().expect("array").iter().map(|x| x.as_f64().expect("number")).collect()
}

fn assert_close(got: &[f64], want: &[f64], tol: f64) {
    assert_eq!(got.len(), want.len(), "{got:?} vs {want:?}");
    assert!(got.iter().zip(want).all(|(g, w)| (g - w).abs() <= tol), "{got:?} vs {want:?}");
}

/// Asserts exit code 2 and exactly one line on stderr, and returns it.
fn usage_error(args: &[&str]) -> String {
    let out = specd(args);
    assert_eq!(out.status.code(), Some(2), "{args:?}");
    let stderr = String::from_utf8(out.stderr).unwrap();
    assert_eq!(stderr.lines().count(), 1, "{stderr}");
    stderr
}

const WORKED: [&str; 4] = ["--target", "0.6,0.3,0.1", "--draft", "0.5,0.25,0.25"];

#[test]
fn rule_reproduces_the_worked_example() {
    let v = json(&[&["rule"], &WORKED[..], &["--json"]].concat());
    assert_close(&floats(&v["acceptance"]), &[1.0, 1.0, 0.4], 1e-12);
    assert_close(&floats(&v["accepted_mass"]), &[0.5, 0.25, 0.1], 1e-12);
    assert_close(&[v["beta"].as_f64().unwrap()], &[0.85], 1e-12);
    assert_close(&[v["rejection"].as_f64().unwrap()], &[0.15], 1e-12);
    assert_close(&floats(&v["residual"]), &[2.0 / 3.0, 1.0 / 3.0, 0.0], 1e-12);
    assert_close(&floats(&v["output_law"]), &[0.6, 0.3, 0.1], 1e-12);
    assert_close(&floats(&v["naive_law"]), &[0.59, 0.295, 0.115], 1e-12);
    assert!(v.get("empirical").is_none(), "no simulation unless asked");
}

#[test]
fn rule_simulation_passes_for_the_rule_and_fails_for_the_naive_one() {
    let v = json(&[&["rule"], &WORKED[..], &["--simulate", "200000", "--seed", "11", "--json"]].concat());
    assert_close(&floats(&v["empirical"]), &[0.6, 0.3, 0.1], 0.005);
    // False failure probability of this check for a correct sampler: 1e-3.
    assert!(v["chi2_p_value"].as_f64().unwrap() > 1e-3, "{v}");
    assert_close(&floats(&v["naive_empirical"]), &[0.59, 0.295, 0.115], 0.005);
    assert!(v["naive_chi2_p_value"].as_f64().unwrap() < 1e-3, "{v}");
}

#[test]
fn rule_with_equal_distributions_reports_zero_residual_mass() {
    let v = json(&["rule", "--target", "0.6,0.3,0.1", "--draft", "0.6,0.3,0.1", "--json", "--simulate", "1000"]);
    assert_eq!(v["rejection"].as_f64(), Some(0.0));
    assert!(v["residual"].is_null());
    assert_close(&[v["independent_match_acceptance"].as_f64().unwrap()], &[0.46], 1e-12);
    assert_close(&floats(&v["output_law"]), &[0.6, 0.3, 0.1], 1e-12);
}

#[test]
fn rule_table_walks_through_the_derivation() {
    let out = specd(&[&["rule"], &WORKED[..]].concat());
    assert!(out.status.success());
    let text = String::from_utf8(out.stdout).unwrap();
    for needle in
        ["β = Σ min(p, q) = 0.850000", "(0.600000, 0.300000, 0.100000)", "(0.590000, 0.295000, 0.115000): wrong"]
    {
        assert!(text.contains(needle), "missing {needle:?} in\n{text}");
    }
}

#[test]
fn rule_refuses_bad_input_in_one_line() {
    let sum = usage_error(&["rule", "--target", "0.5,0.4", "--draft", "0.5,0.5"]);
    assert!(sum.contains("--target sums to 0.9, not 1"), "{sum}");
    let neg = usage_error(&["rule", "--target", "1.1,-0.1", "--draft", "0.5,0.5"]);
    let leading = usage_error(&["rule", "--target", "-0.1,1.1", "--draft", "0.5,0.5"]);
    assert!(leading.contains("entry 1 is -0.1"), "{leading}");
    assert!(neg.contains("entry 2 is -0.1"), "{neg}");
    let nan = usage_error(&["rule", "--target", "0.5,0.5", "--draft", "NaN,1"]);
    assert!(nan.contains("--draft: entry 1 is NaN"), "{nan}");
    let lengths = usage_error(&["rule", "--target", "0.5,0.5", "--draft", "0.2,0.3,0.5"]);
    assert!(lengths.contains("--target has 2 entries but --draft has 3"), "{lengths}");
    let text = usage_error(&["rule", "--target", "half,0.5", "--draft", "0.5,0.5"]);
    assert!(text.contains("entry 1 ('half') is not a number"), "{text}");
}

#[test]
fn cost_reproduces_the_design_numbers() {
    let base = ["cost", "--gamma", "2", "--alpha", "0.5", "--target-ms", "100", "--json"];
    let v = json(&[&base[..], &["--draft-ms", "20"]].concat());
    let get = |v: &Value, k: &str| v[k].as_f64().unwrap_or_else(|| panic!("{k} in {v}"));
    assert_close(
        &[get(&v, "tokens_per_round"), get(&v, "round_ms"), get(&v, "ms_per_token"), get(&v, "speedup")],
        &[1.75, 140.0, 80.0, 1.25],
        1e-9,
    );
    assert!(get(&v, "best_speedup") >= 1.25 - 1e-9);
    let slow = json(&[&base[..], &["--draft-ms", "50"]].concat());
    assert_close(&[get(&slow, "ms_per_token"), get(&slow, "speedup")], &[114.286, 0.875], 5e-4);
    assert_eq!(slow["best_gamma"].as_u64(), Some(0), "speculation must switch itself off");
    assert_eq!(slow["speculation"], "off");
    let rtt = json(&[&base[..], &["--draft-ms", "20", "--rtt-ms", "40"]].concat());
    assert_close(&[get(&rtt, "round_ms")], &[180.0], 1e-9);
}

#[test]
fn cost_gives_each_verification_rules_tokens_per_round_for_given_distributions() {
    // The worked p and q at both positions of γ = 2, by hand. Ratios p/q: A 1.2, B 1.2, C 0.4.
    // Token verification: 1 + β + β² with β = 0.85: 2.5725.
    // Block verification: after x_1 ∈ {A, B} (0.75), P_1 = 1, r_1 = Σ max(p − q, 0) = 0.15 and
    // h_1 = 0.15 / 0.15 = 1; then h_2 = P_2 is 1 after A or B and 0.4 after C, so E[τ] =
    // 0.75·2 + 0.25·(2·0.4 + 0.6) = 1.85. After x_1 = C (0.25), P_1 = 0.4, r_1 = 0, h_1 = 0,
    // h_2 = 0.48 after A or B and 0.16 after C: E[τ] = 0.75·0.96 + 0.25·0.32 = 0.8. So
    // E[τ] = 0.75·1.85 + 0.25·0.8 = 1.5875: 2.5875 tokens per round.
    let args = ["cost", "--gamma", "2", "--alpha", "0.85", "--target-ms", "100", "--draft-ms", "20", "--json"];
    let v = json(&[&args[..], &WORKED[..]].concat());
    let by_rule = &v["tokens_per_round_by_rule"];
    let get = |k: &str| by_rule[k].as_f64().unwrap_or_else(|| panic!("{k} in {v}"));
    assert_close(&[get("token"), get("block")], &[2.5725, 2.5875], 1e-12);
    assert_close(&[v["tokens_per_round"].as_f64().unwrap()], &[2.5725], 1e-12);
    assert!(v.get("tokens_per_round_by_rule").is_some_and(|x| x.is_object()));
    // Two children of the prefix, drawn without replacement, by hand: a first child A or B
    // is accepted surely (p/q = 1.2); a first child C is accepted with 0.4, and after its
    // rejection p′ = norm(max(p − q, 0)) = (2/3, 1/3, 0) while the second child comes from q
    // without C, (2/3, 1/3, 0): the same, so it is accepted surely. One candidate accepted
    // every round: 2 tokens per round, against 1.85 for a chain of one.
    let tree = json(&[
        "cost",
        "--gamma",
        "1",
        "--alpha",
        "0.85",
        "--target-ms",
        "100",
        "--draft-ms",
        "20",
        "--json",
        "--tree",
        "2",
        "--target",
        "0.6,0.3,0.1",
        "--draft",
        "0.5,0.25,0.25",
    ]);
    let t = &tree["tokens_per_round_by_rule"]["tree"];
    assert_eq!(t["target_positions"].as_u64(), Some(3), "{tree}");
    assert_close(
        &[t["tokens_per_round"].as_f64().unwrap(), t["over_chain_token"].as_f64().unwrap()],
        &[2.0, 2.0 / 1.85],
        1e-12,
    );
    let plain = json(&args);
    assert!(plain["tokens_per_round_by_rule"].is_null(), "{plain}");
    let mismatch = usage_error(&[&args[..], &["--target", "0.5,0.5", "--draft", "0.2,0.3,0.5"]].concat());
    assert!(mismatch.contains("--target has 2 entries but --draft has 3"), "{mismatch}");
    // Refused before enumerating: too many blocks (100^4), or few blocks each holding five
    // rows of 1 000 numbers.
    let refusal = |gamma: &str, entries: usize| {
        let uniform = vec![format!("{}", 1.0 / entries as f64); entries].join(",");
        let flags = ["--target-ms", "100", "--draft-ms", "20", "--target", &uniform, "--draft", &uniform];
        usage_error(&[&["cost", "--gamma", gamma, "--alpha", "0.5"][..], &flags[..]].concat())
    };
    let huge = refusal("4", 100);
    assert!(huge.contains("blocks to enumerate"), "{huge}");
    let heavy = refusal("2", 1000);
    assert!(heavy.contains("too many to hold"), "{heavy}");
}

#[test]
fn cost_refuses_bad_input_in_one_line() {
    let args = |alpha: &'static str, gamma: &'static str| {
        ["cost", "--gamma", gamma, "--alpha", alpha, "--target-ms", "100", "--draft-ms", "20"]
    };
    assert!(usage_error(&args("1", "2")).contains("--alpha 1: must be in [0, 1)"));
    assert!(usage_error(&args("-0.5", "2")).contains("--alpha -0.5"));
    assert!(usage_error(&args("0.5", "17")).contains("--gamma 17 is above the maximum 16"));
    let max = usage_error(&[&args("0.5", "2")[..], &["--max-gamma", "64"]].concat());
    assert!(max.contains("above the maximum 32"), "{max}");
    let target = usage_error(&["cost", "--gamma", "2", "--alpha", "0.5", "--target-ms", "0", "--draft-ms", "20"]);
    assert!(target.contains("--target-ms 0"), "{target}");
}

#[test]
fn help_teaches() {
    for cmd in ["rule", "cost"] {
        let out = specd(&[cmd, "--help"]);
        assert!(out.status.success());
        let text = String::from_utf8(out.stdout).unwrap();
        assert!(text.contains("Example"), "{cmd} --help has no example:\n{text}");
        assert!(text.contains("[env: SPECD_"), "{cmd} --help does not show env fallbacks");
    }
}
