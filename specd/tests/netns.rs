//! The roles as processes in their own network namespaces (`specd_netns`), with 10 ms added
//! to each direction of both links (draft ↔ coordinator, coordinator ↔ target) by the delay
//! proxy: greedy identity and the 3-token law audit still hold, and the harness leaves no
//! namespace or veth behind, also when the test body panics. `specd bench --netns` runs end
//! to end on the tiny demo pair.
//!
//! These tests need root and iproute2; without them they fail with the reason, unless
//! `SPECD_SKIP_NETNS=1` (then they say loudly that they skipped). Extra coordinator flags
//! come from `SPECD_NETNS_COORDINATOR_ARGS` (whitespace-separated, e.g. `--optimistic on`).

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use specd_e2e::law_tables::{TableFiles, TablePair};
use specd_e2e::{Table, scratch_dir};
use specd_netns::{ClusterSpec, Delay, NetnsCluster, Topology};

const SPECD: &str = env!("CARGO_BIN_EXE_specd");

/// False (loudly) with `SPECD_SKIP_NETNS=1`; panics with the reason when namespaces cannot
/// be made here.
fn netns_or_skip(test: &str) -> bool {
    if std::env::var("SPECD_SKIP_NETNS").as_deref() == Ok("1") {
        eprintln!("\n!!!!! SKIPPED {test}: SPECD_SKIP_NETNS=1, network namespaces NOT tested !!!!!\n");
        return false;
    }
    if let Err(e) = specd_netns::check_privileges() {
        panic!("{test}: {e}. Run the tests as root with iproute2, or set SPECD_SKIP_NETNS=1 to skip them");
    }
    true
}

fn coordinator_args(base: &[&str]) -> Vec<String> {
    let extra = std::env::var("SPECD_NETNS_COORDINATOR_ARGS").unwrap_or_default();
    base.iter().map(|s| (*s).to_owned()).chain(extra.split_whitespace().map(str::to_owned)).collect()
}

fn ten_ms() -> Delay {
    Delay::from_ms(10.0, 0.0).unwrap()
}

/// A table whose next token depends on the last one (`suffix` rules), pseudo-random rows.
fn suffix_table(path: &Path, vocab: u32, salt: u64) -> PathBuf {
    let mut state = 0x9e37_79b9_7f4a_7c15u64 ^ salt.wrapping_mul(0xff51_afd7_ed55_8ccd);
    let mut uniform = move || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        (state >> 11) as f64 / (1u64 << 53) as f64
    };
    let rules: Vec<Value> = (0..vocab)
        .map(|last| {
            let w: Vec<f64> = (0..vocab).map(|_| 0.05 + uniform()).collect();
            let total: f64 = w.iter().sum();
            json!({"suffix": [last], "probs": w.iter().map(|x| x / total).collect::<Vec<_>>()})
        })
        .collect();
    let file = json!({"vocab_size": vocab, "default": vec![1.0 / f64::from(vocab); vocab as usize], "rules": rules});
    std::fs::write(path, serde_json::to_vec(&file).unwrap()).unwrap();
    path.to_owned()
}

fn start(dir: &Path, target: PathBuf, draft: PathBuf, gamma: &str) -> NetnsCluster {
    let spec = ClusterSpec {
        draft_link: ten_ms(),
        target_link: ten_ms(),
        coordinator_args: coordinator_args(&["--gamma", gamma]),
        log_dir: Some(dir.to_owned()),
        ..ClusterSpec::new(SPECD, target, draft)
    };
    NetnsCluster::start(&spec).unwrap_or_else(|e| panic!("{e}"))
}

/// `specd ARGS` next to the coordinator; its JSON output.
fn specd_json(cluster: &NetnsCluster, args: &[&str]) -> Value {
    let out = cluster.command(SPECD).args(args).output().unwrap();
    assert!(out.status.success(), "specd {args:?}: {}", String::from_utf8_lossy(&out.stderr));
    serde_json::from_slice(&out.stdout).unwrap()
}

#[test]
fn greedy_speculation_equals_target_only_across_namespaces() {
    if !netns_or_skip("greedy identity across namespaces") {
        return;
    }
    let dir = scratch_dir("netns-greedy");
    let (target, draft) = (suffix_table(&dir.join("target.json"), 16, 1), suffix_table(&dir.join("draft.json"), 16, 2));
    let cluster = start(&dir, target, draft, "4");
    let (mut drafted, mut accepted) = (0, 0);
    for prompt in ["1", "2,3", "4,5,6", "15", "0,9"] {
        let generate = |gamma: &str| {
            let args = ["generate", "--endpoint", &cluster.endpoint, "--token-ids", prompt, "--max-new-tokens", "16"];
            let started = Instant::now();
            let sampling = ["--temperature", "0", "--gamma", gamma, "--json"];
            let out = specd_json(&cluster, &[&args[..], &sampling[..]].concat());
            (out, started.elapsed())
        };
        let (plain, _) = generate("0");
        let (spec, took) = generate("4");
        assert_eq!(plain["token_ids"].as_array().unwrap().len(), 16, "{plain}");
        assert_eq!(spec["token_ids"], plain["token_ids"], "prompt {prompt}");
        let rounds = spec["stats"]["rounds"].as_u64().unwrap();
        // Every round waits at least one verify round trip over the 2 × 10 ms target link.
        assert!(took >= Duration::from_millis(20 * rounds), "{rounds} rounds in {took:?}: no delay?");
        drafted += spec["stats"]["draft_tokens"].as_u64().unwrap();
        accepted += spec["stats"]["accepted_tokens"].as_u64().unwrap();
    }
    assert!(
        0 < accepted && accepted < drafted,
        "a different draft is sometimes accepted, sometimes not: {accepted}/{drafted}"
    );
}

#[test]
fn the_three_token_law_audit_passes_across_namespaces() {
    if !netns_or_skip("law audit across namespaces") {
        return;
    }
    let dir = scratch_dir("netns-audit");
    let target = Table {
        vocab_size: 3,
        default: vec![0.5, 0.3, 0.2],
        rules: vec![(vec![0], vec![0.1, 0.2, 0.7]), (vec![0, 1], vec![0.6, 0.3, 0.1])],
    };
    let draft = Table { vocab_size: 3, default: vec![0.2, 0.2, 0.6], rules: vec![] };
    let TableFiles { target: t, draft: d } = TablePair { target, draft }.write(&dir).unwrap();
    let cluster = start(&dir, t, d, "3");
    let started = Instant::now();
    let report = specd_json(
        &cluster,
        &[
            "audit",
            "--endpoint",
            &cluster.endpoint,
            "--token-ids",
            "0",
            "--tokens",
            "3",
            "--gamma",
            "3",
            "--samples",
            "3000",
            "--concurrency",
            "32",
            "--json",
        ],
    );
    eprintln!("audit across namespaces took {:?}: {report}", started.elapsed());
    assert_eq!(report["mode"], "exact", "{report}");
    assert_eq!(report["verdict"], "pass", "{report}");
}

#[test]
fn teardown_leaves_no_namespace_or_veth_even_when_the_test_panics() {
    if !netns_or_skip("netns teardown") {
        return;
    }
    let mut names = None;
    let result = catch_unwind(AssertUnwindSafe(|| {
        let topology = Topology::create().unwrap();
        names = Some(topology.names());
        let found = topology.names().leftovers().unwrap();
        assert_eq!(found.len(), 3, "three namespaces while it lives: {found:?}");
        let links = Command::new("ip").args(["-n", &topology.coordinator, "-o", "link"]).output().unwrap();
        let links = String::from_utf8_lossy(&links.stdout);
        for veth in [&topology.draft_link.coordinator_veth, &topology.target_link.coordinator_veth] {
            assert!(links.contains(veth.as_str()), "{veth} in {links}");
        }
        panic!("a failing test body");
    }));
    assert!(result.is_err());
    assert_eq!(names.unwrap().leftovers().unwrap(), Vec::<String>::new());

    // The same with the roles running: processes stopped, then everything deleted.
    let dir = scratch_dir("netns-teardown");
    let (t, d) = (suffix_table(&dir.join("t.json"), 4, 1), suffix_table(&dir.join("d.json"), 4, 2));
    let mut seen = None;
    let result = catch_unwind(AssertUnwindSafe(|| {
        let cluster = start(&dir, t, d, "2");
        seen = Some((cluster.topology.names(), cluster.pids()));
        panic!("a failing test body with a cluster");
    }));
    assert!(result.is_err());
    let (names, pids) = seen.unwrap();
    assert_eq!(pids.len(), 5, "target, draft, two proxies, coordinator");
    assert_eq!(names.leftovers().unwrap(), Vec::<String>::new());
    for pid in pids {
        assert!(!Path::new(&format!("/proc/{pid}")).exists(), "process {pid} outlived the cluster");
    }
}

#[test]
fn bench_netns_reports_the_network_and_cleans_up() {
    if !netns_or_skip("specd bench --netns") {
        return;
    }
    let pair = std::env::temp_dir().join(format!("specd-netns-demo-{}", std::process::id()));
    let out = Command::new(SPECD)
        .args(["models", "demo", "--preset", "tiny", "--out", pair.to_str().unwrap(), "--json"])
        .output()
        .unwrap();
    assert!(out.status.success(), "specd models demo: {}", String::from_utf8_lossy(&out.stderr));
    // The tiny pair's context is 64 tokens: short prompts.
    let prompts = pair.join("prompts.txt");
    std::fs::write(&prompts, "def add(a, b):\n---\nimport os\n").unwrap();
    let child = Command::new(SPECD)
        .args(["bench", "--netns", "--rtt-ms", "20", "--demo-dir", pair.to_str().unwrap()])
        .args(["--prompts", prompts.to_str().unwrap()])
        .args(["--repeat", "1", "--max-new-tokens", "8", "--gamma", "3", "--draft-delay-ms", "1", "--json"])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let pid = child.id();
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success(), "specd bench --netns: {}", String::from_utf8_lossy(&out.stderr));
    let report: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(report["network"], "netns", "{report}");
    assert_eq!(report["rtt_ms"], 20.0);
    assert_eq!(report["draft_delay_ms"], 1.0);
    assert!(report["wire_bytes_per_round"].as_f64().unwrap() > 0.0, "{report}");
    let namespaces = Command::new("ip").args(["netns", "list"]).output().unwrap();
    let namespaces = String::from_utf8_lossy(&namespaces.stdout);
    assert!(!namespaces.contains(&format!("specd-{pid}-")), "bench left namespaces: {namespaces}");
    let _ = std::fs::remove_dir_all(pair);
}
