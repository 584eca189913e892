//! A process that runs a target model keeps libtorch's idle CPU workers awake across a
//! drafting gap: it starts itself again with `GOMP_SPINCOUNT` set, unless the user chose how
//! they wait (`specd/src/openmp.rs`). libgomp reads the variable only as it loads, so what
//! counts is the environment of the running process, read here from `/proc/PID/environ`.
//! And a node gives its model's threads one CPU each where they use them all
//! (`model/src/pinning.rs`), read from `/proc/PID/task/*/status`.

#![cfg(target_os = "linux")]

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

mod common;
use common::Running;

/// A running process's threads: name and the CPUs each may run on.
type Threads = Vec<(String, String)>;

/// Starts `specd ROLE` on a table model with `envs` (and neither variable inherited), waits
/// until it listens, and returns its environment and its log.
fn environment_and_log(role_args: &[&str], envs: &[(&str, &str)], name: &str) -> (Vec<String>, String) {
    let (environ, _, log) = environment_threads_and_log(role_args, envs, name);
    (environ, log)
}

/// [`environment_and_log`], and the process's threads while it listens.
fn environment_threads_and_log(
    role_args: &[&str],
    envs: &[(&str, &str)],
    name: &str,
) -> (Vec<String>, Threads, String) {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../target/e2e/openmp_wait");
    std::fs::create_dir_all(&dir).unwrap();
    let log = dir.join(format!("{name}.log"));
    let mut child = Command::new(env!("CARGO_BIN_EXE_specd"))
        .args(role_args)
        .env_remove("GOMP_SPINCOUNT")
        .env_remove("OMP_WAIT_POLICY")
        .env_remove("SPECD_SET_GOMP_SPINCOUNT")
        // Nor how threads are counted and bound.
        .env_remove("OMP_NUM_THREADS")
        .env_remove("OMP_PROC_BIND")
        .env_remove("OMP_PLACES")
        .env_remove("GOMP_CPU_AFFINITY")
        .env_remove("SPECD_THREADS")
        .env_remove("SPECD_PIN_THREADS")
        .envs(envs.iter().copied())
        .env("RUST_LOG", "info")
        .stdout(Stdio::piped())
        .stderr(std::fs::File::create(&log).unwrap())
        .spawn()
        .expect("specd starts");
    let mut line = String::new();
    BufReader::new(child.stdout.take().expect("stdout")).read_line(&mut line).expect("a line");
    assert!(line.starts_with("listening on "), "{line:?}");
    let running = Running(child);
    let environ = std::fs::read(format!("/proc/{}/environ", running.0.id())).expect("environ");
    let environ = environ.split(|&b| b == 0).map(|v| String::from_utf8_lossy(v).into_owned()).collect();
    let mut threads = Vec::new();
    for task in std::fs::read_dir(format!("/proc/{}/task", running.0.id())).expect("tasks") {
        let task = task.expect("task").path();
        let (Ok(name), Ok(status)) =
            (std::fs::read_to_string(task.join("comm")), std::fs::read_to_string(task.join("status")))
        else {
            continue; // a thread that ended meanwhile
        };
        let cpus = status.lines().find_map(|l| l.strip_prefix("Cpus_allowed_list:")).unwrap_or_default();
        threads.push((name.trim().to_owned(), cpus.trim().to_owned()));
    }
    drop(running);
    (environ, threads, std::fs::read_to_string(&log).unwrap())
}

/// A four-token table model in this test's scratch directory.
fn table_model(name: &str) -> PathBuf {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../target/e2e/openmp_wait");
    std::fs::create_dir_all(&dir).unwrap();
    let model = dir.join(name);
    std::fs::write(&model, r#"{"vocab_size": 4, "default": [0.4, 0.3, 0.2, 0.1]}"#).unwrap();
    model
}

fn node(role: &'static str, model: &Path) -> Vec<String> {
    vec![role.into(), "--model".into(), model.display().to_string(), "--listen".into(), "127.0.0.1:0".into()]
}

#[test]
fn a_target_sets_the_spin_count_unless_the_user_chose_how_workers_wait() {
    let model = table_model("model.json");
    let has = |environ: &[String], entry: &str| environ.iter().any(|e| e == entry);
    let spin_of = |environ: &[String]| environ.iter().find(|e| e.starts_with("GOMP_SPINCOUNT=")).cloned();

    let target = node("target", &model);
    let target: Vec<&str> = target.iter().map(String::as_str).collect();
    let (environ, log) = environment_and_log(&target, &[], "target_default");
    assert!(has(&environ, "GOMP_SPINCOUNT=1000000"), "{:?}", spin_of(&environ));
    assert!(log.contains("GOMP_SPINCOUNT=1000000 (specd's default)"), "{log}");

    let (environ, log) = environment_and_log(&target, &[("GOMP_SPINCOUNT", "5")], "target_user");
    assert_eq!(spin_of(&environ).as_deref(), Some("GOMP_SPINCOUNT=5"), "the user's count is kept");
    assert!(log.contains("GOMP_SPINCOUNT=5 (set by the user)"), "{log}");

    let (environ, log) = environment_and_log(&target, &[("OMP_WAIT_POLICY", "passive")], "target_policy");
    assert_eq!(spin_of(&environ), None, "a wait policy is the user's choice");
    assert!(log.contains("OMP_WAIT_POLICY=passive (set by the user)"), "{log}");

    // A standalone draft is not started again: its workers would spin through verify passes.
    let draft = node("draft", &model);
    let draft: Vec<&str> = draft.iter().map(String::as_str).collect();
    let (environ, log) = environment_and_log(&draft, &[], "draft");
    assert_eq!(spin_of(&environ), None);
    assert!(log.contains("libgomp's default"), "{log}");

    // No model runs in a coordinator.
    let (_target, target_address) = common::start(&target, &[]);
    let url = format!("http://{target_address}");
    let (environ, _) =
        environment_and_log(&["coordinator", "--target", &url, "--listen", "127.0.0.1:0"], &[], "coordinator");
    assert_eq!(spin_of(&environ), None);
}

#[test]
fn a_node_gives_its_team_of_two_one_cpu_each_on_two_cpus() {
    let model = table_model("pinning_model.json");
    // The CPUs this process may run on, which the node inherits (what the node decides by).
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    let allowed = status.lines().find_map(|l| l.strip_prefix("Cpus_allowed_list:")).unwrap().trim().to_owned();
    let two_cpus = cpu_count(&allowed) == 2;
    let mut target = node("target", &model);
    target.push("--threads=2".into());
    let target: Vec<&str> = target.iter().map(String::as_str).collect();
    let model_threads = |threads: &Threads| -> Vec<String> {
        threads.iter().filter(|(name, _)| name == "specd-target-mo").map(|(_, cpus)| cpus.clone()).collect()
    };

    let (_, threads, log) = environment_threads_and_log(&target, &[], "pinned");
    if two_cpus {
        assert!(log.contains("model threads pinned, one CPU each"), "{log}");
        let mut pinned = model_threads(&threads);
        assert!(pinned.len() >= 2, "the model thread and its worker: {threads:?}");
        assert!(pinned.iter().all(|c| c.parse::<usize>().is_ok()), "each on one CPU: {threads:?}");
        pinned.sort();
        pinned.dedup();
        assert_eq!(pinned.len(), 2, "the model thread on one CPU, the others on the other: {threads:?}");
        let others: Vec<_> = threads.iter().filter(|(name, _)| name != "specd-target-mo").collect();
        assert!(others.iter().all(|(_, c)| *c == allowed), "the other threads run anywhere: {others:?}");
    } else {
        assert!(log.contains("model threads left to the scheduler") && log.contains("threads on"), "{log}");
    }

    let mut off = target.clone();
    off.push("--pin-threads=false");
    let (_, threads, log) = environment_threads_and_log(&off, &[], "unpinned");
    assert!(!log.contains("model threads pinned"), "{log}");
    assert!(model_threads(&threads).iter().all(|c| *c == allowed), "{threads:?}");

    let (_, _, log) = environment_threads_and_log(&target, &[("OMP_PLACES", "cores")], "user_places");
    assert!(log.contains("OMP_PLACES is set"), "the user's binding is kept: {log}");
}

/// The CPUs in a list such as `0-3,8,10-11`.
fn cpu_count(list: &str) -> usize {
    let span = |range: &str| match range.split_once('-') {
        Some((first, last)) => last.parse::<usize>().unwrap() - first.parse::<usize>().unwrap() + 1,
        None => 1,
    };
    list.split(',').map(span).sum()
}
