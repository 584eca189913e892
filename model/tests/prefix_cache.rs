//! The prefix cache on real models: a session that starts from a cached prefix gives the
//! logits a fresh session gives, for every fixture family (Gemma 3's windowed layers and
//! Mistral's sliding window included, with sequences longer than their windows) on libtorch,
//! and for the families the host engine runs, whether the prefix ends mid-block (its rows
//! copied from an entry that holds more) or covers the whole prompt but its last token (the
//! entry taken over). Bound: 2e-5 in f32, the noise between a block and the same tokens one
//! at a time (`kv_cache.rs`); rows computed from another sequence's cache are off by far
//! more (asserted below, so the comparison can fail).

mod common;

use anyhow::Result;
use common::{FIXTURES, cpu_f32, fixture, max_abs_diff, reference};
use specd_model::{Engine, LanguageModel, LoadOptions, PrefixCache, PrefixRequest, load_model};

const TOL: f32 = 2e-5;

const HOST_FIXTURES: [&str; 5] = ["llama_gqa_untied", "llama_tied", "qwen2", "mistral_sharded", "mistral_window"];

/// 40 tokens from the fixture's reference ones, longer than every fixture's window.
fn long_prompt(name: &str, vocab: usize) -> Result<Vec<u32>> {
    let tokens = reference(name)?.tokens;
    Ok((0..40).map(|i| (tokens[i % tokens.len()] + i as u32 / 7) % vocab as u32).collect())
}

/// The last `rows` rows of logits of a fresh session's pass over `tokens`.
fn fresh_rows(name: &str, options: &LoadOptions, tokens: &[u32], rows: usize) -> Result<Vec<Vec<f32>>> {
    let mut m = load_model(&fixture(name), options)?;
    let s = m.open_session(None)?;
    Ok(m.forward_last(s, tokens, rows)?.to_rows())
}

fn check(name: &str, options: &LoadOptions) -> Result<()> {
    let fresh_pass = |tokens: &[u32], rows: usize| fresh_rows(name, options, tokens, rows);
    let mut m = PrefixCache::new(load_model(&fixture(name), options)?, 16);
    let vocab = m.info().vocab_size;
    let first = long_prompt(name, vocab)?[..37].to_vec();
    let opened = m.open_with_prefix(&PrefixRequest { tokens: &first, salt: "", capacity: Some(64) })?;
    assert_eq!(opened.reused, 0, "{name}: nothing cached yet");
    m.forward(opened.session, &first)?;
    // Rows of rejected candidates past the committed tokens: the node trims them away
    // before it retires the session, as here.
    m.forward(opened.session, &[1, 2, 3])?;
    m.truncate(opened.session, first.len())?;
    m.retire(opened.session, "", &first)?;

    // Shares 25 tokens (mid-block) with the entry, which holds more: copied.
    let mut other = first[..25].to_vec();
    other.extend((0..8).map(|i| (first[25 + i] + 1) % vocab as u32));
    let opened = m.open_with_prefix(&PrefixRequest { tokens: &other, salt: "", capacity: Some(64) })?;
    assert_eq!(opened.reused, 25, "{name}");
    let cached = m.forward(opened.session, &other[25..])?.to_rows();
    let fresh = fresh_pass(&other, 8)?;
    let diff = max_abs_diff(&cached, &fresh);
    assert!(diff <= TOL, "{name}: after a copied prefix, max |Δlogit| = {diff} > {TOL}");
    // The same rows scored on the wrong prefix (the entry's own tokens) differ: the
    // comparison can fail.
    let wrong = m.open_with_prefix(&PrefixRequest { tokens: &first, salt: "", capacity: Some(64) })?;
    m.truncate(wrong.session, 25)?;
    m.forward(wrong.session, &[first[25]])?;
    let off = max_abs_diff(&m.forward(wrong.session, &other[26..])?.to_rows(), &fresh[1..]);
    assert!(off > 1e-3, "{name}: another prefix's rows differ by only {off}");
    m.release(wrong.session)?;
    m.release(opened.session)?;

    // Continues the whole entry: taken over, its last token the only one fed.
    let mut next = long_prompt(name, vocab)?;
    next.truncate(38);
    let opened = m.open_with_prefix(&PrefixRequest { tokens: &next, salt: "", capacity: Some(64) })?;
    assert_eq!(opened.reused, 37, "{name}");
    let cached = m.forward(opened.session, &next[37..])?.to_rows();
    let diff = max_abs_diff(&cached, &fresh_pass(&next, 1)?);
    assert!(diff <= TOL, "{name}: after a whole entry, max |Δlogit| = {diff} > {TOL}");
    let stats = m.prefix_cache_stats().expect("a cache has stats");
    assert_eq!((stats.hits, stats.entries), (3, 0), "{name}: {stats:?}");
    Ok(())
}

#[test]
fn logits_after_a_hit_equal_a_fresh_pass_on_libtorch() -> Result<()> {
    for name in FIXTURES {
        check(name, &cpu_f32())?;
    }
    Ok(())
}

#[test]
fn logits_after_a_hit_equal_a_fresh_pass_on_the_host_engine() -> Result<()> {
    for name in HOST_FIXTURES {
        check(name, &LoadOptions { engine: Engine::Host, ..cpu_f32() })?;
    }
    Ok(())
}

/// Two live sessions started from one entry (two conversations on one system prompt), their
/// passes interleaved: each gives a fresh pass's logits, so neither sees the other's rows,
/// and the entry is left whole for a third, which takes it over.
fn two_sessions_on_one_entry(name: &str, options: &LoadOptions) -> Result<()> {
    let fresh_pass = |tokens: &[u32], rows: usize| fresh_rows(name, options, tokens, rows);
    let mut m = PrefixCache::new(load_model(&fixture(name), options)?, 16);
    let vocab = m.info().vocab_size as u32;
    let entry = long_prompt(name, vocab as usize)?[..37].to_vec();
    let first = m.open_with_prefix(&PrefixRequest { tokens: &entry, salt: "", capacity: Some(64) })?;
    m.forward(first.session, &entry)?;
    m.retire(first.session, "", &entry)?;

    let branch = |shift: u32| -> Vec<u32> {
        let mut tokens = entry[..30].to_vec();
        tokens.extend((0..9).map(|i| (entry[(30 + i) % entry.len()] + shift + i as u32) % vocab));
        tokens
    };
    let (a, b) = (branch(1), branch(2));
    let opened_a = m.open_with_prefix(&PrefixRequest { tokens: &a[..36], salt: "", capacity: Some(64) })?;
    let opened_b = m.open_with_prefix(&PrefixRequest { tokens: &b[..36], salt: "", capacity: Some(64) })?;
    assert_eq!((opened_a.reused, opened_b.reused), (30, 30), "{name}: both copy the shared rows");
    let (sa, sb) = (opened_a.session, opened_b.session);
    // Interleaved: A's rest of its prompt, B's, then one token each in turn.
    let mut rows_a = m.forward(sa, &a[30..36])?.to_rows();
    let mut rows_b = m.forward(sb, &b[30..36])?.to_rows();
    for i in 36..39 {
        rows_a.extend(m.forward(sa, &a[i..=i])?.to_rows());
        rows_b.extend(m.forward(sb, &b[i..=i])?.to_rows());
    }
    for (tokens, rows, who) in [(&a, &rows_a, "A"), (&b, &rows_b, "B")] {
        let diff = max_abs_diff(rows, &fresh_pass(tokens, 9)?);
        assert!(diff <= TOL, "{name}: session {who} beside the other, max |Δlogit| = {diff} > {TOL}");
    }
    // The entry is still whole: a prompt continuing it takes it over.
    let mut next = entry.clone();
    next.push(entry[0]);
    let third = m.open_with_prefix(&PrefixRequest { tokens: &next, salt: "", capacity: Some(64) })?;
    assert_eq!(third.reused, 37, "{name}");
    let diff = max_abs_diff(&m.forward(third.session, &next[37..])?.to_rows(), &fresh_pass(&next, 1)?);
    assert!(diff <= TOL, "{name}: the entry after two copies, max |Δlogit| = {diff} > {TOL}");
    Ok(())
}

#[test]
fn two_live_sessions_on_one_entry_each_equal_a_fresh_pass() -> Result<()> {
    two_sessions_on_one_entry("llama_tied", &cpu_f32())?;
    two_sessions_on_one_entry("gemma3", &cpu_f32())?;
    two_sessions_on_one_entry("llama_tied", &LoadOptions { engine: Engine::Host, ..cpu_f32() })
}
