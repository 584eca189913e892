//! The model worker thread: handles from many threads and from async code, load errors,
//! and per-request errors that leave the worker serving.

mod common;

use std::path::PathBuf;

use anyhow::Result;
use serde_json::json;
use specd_model::{ModelError, ModelWorker, TableModel, load_model};

fn table_worker() -> Result<specd_model::ModelHandle> {
    Ok(ModelWorker::spawn("table", 8, || {
        TableModel::from_json("abc", json!({"vocab_size": 3, "default": [0.6, 0.3, 0.1]}), None)
            .map_err(ModelError::InvalidInput)
    })?)
}

#[test]
fn handles_from_many_threads_share_one_model() -> Result<()> {
    let h = table_worker()?;
    assert_eq!(h.info().vocab_size, 3);
    let threads: Vec<_> = (0..4)
        .map(|i| {
            let h = h.clone();
            std::thread::spawn(move || -> specd_model::Result<usize> {
                let s = h.open_session_blocking(Some(32))?;
                for _ in 0..=i {
                    h.forward_blocking(s, vec![0, 1])?;
                }
                h.truncate_blocking(s, 1)?;
                let n = h.call_blocking(move |m| m.session_len(s))?;
                h.release_blocking(s)?;
                Ok(n)
            })
        })
        .collect();
    for t in threads {
        assert_eq!(t.join().expect("thread")?, 1);
    }
    assert_eq!(h.call_blocking(|m| Ok(m.memory_in_use().0))?, 0);
    Ok(())
}

#[test]
fn async_api_and_errors_keep_the_worker_alive() -> Result<()> {
    let h = table_worker()?;
    let rt = tokio::runtime::Builder::new_current_thread().build()?;
    rt.block_on(async {
        let s = h.open_session(None).await?;
        let l = h.forward(s, vec![0, 1, 2]).await?;
        assert_eq!(l.rows(), 3);
        let l = h.truncate_and_forward(s, 1, vec![2]).await?;
        assert_eq!(l.rows(), 1);
        assert_eq!(h.session_len(s).await?, 2);
        assert!(matches!(h.forward(s, vec![7]).await, Err(ModelError::InvalidInput(_))));
        assert!(matches!(h.release(99).await, Err(ModelError::UnknownSession(99))));
        h.release(s).await?;
        anyhow::Ok(())
    })?;
    // A panicking job fails only itself.
    let r = h.call_blocking(|_m| -> specd_model::Result<()> { panic!("boom") });
    assert!(matches!(r, Err(ModelError::WorkerGone(_))));
    assert!(h.open_session_blocking(None).is_ok());
    Ok(())
}

#[test]
fn load_errors_come_back_from_spawn() {
    let err = ModelWorker::spawn("bad", 1, || load_model(&PathBuf::from("/nonexistent/x"), &common::cpu_f32()))
        .expect_err("must fail");
    assert!(matches!(err, ModelError::MissingFile { .. }), "{err}");
}

#[test]
fn llama_through_the_worker_matches_direct_use() -> Result<()> {
    let dir = common::fixture("llama_gqa_untied");
    let r = common::reference("llama_gqa_untied")?;
    let h = ModelWorker::spawn("llama", 4, move || load_model(&dir, &common::cpu_f32()))?;
    assert_eq!(h.info().architecture, "LlamaForCausalLM");
    let s = h.open_session_blocking(None)?;
    let l = h.forward_blocking(s, r.tokens.clone())?;
    assert!(common::max_abs_diff(&l.to_rows(), &r.logits) <= 1e-4);
    assert_eq!(h.encode_blocking(r.text.clone())?, r.text_ids);
    Ok(())
}
