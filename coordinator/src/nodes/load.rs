//! How many generations each replica serves now, and which replica a new session goes to:
//! the one holding its prefix unless that one carries more than its share, else the least
//! loaded.
//!
//! "Its share" is consistent hashing with bounded loads (Mirrokni, Thorup and Zadimoghaddam,
//! 2018): a replica takes a routed session while it would serve at most [`LOAD_SLACK`] times
//! the mean, counting the new session. One long system prompt shared by every conversation
//! then fills its replica to the bound and spills the rest over the others, rather than
//! piling every conversation onto one node.

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

/// How far above the mean load a replica still takes sessions routed to it by prefix.
pub const LOAD_SLACK: f64 = 1.25;

/// Generations running on each replica of one role, by address.
#[derive(Debug, Default)]
pub struct ReplicaLoads {
    by_address: Mutex<HashMap<String, Arc<AtomicUsize>>>,
}

impl ReplicaLoads {
    fn counter(&self, address: &str) -> Arc<AtomicUsize> {
        let mut map = self.by_address.lock().unwrap_or_else(PoisonError::into_inner);
        Arc::clone(map.entry(address.to_owned()).or_default())
    }

    /// Generations on `address` now.
    pub fn of(&self, address: &str) -> usize {
        self.counter(address).load(Ordering::Relaxed)
    }

    /// Counts one more generation on `address` until the lease is dropped.
    pub fn lease(&self, address: &str) -> ReplicaLease {
        let counter = self.counter(address);
        counter.fetch_add(1, Ordering::Relaxed);
        ReplicaLease(counter)
    }
}

/// One generation counted on a replica; dropped when the generation has released its
/// sessions.
#[derive(Debug)]
pub struct ReplicaLease(Arc<AtomicUsize>);

impl Drop for ReplicaLease {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

/// Which of `loads` (each replica's generations now, in the replicas' order) a new session
/// goes to: `routed` (the replica holding its prefix) while it stays within its bounded share,
/// else the least loaded, ties taken in turn from `turn`. `loads` is not empty.
pub fn choose(loads: &[usize], routed: Option<usize>, turn: usize) -> usize {
    let n = loads.len();
    let total: usize = loads.iter().sum::<usize>() + 1;
    let bound = (LOAD_SLACK * total as f64 / n as f64).ceil() as usize;
    if let Some(r) = routed.filter(|&r| r < n && loads[r] < bound) {
        return r;
    }
    (0..n).map(|i| (turn + i) % n).min_by_key(|&i| loads[i]).unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_routed_session_stays_on_its_replica_until_that_carries_more_than_its_share() {
        // Two replicas: the routed one takes sessions while it would serve at most 1.25 × the mean.
        assert_eq!(choose(&[0, 0], Some(1), 0), 1);
        assert_eq!(choose(&[0, 1], Some(1), 0), 1, "2 of 2: bound ⌈1.25⌉ = 2");
        assert_eq!(choose(&[0, 2], Some(1), 0), 0, "3 of 3: bound ⌈1.875⌉ = 2, spilled");
        assert_eq!(choose(&[4, 5], Some(1), 0), 1, "6 of 10: bound ⌈6.25⌉ = 7");
        assert_eq!(choose(&[1, 7], Some(1), 0), 0);
    }

    #[test]
    fn without_a_route_the_least_loaded_in_turn() {
        assert_eq!(choose(&[2, 1, 3], None, 0), 1);
        assert_eq!((0..4).map(|turn| choose(&[0, 0], None, turn)).collect::<Vec<_>>(), vec![0, 1, 0, 1]);
        // A route to a replica no longer listed counts as none.
        assert_eq!(choose(&[1, 0], Some(5), 0), 1);
    }

    #[test]
    fn a_lease_counts_until_dropped() {
        let loads = ReplicaLoads::default();
        let (a, b) = (loads.lease("http://a"), loads.lease("http://a"));
        assert_eq!((loads.of("http://a"), loads.of("http://b")), (2, 0));
        drop(a);
        assert_eq!(loads.of("http://a"), 1);
        drop(b);
        assert_eq!(loads.of("http://a"), 0);
    }
}
