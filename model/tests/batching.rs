//! Batching across sessions: one ragged forward pass over several sessions' runs equals the
//! runs forwarded one by one (≤ 1e-5, f32) on every fixture architecture (GQA, tied, Qwen2
//! biases, sharded, sliding window), also when each run asks for its last rows only, a bad
//! item fails alone, and the worker gathers concurrent jobs' forwards into shared passes
//! within its token budget.

mod common;

use std::sync::{Arc, Barrier};
use std::time::Duration;

use anyhow::Result;
use common::{FIXTURES, load, max_abs_diff, reference};
use serde_json::json;
use specd_model::{
    BatchPolicy, ForwardItem, LanguageModel, ModelError, ModelHandle, ModelWorker, SessionId, Slowed, TableModel,
    load_model,
};

const TOL: f32 = 1e-5;

/// Prefill lengths and the run each session then forwards in the batch: a decode step, a
/// verify-sized block, a prefill from nothing, and a long history (past the sliding window
/// of `mistral_window`).
const LAYOUT: [(usize, usize); 4] = [(6, 1), (4, 5), (0, 7), (11, 3)];

/// The rows each session's run asks for in the batch that trims: its last, a verify block's
/// γ + 1 of a longer run, a prompt's last, and every row.
const ROWS: [usize; 4] = [1, 3, 1, 3];

#[test]
fn a_ragged_batch_equals_its_runs_forwarded_alone() -> Result<()> {
    for name in FIXTURES {
        for rows in [None, Some(ROWS)] {
            check_ragged_batch(name, rows)?;
        }
    }
    Ok(())
}

/// One batch over the sessions of [`LAYOUT`], each run asking for `rows` (every row when
/// `None`), against each run forwarded alone with every row.
fn check_ragged_batch(name: &str, rows: Option<[usize; 4]>) -> Result<()> {
    let tokens = reference(name)?.tokens;
    let (mut alone, mut batched) = (load(name)?, load(name)?);
    let mut want = Vec::new();
    let mut sessions = Vec::new();
    for (i, &(past, run)) in LAYOUT.iter().enumerate() {
        // Each session gets its own slice of the reference tokens, rotated, so runs differ.
        let seq: Vec<u32> = tokens.iter().cycle().skip(i * 3).take(past + run).copied().collect();
        let (a, b) = (alone.open_session(None)?, batched.open_session(None)?);
        if past > 0 {
            alone.forward(a, &seq[..past])?;
            batched.forward(b, &seq[..past])?;
        }
        let every = alone.forward(a, &seq[past..])?.to_rows();
        let keep = rows.map_or(run, |r| r[i].min(run));
        want.push(every[run - keep..].to_vec());
        sessions.push((b, seq[past..].to_vec()));
    }
    let items: Vec<ForwardItem<'_>> = sessions
        .iter()
        .enumerate()
        .map(|(i, (session, run))| ForwardItem {
            session: *session,
            tokens: run,
            rows: rows.map_or(run.len(), |r| r[i]),
        })
        .collect();
    let got = batched.forward_batch(&items);
    for (i, (result, want)) in got.into_iter().zip(&want).enumerate() {
        let got = result?.to_rows();
        assert_eq!(got.len(), want.len(), "{name} {rows:?}: session {i} rows");
        let diff = max_abs_diff(&got, want);
        assert!(diff <= TOL, "{name} {rows:?}: session {i} batched vs alone {diff}");
        let (past, run) = LAYOUT[i];
        assert_eq!(batched.session_len(sessions[i].0)?, past + run, "{name}: session {i} length");
    }
    Ok(())
}

#[test]
fn a_bad_item_fails_alone_and_a_session_may_not_appear_twice() -> Result<()> {
    let mut m = load("llama_gqa_untied")?;
    let vocab = m.info().vocab_size as u32;
    let (a, b) = (m.open_session(None)?, m.open_session(None)?);
    let good = [1u32, 2, 3];
    let bad = [vocab];
    let item = ForwardItem::every_row;
    let results = m.forward_batch(&[item(a, &good), item(b, &bad), item(99, &good), item(a, &good)]);
    assert!(results[0].is_ok());
    assert!(matches!(results[1], Err(ModelError::InvalidInput(_))), "{:?}", results[1]);
    assert!(matches!(results[2], Err(ModelError::UnknownSession(99))), "{:?}", results[2]);
    assert!(matches!(results[3], Err(ModelError::InvalidInput(_))), "{:?}", results[3]);
    assert_eq!(m.session_len(a)?, 3);
    assert_eq!(m.session_len(b)?, 0, "a failed item leaves its session as it was");
    Ok(())
}

fn slow_table(delay: Duration) -> impl FnOnce() -> specd_model::Result<Slowed<TableModel>> + Send + 'static {
    move || {
        let table = TableModel::from_json("abc", json!({"vocab_size": 3, "default": [0.6, 0.3, 0.1]}), None)
            .map_err(ModelError::InvalidInput)?;
        Ok(Slowed::new(table, delay))
    }
}

/// `n` threads open a session each, wait for one another, then run `job` on it at once.
fn at_once<R: Send + 'static>(
    handle: &ModelHandle,
    n: usize,
    job: fn(&mut dyn LanguageModel, SessionId) -> specd_model::Result<R>,
) -> specd_model::Result<Vec<R>> {
    let barrier = Arc::new(Barrier::new(n));
    let threads: Vec<_> = (0..n)
        .map(|_| {
            let (handle, barrier) = (handle.clone(), Arc::clone(&barrier));
            std::thread::spawn(move || {
                let s = handle.open_session_blocking(Some(16))?;
                barrier.wait();
                handle.call_blocking(move |m| job(m, s))
            })
        })
        .collect();
    threads.into_iter().map(|t| t.join().expect("thread")).collect()
}

/// Eight threads forward at once against a model whose passes take 40 ms: while the first
/// pass runs the other seven queue, and the next pass takes them all.
#[test]
fn the_worker_gathers_concurrent_forwards_into_one_pass() -> Result<()> {
    let policy = BatchPolicy { max_sequences: 16, max_tokens: 512, window: Duration::ZERO, min_pass: Duration::ZERO };
    let handle = ModelWorker::spawn_batched("batched", 64, policy, slow_table(Duration::from_millis(40)))?;
    let sizes = at_once(&handle, 8, |m, s| {
        m.forward(s, &[0, 1])?;
        Ok(m.last_batch_size())
    })?;
    let totals = handle.batch_totals();
    assert_eq!(totals.sequences, 8);
    assert_eq!(totals.tokens, 16);
    assert!(totals.passes <= 3, "8 concurrent forwards took {} passes", totals.passes);
    assert!(sizes.iter().any(|&s| s >= 4), "batch sizes seen by the callers: {sizes:?}");
    Ok(())
}

/// With a budget of 4 tokens, three waiting runs of 3 tokens cannot share a pass: each
/// runs in its own, none is lost, and the order is kept.
#[test]
fn the_token_budget_splits_batches_and_loses_nothing() -> Result<()> {
    let policy = BatchPolicy { max_sequences: 16, max_tokens: 4, window: Duration::ZERO, min_pass: Duration::ZERO };
    let handle = ModelWorker::spawn_batched("budget", 64, policy, slow_table(Duration::from_millis(20)))?;
    let lengths = at_once(&handle, 4, |m, s| {
        m.forward(s, &[0, 1, 2])?;
        m.session_len(s)
    })?;
    assert_eq!(lengths, [3; 4]);
    let totals = handle.batch_totals();
    assert_eq!((totals.passes, totals.sequences, totals.tokens), (4, 4, 12));
    Ok(())
}

/// Through the worker, batched jobs give the logits unbatched ones give, on a real model.
#[test]
fn batched_jobs_match_unbatched_jobs_on_a_llama() -> Result<()> {
    let dir = common::fixture("qwen2");
    let tokens = reference("qwen2")?.tokens;
    let spawn = |policy| {
        let dir = dir.clone();
        ModelWorker::spawn_batched("llama", 64, policy, move || load_model(&dir, &common::cpu_f32()))
    };
    let run_all = |handle: ModelHandle| -> Result<Vec<Vec<Vec<f32>>>> {
        let threads: Vec<_> = (0..4)
            .map(|i| {
                let (handle, tokens) = (handle.clone(), tokens.clone());
                std::thread::spawn(move || -> specd_model::Result<Vec<Vec<f32>>> {
                    let s = handle.open_session_blocking(None)?;
                    handle.call_blocking(move |m| {
                        let mut rows = m.forward(s, &tokens[..3 + i])?.to_rows();
                        for t in &tokens[3 + i..] {
                            rows.extend(m.forward(s, std::slice::from_ref(t))?.to_rows());
                        }
                        Ok(rows)
                    })
                })
            })
            .collect();
        Ok(threads.into_iter().map(|t| t.join().expect("thread")).collect::<Result<_, _>>()?)
    };
    let unbatched = run_all(spawn(BatchPolicy::UNBATCHED)?)?;
    // Batched from the first job, however fast this tiny model's passes are.
    let batched_handle = spawn(BatchPolicy { min_pass: Duration::ZERO, ..BatchPolicy::default() })?;
    let batched = run_all(batched_handle.clone())?;
    for (i, (a, b)) in unbatched.iter().zip(&batched).enumerate() {
        let diff = max_abs_diff(a, b);
        assert!(diff <= TOL, "session {i}: batched vs unbatched {diff}");
    }
    assert!(batched_handle.batch_totals().passes > 0);
    Ok(())
}

/// With the default minimum pass time, a model whose jobs take microseconds is not batched
/// (the hand-offs would cost more than they save); one whose passes take 5 ms is, after its
/// first job has been timed. A second session is open throughout, so that only the pass
/// time decides.
#[test]
fn batching_starts_only_when_passes_are_slow_enough() -> Result<()> {
    for (delay, batched) in [(Duration::ZERO, false), (Duration::from_millis(5), true)] {
        let handle = ModelWorker::spawn_batched("min-pass", 64, BatchPolicy::default(), slow_table(delay))?;
        let s = handle.open_session_blocking(Some(16))?;
        handle.open_session_blocking(Some(16))?;
        for _ in 0..3 {
            handle.call_blocking(move |m| m.forward(s, &[0]).map(|_| ()))?;
        }
        let passes = handle.batch_totals().passes;
        assert_eq!(passes > 0, batched, "delay {delay:?}: {passes} batched passes");
    }
    Ok(())
}

/// A lone session has no one to share a pass with: its jobs run on the model thread however
/// slow its passes are, and go through batching only while a second session is open.
#[test]
fn a_lone_session_is_not_batched() -> Result<()> {
    let policy = BatchPolicy { min_pass: Duration::ZERO, ..BatchPolicy::default() };
    let handle = ModelWorker::spawn_batched("lone", 64, policy, slow_table(Duration::from_millis(5)))?;
    let forward = |s: SessionId| handle.call_blocking(move |m| m.forward(s, &[0]).map(|_| ()));
    let s = handle.open_session_blocking(Some(16))?;
    for _ in 0..3 {
        forward(s)?;
    }
    assert_eq!(handle.batch_totals().passes, 0, "a lone session's forwards went through batching");
    let other = handle.open_session_blocking(Some(16))?;
    forward(s)?;
    assert_eq!(handle.batch_totals().passes, 1, "with two sessions open, a forward is batched");
    handle.release_blocking(other)?;
    forward(s)?;
    assert_eq!(handle.batch_totals().passes, 1, "alone again, a forward went through batching");
    Ok(())
}
