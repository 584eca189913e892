//! The table model: the seed's A/B/C example, rule resolution, validation, sessions.

use anyhow::Result;
use serde_json::json;
use specd_model::table::ZERO_PROB_LOGIT;
use specd_model::{LanguageModel, ModelError, TableModel};

fn softmax(row: &[f32]) -> Vec<f64> {
    let max = row.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let e: Vec<f64> = row.iter().map(|&x| f64::from(x - max).exp()).collect();
    let z: f64 = e.iter().sum();
    e.iter().map(|x| x / z).collect()
}

fn close(a: &[f64], b: &[f64]) -> bool {
    a.len() == b.len() && a.iter().zip(b).all(|(x, y)| (x - y).abs() < 1e-6)
}

fn abc(p: [f64; 3]) -> Result<TableModel> {
    TableModel::from_json("abc", json!({"vocab_size": 3, "tokens": ["A", "B", "C"], "default": p}), None)
        .map_err(anyhow::Error::msg)
}

#[test]
fn seed_example_target_and_draft() -> Result<()> {
    let mut p = abc([0.60, 0.30, 0.10])?;
    let mut q = abc([0.50, 0.25, 0.25])?;
    let (sp, sq) = (p.open_session(None)?, q.open_session(None)?);
    let lp = p.forward(sp, &[0, 1, 2])?;
    let lq = q.forward(sq, &[0, 1, 2])?;
    assert_eq!(lp.rows(), 3);
    for i in 0..3 {
        assert!(close(&softmax(lp.row(i).unwrap()), &[0.6, 0.3, 0.1]));
        assert!(close(&softmax(lq.row(i).unwrap()), &[0.5, 0.25, 0.25]));
    }
    assert!((lp.row(0).unwrap()[0] - 0.6f32.ln()).abs() < 1e-6);
    assert_eq!(p.info().tokenizer_fingerprint, q.info().tokenizer_fingerprint);
    assert_eq!(p.encode("A C B")?, vec![0, 2, 1]);
    assert!(matches!(p.encode("A D"), Err(ModelError::InvalidInput(_))));
    Ok(())
}

#[test]
fn prefix_beats_longest_suffix_beats_default() -> Result<()> {
    let mut m = TableModel::from_json(
        "rules",
        json!({
            "vocab_size": 4,
            "default": [0.25, 0.25, 0.25, 0.25],
            "rules": [
                {"suffix": [1], "probs": [1.0, 0.0, 0.0, 0.0]},
                {"suffix": [0, 1], "probs": [0.0, 1.0, 0.0, 0.0]},
                {"prefix": [2, 0, 1], "probs": [0.0, 0.0, 1.0, 0.0]}
            ]
        }),
        None,
    )
    .map_err(anyhow::Error::msg)?;
    let s = m.open_session(None)?;
    let l = m.forward(s, &[3, 1, 0, 1])?;
    let argmax = |r: &[f32]| r.iter().enumerate().max_by(|a, b| a.1.total_cmp(b.1)).unwrap().0;
    assert!(close(&softmax(l.row(0).unwrap()), &[0.25; 4]), "[3] → default");
    assert_eq!(argmax(l.row(1).unwrap()), 0, "[3,1] → suffix [1]");
    assert_eq!(l.row(2).unwrap(), &[0.25f32.ln(); 4][..], "[3,1,0] → default");
    assert_eq!(argmax(l.row(3).unwrap()), 1, "[3,1,0,1] → longest suffix [0,1]");
    assert_eq!(l.row(3).unwrap()[0], ZERO_PROB_LOGIT);
    // Exact prefix wins; after a rollback the history is the truncated one.
    m.truncate(s, 0)?;
    let l = m.forward(s, &[2, 0, 1])?;
    assert_eq!(argmax(l.row(2).unwrap()), 2, "[2,0,1] → prefix rule");
    m.truncate(s, 2)?;
    let l = m.forward(s, &[1])?;
    assert_eq!(argmax(l.row(0).unwrap()), 2, "same history after truncate");
    m.truncate(s, 1)?;
    let l = m.forward(s, &[3, 0, 1, 1])?;
    assert_eq!(argmax(l.row(2).unwrap()), 1, "[2,3,0,1] → suffix [0,1], not prefix");
    assert_eq!(m.session_len(s)?, 5);
    Ok(())
}

#[test]
fn bad_tables_are_rejected_with_messages() {
    let cases = [
        (json!({"vocab_size": 3, "default": [0.5, 0.5]}), "2 probabilities"),
        (json!({"vocab_size": 2, "default": [0.5, 0.6]}), "sum"),
        (json!({"vocab_size": 2, "default": [1.5, -0.5]}), "non-negative"),
        (json!({"vocab_size": 0, "default": []}), "vocab_size"),
        (json!({"vocab_size": 2, "default": [1, 0], "rules": [{"probs": [1, 0]}]}), "exactly one"),
        (json!({"vocab_size": 2, "default": [1, 0], "rules": [{"prefix": [5], "probs": [1, 0]}]}), "outside"),
        (
            json!({"vocab_size": 2, "default": [1, 0], "rules": [{"prefix": [1], "probs": [1, 0]}, {"prefix": [1], "probs": [0, 1]}]}),
            "repeats",
        ),
        (json!({"vocab_size": 2, "tokens": ["a", "a"], "default": [1, 0]}), "twice"),
        (json!({"vocab_size": 2, "default": [1, 0], "typo": 1}), "unknown field"),
        (json!({"vocab_size": 2, "eos_token_ids": [2], "default": [1, 0]}), "eos"),
    ];
    for (value, needle) in cases {
        let err = TableModel::from_json("bad", value.clone(), None).expect_err("must fail");
        assert!(err.contains(needle), "{value}: {err}");
    }
}

#[test]
fn table_file_loads_and_budget_applies() -> Result<()> {
    let dir = std::env::temp_dir().join(format!("specd-table-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let path = dir.join("abc.json");
    std::fs::write(
        &path,
        json!({"vocab_size": 3, "context_length": 10, "eos_token_ids": [2], "default": [0.6, 0.3, 0.1]}).to_string(),
    )?;
    let mut m = TableModel::load(&path, Some(4 * 15))?;
    assert_eq!(m.info().eos_token_ids, vec![2]);
    assert_eq!(m.info().context_length, 10);
    let s = m.open_session(None)?;
    assert!(matches!(m.open_session(Some(6)), Err(ModelError::MemoryBudget { .. })));
    m.open_session(Some(5))?;
    m.forward(s, &[0; 10])?;
    assert!(matches!(m.forward(s, &[0]), Err(ModelError::ContextOverflow { .. })));
    std::fs::write(&path, "{")?;
    assert!(matches!(TableModel::load(&path, None), Err(ModelError::InvalidFile { .. })));
    std::fs::remove_dir_all(&dir)?;
    Ok(())
}
