//! Routing by prefix: which replica of a role last opened a session on a prompt's blocks, so
//! that a conversation's next turn, or an agent's next call, opens where its prefix is
//! cached (each node's prefix cache: docs/architecture.md).
//!
//! A prompt is cut into blocks of [`BLOCK_TOKENS`] tokens, as the nodes' caches cut it, and
//! each whole block is named by a hash of the request's `cache_salt` and every token up to
//! the block's end (a chain, so equal names mean equal prefixes but for a hash collision,
//! which only sends a session to a replica that has nothing for it). The table maps names
//! to the replica that holds them; a lookup walks a prompt's chain from its longest prefix
//! down. Its size is bounded: past [`PrefixRoutes::new`]'s capacity, the names used longest
//! ago go.

use std::collections::HashMap;
use std::hash::{DefaultHasher, Hash, Hasher};
use std::sync::{Arc, Mutex, PoisonError};

/// Tokens per block: the nodes' prefix caches match whole blocks of this many tokens
/// (`specd_model::prefix_cache`), and so routes do.
pub const BLOCK_TOKENS: usize = 16;

/// How many block names the coordinator remembers per role by default: about 1.6 M prompt
/// tokens' worth, some 5 MB.
pub const DEFAULT_CAPACITY: usize = 100_000;

/// A prompt's chain of block names, one per whole block, under its salt.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PromptBlocks(Arc<[u64]>);

impl PromptBlocks {
    /// The names of the whole blocks of `tokens` under `salt`.
    pub fn of(salt: &str, tokens: &[u32]) -> Self {
        let mut running = DefaultHasher::new();
        salt.hash(&mut running);
        let names = tokens
            .chunks_exact(BLOCK_TOKENS)
            .map(|block| {
                block.hash(&mut running);
                running.finish()
            })
            .collect();
        Self(names)
    }

    /// No whole block: nothing to route by.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

/// Which replica holds which block names, for one role.
#[derive(Debug)]
pub struct PrefixRoutes {
    capacity: usize,
    table: Mutex<Table>,
}

#[derive(Debug, Default)]
struct Table {
    by_name: HashMap<u64, Holder>,
    /// Bumped on every record and hit: what "used longest ago" is measured in.
    clock: u64,
}

#[derive(Debug)]
struct Holder {
    replica: Arc<str>,
    used: u64,
}

impl PrefixRoutes {
    /// A table that remembers at most `capacity` block names (at least one).
    pub fn new(capacity: usize) -> Self {
        Self { capacity: capacity.max(1), table: Mutex::default() }
    }

    /// The replica that holds the longest prefix of `blocks` recorded, and how many blocks it
    /// holds.
    pub fn lookup(&self, blocks: &PromptBlocks) -> Option<(Arc<str>, usize)> {
        let mut table = self.table.lock().unwrap_or_else(PoisonError::into_inner);
        table.clock += 1;
        let now = table.clock;
        let (longest, replica) = blocks
            .0
            .iter()
            .enumerate()
            .rev()
            .find_map(|(i, name)| Some((i + 1, Arc::clone(&table.by_name.get(name)?.replica))))?;
        // The shorter prefixes are in use too: a prompt that shares only them finds them.
        for name in &blocks.0[..longest] {
            if let Some(holder) = table.by_name.get_mut(name) {
                holder.used = now;
            }
        }
        Some((replica, longest))
    }

    /// `replica` now holds every block of `blocks` (a session opened there on them).
    pub fn record(&self, blocks: &PromptBlocks, replica: &str) {
        if blocks.is_empty() {
            return;
        }
        let mut table = self.table.lock().unwrap_or_else(PoisonError::into_inner);
        table.clock += 1;
        let now = table.clock;
        let replica: Arc<str> = Arc::from(replica);
        for &name in blocks.0.iter() {
            table.by_name.insert(name, Holder { replica: Arc::clone(&replica), used: now });
        }
        if table.by_name.len() > self.capacity {
            // Down to three quarters at once, so that a full table does not select on every
            // record: the names used longest ago go (with every name used at the same time as
            // the last of them).
            let keep = self.capacity - self.capacity / 4;
            let mut stamps: Vec<u64> = table.by_name.values().map(|h| h.used).collect();
            let cut = stamps.len() - keep;
            let (_, &mut newest_dropped, _) = stamps.select_nth_unstable(cut - 1);
            table.by_name.retain(|_, holder| holder.used > newest_dropped);
        }
    }

    /// Block names remembered now.
    pub fn len(&self) -> usize {
        self.table.lock().unwrap_or_else(PoisonError::into_inner).by_name.len()
    }

    /// Nothing remembered.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// What a generation records once its session opened on a target: its prompt's blocks are
/// held there, so the next request that shares them goes there too.
#[derive(Debug, Clone)]
pub struct RouteNote {
    routes: Arc<PrefixRoutes>,
    blocks: PromptBlocks,
}

impl RouteNote {
    pub fn new(routes: Arc<PrefixRoutes>, blocks: PromptBlocks) -> Self {
        Self { routes, blocks }
    }

    /// The session opened on (or moved to) `replica`.
    pub fn opened_on(&self, replica: &str) {
        self.routes.record(&self.blocks, replica);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn prompt(seed: u32, len: usize) -> Vec<u32> {
        (0..len as u32).map(|i| (i * 7 + seed * 13) % 50).collect()
    }

    #[test]
    fn a_prompt_goes_where_its_longest_recorded_prefix_is() {
        let routes = PrefixRoutes::new(1000);
        let system = prompt(1, 40);
        routes.record(&PromptBlocks::of("", &system), "http://a");
        // The next turn: the same prompt, a reply and a new message.
        let mut next = system.clone();
        next.extend(prompt(2, 30));
        routes.record(&PromptBlocks::of("", &next[..64]), "http://b");
        assert_eq!(routes.lookup(&PromptBlocks::of("", &next)), Some((Arc::from("http://b"), 4)));
        // A prompt sharing only the first two blocks: the replica recorded last for them.
        let mut other = system[..32].to_vec();
        other.extend(prompt(3, 40));
        assert_eq!(routes.lookup(&PromptBlocks::of("", &other)), Some((Arc::from("http://b"), 2)));
        // Nothing shared, or another salt, or under a whole block: no route.
        assert_eq!(routes.lookup(&PromptBlocks::of("", &prompt(9, 64))), None);
        assert_eq!(routes.lookup(&PromptBlocks::of("tenant", &next)), None);
        assert!(PromptBlocks::of("", &system[..15]).is_empty());
    }

    #[test]
    fn a_full_table_forgets_the_names_used_longest_ago() {
        let routes = PrefixRoutes::new(8);
        let (old, kept) = (prompt(1, 64), prompt(2, 64));
        routes.record(&PromptBlocks::of("", &old), "http://a");
        routes.record(&PromptBlocks::of("", &kept), "http://b");
        assert_eq!(routes.len(), 8);
        // A hit keeps the first prompt's names in use; the second's go when a third comes.
        assert!(routes.lookup(&PromptBlocks::of("", &old)).is_some());
        routes.record(&PromptBlocks::of("", &prompt(3, 16)), "http://c");
        assert!(routes.len() <= 8, "{}", routes.len());
        assert_eq!(
            routes.lookup(&PromptBlocks::of("", &old)).map(|(r, n)| (r.to_string(), n)),
            Some(("http://a".into(), 4))
        );
        assert_eq!(routes.lookup(&PromptBlocks::of("", &prompt(3, 16))).map(|(_, n)| n), Some(1));
        assert_eq!(routes.lookup(&PromptBlocks::of("", &kept)), None);
    }
}
