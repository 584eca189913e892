//! Session bookkeeping shared by every backend: ids, capacities and the memory budget.
//!
//! A session reserves, when it opens, the tokens its request can reach (all of them counted
//! against the budget at once, so admission is decided before any pass runs). One that
//! outgrows its reservation anyway grows by [`GROWTH_CHUNK`] tokens at a time, each growth
//! admitted against the budget like a new session, up to the model's context length.
//!
//! The budget may be set after the table is made ([`SessionTable::set_budget`]): a fraction
//! of the free memory is measured once the model is warmed up, and warm-up opens a session
//! of its own. What sessions hold is counted from the first one either way, so a budget set
//! later bounds them all.

use std::collections::HashMap;

use crate::error::{ModelError, Result};
use crate::language_model::SessionId;

/// Tokens by which a session that outgrows its reservation grows.
pub(crate) const GROWTH_CHUNK: usize = 256;

/// A session's reservation after it grows: its new capacity and the bytes that adds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Growth {
    pub(crate) capacity: usize,
    pub(crate) bytes: u64,
}

/// One open session's state `S` plus its length and capacity.
#[derive(Debug)]
pub(crate) struct Session<S> {
    pub(crate) state: S,
    pub(crate) len: usize,
    pub(crate) capacity: usize,
    bytes: u64,
}

/// Open sessions of one model, with a budget on the bytes their caches hold.
#[derive(Debug)]
pub(crate) struct SessionTable<S> {
    sessions: HashMap<SessionId, Session<S>>,
    next_id: SessionId,
    in_use: u64,
    budget: Option<u64>,
}

impl<S> SessionTable<S> {
    pub(crate) fn new(budget: Option<u64>) -> Self {
        Self { sessions: HashMap::new(), next_id: 1, in_use: 0, budget }
    }

    /// Bounds what the sessions hold together from now on (`None`: unbounded). Sessions open
    /// already stay open and count against it, even past it: they are not taken back, but
    /// nothing more is admitted until they fit.
    pub(crate) fn set_budget(&mut self, budget: Option<u64>) {
        self.budget = budget;
    }

    /// Checks the budget for a session of `bytes`, without allocating anything.
    pub(crate) fn admit(&self, bytes: u64) -> Result<()> {
        if let Some(budget) = self.budget
            && self.in_use.saturating_add(bytes) > budget
        {
            return Err(ModelError::MemoryBudget {
                requested: bytes,
                in_use: self.in_use,
                budget,
                sessions: self.sessions.len(),
            });
        }
        Ok(())
    }

    /// Registers a session that [`Self::admit`] accepted.
    pub(crate) fn insert(&mut self, state: S, capacity: usize, bytes: u64) -> Result<SessionId> {
        self.admit(bytes)?;
        let id = self.next_id;
        self.next_id += 1;
        self.in_use += bytes;
        self.sessions.insert(id, Session { state, len: 0, capacity, bytes });
        Ok(id)
    }

    pub(crate) fn get(&self, id: SessionId) -> Result<&Session<S>> {
        self.sessions.get(&id).ok_or(ModelError::UnknownSession(id))
    }

    pub(crate) fn get_mut(&mut self, id: SessionId) -> Result<&mut Session<S>> {
        self.sessions.get_mut(&id).ok_or(ModelError::UnknownSession(id))
    }

    /// The sessions `ids` (distinct), each `None` where there is no such session: for a
    /// pass that writes several sessions' caches at once.
    pub(crate) fn many_mut(&mut self, ids: &[SessionId]) -> Vec<Option<&mut Session<S>>> {
        let mut found: HashMap<SessionId, &mut Session<S>> =
            self.sessions.iter_mut().filter(|(id, _)| ids.contains(id)).map(|(id, s)| (*id, s)).collect();
        ids.iter().map(|id| found.remove(id)).collect()
    }

    /// What the session must grow by for `extra` more tokens: `None` when they fit in its
    /// reservation; else its capacity rounded up to whole [`GROWTH_CHUNK`]s past what it
    /// needs (at most `context_length`), checked against the budget. Changes nothing: the
    /// caller allocates, then calls [`Self::grown`].
    pub(crate) fn growth(
        &self,
        id: SessionId,
        extra: usize,
        context_length: usize,
        bytes_per_token: u64,
    ) -> Result<Option<Growth>> {
        let s = self.get(id)?;
        let needed = s.len + extra;
        if needed > context_length {
            return Err(ModelError::ContextOverflow { session: id, len: s.len, extra, capacity: context_length });
        }
        if needed <= s.capacity {
            return Ok(None);
        }
        let capacity = needed.next_multiple_of(GROWTH_CHUNK).min(context_length);
        let bytes = (capacity - s.capacity) as u64 * bytes_per_token;
        // A session that would outgrow the whole budget can never fit: named by its whole
        // size, which makes it the request's fault (INVALID_ARGUMENT), not the node's load.
        if let Some(budget) = self.budget
            && s.bytes.saturating_add(bytes) > budget
        {
            return Err(ModelError::MemoryBudget {
                requested: s.bytes.saturating_add(bytes),
                in_use: self.in_use,
                budget,
                sessions: self.sessions.len(),
            });
        }
        self.admit(bytes)?;
        Ok(Some(Growth { capacity, bytes }))
    }

    /// Records a growth that [`Self::growth`] planned and the caller allocated.
    pub(crate) fn grown(&mut self, id: SessionId, growth: Growth) -> Result<()> {
        let s = self.sessions.get_mut(&id).ok_or(ModelError::UnknownSession(id))?;
        s.capacity = growth.capacity;
        s.bytes += growth.bytes;
        self.in_use += growth.bytes;
        Ok(())
    }

    /// Checks, for a copy of the first `len` tokens of `source` into a new session of
    /// `capacity` tokens, that `source` holds them and that `capacity` holds them and one
    /// more (a copy is made to be forwarded after).
    pub(crate) fn check_copy(&self, source: SessionId, len: usize, capacity: usize) -> Result<()> {
        let s = self.get(source)?;
        if len > s.len || len >= capacity {
            return Err(ModelError::InvalidInput(format!(
                "cannot copy {len} tokens of session {source} (it holds {}) into a session of {capacity}",
                s.len
            )));
        }
        Ok(())
    }

    /// Sets the session's length to `len` ≤ its current length.
    pub(crate) fn truncate(&mut self, id: SessionId, len: usize) -> Result<()> {
        let s = self.get_mut(id)?;
        if len > s.len {
            return Err(ModelError::InvalidInput(format!(
                "cannot truncate session {id} to {len}: it holds only {} tokens",
                s.len
            )));
        }
        s.len = len;
        Ok(())
    }

    /// Registers a session that [`Self::admit`] accepted whose state already holds `len`
    /// tokens (a copy of another session's).
    pub(crate) fn insert_holding(&mut self, state: S, capacity: usize, bytes: u64, len: usize) -> Result<SessionId> {
        let id = self.insert(state, capacity, bytes)?;
        self.get_mut(id)?.len = len;
        Ok(id)
    }

    pub(crate) fn remove(&mut self, id: SessionId) -> Result<()> {
        let s = self.sessions.remove(&id).ok_or(ModelError::UnknownSession(id))?;
        self.in_use -= s.bytes;
        Ok(())
    }

    pub(crate) fn len(&self) -> usize {
        self.sessions.len()
    }

    pub(crate) fn memory(&self) -> (u64, Option<u64>) {
        (self.in_use, self.budget)
    }
}

/// Resolves a requested capacity against the model's context length.
pub(crate) fn resolve_capacity(requested: Option<usize>, context_length: usize) -> Result<usize> {
    let cap = requested.unwrap_or(context_length);
    if cap == 0 || cap > context_length {
        return Err(ModelError::InvalidInput(format!(
            "session capacity {cap} must be between 1 and the context length {context_length}"
        )));
    }
    Ok(cap)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_budget_set_later_counts_the_sessions_opened_before_it() {
        let mut table = SessionTable::new(None);
        let early = table.insert((), 10, 600).unwrap();
        table.set_budget(Some(1000));
        assert_eq!(table.memory(), (600, Some(1000)));
        let err = table.insert((), 10, 500).unwrap_err();
        assert!(matches!(err, ModelError::MemoryBudget { in_use: 600, budget: 1000, .. }), "{err}");
        table.insert((), 10, 400).unwrap();
        // Set below what is held: nothing is taken back, nothing more admitted.
        table.set_budget(Some(100));
        assert!(table.admit(1).is_err());
        table.remove(early).unwrap();
        table.set_budget(None);
        assert_eq!(table.memory(), (400, None));
        table.admit(u64::MAX).unwrap();
    }

    #[test]
    fn a_session_grows_by_whole_chunks_within_the_budget_and_the_context() {
        let per_token = 10u64;
        let mut table = SessionTable::new(Some(1000 * per_token));
        let id = table.insert((), 100, 100 * per_token).unwrap();
        table.get_mut(id).unwrap().len = 90;
        assert_eq!(table.growth(id, 10, 4096, per_token).unwrap(), None);
        let growth = table.growth(id, 11, 4096, per_token).unwrap().unwrap();
        assert_eq!(growth, Growth { capacity: GROWTH_CHUNK, bytes: (GROWTH_CHUNK as u64 - 100) * per_token });
        table.grown(id, growth).unwrap();
        assert_eq!(table.memory().0, GROWTH_CHUNK as u64 * per_token);
        // Capped by the context length, and refused past it.
        let growth = table.growth(id, 300, 500, per_token).unwrap().unwrap();
        assert_eq!(growth.capacity, 500);
        let err = table.growth(id, 411, 500, per_token).unwrap_err();
        assert!(matches!(err, ModelError::ContextOverflow { capacity: 500, .. }), "{err}");
        // Past the whole budget: refused for good, named by the whole session's size, and
        // nothing recorded.
        let err = table.growth(id, 2000, 1 << 20, per_token).unwrap_err();
        assert!(matches!(err, ModelError::MemoryBudget { in_use, .. } if in_use == GROWTH_CHUNK as u64 * per_token));
        assert!(matches!(err, ModelError::MemoryBudget { requested, .. } if requested == 2304 * per_token), "{err}");
        assert_eq!(err.class(), crate::error::ErrorClass::InvalidArgument);
        assert_eq!(table.get(id).unwrap().capacity, GROWTH_CHUNK);
        // Within the whole budget but not beside the other sessions: refused for now.
        let other = table.insert((), 600, 600 * per_token).unwrap();
        let err = table.growth(id, 200, 1 << 20, per_token).unwrap_err();
        assert_eq!(err.class(), crate::error::ErrorClass::ResourceExhausted, "{err}");
        table.remove(other).unwrap();
    }
}
