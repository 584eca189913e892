//! The roles of specd on an emulated network: each in its own network namespace on this
//! machine, joined by veth pairs, with a one-way delay added to each direction of the
//! draft ↔ coordinator and coordinator ↔ target links.
//!
//! Modules:
//! - [`topology`]: three namespaces and two veth pairs with their own addresses, torn down
//!   when dropped (also while a test panics), and [`topology::Names::leftovers`] to prove it;
//! - [`delay_proxy`]: a user-space TCP proxy that delays every chunk by a fixed one-way delay
//!   (plus optional jitter) through a queue, order kept and throughput not capped (this
//!   kernel has no `sch_netem`, so `tc netem` is not an option);
//! - [`cluster`]: `specd target`, `specd draft`, the delay proxies and `specd coordinator`
//!   as processes in those namespaces (`ip netns exec`).
//!
//! Everything here needs root and iproute2's `ip`; [`check_privileges`] says why not.

pub mod cluster;
pub mod delay_proxy;
pub mod topology;

pub use cluster::{ClusterSpec, NetnsCluster};
pub use delay_proxy::Delay;
pub use topology::{Names, Topology, check_privileges};

/// What can go wrong setting up or using the namespaces.
#[derive(Debug, thiserror::Error)]
pub enum NetnsError {
    #[error(
        "network namespaces need root (this process runs with effective uid {0}): the harness creates them and \
         their veth pairs with `ip`"
    )]
    NotRoot(u32),
    #[error("iproute2's `ip` cannot run ({0}); the network-namespace harness needs it")]
    NoIp(String),
    #[error("`ip {args}` failed: {stderr}")]
    Ip { args: String, stderr: String },
    #[error("{role}: {why}")]
    Role { role: String, why: String },
    #[error(transparent)]
    Io(#[from] std::io::Error),
}
