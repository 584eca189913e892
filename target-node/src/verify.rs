//! One Verify: catch up with the rollback point, run **one** forward pass over the pending
//! tokens and the candidates, and compute p at every block position plus the pieces of the
//! sparse wire format; or the same for a tree of candidates ([`verify_tree`]). Runs on the
//! model thread in one job.

use std::time::Instant;

use specd_device_sampling::{BlockHistory, DeviceRule, masked_rows, score_block_with};
use specd_model::{LanguageModel, ModelError, TokenTree};
use specd_node::{BlockMasks, NodeError, SessionState};
use specd_proto::v1::{PositionLogprobs, ScoredAlternative};
use specd_sampling::logprobs::{logprob, top_logprobs};
use specd_sampling::tree_rule::{ChildDraws, DraftTree};
use specd_sampling::{
    DenseDist, RoundKey, ScoredBlock, ScoredNode, TokenMask, block_distributions, score_block, score_tree,
    tree_distributions,
};

/// What a Verify asks for.
#[derive(Debug, Clone)]
pub struct VerifyJob {
    pub round: u32,
    pub rollback_to: usize,
    pub pending: Vec<u32>,
    pub candidates: Vec<u32>,
    /// The draft's supports, one per candidate; `None`: dense wire format.
    pub supports: Option<Vec<Vec<u32>>>,
    /// Threads for the block's distributions and pieces ([`specd_node::Node::sampling_threads`]).
    pub sampling_threads: usize,
    /// Log-probabilities asked for, with this many alternatives per position.
    pub logprobs: Option<usize>,
    /// The device path's rule ([`specd_node::NodeFaults::device_rule`]).
    pub device_rule: DeviceRule,
    /// How a constrained block's rows are masked ([`specd_node::NodeFaults::block_masks`]).
    pub block_masks: BlockMasks,
    /// Set for a tree: each candidate's parent (0: the committed sequence, i: candidate
    /// i − 1); `supports` then holds each candidate's parent's support. `None`: a chain.
    pub parents: Option<Vec<usize>>,
}

/// The target's answer, in the wire format asked for.
#[derive(Debug)]
pub enum Verdict {
    Sparse(ScoredBlock),
    /// p at positions 1..γ+1.
    Dense(Vec<DenseDist>),
    /// A tree's nodes, node 0 (the committed sequence) first.
    SparseTree(Vec<ScoredNode>),
    /// p after every node of a tree, node 0 first.
    DenseTree(Vec<DenseDist>),
}

#[derive(Debug)]
pub struct Verified {
    pub verdict: Verdict,
    /// When asked: positions 1..γ+1.
    pub logprobs: Vec<PositionLogprobs>,
    pub verify_ns: u64,
    /// Sequences that shared the forward pass (batching across sessions).
    pub batch_size: usize,
}

/// Runs on the model thread, through [`specd_node::Node::run`]: if it fails half-way, the
/// session keeps the state it had before, with its cache forgotten.
pub fn verify(model: &mut dyn LanguageModel, state: &mut SessionState, job: &VerifyJob) -> Result<Verified, NodeError> {
    if let Some(parents) = &job.parents {
        return verify_tree(model, state, job, parents);
    }
    let started = Instant::now();
    if let Some(supports) = &job.supports
        && supports.len() != job.candidates.len()
    {
        return Err(NodeError::InvalidRequest(format!(
            "{} supports for {} candidates",
            supports.len(),
            job.candidates.len()
        )));
    }
    let catch_up = state.history.catch_up(job.rollback_to, &job.pending)?;
    catch_up.apply_to_cache(model, state.model_session)?;
    let mut feed = catch_up.feed;
    feed.extend_from_slice(&job.candidates);
    let gamma = job.candidates.len();
    let session = state.model_session;
    // The rows that score the block: after the last pending token and after each candidate.
    let forward = |model: &mut dyn LanguageModel| model.forward_last(session, &feed, gamma + 1);
    // Under a constraint, row i's law is p restricted to what the constraint allows after the
    // committed output and the first i candidates (docs/rule.md#constrained-decoding). The
    // masks depend on the tokens alone, so they may be computed during the pass
    // ([`specd_node::FollowedConstraint::alongside`]).
    let (logits, masks) = match state.constraint.as_mut() {
        Some(constraint) => {
            let (output, candidates) = (state.history.generated(), job.candidates.as_slice());
            let (logits, masks) =
                constraint.alongside(|c| c.block_masks(job.block_masks, output, candidates), || forward(model));
            (logits?, Some(masks?))
        }
        None => (forward(model)?, None),
    };
    let history = &mut state.history;
    let batch_size = model.last_batch_size();
    let key = RoundKey { seed: state.seed, round: job.round };
    let first_row = logits.rows() - gamma - 1;
    // Logits the model left on its device are scored there when the reply is sparse and
    // without log-probabilities (which need every row's top tokens): only the reply's few
    // numbers come to the host.
    if !logits.on_host()
        && let (Some(supports), None) = (&job.supports, job.logprobs)
    {
        let rows = logits.tensor()?.f_narrow(0, first_row as i64, gamma as i64 + 1).map_err(ModelError::from)?;
        let rows = match &masks {
            Some(masks) => masked_rows(&rows, masks)?,
            None => rows,
        };
        let supports: Vec<&[u32]> = supports.iter().map(Vec::as_slice).collect();
        let block_history =
            BlockHistory { prompt: history.prompt(), generated: history.generated(), block: &job.candidates };
        let scored = score_block_with(job.device_rule, &rows, &state.params, block_history, &supports, key)?;
        history.push_forwarded(&job.candidates);
        let verdict = Verdict::Sparse(scored.block);
        return Ok(Verified {
            verdict,
            logprobs: Vec::new(),
            verify_ns: started.elapsed().as_nanos() as u64,
            batch_size,
        });
    }
    let logits = logits.into_host()?;
    let mut rows: Vec<&[f32]> =
        (first_row..logits.rows()).map(|i| logits.row(i).expect("host logits have a row per token")).collect();
    let masked = match &masks {
        Some(masks) => masked_copies(&rows, masks)?,
        None => Vec::new(),
    };
    for (row, copy) in rows.iter_mut().zip(&masked) {
        if let Some(copy) = copy {
            *row = copy;
        }
    }
    let p = block_distributions(
        &rows,
        &state.params,
        history.prompt(),
        history.generated(),
        &job.candidates,
        job.sampling_threads,
    )?;
    history.push_forwarded(&job.candidates);
    let block = match &job.supports {
        Some(supports) => {
            let supports: Vec<&[u32]> = supports.iter().map(Vec::as_slice).collect();
            Some(score_block(&p, &supports, key, job.sampling_threads)?)
        }
        None => None,
    };
    let logprobs = job.logprobs.map(|n| position_logprobs(&p, block.as_ref(), n)).unwrap_or_default();
    let verdict = match block {
        Some(block) => Verdict::Sparse(block),
        None => Verdict::Dense(p),
    };
    Ok(Verified { verdict, logprobs, verify_ns: started.elapsed().as_nanos() as u64, batch_size })
}

/// A masked copy of each row of `rows` that has a constraint mask; `None` for a row without
/// one, which lies past a candidate the constraint forbids: the rule rejects that candidate
/// and never reads the row, so copying it (a row is the vocabulary's width) would be waste.
fn masked_copies(rows: &[&[f32]], masks: &[Option<TokenMask>]) -> Result<Vec<Option<Vec<f32>>>, NodeError> {
    rows.iter()
        .zip(masks)
        .map(|(row, mask)| mask.as_ref().map(|mask| mask.masked(row).map_err(NodeError::from)).transpose())
        .collect()
}

/// The most pending tokens a tree pass scores with the tree; a longer catch-up runs first.
const PENDING_IN_TREE_PASS: usize = 16;

/// A tree's Verify: the pending tokens and every node of the tree in **one** pass
/// ([`LanguageModel::forward_tree`]: the pending tokens as a chain, the tree hanging from the
/// last), p after every node, each with its own path's penalties, and the sparse pieces per
/// node ([`score_tree`]). The cache keeps every node's rows until the next request says which
/// path was committed ([`specd_node::SessionHistory::push_forwarded_tree`]).
fn verify_tree(
    model: &mut dyn LanguageModel,
    state: &mut SessionState,
    job: &VerifyJob,
    parents: &[usize],
) -> Result<Verified, NodeError> {
    let started = Instant::now();
    if job.logprobs.is_some() {
        return Err(NodeError::InvalidRequest("log-probabilities are not computed for a tree".into()));
    }
    if state.constraint.is_some() {
        return Err(NodeError::InvalidRequest("a constrained session is verified in chains, not trees".into()));
    }
    let tree = DraftTree { parents: parents.to_vec(), tokens: job.candidates.clone() };
    tree.validate(ChildDraws::WithReplacement).map_err(|e| NodeError::InvalidRequest(e.to_string()))?;
    let supports = match &job.supports {
        Some(supports) => Some(node_supports(&tree, supports)?),
        None => None,
    };
    let history = &mut state.history;
    let catch_up = history.catch_up(job.rollback_to, &job.pending)?;
    catch_up.apply_to_cache(model, state.model_session)?;
    let mut feed = catch_up.feed;
    // A long catch-up (a prompt, or a spare target's refill) goes first in a pass of its own
    // that returns one row: in the tree pass, every pending token would return a row of
    // logits (and on an engine that scores a tree path by path, re-run its whole path).
    if feed.len() > PENDING_IN_TREE_PASS {
        let last = feed.len() - 1;
        model.forward_last(state.model_session, &feed[..last], 1)?;
        history.mark_cached_to(catch_up.keep + last);
        feed.drain(..last);
    }
    let fed = feed.len();
    let pass = TokenTree::new(
        feed.iter().chain(&tree.tokens).copied().collect(),
        (0..fed).map(|i| i.checked_sub(1)).chain(tree.parents.iter().map(|&parent| Some(fed - 1 + parent))).collect(),
    )?;
    let logits = model.forward_tree(state.model_session, &pass)?.into_host()?;
    let batch_size = model.last_batch_size();
    history.push_forwarded_tree(pass);
    // Node u of the drafted tree is pass node fed − 1 + u: node 0 is the last pending token.
    let rows: Vec<&[f32]> =
        (fed - 1..logits.rows()).map(|i| logits.row(i).expect("host logits have a row per token")).collect();
    let p =
        tree_distributions(&rows, &state.params, history.prompt(), history.generated(), &tree, job.sampling_threads)?;
    let verdict = match supports {
        Some(supports) => {
            let supports: Vec<Option<&[u32]>> = supports.iter().map(|s| s.map(Vec::as_slice)).collect();
            Verdict::SparseTree(score_tree(&p, &supports, RoundKey { seed: state.seed, round: job.round })?)
        }
        None => Verdict::DenseTree(p),
    };
    Ok(Verified { verdict, logprobs: Vec::new(), verify_ns: started.elapsed().as_nanos() as u64, batch_size })
}

/// The support each node's children were drawn from, from each candidate's copy of its
/// parent's: siblings must agree. `None` for a node without children.
fn node_supports<'a>(tree: &DraftTree, supports: &'a [Vec<u32>]) -> Result<Vec<Option<&'a Vec<u32>>>, NodeError> {
    if supports.len() != tree.tokens.len() {
        return Err(NodeError::InvalidRequest(format!(
            "{} supports for {} tree candidates",
            supports.len(),
            tree.tokens.len()
        )));
    }
    let mut of_node: Vec<Option<&Vec<u32>>> = vec![None; tree.len()];
    for (i, (&parent, support)) in tree.parents.iter().zip(supports).enumerate() {
        match of_node[parent] {
            Some(first) if first != support => {
                return Err(NodeError::InvalidRequest(format!(
                    "candidate {i} carries another support than its siblings: all were drawn from node {parent}'s q"
                )));
            }
            _ => of_node[parent] = Some(support),
        }
    }
    Ok(of_node)
}

/// Each position's most likely tokens and, in the sparse format, the log-probability of the
/// token the target drew there: what the coordinator needs for the log-probability of every
/// token it emits, whichever branch of the rule emitted it (the candidates' and the
/// residual's are p on the support, already in the reply).
fn position_logprobs(p: &[DenseDist], block: Option<&ScoredBlock>, n: usize) -> Vec<PositionLogprobs> {
    let drawn = |i: usize| -> Option<f64> {
        let block = block?;
        let token = match block.positions.get(i) {
            Some(position) => position.complement_sample?,
            None => block.bonus,
        };
        Some(logprob(p[i].prob(token)))
    };
    p.iter()
        .enumerate()
        .map(|(i, p_i)| PositionLogprobs {
            top: top_logprobs(p_i, n)
                .into_iter()
                .map(|(token_id, logprob)| ScoredAlternative { token_id, logprob })
                .collect(),
            drawn: drawn(i),
        })
        .collect()
}
