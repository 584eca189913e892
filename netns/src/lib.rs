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
//!   as processes in those namespaces (`ip netns exec`);
//! - [`error`]: [`NetnsError`], what can go wrong setting up or using them.
//!
//! Everything here needs root and iproute2's `ip`; [`check_privileges`] says why not.

pub mod cluster;
pub mod delay_proxy;
pub mod error;
pub mod topology;

pub use cluster::{ClusterSpec, NetnsCluster};
pub use delay_proxy::Delay;
pub use error::NetnsError;
pub use topology::{Names, Topology, check_privileges};
