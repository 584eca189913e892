//! KV-cache consistency: incremental decoding equals a full recompute, truncate-then-redecode
//! equals a fresh session, one forward of k tokens equals k one-token forwards, and a pass
//! that returns its last rows only equals those rows of the whole pass (≤ 2e-5, f32).

mod common;

use anyhow::Result;
use common::{FIXTURES, load, max_abs_diff, reference, rows};
use specd_model::{LanguageModel, LlamaModel, ModelError, SessionId};

/// float32 noise between a block and the same tokens one at a time: ≤ 1e-5 for most
/// fixtures, 1.3e-5 for gemma3_multimodal (logits up to 9, four `(1 + w)` norms a layer).
/// A wrong cache is off by more than 1e-2 (asserted below).
const TOL: f32 = 2e-5;

fn full(m: &mut LlamaModel, tokens: &[u32]) -> Result<Vec<Vec<f32>>> {
    let s = m.open_session(None)?;
    let out = m.forward(s, tokens)?.to_rows();
    m.release(s)?;
    Ok(out)
}

/// A fixture's reference tokens and its model with two fresh sessions, to compare two ways of
/// running the same tokens.
fn two_sessions(name: &str) -> Result<(Vec<u32>, LlamaModel, SessionId, SessionId)> {
    let tokens = reference(name)?.tokens;
    let mut m = load(name)?;
    let (a, b) = (m.open_session(None)?, m.open_session(None)?);
    Ok((tokens, m, a, b))
}

#[test]
fn incremental_decoding_equals_full_recompute() -> Result<()> {
    for name in FIXTURES {
        let tokens = reference(name)?.tokens;
        let mut m = load(name)?;
        let want = full(&mut m, &tokens)?;
        // Prefill 5, then one token at a time.
        let s = m.open_session(None)?;
        let mut parts = vec![m.forward(s, &tokens[..5])?];
        for t in &tokens[5..] {
            parts.push(m.forward(s, std::slice::from_ref(t))?);
        }
        assert_eq!(m.session_len(s)?, tokens.len());
        let diff = max_abs_diff(&rows(&parts), &want);
        assert!(diff <= TOL, "{name}: incremental vs full {diff}");
    }
    Ok(())
}

#[test]
fn one_forward_of_k_equals_k_single_forwards() -> Result<()> {
    for name in FIXTURES {
        let (tokens, mut m, a, b) = two_sessions(name)?;
        m.forward(a, &tokens[..4])?;
        m.forward(b, &tokens[..4])?;
        let block = m.forward(a, &tokens[4..10])?;
        let singles: Vec<_> =
            tokens[4..10].iter().map(|t| m.forward(b, std::slice::from_ref(t))).collect::<Result<_, _>>()?;
        let diff = max_abs_diff(&block.to_rows(), &rows(&singles));
        assert!(diff <= TOL, "{name}: block vs singles {diff}");
    }
    Ok(())
}

/// A prompt's pass asks for its last row, a verify block for its γ + 1: the head runs on
/// those rows only, and they equal the same rows of a pass that returns every row.
#[test]
fn the_last_rows_of_a_pass_equal_those_rows_of_the_whole_pass() -> Result<()> {
    for name in FIXTURES {
        let (tokens, mut m, a, b) = two_sessions(name)?;
        for (run, rows) in [(0..6, 1), (6..10, 3), (10..11, 5)] {
            let every = m.forward(a, &tokens[run.clone()])?.to_rows();
            let last = m.forward_last(b, &tokens[run.clone()], rows)?.to_rows();
            let want = &every[every.len() - rows.min(run.len())..];
            assert_eq!(last.len(), want.len(), "{name} {run:?}: rows returned");
            let diff = max_abs_diff(&last, want);
            assert!(diff <= TOL, "{name} {run:?}: last {rows} rows vs every row {diff}");
            assert_eq!(m.session_len(b)?, run.end, "{name}: the whole run is in the cache");
        }
        // Zero rows asks for nothing a node could use: it gets the last row.
        assert_eq!(m.forward_last(b, &tokens[11..12], 0)?.rows(), 1);
    }
    Ok(())
}

#[test]
fn truncate_then_redecode_equals_a_fresh_session() -> Result<()> {
    for name in FIXTURES {
        let tokens = reference(name)?.tokens;
        let mut m = load(name)?;
        // A speculative block that gets rejected: different tokens after position 6.
        let s = m.open_session(None)?;
        m.forward(s, &tokens[..6])?;
        let rejected: Vec<u32> = tokens[6..].iter().map(|t| (t + 11) % 96).collect();
        let stale = m.forward(s, &rejected)?;
        m.truncate(s, 6)?;
        assert_eq!(m.session_len(s)?, 6);
        let redone = m.forward(s, &tokens[6..])?;
        let fresh = full(&mut m, &tokens)?;
        let diff = max_abs_diff(&redone.to_rows(), &fresh[6..]);
        assert!(diff <= TOL, "{name}: truncate+redecode vs fresh {diff}");
        // The rejected block really scored differently (the test can fail).
        assert!(max_abs_diff(&stale.to_rows(), &fresh[6..]) > 1e-2, "{name}");
    }
    Ok(())
}

#[test]
fn session_errors_are_typed() -> Result<()> {
    let mut m = load("llama_tied")?;
    let context = m.info().context_length;
    let s = m.open_session(Some(8))?;
    m.forward(s, &[1, 2, 3])?;
    // Past its reservation a session grows; past the model's context it cannot.
    m.forward(s, &[1; 6])?;
    let too_many = vec![1; context - 8];
    assert!(
        matches!(m.forward(s, &too_many), Err(ModelError::ContextOverflow { len: 9, capacity, .. }) if capacity == context)
    );
    assert_eq!(m.session_len(s)?, 9, "a failed forward keeps the length");
    m.truncate(s, 3)?;
    assert!(matches!(m.truncate(s, 4), Err(ModelError::InvalidInput(_))));
    assert!(matches!(m.forward(s, &[96]), Err(ModelError::InvalidInput(_))));
    assert!(matches!(m.forward(s, &[]), Err(ModelError::InvalidInput(_))));
    assert!(matches!(m.open_session(Some(65)), Err(ModelError::InvalidInput(_))));
    m.release(s)?;
    assert!(matches!(m.forward(s, &[1]), Err(ModelError::UnknownSession(id)) if id == s));
    assert!(matches!(m.release(s), Err(ModelError::UnknownSession(_))));
    Ok(())
}

#[test]
fn memory_budget_refuses_a_session_that_does_not_fit() -> Result<()> {
    let dir = common::fixture("llama_tied");
    // 2 layers × 2 (k, v) × 4 kv heads × 8 head_dim × 4 bytes = 512 bytes per token.
    let opts = specd_model::LoadOptions { kv_budget: specd_model::KvBudget::Bytes(512 * 100), ..common::cpu_f32() };
    let mut m = LlamaModel::load(&dir, &opts)?;
    assert_eq!(m.info().kv_bytes_per_token, 512);
    let a = m.open_session(Some(60))?;
    let err = m.open_session(Some(60)).unwrap_err();
    assert!(
        matches!(err, ModelError::MemoryBudget { requested: 30720, in_use: 30720, budget: 51200, sessions: 1 }),
        "{err}"
    );
    assert!(err.to_string().contains("memory budget"));
    let b = m.open_session(Some(40))?;
    assert_eq!(m.memory_in_use(), (512 * 100, Some(51200)));
    m.release(a)?;
    m.release(b)?;
    assert_eq!(m.memory_in_use().0, 0);
    m.open_session(Some(64))?;
    Ok(())
}
