//! Session bookkeeping shared by every backend: ids, capacities and the memory budget.

use std::collections::HashMap;

use crate::error::{ModelError, Result};
use crate::language_model::SessionId;

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

    /// Checks that `extra` more tokens fit in the session.
    pub(crate) fn check_room(&self, id: SessionId, extra: usize) -> Result<()> {
        let s = self.get(id)?;
        if s.len + extra > s.capacity {
            return Err(ModelError::ContextOverflow { session: id, len: s.len, extra, capacity: s.capacity });
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
