//! The Kubernetes manifests of deploy/k8s (issue #8) and `specd <role> --check-config`.
//!
//! For every overlay: `kubectl kustomize` renders it, PyPI `kubernetes-validate --strict`
//! accepts the result, and every specd container's arguments and environment (its
//! ConfigMaps and Secrets resolved) are accepted by this binary: each SPECD_* name is one the
//! role reads (from its `--help`), and `specd ROLE ARGS --check-config` with exactly that
//! environment exits 0. Paths under /models point into a scratch directory holding stand-in
//! checkpoints (a real config.json, an empty weights file): --check-config reads config.json,
//! never the weights. Probes, container ports and the coordinator's `dns:///` names are
//! checked against each other and against the headless Services.
//!
//! Without kubectl the manifest test says so loudly and passes, unless
//! SPECD_REQUIRE_KUBECTL=1 (`make deploy-check`).

use std::collections::{BTreeMap, BTreeSet};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

use serde_json::Value;

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn python() -> PathBuf {
    std::env::var_os("SPECD_PYTHON").map_or_else(|| root().join(".venv/bin/python"), PathBuf::from)
}

/// Runs `command` with `stdin`, panicking with its stderr unless it succeeds.
fn run(command: &mut Command, stdin: &[u8]) -> Output {
    let what = format!("{command:?}");
    let mut child = command
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("cannot run {what}: {e}"));
    child.stdin.take().expect("stdin").write_all(stdin).expect("write stdin");
    let output = child.wait_with_output().expect("wait");
    assert!(
        output.status.success(),
        "{what} failed ({}):\n{}{}",
        output.status,
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    output
}

/// A stand-in Hugging Face checkpoint: a valid config.json and an empty weights file.
fn stand_in_checkpoint(dir: &Path) {
    std::fs::create_dir_all(dir).unwrap();
    let config = serde_json::json!({
        "architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": 96,
        "hidden_size": 32, "intermediate_size": 48, "num_hidden_layers": 2, "num_attention_heads": 4,
        "num_key_value_heads": 2, "max_position_embeddings": 64, "rms_norm_eps": 1e-5,
        "hidden_act": "silu", "tie_word_embeddings": true, "bos_token_id": 1, "eos_token_id": 2
    });
    std::fs::write(dir.join("config.json"), serde_json::to_vec_pretty(&config).unwrap()).unwrap();
    std::fs::write(dir.join("model.safetensors"), b"").unwrap();
}

fn specd(args: &[&str], envs: &BTreeMap<String, String>) -> Output {
    let mut command = Command::new(env!("CARGO_BIN_EXE_specd"));
    command.args(args).env_clear();
    // The binary needs libtorch; nothing else of the test's environment may leak in.
    for keep in ["LD_LIBRARY_PATH", "PATH", "HOME"] {
        if let Some(value) = std::env::var_os(keep) {
            command.env(keep, value);
        }
    }
    command.envs(envs).output().expect("specd runs")
}

/// The environment variables `specd ROLE` reads: the `[env: NAME=…]` of its help.
fn env_names(role: &str) -> BTreeSet<String> {
    let help = specd(&[role, "--help"], &BTreeMap::new());
    assert!(help.status.success());
    let text = String::from_utf8(help.stdout).unwrap();
    text.split("[env: ").skip(1).map(|rest| rest.split(['=', ']']).next().unwrap().to_owned()).collect()
}

/// Variables a role reads that are not its flags.
const OTHER_ENV: [&str; 3] = ["RUST_LOG", "OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_SERVICE_NAME"];

fn kubectl() -> Option<String> {
    let kubectl = std::env::var("KUBECTL").unwrap_or_else(|_| "kubectl".into());
    let works = Command::new(&kubectl).args(["version", "--client"]).output().is_ok_and(|o| o.status.success());
    works.then_some(kubectl)
}

fn docs_of<'a>(docs: &'a [Value], kind: &str) -> impl Iterator<Item = &'a Value> {
    docs.iter().filter(move |d| d["kind"] == kind)
}

fn named<'a>(docs: &'a [Value], kind: &str, name: &str) -> &'a Value {
    docs_of(docs, kind)
        .find(|d| d["metadata"]["name"] == name)
        .unwrap_or_else(|| panic!("no {kind} {name} in the rendered manifests"))
}

fn port_of(listen: &str) -> u64 {
    listen.rsplit_once(':').and_then(|(_, p)| p.parse().ok()).unwrap_or_else(|| panic!("no port in {listen:?}"))
}

/// The environment a container gets: its envFrom ConfigMaps, then its env entries.
fn container_env(docs: &[Value], container: &Value, models: &Path) -> BTreeMap<String, String> {
    let mut env = BTreeMap::new();
    for source in container["envFrom"].as_array().into_iter().flatten() {
        let name = source["configMapRef"]["name"].as_str().expect("envFrom configMapRef (no other kind is used)");
        let map = named(docs, "ConfigMap", name);
        for (key, value) in map["data"].as_object().expect("ConfigMap data") {
            env.insert(key.clone(), value.as_str().expect("string").to_owned());
        }
    }
    for entry in container["env"].as_array().into_iter().flatten() {
        let name = entry["name"].as_str().unwrap().to_owned();
        let value = match (&entry["value"], &entry["valueFrom"]["secretKeyRef"]) {
            (Value::String(v), _) => v.clone(),
            // A Secret's value is not in the manifests: its name is what is checked.
            (_, Value::Object(_)) => "secret-from-the-manifests".to_owned(),
            other => panic!("env {name}: unexpected source {other:?}"),
        };
        env.insert(name, value);
    }
    env.into_iter().map(|(k, v)| (k, localize(&v, models))).collect()
}

/// `/models/...` → the scratch models directory.
fn localize(value: &str, models: &Path) -> String {
    match value.strip_prefix("/models") {
        Some(rest) if rest.is_empty() || rest.starts_with('/') => format!("{}{rest}", models.display()),
        _ => value.to_owned(),
    }
}

/// Checks one rendered overlay; returns what it checked, one line per container.
fn check_overlay(overlay: &str, docs: &[Value], models: &Path) -> Vec<String> {
    let mut report = Vec::new();
    let mut roles = BTreeSet::new();
    let workloads = ["Deployment", "StatefulSet", "Job"].into_iter().flat_map(|k| docs_of(docs, k));
    for workload in workloads {
        let name = workload["metadata"]["name"].as_str().unwrap();
        let spec = &workload["spec"]["template"]["spec"];
        let containers =
            spec["initContainers"].as_array().into_iter().flatten().chain(spec["containers"].as_array().unwrap());
        for container in containers {
            let image = container["image"].as_str().unwrap();
            let cname = container["name"].as_str().unwrap();
            if !image.contains("specd") {
                report.push(format!("{overlay}: {name}/{cname}: image {image}, not specd: not checked"));
                continue;
            }
            if container.get("command").is_some() {
                // A shell script around specd (the models Job, the wait for the models).
                let script = container["args"].to_string();
                if script.contains("specd ") {
                    assert!(
                        script.contains("specd models demo --out /models/demo"),
                        "{overlay}: {name}/{cname}: {script}"
                    );
                    report.push(format!(
                        "{overlay}: {name}/{cname}: runs `specd models demo --out /models/demo` (issue #5's subcommand; not checked here)"
                    ));
                } else {
                    report.push(format!("{overlay}: {name}/{cname}: a shell loop without specd: not checked"));
                }
                continue;
            }
            let args: Vec<String> = container["args"]
                .as_array()
                .unwrap_or_else(|| panic!("{overlay}: {name}/{cname}: no args (the role)"))
                .iter()
                .map(|a| localize(a.as_str().unwrap(), models))
                .collect();
            let role = args[0].clone();
            assert!(["target", "draft", "coordinator"].contains(&role.as_str()), "{overlay}: {name}: role {role}");
            let env = container_env(docs, container, models);
            let accepted = env_names(&role);
            for key in env.keys() {
                assert!(
                    accepted.contains(key) || OTHER_ENV.contains(&key.as_str()),
                    "{overlay}: {name}/{cname}: `specd {role}` reads no {key} (it reads {accepted:?})"
                );
            }
            let mut argv: Vec<&str> = args.iter().map(String::as_str).collect();
            argv.push("--check-config");
            let output = specd(&argv, &env);
            assert!(
                output.status.success(),
                "{overlay}: {name}/{cname}: specd {argv:?} with {env:?}: {}",
                String::from_utf8_lossy(&output.stderr)
            );
            let line = String::from_utf8(output.stdout).unwrap();
            assert!(line.starts_with("config ok: "), "{line}");
            // The probes and the grpc port are the port the role listens on.
            let listen = port_of(env.get("SPECD_LISTEN").expect("SPECD_LISTEN"));
            for probe in ["startupProbe", "readinessProbe", "livenessProbe"] {
                assert_eq!(container[probe]["grpc"]["port"], listen, "{overlay}: {name}: {probe}");
            }
            let grpc = container["ports"].as_array().unwrap().iter().find(|p| p["name"] == "grpc").expect("grpc port");
            assert_eq!(grpc["containerPort"], listen, "{overlay}: {name}");
            if let Some(metrics) = env.get("SPECD_METRICS_LISTEN") {
                let port = container["ports"].as_array().unwrap().iter().find(|p| p["name"] == "metrics");
                assert_eq!(port.expect("metrics port")["containerPort"], port_of(metrics), "{overlay}: {name}");
            }
            if role == "coordinator" {
                for key in ["SPECD_TARGET", "SPECD_DRAFT"] {
                    for address in env[key].split(',') {
                        check_dns_name(overlay, docs, address);
                    }
                }
            } else {
                let mount = container["volumeMounts"].as_array().unwrap().iter().find(|m| m["mountPath"] == "/models");
                assert_eq!(mount.expect("/models mounted")["readOnly"], true, "{overlay}: {name}: models read-only");
            }
            roles.insert(role);
            report.push(format!("{overlay}: {name}/{cname}: {}", line.trim()));
        }
    }
    assert_eq!(roles.into_iter().collect::<Vec<_>>(), ["coordinator", "draft", "target"], "{overlay}");
    report
}

/// `dns:///NAME:PORT` names a headless Service of the overlay with that port.
fn check_dns_name(overlay: &str, docs: &[Value], address: &str) {
    let name = address.strip_prefix("dns:///").unwrap_or_else(|| panic!("{overlay}: {address} is not dns:///"));
    let (host, port) = name.rsplit_once(':').unwrap();
    let service = named(docs, "Service", host.split('.').next().unwrap());
    assert_eq!(service["spec"]["clusterIP"], "None", "{overlay}: {host} must be headless to list every pod");
    let ports: Vec<u64> =
        service["spec"]["ports"].as_array().unwrap().iter().filter_map(|p| p["port"].as_u64()).collect();
    assert!(ports.contains(&port.parse().unwrap()), "{overlay}: {address}: the Service has ports {ports:?}");
}

#[test]
fn every_overlay_renders_validates_and_passes_check_config() {
    let Some(kubectl) = kubectl() else {
        let message = "kubectl not found (set KUBECTL or put it on PATH): the Kubernetes manifests are NOT checked";
        assert!(std::env::var("SPECD_REQUIRE_KUBECTL").as_deref() != Ok("1"), "{message}");
        eprintln!("\n!!!!! SKIPPED: {message} !!!!!\n");
        return;
    };
    let python = python();
    let validate = python.with_file_name("kubernetes-validate");
    assert!(validate.is_file(), "{} is missing: run `make pydeps` (PyPI kubernetes-validate)", validate.display());
    let models = specd_e2e::scratch_dir("deploy-models");
    for dir in ["target", "draft", "demo/target", "demo/draft"] {
        stand_in_checkpoint(&models.join(dir));
    }
    let overlays_dir = root().join("deploy/k8s/overlays");
    let mut overlays: Vec<String> =
        std::fs::read_dir(&overlays_dir).unwrap().map(|e| e.unwrap().file_name().into_string().unwrap()).collect();
    overlays.sort();
    assert_eq!(overlays, ["cpu-demo", "gpu"]);
    for overlay in &overlays {
        let rendered = run(Command::new(&kubectl).arg("kustomize").arg(overlays_dir.join(overlay)), b"").stdout;
        run(Command::new(&validate).args(["--strict", "--quiet", "-"]), &rendered);
        let json = run(
            Command::new(&python).args([
                "-c",
                "import sys, json, yaml; json.dump([d for d in yaml.safe_load_all(sys.stdin) if d], sys.stdout)",
            ]),
            &rendered,
        )
        .stdout;
        let docs: Vec<Value> = serde_json::from_slice(&json).unwrap();
        for line in check_overlay(overlay, &docs, &models) {
            eprintln!("{line}");
        }
    }
}

#[test]
fn check_config_refuses_what_would_fail_at_startup() {
    let models = specd_e2e::scratch_dir("check-config");
    stand_in_checkpoint(&models.join("ok"));
    std::fs::create_dir_all(models.join("no-weights")).unwrap();
    std::fs::copy(models.join("ok/config.json"), models.join("no-weights/config.json")).unwrap();
    let ok = models.join("ok").display().to_string();
    let env = |pairs: &[(&str, &str)]| -> BTreeMap<String, String> {
        pairs.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned())).collect()
    };
    let accepted = specd(&["target", "--check-config"], &env(&[("SPECD_MODEL", &ok), ("SPECD_DTYPE", "bf16")]));
    assert!(accepted.status.success(), "{}", String::from_utf8_lossy(&accepted.stderr));
    let line = String::from_utf8(accepted.stdout).unwrap();
    assert!(line.starts_with("config ok: target on 127.0.0.1:50052") && line.contains("bf16"), "{line}");
    assert_eq!(line.lines().count(), 1, "{line}");
    // `specd up` hands its rounds to its nodes in process unless told to use gRPC.
    for (transport, said) in [(None, "rounds in process"), (Some("grpc"), "rounds over loopback gRPC")] {
        let mut vars = vec![("SPECD_TARGET_MODEL", ok.as_str()), ("SPECD_DRAFT_MODEL", ok.as_str())];
        vars.extend(transport.map(|t| ("SPECD_ROUND_TRANSPORT", t)));
        let up = specd(&["up", "--check-config"], &env(&vars));
        assert!(up.status.success(), "{}", String::from_utf8_lossy(&up.stderr));
        let line = String::from_utf8(up.stdout).unwrap();
        assert!(line.starts_with("config ok: up on") && line.contains(said), "{transport:?}: {line}");
    }
    // `--optimistic` takes a value, as flag and as variable (the manifests set it).
    for (args, envs) in [
        (vec!["coordinator", "--target", "http://t:1", "--optimistic", "on"], env(&[])),
        (vec!["coordinator", "--target", "http://t:1"], env(&[("SPECD_OPTIMISTIC", "on")])),
    ] {
        let output = specd(&[&args[..], &["--check-config"]].concat(), &envs);
        assert!(output.status.success(), "{args:?} {envs:?}: {}", String::from_utf8_lossy(&output.stderr));
    }

    let no_weights = models.join("no-weights").display().to_string();
    let missing = models.join("missing").display().to_string();
    let cases: Vec<(Vec<&str>, BTreeMap<String, String>, &str)> = vec![
        (vec!["target"], env(&[("SPECD_MODEL", &missing)]), "no such file or directory"),
        (vec!["draft"], env(&[("SPECD_MODEL", &no_weights)]), "model.safetensors"),
        (vec!["target"], env(&[("SPECD_MODEL", &ok), ("SPECD_DEVICE", "tpu")]), "unknown device"),
        (vec!["target"], env(&[("SPECD_MODEL", &ok), ("SPECD_TLS_CERT", "/nope.pem")]), "certificate and the key"),
        (vec!["target", "--model", &ok, "--otlp-endpoint", "collector:4317"], env(&[]), "OTLP endpoint"),
        (vec!["coordinator"], env(&[("SPECD_TARGET", "specd-target:50052")]), "dns:///HOST:PORT"),
        (vec!["coordinator"], env(&[("SPECD_TARGET", "dns:///t")]), "port is missing"),
        (
            vec!["coordinator", "--target", "dns:///t:1"],
            env(&[("SPECD_DISCOVERY_INTERVAL_S", "0")]),
            "--discovery-interval-s",
        ),
        (vec!["coordinator", "--target", "http://t:1", "--gamma", "99"], env(&[]), "above the maximum"),
        (vec!["coordinator", "--target", "http://t:1", "--optimistic", "maybe"], env(&[]), "expected on or off"),
        (vec!["coordinator", "--target", "http://t:1"], env(&[("SPECD_NODE_TLS_CA", "/nope.pem")]), "/nope.pem"),
    ];
    for (args, envs, needle) in cases {
        let mut argv = args.clone();
        argv.push("--check-config");
        let output = specd(&argv, &envs);
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert_eq!(output.status.code(), Some(2), "{argv:?} {envs:?}: {stderr}");
        assert!(stderr.contains(needle), "{argv:?} {envs:?}: {needle:?} not in {stderr}");
        assert!(output.stdout.is_empty(), "nothing on stdout when invalid");
    }
}
