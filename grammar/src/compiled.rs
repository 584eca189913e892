//! The matchers of constraints compiled before, fresh (before any token), by the text of the
//! constraint: clients send the same schema or grammar with request after request (an agent's
//! tools, a service's response format), and each request is compiled three times (by the
//! coordinator and by both nodes). A clone of a fresh matcher is an independent matcher; its
//! lexer's cache stays shared, so what one session's masks built serves the next.

use std::collections::HashMap;

use llguidance::Matcher;

/// How many compiled constraints a vocabulary keeps; the least recently used goes first.
pub(crate) const CAPACITY: usize = 128;

#[derive(Default)]
pub(crate) struct CompiledCache {
    entries: HashMap<String, (Matcher, u64)>,
    clock: u64,
}

impl CompiledCache {
    /// A fresh matcher for `key`, if it was compiled before.
    pub(crate) fn get(&mut self, key: &str) -> Option<Matcher> {
        self.clock += 1;
        let clock = self.clock;
        self.entries.get_mut(key).map(|(matcher, used)| {
            *used = clock;
            matcher.clone()
        })
    }

    pub(crate) fn insert(&mut self, key: String, matcher: &Matcher) {
        if self.entries.len() >= CAPACITY
            && let Some(oldest) = self.entries.iter().min_by_key(|(_, (_, used))| *used).map(|(k, _)| k.clone())
        {
            self.entries.remove(&oldest);
        }
        self.clock += 1;
        self.entries.insert(key, (matcher.clone(), self.clock));
    }

    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.entries.len()
    }
}
