//! Attention over bucketed key lengths (the keys past a session's length masked out, as a
//! GPU uses them so that its kernels see few shapes) and with the KV heads repeated for their
//! query heads computes what attention over exact lengths does, within float32 rounding, for
//! every fixture family (windowed layers included): across a prompt, decode steps, a verify
//! block, a rollback with stale keys left behind, and a batched pass of two sessions of
//! different lengths.

mod common;

use anyhow::Result;
use common::{FIXTURES, cpu_f32, fixture, max_abs_diff};
use specd_model::{AttentionOptions, ForwardItem, KeyLengths, LanguageModel, LlamaModel, LoadOptions};

/// Relative to the largest logit.
const TOL: f32 = 1e-5;

/// Every row of logits the scenario produces, in order.
fn scenario(m: &mut LlamaModel, tokens: &[u32]) -> Result<Vec<Vec<f32>>> {
    let mut out = Vec::new();
    let (prompt, rest) = tokens.split_at(tokens.len() / 3);
    let s = m.open_session(None)?;
    out.extend(m.forward(s, prompt)?.to_rows());
    // Decode steps, each one more key than the last.
    for &t in &rest[..4] {
        out.extend(m.forward(s, &[t])?.to_rows());
    }
    // A verify block, then a rollback to before it: its keys stay in the cache, stale,
    // and must be masked out by the next runs, which write different tokens there.
    let at = m.session_len(s)?;
    out.extend(m.forward(s, &rest[4..10])?.to_rows());
    m.truncate(s, at)?;
    let other: Vec<u32> = rest[4..10].iter().rev().copied().collect();
    out.extend(m.forward(s, &other)?.to_rows());
    m.truncate(s, at + 2)?;
    out.extend(m.forward(s, &rest[10..])?.to_rows());
    // A second session in one pass with the first, at another length.
    let t = m.open_session(None)?;
    out.extend(m.forward(t, &tokens[..5])?.to_rows());
    let batch = m.forward_batch(&[
        ForwardItem { session: s, tokens: &tokens[..3], rows: 3 },
        ForwardItem { session: t, tokens: &tokens[5..7], rows: 2 },
    ]);
    for logits in batch {
        out.extend(logits?.to_rows());
    }
    Ok(out)
}

fn with(attention: AttentionOptions) -> LoadOptions {
    LoadOptions { attention, ..cpu_f32() }
}

#[test]
fn bucketed_keys_and_repeated_kv_heads_equal_exact_attention_for_every_family() -> Result<()> {
    let variants = [
        ("keys in buckets of 8", AttentionOptions { keys: KeyLengths::Bucketed(8), ..Default::default() }),
        ("keys in buckets of 5", AttentionOptions { keys: KeyLengths::Bucketed(5), ..Default::default() }),
        ("KV heads repeated", AttentionOptions { expand_kv_heads: true, ..Default::default() }),
        ("both", AttentionOptions { keys: KeyLengths::Bucketed(16), expand_kv_heads: true, ..Default::default() }),
    ];
    for name in FIXTURES {
        // 24 of the fixtures' 96 ids, spread over the vocabulary, within their 64 positions.
        let tokens: Vec<u32> = (0..24u32).map(|i| (i * 37 + 5) % 96).collect();
        let exact = scenario(&mut LlamaModel::load(&fixture(name), &cpu_f32())?, &tokens)?;
        let scale = exact.iter().flatten().fold(0f32, |m, x| m.max(x.abs()));
        for (what, attention) in variants {
            let got = scenario(&mut LlamaModel::load(&fixture(name), &with(attention))?, &tokens)?;
            // float32 rounding relative to the logits' size (Gemma's reach tens).
            let tol = TOL * scale.max(1.0);
            let diff = max_abs_diff(&got, &exact);
            assert!(diff <= tol, "{name}, {what}: max |Δlogit| = {diff} > {tol}");
        }
    }
    Ok(())
}
