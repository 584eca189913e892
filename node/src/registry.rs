//! The open sessions of a node, by the coordinator's session id.
//!
//! Requests of one session are serialised by its own lock (the coordinator sends one at a
//! time anyway); different sessions never wait on each other here. The model work itself is
//! serialised by the model thread.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use dashmap::DashMap;
use tokio::sync::Mutex;

/// Why a session cannot be registered.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RegistryError {
    #[error("session_id is empty")]
    EmptyId,
    #[error("{0} sessions are open, the node's limit")]
    Full(usize),
    #[error("session {0} is already open")]
    Duplicate(String),
}

/// A session's state and when it was last asked for.
#[derive(Debug)]
struct Entry<S> {
    state: Arc<Mutex<S>>,
    /// Milliseconds since the registry's `origin`.
    last_used_ms: AtomicU64,
}

/// Sessions of state `S`, at most `limit` at once.
#[derive(Debug)]
pub struct SessionRegistry<S> {
    sessions: DashMap<String, Entry<S>>,
    limit: usize,
    origin: Instant,
}

impl<S> SessionRegistry<S> {
    pub fn new(limit: usize) -> Self {
        Self { sessions: DashMap::new(), limit, origin: Instant::now() }
    }

    pub fn len(&self) -> usize {
        self.sessions.len()
    }

    pub fn is_empty(&self) -> bool {
        self.sessions.is_empty()
    }

    /// Checks that `id` could be registered now (before paying for a model session).
    pub fn check_new(&self, id: &str) -> Result<(), RegistryError> {
        if id.is_empty() {
            return Err(RegistryError::EmptyId);
        }
        if self.sessions.len() >= self.limit {
            return Err(RegistryError::Full(self.limit));
        }
        if self.sessions.contains_key(id) {
            return Err(RegistryError::Duplicate(id.to_owned()));
        }
        Ok(())
    }

    /// Registers `state` under `id`; gives it back when `id` was taken meanwhile.
    pub fn insert(&self, id: String, state: S) -> Result<(), (RegistryError, S)> {
        match self.sessions.entry(id) {
            dashmap::Entry::Vacant(slot) => {
                slot.insert(Entry { state: Arc::new(Mutex::new(state)), last_used_ms: AtomicU64::new(self.now_ms()) });
                Ok(())
            }
            dashmap::Entry::Occupied(slot) => Err((RegistryError::Duplicate(slot.key().clone()), state)),
        }
    }

    fn now_ms(&self) -> u64 {
        self.origin.elapsed().as_millis() as u64
    }

    /// The session, marked as used now.
    pub fn get(&self, id: &str) -> Option<Arc<Mutex<S>>> {
        self.sessions.get(id).map(|entry| {
            entry.last_used_ms.store(self.now_ms(), Ordering::Relaxed);
            Arc::clone(&entry.state)
        })
    }

    pub fn remove(&self, id: &str) -> Option<Arc<Mutex<S>>> {
        self.sessions.remove(id).map(|(_, entry)| entry.state)
    }

    /// Sessions nobody asked for in the last `ttl`.
    pub fn idle(&self, ttl: Duration) -> Vec<String> {
        let now = self.now_ms();
        let ttl = ttl.as_millis() as u64;
        self.sessions
            .iter()
            .filter(|e| now.saturating_sub(e.value().last_used_ms.load(Ordering::Relaxed)) >= ttl)
            .map(|e| e.key().clone())
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn limits_and_duplicates() {
        let r = SessionRegistry::new(1);
        assert_eq!(r.check_new(""), Err(RegistryError::EmptyId));
        r.insert("a".into(), 1).unwrap();
        assert_eq!(r.check_new("b"), Err(RegistryError::Full(1)));
        assert!(matches!(r.insert("a".into(), 2), Err((RegistryError::Duplicate(_), 2))));
        assert!(r.get("a").is_some());
        assert!(r.remove("a").is_some());
        assert!(r.is_empty());
        assert_eq!(r.check_new("a"), Ok(()));
    }

    #[test]
    fn idle_sessions_are_those_not_asked_for_within_the_ttl() {
        let r = SessionRegistry::new(4);
        r.insert("old".into(), 1).unwrap();
        r.insert("busy".into(), 2).unwrap();
        std::thread::sleep(Duration::from_millis(30));
        r.get("busy");
        assert_eq!(r.idle(Duration::from_millis(20)), vec!["old".to_owned()]);
        assert!(r.idle(Duration::from_secs(60)).is_empty());
    }
}
