//! One Propose: catch up with the rollback point, then sample γ candidates, each from the
//! (truncated) q it is sent with. Runs on the model thread in one job, so a block costs one
//! channel round trip however long it is.

use std::time::Instant;

use specd_model::LanguageModel;
use specd_node::{NodeError, SessionState};
use specd_sampling::{DenseDist, Purpose, SparseDist, StreamKey, TokenHistory, Truncation, effective_distribution};

/// The distribution a candidate was drawn from, in the wire format asked for.
#[derive(Debug, Clone, PartialEq)]
pub enum ProposalDist {
    Sparse(SparseDist),
    Dense(DenseDist),
}

/// What a Propose asks for.
#[derive(Debug, Clone)]
pub struct ProposeJob {
    pub round: u32,
    pub rollback_to: usize,
    pub pending: Vec<u32>,
    pub gamma: usize,
    /// `None`: dense wire format.
    pub truncation: Option<Truncation>,
}

/// The block and how long the model work took.
#[derive(Debug)]
pub struct Proposal {
    pub candidates: Vec<(u32, ProposalDist)>,
    pub draft_ns: u64,
}

/// Runs on the model thread, through [`specd_node::Node::run`]: if it fails half-way, the
/// session keeps the state it had before, with its cache forgotten.
pub fn propose(
    model: &mut dyn LanguageModel,
    state: &mut SessionState,
    job: &ProposeJob,
) -> Result<Proposal, NodeError> {
    let started = Instant::now();
    let history = &mut state.history;
    let catch_up = history.catch_up(job.rollback_to, &job.pending)?;
    let mut candidates = Vec::with_capacity(job.gamma);
    if job.gamma > 0 {
        model.truncate(state.model_session, catch_up.keep)?;
        let mut logits = model.forward(state.model_session, &catch_up.feed)?;
        history.mark_cached();
        for position in 1..=job.gamma {
            let row = logits.row(logits.rows() - 1).expect("forward returns a row per token");
            let q = effective_distribution(
                row,
                &state.params,
                TokenHistory { prompt: history.prompt(), generated: history.generated() },
            )?;
            let u = StreamKey::new(state.seed, job.round, position as u32, Purpose::Draft).uniform();
            let (token, dist) = match job.truncation {
                Some(t) => {
                    let sparse = q.truncate(t);
                    (sparse.sample(u), ProposalDist::Sparse(sparse))
                }
                None => (q.sample(u), ProposalDist::Dense(q)),
            };
            candidates.push((token, dist));
            if position < job.gamma {
                logits = model.forward(state.model_session, &[token])?;
                history.push_forwarded(&[token]);
            } else {
                history.push_unforwarded(token);
            }
        }
    }
    Ok(Proposal { candidates, draft_ns: started.elapsed().as_nanos() as u64 })
}
