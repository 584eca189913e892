//! KV memory by the request: on a model of Llama-3.2-1B's shape where the cache is concerned
//! (16 layers, 8 KV heads of 64, 131 072 positions; a tiny width elsewhere, random weights), a
//! session holds what it reserves, the budget admits ⌊B / per-session⌋ sessions and refuses
//! the next naming the numbers, a whole-context session is refused without allocating 8 GiB,
//! and a session that outgrows its reservation grows by whole chunks, within the budget,
//! computing what a session that reserved enough computes.

use anyhow::Result;
use specd_model::{
    DType, DeviceSpec, ForwardItem, KvBudget, LanguageModel, LlamaConfig, LlamaModel, LlamaShape, LoadOptions,
    ModelError,
};

const LAYERS: usize = 16;
const KV_HEADS: usize = 8;
const HEAD_DIM: usize = 64;
const CONTEXT: usize = 131_072;
/// K and V, every layer, f32: 2 × 16 × 8 × 64 × 4 bytes.
const BYTES_PER_TOKEN: u64 = 2 * LAYERS as u64 * KV_HEADS as u64 * HEAD_DIM as u64 * 4;
/// A request as the coordinator describes it: prompt + max_new_tokens + the largest block + 1.
const REACH: usize = 19 + 64 + 8 + 1;
/// The tokens by which a session grows past its reservation (the model's chunk).
const CHUNK: usize = 256;

fn one_b_shaped() -> LlamaConfig {
    LlamaConfig::llama(LlamaShape {
        vocab_size: 256,
        hidden_size: 64,
        intermediate_size: 128,
        layers: LAYERS,
        heads: 32,
        kv_heads: KV_HEADS,
        head_dim: HEAD_DIM,
        context: CONTEXT,
    })
}

fn model(budget: KvBudget) -> Result<LlamaModel> {
    let opts = LoadOptions { device: DeviceSpec::Cpu, dtype: DType::F32, kv_budget: budget, ..LoadOptions::default() };
    Ok(LlamaModel::random(one_b_shaped(), 11, &opts)?)
}

#[test]
fn sessions_hold_what_they_reserve_and_the_budget_admits_whole_sessions() -> Result<()> {
    let per_session = REACH as u64 * BYTES_PER_TOKEN;
    // Room for 5.5 sessions: 5 fit, the sixth does not.
    let budget = per_session * 11 / 2;
    let mut m = model(KvBudget::Bytes(budget))?;
    assert_eq!(m.info().kv_bytes_per_token, BYTES_PER_TOKEN);
    let admitted = (budget / per_session) as usize;
    assert_eq!(admitted, 5);
    let mut sessions = Vec::new();
    for i in 0..admitted {
        sessions.push(m.open_session(Some(REACH))?);
        assert_eq!(m.memory_in_use(), ((i as u64 + 1) * per_session, Some(budget)));
    }
    let err = m.open_session(Some(REACH)).unwrap_err();
    assert!(
        matches!(err, ModelError::MemoryBudget { requested, in_use, budget: b, sessions: 5 }
            if requested == per_session && in_use == 5 * per_session && b == budget),
        "{err}"
    );
    let message = err.to_string();
    for number in [per_session, 5 * per_session, budget] {
        assert!(message.contains(&number.to_string()), "{number} missing from: {message}");
    }
    // A session of the whole context (8 GiB here) is refused before anything is allocated.
    let whole = m.open_session(None).unwrap_err();
    assert!(
        matches!(whole, ModelError::MemoryBudget { requested, .. } if requested == CONTEXT as u64 * BYTES_PER_TOKEN),
        "{whole}"
    );
    // The sessions admitted run: a prompt, then decoding, within their reservations.
    let prompt: Vec<u32> = (0..19).map(|i| (i * 37 % 256) as u32).collect();
    m.forward(sessions[0], &prompt)?;
    m.forward(sessions[0], &[5, 6, 7])?;
    assert_eq!(m.memory_in_use().0, 5 * per_session);
    // Releasing one makes room for exactly one more.
    m.release(sessions.pop().expect("five"))?;
    m.open_session(Some(REACH))?;
    assert!(matches!(m.open_session(Some(REACH)), Err(ModelError::MemoryBudget { .. })));
    Ok(())
}

#[test]
fn a_session_past_its_reservation_grows_by_chunks_and_computes_the_same() -> Result<()> {
    let mut m = model(KvBudget::Unbounded)?;
    let tokens: Vec<u32> = (0..24).map(|i| (i * 91 % 256) as u32).collect();
    let small = m.open_session(Some(8))?;
    let large = m.open_session(Some(CHUNK + 8))?;
    assert_eq!(m.memory_in_use().0, (8 + CHUNK as u64 + 8) * BYTES_PER_TOKEN);
    let mut grown = vec![m.forward(small, &tokens[..8])?];
    let mut reference = vec![m.forward(large, &tokens[..8])?];
    // One token past the reservation: the cache grows to one chunk, and holds what it held.
    for t in &tokens[8..] {
        grown.push(m.forward(small, std::slice::from_ref(t))?);
        reference.push(m.forward(large, std::slice::from_ref(t))?);
    }
    assert_eq!(m.memory_in_use().0, (CHUNK as u64 + CHUNK as u64 + 8) * BYTES_PER_TOKEN);
    let rows = |parts: &[specd_model::Logits]| parts.iter().flat_map(|l| l.to_rows()).collect::<Vec<_>>();
    let diff = rows(&grown)
        .iter()
        .zip(rows(&reference))
        .flat_map(|(a, b)| a.iter().zip(b).map(|(x, y)| (x - y).abs()).collect::<Vec<_>>())
        .fold(0f32, f32::max);
    // The same f32 computation over the same keys: equal up to summation order.
    assert!(diff <= 1e-5, "grown cache differs by {diff}");
    Ok(())
}

#[test]
fn a_growth_past_the_budget_fails_that_pass_only_and_leaves_the_session_usable() -> Result<()> {
    // Room for a session of 16 tokens and one of 200, not for either to grow by a chunk.
    let budget = 216 * BYTES_PER_TOKEN + CHUNK as u64 * BYTES_PER_TOKEN / 2;
    let mut m = model(KvBudget::Bytes(budget))?;
    let a = m.open_session(Some(16))?;
    let b = m.open_session(Some(200))?;
    let tokens: Vec<u32> = (0..17).map(|i| (i * 13 % 256) as u32).collect();
    let before = m.forward(a, &tokens[..16])?.to_rows();
    // A batched pass: the session that would outgrow the budget fails, the other runs.
    let results = m.forward_batch(&[
        ForwardItem { session: a, tokens: &tokens[16..], rows: 1 },
        ForwardItem { session: b, tokens: &tokens[..4], rows: 1 },
    ]);
    let err = results[0].as_ref().unwrap_err();
    assert!(
        matches!(err, ModelError::MemoryBudget { requested, .. } if *requested == (CHUNK as u64 - 16) * BYTES_PER_TOKEN),
        "{err}"
    );
    assert!(results[1].is_ok());
    assert_eq!(m.session_len(a)?, 16);
    assert_eq!(m.memory_in_use().0, 216 * BYTES_PER_TOKEN);
    // Its cache is intact: recomputing its last position gives the same logits.
    m.truncate(a, 15)?;
    let again = m.forward(a, &tokens[15..16])?.to_rows();
    let diff = before[15].iter().zip(&again[0]).map(|(x, y)| (x - y).abs()).fold(0f32, f32::max);
    assert!(diff <= 1e-5, "{diff}");
    Ok(())
}
