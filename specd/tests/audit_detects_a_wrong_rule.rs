//! `specd audit` must catch a coordinator that breaks the law. The cluster runs in this
//! process (specd-e2e) with the deliberately wrong rule (on rejection, resample from p
//! instead of the residual); the audit runs as the real `specd` process against it.
//!
//! Error rates: against the correct rule the audit fails with probability 1e-3 (its
//! --alpha). The audit's seeds are fixed (0..N), so each run here is deterministic: with
//! the wrong rule and 4000 samples the exact test gave p = 7e-34 and the two-sample test
//! p = 4e-12 (27 cells each), while the correct rule gave p = 0.12.

use std::process::Command;

use specd_coordinator::{GammaChoice, RuleVariant};
use specd_e2e::law_tables::{TableFiles, TablePair};
use specd_e2e::{Cluster, ClusterOptions, Table, scratch_dir};

fn tables() -> TablePair {
    let target = Table {
        vocab_size: 3,
        default: vec![0.5, 0.3, 0.2],
        rules: vec![(vec![0], vec![0.1, 0.2, 0.7]), (vec![0, 1], vec![0.6, 0.3, 0.1])],
    };
    let draft = Table { vocab_size: 3, default: vec![0.2, 0.2, 0.6], rules: vec![] };
    TablePair { target, draft }
}

async fn audit(rule: RuleVariant, mode: &str) -> serde_json::Value {
    let dir = scratch_dir(&format!("audit-{rule:?}-{mode}"));
    let TableFiles { target: t, draft: d } = tables().write(&dir).unwrap();
    let options = ClusterOptions { gamma: GammaChoice::Fixed(3), rule, ..ClusterOptions::default() };
    let cluster = Cluster::start(&t, &d, &options).await.unwrap();
    let endpoint = cluster.endpoint.clone();
    let mode = mode.to_owned();
    let out = tokio::task::spawn_blocking(move || {
        Command::new(env!("CARGO_BIN_EXE_specd"))
            .args(["audit", "--endpoint", &endpoint, "--token-ids", "0", "--tokens", "3"])
            .args(["--samples", "4000", "--json", "--mode", &mode])
            .output()
            .unwrap()
    })
    .await
    .unwrap();
    cluster.shutdown().await;
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!("{e}: stdout {:?} stderr {}", out.stdout, String::from_utf8_lossy(&out.stderr));
    });
    assert_eq!(out.status.success(), report["verdict"] == "pass", "exit status follows the verdict: {report}");
    eprintln!("{rule:?} {report}");
    report
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_exact_audit_passes_the_rule_and_fails_the_wrong_rule() {
    let right = audit(RuleVariant::Exact, "exact").await;
    assert_eq!(right["verdict"], "pass", "{right}");
    assert_eq!(right["cells"], 27);
    let wrong = audit(RuleVariant::NaiveResampleFromTarget, "exact").await;
    assert_eq!(wrong["verdict"], "fail", "{wrong}");
    assert!(wrong["p_value"].as_f64().unwrap() < 1e-6, "{wrong}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_two_sample_audit_fails_the_wrong_rule() {
    let wrong = audit(RuleVariant::NaiveResampleFromTarget, "two-sample").await;
    assert_eq!(wrong["verdict"], "fail", "{wrong}");
}
