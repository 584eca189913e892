//! The rows a node asks for reach the model through every wrapper: `Box`, `Slowed` and the
//! batching worker's hand-off to the model thread. A wrapper that fell back to the default
//! `forward_last` would still return the right rows, computed the slow way (the head over
//! every row), so the model here records what it was asked for.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::Result;
use serde_json::json;
use specd_model::{
    BatchPolicy, LanguageModel, Logits, ModelError, ModelInfo, ModelWorker, SessionId, Slowed, TableModel,
};

/// A table model that records the `rows` of every `forward_last` and refuses plain
/// `forward`, which a caller asking for rows must never reach.
struct RowsSpy {
    table: TableModel,
    asked: Arc<Mutex<Vec<usize>>>,
}

impl RowsSpy {
    fn new() -> Result<(Self, Arc<Mutex<Vec<usize>>>)> {
        let table = TableModel::from_json("abc", json!({"vocab_size": 3, "default": [0.6, 0.3, 0.1]}), None)
            .map_err(anyhow::Error::msg)?;
        let asked = Arc::new(Mutex::new(Vec::new()));
        Ok((Self { table, asked: Arc::clone(&asked) }, asked))
    }
}

impl LanguageModel for RowsSpy {
    fn info(&self) -> &ModelInfo {
        self.table.info()
    }
    fn open_session(&mut self, capacity: Option<usize>) -> specd_model::Result<SessionId> {
        self.table.open_session(capacity)
    }
    fn session_len(&self, session: SessionId) -> specd_model::Result<usize> {
        self.table.session_len(session)
    }
    fn forward(&mut self, _: SessionId, _: &[u32]) -> specd_model::Result<Logits> {
        Err(ModelError::InvalidInput("forward reached: the rows asked for were lost on the way".into()))
    }
    fn forward_last(&mut self, session: SessionId, tokens: &[u32], rows: usize) -> specd_model::Result<Logits> {
        self.asked.lock().expect("lock").push(rows);
        self.table.forward(session, tokens)?.last_rows(rows)
    }
    fn truncate(&mut self, session: SessionId, len: usize) -> specd_model::Result<()> {
        self.table.truncate(session, len)
    }
    fn release(&mut self, session: SessionId) -> specd_model::Result<()> {
        self.table.release(session)
    }
    fn memory_in_use(&self) -> (u64, Option<u64>) {
        self.table.memory_in_use()
    }
    fn open_sessions(&self) -> usize {
        self.table.open_sessions()
    }
}

/// Asks `model` for the last 2 rows of a 5-token run, then the last row of a 1-token run.
fn ask(model: &mut dyn LanguageModel) -> specd_model::Result<Vec<usize>> {
    let session = model.open_session(Some(16))?;
    let block = model.forward_last(session, &[0, 1, 2, 1, 0], 2)?;
    let step = model.forward_last(session, &[2], 1)?;
    Ok(vec![block.rows(), step.rows()])
}

#[test]
fn box_and_slowed_pass_the_rows_on() -> Result<()> {
    let (spy, asked) = RowsSpy::new()?;
    let mut boxed: Box<dyn LanguageModel> = Box::new(Slowed::new(spy, Duration::ZERO));
    assert_eq!(ask(&mut boxed)?, [2, 1]);
    assert_eq!(*asked.lock().expect("lock"), [2, 1]);
    Ok(())
}

#[test]
fn the_batching_worker_passes_the_rows_to_the_model_thread() -> Result<()> {
    let (spy, asked) = RowsSpy::new()?;
    // Batching from the first job on, with other sessions open (a lone one is not batched):
    // the job's forwards go to the model thread as ForwardRequests, one pass each.
    let policy = BatchPolicy { max_sequences: 4, max_tokens: 64, window: Duration::ZERO, min_pass: Duration::ZERO };
    let handle = ModelWorker::spawn_batched("rows", 8, policy, move || Ok(spy))?;
    for _ in 0..2 {
        handle.open_session_blocking(Some(16))?;
    }
    assert_eq!(handle.call_blocking(ask)?, [2, 1]);
    assert_eq!(*asked.lock().expect("lock"), [2, 1]);
    assert_eq!(handle.batch_totals().passes, 2, "the forwards did not go through batching");
    Ok(())
}
