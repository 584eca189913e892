//! Three network namespaces (coordinator, draft, target) and two veth pairs:
//!
//! ```text
//!   draft ns              coordinator ns               target ns
//!   10.B.B.2/30 ── veth ── 10.B.B.1/30   10.B.B.5/30 ── veth ── 10.B.B.6/30
//! ```
//!
//! Names start with `specd-<pid>-<n>-` (namespaces) and `sd<pid hex><n hex>` (veths), and the
//! /28 block `10.B.B.0` is derived from the pid and the instance number `n`, so harnesses in
//! one process or several can run at once. Each namespace has `lo` up. The veths are created
//! directly inside their namespaces and die with them; dropping the [`Topology`] deletes the
//! namespaces (and any veth of ours that stayed in the root namespace), also while a test
//! panics. Namespaces left by a process that died without dropping (SIGKILL) are swept by
//! the next [`Topology::create`].

use std::net::Ipv4Addr;
use std::process::Command;
use std::sync::atomic::{AtomicU32, Ordering};

use crate::error::NetnsError;

/// Harnesses created by this process so far.
static INSTANCES: AtomicU32 = AtomicU32::new(0);

/// Root and a working `ip`, or why not.
pub fn check_privileges() -> Result<(), NetnsError> {
    let status = std::fs::read_to_string("/proc/self/status")?;
    // "Uid:\treal\teffective\tsaved\tfs"
    let euid = status
        .lines()
        .find_map(|l| l.strip_prefix("Uid:"))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|u| u.parse::<u32>().ok())
        .unwrap_or(u32::MAX);
    if euid != 0 {
        return Err(NetnsError::NotRoot(euid));
    }
    match Command::new("ip").arg("-V").output() {
        Ok(out) if out.status.success() => Ok(()),
        Ok(out) => Err(NetnsError::NoIp(String::from_utf8_lossy(&out.stderr).trim().to_owned())),
        Err(e) => Err(NetnsError::NoIp(e.to_string())),
    }
}

/// Runs `ip ARGS`; its stdout, or its stderr as the error.
pub(crate) fn ip(args: &[&str]) -> Result<String, NetnsError> {
    let out = Command::new("ip").args(args).output().map_err(|e| NetnsError::NoIp(e.to_string()))?;
    if !out.status.success() {
        return Err(NetnsError::Ip {
            args: args.join(" "),
            stderr: String::from_utf8_lossy(&out.stderr).trim().to_owned(),
        });
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// The names one harness uses, to look for what it left behind.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Names {
    /// Every namespace of the harness starts with this.
    pub namespace_prefix: String,
    /// Every veth of the harness starts with this.
    pub veth_prefix: String,
}

impl Names {
    /// The harness's namespaces still listed by `ip netns list`, and its veths still in the
    /// root namespace; empty after a clean teardown.
    pub fn leftovers(&self) -> Result<Vec<String>, NetnsError> {
        let mut found: Vec<String> =
            namespaces()?.into_iter().filter(|n| n.starts_with(&self.namespace_prefix)).collect();
        found.extend(root_links()?.into_iter().filter(|l| l.starts_with(&self.veth_prefix)));
        Ok(found)
    }
}

/// Every namespace `ip netns list` shows.
fn namespaces() -> Result<Vec<String>, NetnsError> {
    // "NAME" or "NAME (id: N)" per line.
    Ok(ip(&["netns", "list"])?.lines().filter_map(|l| l.split_whitespace().next()).map(str::to_owned).collect())
}

/// Every link of the root namespace, by name.
fn root_links() -> Result<Vec<String>, NetnsError> {
    // "N: NAME@PEER: <FLAGS> …" per line.
    Ok(ip(&["-o", "link", "show"])?
        .lines()
        .filter_map(|l| l.split(": ").nth(1))
        .map(|n| n.split('@').next().unwrap_or(n).to_owned())
        .collect())
}

/// One veth pair between the coordinator's namespace and a node's.
#[derive(Debug, Clone)]
pub struct Link {
    /// The veth in the coordinator's namespace, and its address.
    pub coordinator_veth: String,
    pub coordinator_address: Ipv4Addr,
    /// The veth in the node's namespace, and its address (the node listens there).
    pub node_veth: String,
    pub node_address: Ipv4Addr,
}

/// The namespaces and links of one harness; deleted when dropped.
#[derive(Debug)]
pub struct Topology {
    names: Names,
    pub coordinator: String,
    pub draft: String,
    pub target: String,
    pub draft_link: Link,
    pub target_link: Link,
    /// Namespaces created so far (all three once `create` returns).
    created: Vec<String>,
}

impl Topology {
    /// Creates the namespaces and links. On failure whatever was made is deleted again.
    pub fn create() -> Result<Self, NetnsError> {
        check_privileges()?;
        sweep_dead_processes_namespaces();
        let pid = std::process::id();
        let n = INSTANCES.fetch_add(1, Ordering::Relaxed);
        let names = Names {
            namespace_prefix: format!("specd-{pid}-{n}-"),
            veth_prefix: format!("sd{:06x}{:02x}", pid & 0xff_ffff, n & 0xff),
        };
        // A /28 per harness: 20 bits from the pid and the instance, below 10.0.0.0/8.
        let block = ((pid & 0xfff) << 8) | (n & 0xff);
        let base = u32::from(Ipv4Addr::new(10, 0, 0, 0)) | (block << 4);
        let link = |offset: u32, side: &str| Link {
            coordinator_veth: format!("{}{side}c", names.veth_prefix),
            coordinator_address: Ipv4Addr::from(base + offset + 1),
            node_veth: format!("{}{side}n", names.veth_prefix),
            node_address: Ipv4Addr::from(base + offset + 2),
        };
        let mut topology = Self {
            coordinator: format!("{}coordinator", names.namespace_prefix),
            draft: format!("{}draft", names.namespace_prefix),
            target: format!("{}target", names.namespace_prefix),
            draft_link: link(0, "d"),
            target_link: link(4, "t"),
            names,
            created: Vec::new(),
        };
        for ns in [topology.coordinator.clone(), topology.draft.clone(), topology.target.clone()] {
            ip(&["netns", "add", &ns])?;
            topology.created.push(ns.clone());
            ip(&["-n", &ns, "link", "set", "lo", "up"])?;
        }
        let (coordinator, draft, target) = (&topology.coordinator, &topology.draft, &topology.target);
        for (link, node_ns) in [(&topology.draft_link, draft), (&topology.target_link, target)] {
            connect(
                coordinator,
                &link.coordinator_veth,
                link.coordinator_address,
                node_ns,
                &link.node_veth,
                link.node_address,
            )?;
        }
        Ok(topology)
    }

    /// The names this harness uses (for [`Names::leftovers`] after it is dropped).
    pub fn names(&self) -> Names {
        self.names.clone()
    }

    /// Deletes the namespaces (their veths go with them) and any veth of ours in the root
    /// namespace. Processes still inside keep a namespace alive: stop them first.
    fn teardown(&mut self) {
        if let Ok(links) = root_links() {
            for link in links.iter().filter(|l| l.starts_with(&self.names.veth_prefix)) {
                let _ = ip(&["link", "del", link]);
            }
        }
        for ns in self.created.drain(..).rev() {
            if let Err(e) = ip(&["netns", "del", &ns]) {
                eprintln!("specd-netns: cannot delete namespace {ns}: {e}");
            }
        }
    }
}

impl Drop for Topology {
    fn drop(&mut self) {
        self.teardown();
    }
}

/// A veth pair from `a` (in namespace `a_ns`) to `b` (in `b_ns`), addressed /30 and up.
fn connect(a_ns: &str, a: &str, a_addr: Ipv4Addr, b_ns: &str, b: &str, b_addr: Ipv4Addr) -> Result<(), NetnsError> {
    ip(&["link", "add", a, "netns", a_ns, "type", "veth", "peer", "name", b, "netns", b_ns])?;
    for (ns, dev, addr) in [(a_ns, a, a_addr), (b_ns, b, b_addr)] {
        ip(&["-n", ns, "addr", "add", &format!("{addr}/30"), "dev", dev])?;
        ip(&["-n", ns, "link", "set", dev, "up"])?;
    }
    Ok(())
}

/// Deletes `specd-<pid>-…` namespaces whose process is gone (killed before it could drop its
/// harness). Best effort.
fn sweep_dead_processes_namespaces() {
    let Ok(all) = namespaces() else { return };
    for ns in all {
        let pid = ns.strip_prefix("specd-").and_then(|rest| rest.split('-').next()).and_then(|p| p.parse::<u32>().ok());
        if let Some(pid) = pid
            && !std::path::Path::new(&format!("/proc/{pid}")).exists()
        {
            let _ = ip(&["netns", "del", &ns]);
        }
    }
}
