//! The nodes' caches after a tree round, on a real (tiny, random) Hugging Face checkpoint in
//! f64 over gRPC: what each node computes after the round's committed tokens equals what a
//! fresh session computes over the same sequence. The target keeps the accepted path's rows
//! of its tree pass (a tree mask, positions by depth) and drops the rest; the draft walked
//! its tree one path at a time and re-feeds the path. A row kept from the wrong node, at the
//! wrong position or attending to a sibling would change the next distribution far beyond
//! the 1e-9 allowed here (1e-5 for the host engine, which computes in f32).

use specd_e2e::{Cluster, ClusterOptions, hf_fixture};
use specd_model::{DType, Engine};
use specd_proto::v1::draft_service_client::DraftServiceClient;
use specd_proto::v1::target_service_client::TargetServiceClient;
use specd_proto::v1::{OpenSessionRequest, ProposeRequest, SamplingSettings, VerifyRequest};
use tonic::transport::Channel;

/// Longer than a tree pass takes with its tree (the target prefills it in a pass of its own).
const PROMPT: [u32; 20] = [7, 31, 4, 59, 12, 3, 8, 44, 90, 17, 5, 66, 23, 71, 9, 38, 52, 11, 80, 27];

fn open(id: &str, prompt: &[u32]) -> OpenSessionRequest {
    OpenSessionRequest {
        session_id: id.into(),
        prompt_token_ids: prompt.to_vec(),
        sampling: Some(SamplingSettings {
            temperature: 1.0,
            top_p: 1.0,
            repetition_penalty: 1.0,
            ..Default::default()
        }),
        seed: 3,
        ..Default::default()
    }
}

/// p after the session's committed sequence (`rollback_to` tokens, then `pending`), from a
/// Verify with no candidates in the dense format.
async fn next_p(
    target: &mut TargetServiceClient<Channel>,
    id: &str,
    round: u32,
    rollback_to: usize,
    pending: &[u32],
) -> Vec<f64> {
    let request = VerifyRequest {
        session_id: id.into(),
        round,
        rollback_to: rollback_to as u32,
        pending_token_ids: pending.to_vec(),
        dense: true,
        ..Default::default()
    };
    let reply = target.verify(request).await.unwrap().into_inner();
    reply.dense_p[0].probs.clone()
}

/// q after the session's committed sequence, from a dense Propose of one candidate.
async fn next_q(
    draft: &mut DraftServiceClient<Channel>,
    id: &str,
    round: u32,
    rollback_to: usize,
    pending: &[u32],
) -> Vec<f64> {
    let request = ProposeRequest {
        session_id: id.into(),
        round,
        rollback_to: rollback_to as u32,
        pending_token_ids: pending.to_vec(),
        gamma: 1,
        dense: true,
        ..Default::default()
    };
    draft.propose(request).await.unwrap().into_inner().positions[0].dense_q.clone()
}

fn assert_close(a: &[f64], b: &[f64], tolerance: f64, what: &str) {
    assert_eq!(a.len(), b.len());
    let worst = a.iter().zip(b).map(|(x, y)| (x - y).abs()).fold(0.0, f64::max);
    assert!(worst < tolerance, "{what}: max |Δ| = {worst:e}");
}

/// Both engines score a tree in one pass with a tree mask and move the kept path's rows in
/// place (libtorch's mask a tensor, the host engine's each query row's own path): both must
/// hold what a fresh session computes.
#[tokio::test(flavor = "current_thread")]
async fn after_a_tree_round_both_nodes_compute_what_a_fresh_session_computes() {
    for (engine, dtype, tolerance) in [(Engine::Libtorch, DType::F64, 1e-9), (Engine::Host, DType::F32, 1e-5)] {
        tree_rounds_leave_fresh_caches(engine, dtype, tolerance).await;
    }
}

async fn tree_rounds_leave_fresh_caches(engine: Engine, dtype: DType, tolerance: f64) {
    let model = hf_fixture("llama_gqa_untied");
    let options = ClusterOptions { dtype, engine, ..ClusterOptions::default() };
    let assert_close = |a: &[f64], b: &[f64], what: &str| assert_close(a, b, tolerance, &format!("{engine:?}: {what}"));
    let cluster = Cluster::start(&model, &model, &options).await.unwrap();
    let mut target = TargetServiceClient::connect(cluster.target_url.clone()).await.unwrap();
    let mut draft = DraftServiceClient::connect(cluster.draft_url.clone()).await.unwrap();

    // The target scores a hand-made tree after the prompt: 40 → 41 → 42, 40 → 43, 44 → 45.
    // Nodes are numbered from 1; node 0 is the committed sequence.
    target.open_session(open("t", &PROMPT)).await.unwrap();
    let verify = VerifyRequest {
        session_id: "t".into(),
        round: 0,
        rollback_to: PROMPT.len() as u32,
        candidate_token_ids: vec![40, 44, 41, 43, 45, 42],
        candidate_parents: vec![0, 0, 1, 1, 2, 3],
        dense: true,
        ..Default::default()
    };
    let reply = target.verify(verify).await.unwrap().into_inner();
    assert_eq!(reply.dense_p.len(), 7, "p after every node");
    // The tree's own p after node 3 (path 40, 41) is p after that sequence.
    target.open_session(open("fresh-41", &[&PROMPT[..], &[40, 41]].concat())).await.unwrap();
    let fresh = next_p(&mut target, "fresh-41", 0, PROMPT.len() + 2, &[]).await;
    assert_close(&reply.dense_p[3].probs, &fresh, "p after node 3 of the tree pass");

    // Committed: 40, 41 accepted, then 9. The next request names them as pending.
    let after = next_p(&mut target, "t", 1, PROMPT.len(), &[40, 41, 9]).await;
    target.open_session(open("fresh", &[&PROMPT[..], &[40, 41, 9]].concat())).await.unwrap();
    let fresh = next_p(&mut target, "fresh", 0, PROMPT.len() + 3, &[]).await;
    assert_close(&after, &fresh, "the target after keeping the path 40 → 41");

    // A second tree round whose whole path is accepted (44 → 45, then the bonus 8), after
    // the pending 9 scored in the same pass.
    let verify = VerifyRequest {
        session_id: "t".into(),
        round: 2,
        rollback_to: (PROMPT.len() + 3) as u32,
        candidate_token_ids: vec![44, 40, 45],
        candidate_parents: vec![0, 0, 1],
        dense: true,
        ..Default::default()
    };
    target.verify(verify).await.unwrap();
    let after = next_p(&mut target, "t", 3, PROMPT.len() + 3, &[44, 45, 8]).await;
    target.open_session(open("fresh-2", &[&PROMPT[..], &[40, 41, 9, 44, 45, 8]].concat())).await.unwrap();
    let fresh = next_p(&mut target, "fresh-2", 0, PROMPT.len() + 6, &[]).await;
    assert_close(&after, &fresh, "the target after a whole path and its leaf");

    // The draft: a tree of 3 × 2 children at T = 1 (distinct siblings), then the committed
    // sequence follows one of its paths.
    draft.open_session(open("d", &PROMPT)).await.unwrap();
    let propose = ProposeRequest {
        session_id: "d".into(),
        round: 0,
        rollback_to: PROMPT.len() as u32,
        tree_widths: vec![3, 2],
        dense: true,
        ..Default::default()
    };
    let tree = draft.propose(propose).await.unwrap().into_inner().positions;
    assert_eq!(tree.len(), 9, "three children, two under each");
    let parents: Vec<u32> = tree.iter().map(|p| p.parent).collect();
    assert_eq!(parents, [0, 0, 0, 1, 1, 2, 2, 3, 3], "children numbered as drawn, depth first");
    for (i, position) in tree.iter().enumerate() {
        let q = &position.dense_q;
        assert!(q[position.token_id as usize] > 0.0, "candidate {} was drawn from its q", i + 1);
    }
    // The second child and its first child accepted, then 9.
    let path = [tree[1].token_id, tree[5].token_id, 9];
    let after = next_q(&mut draft, "d", 1, PROMPT.len(), &path).await;
    draft.open_session(open("d-fresh", &[&PROMPT[..], &path].concat())).await.unwrap();
    let fresh = next_q(&mut draft, "d-fresh", 1, PROMPT.len() + 3, &[]).await;
    assert_close(&after, &fresh, "the draft after the path through its second child");
    // The q a child carries is its parent's: the q after the second child is what its
    // children were drawn from.
    draft.open_session(open("d-second", &[&PROMPT[..], &[tree[1].token_id]].concat())).await.unwrap();
    let second = next_q(&mut draft, "d-second", 0, PROMPT.len() + 1, &[]).await;
    assert_close(&tree[5].dense_q, &second, "the q the second child's children carry");

    cluster.shutdown().await;
}
