//! The prefix cache's own cost, without a model's: a table model (whose "cache" is its token
//! history) under [`PrefixCache`], holding 100 entries of 1 000 tokens (100 000 cached tokens;
//! each entry a shared 200-token system prompt and 800 tokens of its own). Per operation,
//! median of 400:
//!
//! 1. a hit: a 1 000-token prompt that shares 900 tokens with one entry is opened from it
//!    (the lookup, and the copy of 900 rows of the table's history), then released;
//! 2. a miss: a 1 000-token prompt that shares nothing is opened, then released;
//! 3. an insert: a session of 1 000 committed tokens is retired into the cache (its copy at
//!    its size, the index's blocks, the entries it covers), then taken out again by a hit
//!    that continues it whole.
//!
//! `cargo bench -p specd-model --bench prefix_cache`

use std::time::{Duration, Instant};

use specd_model::{LanguageModel, PrefixCache, PrefixRequest, TableModel};

const ENTRIES: u32 = 100;
const LEN: u32 = 1_000;
const SYSTEM: u32 = 200;
const REPEATS: usize = 400;

fn sequence(entry: u32) -> Vec<u32> {
    // After the system prompt, each entry's own pseudo-random tokens (an LCG seeded by it).
    let mut state = u64::from(entry) * 0x9e37_79b9 + 1;
    (0..LEN)
        .map(|i| {
            state = state.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1_442_695_040_888_963_407);
            if i < SYSTEM { i % 7 } else { (state >> 59) as u32 }
        })
        .collect()
}

fn median(mut times: Vec<Duration>) -> f64 {
    times.sort();
    times[times.len() / 2].as_secs_f64() * 1e6
}

fn main() {
    let table = serde_json::json!({"vocab_size": 32, "default": vec![1.0 / 32.0; 32]});
    let mut cache = PrefixCache::new(TableModel::from_json("bench", table, None).expect("a table"), 32);
    let capacity = Some(LEN as usize + 8);
    for entry in 0..ENTRIES {
        let tokens = sequence(entry);
        let opened = cache.open_with_prefix(&PrefixRequest { tokens: &tokens, salt: "", capacity }).expect("opens");
        cache.forward(opened.session, &tokens[opened.reused..]).expect("a pass");
        cache.retire(opened.session, "", &tokens).expect("retired");
    }
    let stats = cache.prefix_cache_stats().expect("stats");
    println!("cache: {} entries, {} tokens", stats.entries, stats.tokens);

    let mut hit = sequence(ENTRIES / 2);
    for t in &mut hit[900..] {
        *t = 31;
    }
    let miss: Vec<u32> = (0..LEN).map(|i| 24 + i % 8).collect();
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

    let extra = sequence(ENTRIES + 1);
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
    println!("insert (retire 1 000 committed tokens into the cache): {:.1} µs", median(times));
}
