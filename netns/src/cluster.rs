//! specd's roles as processes in a [`Topology`]: the target and the draft node each in their
//! namespace, listening on their veth's address; in the coordinator's namespace a
//! `specd delay-proxy` per delayed link (listening on its loopback, forwarding across the
//! veth) and `specd coordinator` on 127.0.0.1, reached through the proxies. Clients run in
//! the coordinator's namespace too ([`NetnsCluster::command`]), as a client next to its
//! coordinator would.
//!
//! Dropping the cluster kills the processes (SIGKILL, then waits for them) before the
//! topology deletes the namespaces.

use std::ffi::OsStr;
use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use crate::delay_proxy::Delay;
use crate::error::NetnsError;
use crate::topology::Topology;

/// What to run and how the links behave.
#[derive(Debug, Clone)]
pub struct ClusterSpec {
    /// The `specd` binary.
    pub binary: PathBuf,
    /// `--model` of each node: a checkpoint directory or a table-model file.
    pub target_model: PathBuf,
    pub draft_model: PathBuf,
    /// Each direction of draft ↔ coordinator, and of coordinator ↔ target.
    pub draft_link: Delay,
    pub target_link: Delay,
    /// Extra flags of each role (e.g. `--gamma 3` or `--optimistic on` for the coordinator).
    pub target_args: Vec<String>,
    pub draft_args: Vec<String>,
    pub coordinator_args: Vec<String>,
    /// Each process's stderr goes to `<role>.log` here (discarded when unset).
    pub log_dir: Option<PathBuf>,
    /// How long a role may take to print `listening on HOST:PORT`.
    pub startup_timeout: Duration,
}

impl ClusterSpec {
    /// No extra flags, no delay, no logs, 120 s to start.
    pub fn new(binary: impl Into<PathBuf>, target_model: impl Into<PathBuf>, draft_model: impl Into<PathBuf>) -> Self {
        Self {
            binary: binary.into(),
            target_model: target_model.into(),
            draft_model: draft_model.into(),
            draft_link: Delay::default(),
            target_link: Delay::default(),
            target_args: Vec::new(),
            draft_args: Vec::new(),
            coordinator_args: Vec::new(),
            log_dir: None,
            startup_timeout: Duration::from_secs(120),
        }
    }
}

/// A running cluster; stopped and torn down when dropped.
#[derive(Debug)]
pub struct NetnsCluster {
    /// `http://127.0.0.1:PORT`: the coordinator, reachable from its own namespace.
    pub endpoint: String,
    processes: Vec<(String, Child)>,
    // Dropped after `processes` are killed (in `Drop::drop`).
    pub topology: Topology,
}

impl NetnsCluster {
    /// Creates the topology and starts the roles; on failure everything started is stopped
    /// and deleted again.
    pub fn start(spec: &ClusterSpec) -> Result<Self, NetnsError> {
        let topology = Topology::create()?;
        let mut cluster = Self { endpoint: String::new(), processes: Vec::new(), topology };
        let t = &cluster.topology;
        let nodes = [
            ("target", t.target.clone(), &spec.target_model, t.target_link.node_address, &spec.target_args),
            ("draft", t.draft.clone(), &spec.draft_model, t.draft_link.node_address, &spec.draft_args),
        ];
        let coordinator_ns = t.coordinator.clone();
        let mut addresses = Vec::new();
        for (role, ns, model, address, extra) in nodes {
            let mut args = vec![role.to_owned(), "--model".into(), model.display().to_string()];
            args.extend(["--listen".into(), format!("{address}:0")]);
            args.extend(extra.iter().cloned());
            addresses.push(cluster.spawn(spec, role, &ns, &args)?);
        }
        let (target, draft) = (addresses[0], addresses[1]);
        let target = cluster.through(spec, "target-proxy", target, spec.target_link)?;
        let draft = cluster.through(spec, "draft-proxy", draft, spec.draft_link)?;
        let mut args = vec!["coordinator".to_owned(), "--listen".into(), "127.0.0.1:0".into()];
        args.extend(["--target".into(), format!("http://{target}"), "--draft".into(), format!("http://{draft}")]);
        args.extend(spec.coordinator_args.iter().cloned());
        let coordinator = cluster.spawn(spec, "coordinator", &coordinator_ns, &args)?;
        cluster.endpoint = format!("http://{coordinator}");
        Ok(cluster)
    }

    /// `program` run inside the coordinator's namespace (`ip netns exec`), e.g. `specd
    /// generate --endpoint` [`Self::endpoint`].
    pub fn command(&self, program: impl AsRef<OsStr>) -> Command {
        let mut command = Command::new("ip");
        command.args(["netns", "exec", &self.topology.coordinator]).arg(program);
        command
    }

    /// The process ids of the roles and proxies.
    pub fn pids(&self) -> Vec<u32> {
        self.processes.iter().map(|(_, c)| c.id()).collect()
    }

    /// `node` as the coordinator reaches it: directly, or through a delay proxy in the
    /// coordinator's namespace.
    fn through(
        &mut self,
        spec: &ClusterSpec,
        role: &str,
        node: SocketAddr,
        delay: Delay,
    ) -> Result<SocketAddr, NetnsError> {
        if delay.is_zero() {
            return Ok(node);
        }
        let ms = |d: Duration| format!("{}", d.as_secs_f64() * 1e3);
        let args: Vec<String> = vec![
            "delay-proxy".into(),
            "--listen".into(),
            "127.0.0.1:0".into(),
            "--upstream".into(),
            node.to_string(),
            "--delay-ms".into(),
            ms(delay.one_way),
            "--jitter-ms".into(),
            ms(delay.jitter),
        ];
        let ns = self.topology.coordinator.clone();
        self.spawn(spec, role, &ns, &args)
    }

    /// Starts `binary ARGS` in namespace `ns` and waits for its `listening on HOST:PORT`.
    fn spawn(&mut self, spec: &ClusterSpec, role: &str, ns: &str, args: &[String]) -> Result<SocketAddr, NetnsError> {
        let failed = |why: String| NetnsError::Role { role: role.to_owned(), why };
        let stderr = match &spec.log_dir {
            Some(dir) => Stdio::from(std::fs::File::create(dir.join(format!("{role}.log")))?),
            None => Stdio::null(),
        };
        let mut child = Command::new("ip")
            .args(["netns", "exec", ns])
            .arg(&spec.binary)
            .args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(stderr)
            .spawn()
            .map_err(|e| failed(format!("cannot start {}: {e}", spec.binary.display())))?;
        let stdout = child.stdout.take();
        self.processes.push((role.to_owned(), child));
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            let mut line = String::new();
            if let Some(out) = stdout {
                let _ = BufReader::new(out).read_line(&mut line);
            }
            let _ = tx.send(line);
        });
        let logs = spec.log_dir.as_ref().map(|d| format!(" (see {})", d.join(format!("{role}.log")).display()));
        let line = rx.recv_timeout(spec.startup_timeout).map_err(|_| {
            failed(format!("not listening after {:?}{}", spec.startup_timeout, logs.clone().unwrap_or_default()))
        })?;
        line.trim().strip_prefix("listening on ").and_then(|a| a.parse().ok()).ok_or_else(|| {
            failed(format!(
                "exited or printed {line:?} instead of `listening on HOST:PORT`{}",
                logs.unwrap_or_default()
            ))
        })
    }
}

impl Drop for NetnsCluster {
    fn drop(&mut self) {
        // Coordinator first, nodes last; `ip netns exec` execs, so the child is the role.
        for (_, child) in self.processes.iter_mut().rev() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}
