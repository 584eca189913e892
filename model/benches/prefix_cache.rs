//! The prefix cache's own cost, without a model's: a table model (whose "cache" is its token
//! history) under [`PrefixCache`], holding 100 000 cached tokens in two shapes:
//!
//! - 100 entries of 1 000 tokens, each a shared 200-token system prompt and 800 tokens of its
//!   own (long conversations);
//! - 1 923 entries of 52 tokens, each a shared 48-token system prompt (three whole blocks)
//!   and 4 tokens of its own, so that every entry holds the same blocks and differs past
//!   them only: what a lookup that compared every entry sharing a block would pay most for.
//!
//! Per operation, median of 400:
//!
//! 1. a hit: a prompt of an entry's length that shares 90 % of one entry's tokens is opened
//!    from it (the lookup, and the copy of those rows of the table's history), then released;
//! 2. a miss: a prompt of the same length that shares nothing is opened, then released;
//! 3. an insert: a session of an entry's length of committed tokens is retired into the
//!    cache (its copy at its size, the index's blocks, the entries it covers), then taken out
//!    again by a hit that continues it whole.
//!
//! `cargo bench -p specd-model --bench prefix_cache`

use std::time::{Duration, Instant};

use specd_model::{LanguageModel, PrefixCache, PrefixRequest, TableModel};

const REPEATS: usize = 400;

/// How the cached tokens are laid out.
#[derive(Debug, Clone, Copy)]
struct Shape {
    entries: u32,
    len: u32,
    system: u32,
}

impl Shape {
    fn sequence(self, entry: u32) -> Vec<u32> {
        // After the system prompt, each entry's own pseudo-random tokens (an LCG seeded by it).
        let mut state = u64::from(entry) * 0x9e37_79b9 + 1;
        (0..self.len)
            .map(|i| {
                state = state.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1_442_695_040_888_963_407);
                if i < self.system { i % 7 } else { (state >> 59) as u32 }
            })
            .collect()
    }
}

fn median(mut times: Vec<Duration>) -> f64 {
    times.sort();
    times[times.len() / 2].as_secs_f64() * 1e6
}

fn main() {
    for shape in [Shape { entries: 100, len: 1_000, system: 200 }, Shape { entries: 1_923, len: 52, system: 48 }] {
        measure(shape);
    }
}

fn measure(shape: Shape) {
    let Shape { entries, len, .. } = shape;
    let table = serde_json::json!({"vocab_size": 32, "default": vec![1.0 / 32.0; 32]});
    let mut cache = PrefixCache::new(TableModel::from_json("bench", table, None).expect("a table"), 32);
    let capacity = Some(len as usize + 8);
    for entry in 0..entries {
        let tokens = shape.sequence(entry);
        let opened = cache.open_with_prefix(&PrefixRequest { tokens: &tokens, salt: "", capacity }).expect("opens");
        cache.forward(opened.session, &tokens[opened.reused..]).expect("a pass");
        cache.retire(opened.session, "", &tokens).expect("retired");
    }
    let stats = cache.prefix_cache_stats().expect("stats");
    println!("cache: {} entries, {} tokens ({shape:?})", stats.entries, stats.tokens);

    let mut hit = shape.sequence(entries / 2);
    for t in &mut hit[len as usize * 9 / 10..] {
        *t = 31;
    }
    let miss: Vec<u32> = (0..len).map(|i| 24 + i % 8).collect();
    let mut ops = |prompt: &[u32]| {
        let mut times = Vec::with_capacity(REPEATS);
        let mut reused = 0;
        for _ in 0..REPEATS {
            let started = Instant::now();
            let opened = cache.open_with_prefix(&PrefixRequest { tokens: prompt, salt: "", capacity }).expect("opens");
            times.push(started.elapsed());
            reused = opened.reused;
            cache.release(opened.session).expect("released");
        }
        (median(times), reused)
    };
    let (hit_us, reused) = ops(&hit);
    println!("hit (open from a cached prefix, {reused} tokens copied): {hit_us:.1} µs");
    let (miss_us, reused) = ops(&miss);
    println!("miss (lookup and an empty open, {reused} reused): {miss_us:.1} µs");

    let extra = shape.sequence(entries + 1);
    let mut next = extra.clone();
    next.push(1);
    let mut times = Vec::with_capacity(REPEATS);
    for _ in 0..REPEATS {
        let opened = cache.open_session(capacity).expect("opens");
        cache.forward(opened, &extra).expect("a pass");
        let started = Instant::now();
        cache.retire(opened, "", &extra).expect("retired");
        times.push(started.elapsed());
        let adopted = cache.open_with_prefix(&PrefixRequest { tokens: &next, salt: "", capacity }).expect("opens");
        assert_eq!(adopted.reused, extra.len(), "the retired entry is found whole");
        cache.release(adopted.session).expect("released");
    }
    println!("insert (retire {len} committed tokens into the cache): {:.1} µs", median(times));
}
