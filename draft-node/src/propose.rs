//! One Propose: catch up with the rollback point, then sample γ candidates, each from the
//! (truncated) q it is sent with. Runs on the model thread in one job, so a block costs one
//! channel round trip however long it is.
//!
//! Optimistic drafting (docs/architecture.md): a Propose that asks for it leaves a [`Lookahead`] in
//! the session, and [`draft_ahead`] then drafts the next block in one more model job, as if
//! every candidate were accepted and the bonus token were the draft's own guess. With a push
//! depth (on a stream), it pushes each block as soon as it is complete and goes on drafting
//! the block after it, guessing again, up to that many blocks ahead of the last request: the
//! coordinator then takes a block whose guess came true without a round trip. The next
//! Propose interrupts that job (it stops before its next forward pass), then takes the first
//! block when it is the request that block expects, finishing it if it is not complete yet
//! (and leaving it out of the reply when it was pushed), and otherwise drops every block
//! drafted ahead: the history follows the rollback point like any rejected suffix, and the
//! KV cache is truncated in O(1).
//!
//! Why this is exact: a candidate is drawn with the key (seed, round, position, Draft) from q
//! given the history, whichever job draws it. A block drafted ahead and taken by a matching
//! request is therefore the very block that request would have drafted: the same history
//! (the blocks before it in the chain were each taken by their own matching request, or it
//! would have been dropped), the same draws (bit for bit where the model scores one token at
//! a time as it scores several). The guess only decides whether the work is used; the
//! coordinator's acceptance draws (purposes Accept, Residual) never enter the draft.

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Instant;

use specd_device_sampling::{draw_truncated, masked_rows};
use specd_model::{LanguageModel, Logits, ModelError};
use specd_node::{Lookahead, NodeError, SessionState};
use specd_proto::convert::{dense_proposal, deterministic_dense_proposal, deterministic_proposal, sparse_proposal};
use specd_proto::v1::ProposedPosition;
use specd_sampling::{Purpose, StreamKey, TokenHistory, TokenMask, Truncation, effective_distribution};

use crate::proposer::ngram::{MatchSpan, lookup};

/// What a Propose asks for.
#[derive(Debug, Clone)]
pub struct ProposeJob {
    pub round: u32,
    pub rollback_to: usize,
    pub pending: Vec<u32>,
    pub gamma: usize,
    /// `None`: dense wire format.
    pub truncation: Option<Truncation>,
    /// Draft the next block ahead after this one.
    pub optimistic: bool,
    /// `model+ngram`: a position where the history has a match of these lengths takes the
    /// token after it (q = one-hot) instead of a draw from the model.
    pub ngram: Option<MatchSpan>,
}

/// The block and how long the model work took.
#[derive(Debug)]
pub struct Proposal {
    pub positions: Vec<ProposedPosition>,
    pub draft_ns: u64,
    /// The block was drafted ahead (see the module docs).
    pub optimistic_hit: bool,
    /// The block was drafted ahead and pushed: `positions` is empty.
    pub elided: bool,
    /// A lookahead was left in the session: [`draft_ahead`] should run.
    pub draft_ahead: bool,
    /// Forward passes run for this request, and the sequences that shared them.
    pub passes: BatchTally,
}

/// Forward passes and Σ of their batch sizes (batching across sessions).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct BatchTally {
    pub forward_passes: u32,
    pub batched_sequences: u32,
}

impl BatchTally {
    pub(crate) fn record(&mut self, model: &dyn LanguageModel) {
        self.forward_passes += 1;
        self.batched_sequences += model.last_batch_size() as u32;
    }
}

/// Runs on the model thread, through [`specd_node::Node::run`]: if it fails half-way, the
/// session keeps the state it had before, with its cache forgotten.
pub fn propose(
    model: &mut dyn LanguageModel,
    state: &mut SessionState,
    job: &ProposeJob,
) -> Result<Proposal, NodeError> {
    let started = Instant::now();
    let optimistic_hit = state.lookahead.first().is_some_and(|ahead| serves(ahead, job));
    let mut positions = Vec::with_capacity(job.gamma);
    let mut passes = BatchTally::default();
    let mut elided = false;
    if optimistic_hit {
        // The history already holds the guess and the candidates drafted after it (and the
        // blocks drafted after this one, which stay for the requests after this one).
        let ahead = state.lookahead.remove(0);
        elided = ahead.pushed;
        positions = ahead.positions;
        while positions.len() < job.gamma {
            // Only the last block of the chain can be incomplete: the history ends with it.
            let at = Draw { round: job.round, position: positions.len() + 1, purpose: Purpose::Draft };
            positions.push(next_candidate(model, state, at, job.truncation, job.ngram, &mut passes)?);
        }
        if elided {
            positions.clear();
        }
    } else {
        state.lookahead.clear();
        state.history.catch_up(job.rollback_to, &job.pending)?;
        for position in 1..=job.gamma {
            let at = Draw { round: job.round, position, purpose: Purpose::Draft };
            positions.push(next_candidate(model, state, at, job.truncation, job.ngram, &mut passes)?);
        }
    }
    let draft_ahead = job.optimistic && job.gamma > 0;
    if !draft_ahead {
        state.lookahead.clear();
    } else if state.lookahead.is_empty() {
        state.lookahead.push(next_block(job.round.wrapping_add(1), state.history.len(), job.gamma, job.truncation));
    }
    let draft_ns = started.elapsed().as_nanos() as u64;
    Ok(Proposal { positions, draft_ns, optimistic_hit, elided, draft_ahead, passes })
}

/// An empty block for round `round`, drafted after a history of `rollback_to` tokens.
fn next_block(round: u32, rollback_to: usize, gamma: usize, truncation: Option<Truncation>) -> Lookahead {
    Lookahead {
        round,
        rollback_to,
        gamma,
        truncation,
        guess: None,
        positions: Vec::with_capacity(gamma),
        pushed: false,
    }
}

/// Whether `job` is the request `ahead` was drafted for.
fn serves(ahead: &Lookahead, job: &ProposeJob) -> bool {
    ahead.guess.is_some_and(|guess| job.pending == [guess])
        && ahead.round == job.round
        && ahead.rollback_to == job.rollback_to
        && ahead.gamma == job.gamma
        && ahead.truncation == job.truncation
}

/// How far to draft ahead, and where complete blocks go.
pub struct Ahead<'a> {
    /// The round of the request that asked for it: the first block is for the round after.
    pub after_round: u32,
    /// Blocks to keep ahead of that request: 1 when nothing is pushed.
    pub depth: usize,
    /// Randomness of the candidates: [`Purpose::Draft`] in service (see [`crate::DraftNode`]).
    pub purpose: Purpose,
    /// Sends a complete block to the coordinator; `None`: blocks wait for their request.
    /// Returns whether it went out.
    pub push: Option<&'a mut dyn FnMut(&Lookahead) -> bool>,
    /// `model+ngram`, as [`ProposeJob::ngram`]: the blocks drafted ahead are drafted as
    /// their requests would draft them.
    pub ngram: Option<MatchSpan>,
}

impl std::fmt::Debug for Ahead<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Ahead")
            .field("after_round", &self.after_round)
            .field("depth", &self.depth)
            .field("purpose", &self.purpose)
            .field("pushes", &self.push.is_some())
            .field("ngram", &self.ngram)
            .finish()
    }
}

/// Drafts ahead until `ahead.depth` blocks are complete or `stop` is set (checked before
/// each forward pass); see [`draft_ahead_step`].
pub fn draft_ahead(
    model: &mut dyn LanguageModel,
    state: &mut SessionState,
    ahead: &mut Ahead<'_>,
    stop: &AtomicBool,
) -> Result<(), NodeError> {
    while !stop.load(Ordering::Acquire) && draft_ahead_step(model, state, ahead)? {}
    Ok(())
}

/// One forward pass of drafting ahead: in the last block of the chain, first the guess of
/// the bonus token before it (the mode of q after the block before, lowest id on ties), then
/// one candidate per call; a complete block is pushed (when there is somewhere to push it)
/// and, below the depth, followed by a new empty block. Returns whether there is more to do;
/// `false` also when the session has moved on (a later Propose took or dropped the blocks).
pub fn draft_ahead_step(
    model: &mut dyn LanguageModel,
    state: &mut SessionState,
    ahead: &mut Ahead<'_>,
) -> Result<bool, NodeError> {
    let first_round = ahead.after_round.wrapping_add(1);
    if state.lookahead.first().is_none_or(|first| first.round != first_round) {
        return Ok(false);
    }
    let last = state.lookahead.last().expect("checked above");
    if last.positions.len() == last.gamma {
        if ahead.push.is_none() || state.lookahead.len() >= ahead.depth {
            return Ok(false);
        }
        let next = next_block(last.round.wrapping_add(1), state.history.len(), last.gamma, last.truncation);
        state.lookahead.push(next);
    }
    let last = state.lookahead.last().expect("checked above");
    let (guessed, position, truncation, round) =
        (last.guess.is_some(), last.positions.len() + 1, last.truncation, last.round);
    // Drafting ahead never fails for want of room: the request it expects would.
    if state.history.len() > model.info().context_length {
        return Ok(false);
    }
    if !guessed {
        let next = forward_rest(model, state)?;
        let guess = most_likely(&next, state)?;
        state.history.push_unforwarded(guess);
        state.lookahead.last_mut().expect("checked above").guess = Some(guess);
        return Ok(true);
    }
    let at = Draw { round, position, purpose: ahead.purpose };
    let candidate = next_candidate(model, state, at, truncation, ahead.ngram, &mut BatchTally::default())?;
    let last = state.lookahead.last_mut().expect("checked above");
    last.positions.push(candidate);
    if last.positions.len() < last.gamma {
        return Ok(true);
    }
    match ahead.push.as_mut() {
        Some(push) => {
            last.pushed = push(last);
            Ok(last.pushed && state.lookahead.len() < ahead.depth)
        }
        None => Ok(false),
    }
}

/// The row that scores the next token: the logits of the history's last token, and what the
/// session's constraint allows after the history (`None` without a constraint).
#[derive(Debug)]
pub(crate) struct NextRow {
    pub logits: Logits,
    pub mask: Option<TokenMask>,
}

/// Forwards what the cache lacks of the history (after a candidate: that candidate alone)
/// and returns the row that scores the next token. A constrained session's mask depends on
/// the tokens alone, so it may be computed while the model runs the pass
/// ([`specd_node::FollowedConstraint::alongside`]): at a large vocabulary a mask costs about as
/// much as a small draft's pass (BENCHMARKS.md).
pub(crate) fn forward_rest(model: &mut dyn LanguageModel, state: &mut SessionState) -> Result<NextRow, NodeError> {
    let SessionState { history, constraint, model_session, .. } = state;
    // Never an empty feed: the last token is re-fed when the cache already covers it.
    let keep = history.cached().min(history.len() - 1);
    let forward = |model: &mut dyn LanguageModel| -> Result<Logits, NodeError> {
        model.truncate(*model_session, keep)?;
        Ok(model.forward_last(*model_session, &history.tokens()[keep..], 1)?)
    };
    let (logits, mask) = match constraint.as_mut() {
        Some(constraint) => {
            let output = history.generated();
            let (logits, mask) = constraint.alongside(|c| c.mask_after(output), || forward(model));
            (logits?, mask?)
        }
        None => (forward(model)?, None),
    };
    history.mark_cached();
    Ok(NextRow { logits, mask })
}

/// The draft's most likely next token after the history (ties: the lowest id), from the
/// last row of `next`'s logits, where they are.
fn most_likely(next: &NextRow, state: &SessionState) -> Result<u32, NodeError> {
    if !next.logits.on_host() {
        let row = last_row(next, state)?;
        let history = &state.history;
        let history = TokenHistory { prompt: history.prompt(), generated: history.generated() };
        return Ok(specd_device_sampling::most_likely(&row, &state.params, history)?);
    }
    let q = effective_q(&next.logits, next.mask.as_ref(), state)?;
    let best = q.probs().iter().enumerate().fold(0, |best, (t, p)| if *p > q.probs()[best] { t } else { best });
    Ok(best as u32)
}

/// The last row of logits the model left in a tensor, `[1, V]`, cut to the ids the
/// session draws from and masked by its constraint.
pub(crate) fn last_row(next: &NextRow, state: &SessionState) -> Result<tch::Tensor, NodeError> {
    let logits = &next.logits;
    let vocab = state.vocab_limit.map_or(logits.vocab(), |limit| limit.min(logits.vocab()));
    let row = logits.tensor()?;
    let row = row.f_narrow(0, logits.rows() as i64 - 1, 1).and_then(|row| row.f_narrow(1, 0, vocab as i64));
    let row = row.map_err(ModelError::from)?;
    Ok(match &next.mask {
        Some(mask) => masked_rows(&row, &[Some(mask)])?,
        None => row,
    })
}

/// Whether the session's constraint forbids `token` after its history (the output and the
/// candidates drafted so far). Masking q as the target masks p keeps the draft's candidates in
/// the language, so acceptance stays what it is without one; the law rests on the target's
/// masks alone (docs/rule.md#constrained-decoding).
fn constraint_forbids(state: &mut SessionState, token: u32) -> Result<bool, NodeError> {
    match state.constraint.as_mut() {
        Some(constraint) => constraint.forbids_after(state.history.generated(), token),
        None => Ok(false),
    }
}

/// The effective q after the history, from the last row of host `logits`, masked by `mask`
/// (the session's constraint's).
pub(crate) fn effective_q(
    logits: &Logits,
    mask: Option<&TokenMask>,
    state: &SessionState,
) -> Result<specd_sampling::DenseDist, NodeError> {
    let row = logits.row(logits.rows() - 1).expect("host logits have a row per token");
    // Rows past the target's vocabulary (padding) get q = 0: the draft never proposes an id
    // the target lacks, and its q is still exactly what it draws from.
    let mut row = match state.vocab_limit {
        Some(limit) => &row[..limit.min(row.len())],
        None => row,
    };
    let masked;
    if let Some(mask) = mask {
        masked = mask.masked(row)?;
        row = &masked;
    }
    let history = &state.history;
    Ok(effective_distribution(
        row,
        &state.params,
        TokenHistory { prompt: history.prompt(), generated: history.generated() },
    )?)
}

#[derive(Debug, Clone, Copy)]
struct Draw {
    round: u32,
    position: usize,
    purpose: Purpose,
}

/// The next candidate, appended to the history (not forwarded yet): with `ngram`, the token
/// after a match in the history when there is one (q = one-hot; no forward pass), otherwise
/// a draw from the model's q after the history (one forward pass, recorded in `passes`).
fn next_candidate(
    model: &mut dyn LanguageModel,
    state: &mut SessionState,
    at: Draw,
    truncation: Option<Truncation>,
    ngram: Option<MatchSpan>,
    passes: &mut BatchTally,
) -> Result<ProposedPosition, NodeError> {
    let history = &state.history;
    let found = ngram.and_then(|span| lookup(history.tokens(), history.prompt().len(), span, 1));
    // A copy the constraint forbids would only be rejected: the model draws instead.
    let found = match found {
        Some(found) if constraint_forbids(state, found.tokens[0])? => None,
        found => found,
    };
    if let Some(found) = found {
        let token = found.tokens[0];
        state.history.push_unforwarded(token);
        return Ok(match truncation {
            Some(_) => deterministic_proposal(token, found.source),
            // Over the ids the session draws from: the target's, when it has fewer rows.
            None => {
                deterministic_dense_proposal(token, state.vocab_limit.unwrap_or(model.info().vocab_size), found.source)
            }
        });
    }
    let next = forward_rest(model, state)?;
    passes.record(model);
    draw_candidate(next, state, at, truncation)
}

/// Draws the candidate at `at` from q after the history and appends it to the history, not
/// forwarded yet. A sparse q of logits the model left on its device is truncated there, and
/// only its most likely entries come to the host.
fn draw_candidate(
    next: NextRow,
    state: &mut SessionState,
    at: Draw,
    truncation: Option<Truncation>,
) -> Result<ProposedPosition, NodeError> {
    let u = StreamKey::new(state.seed, at.round, at.position as u32, at.purpose).uniform();
    let (token, wire) = match truncation {
        Some(t) if !next.logits.on_host() => {
            let row = last_row(&next, state)?;
            let history = &state.history;
            let history = TokenHistory { prompt: history.prompt(), generated: history.generated() };
            let drawn = draw_truncated(&row, &state.params, history, t, u)?;
            (drawn.token, sparse_proposal(drawn.token, &drawn.q))
        }
        Some(t) => {
            let sparse = effective_q(&next.logits, next.mask.as_ref(), state)?.truncate(t);
            let token = sparse.sample(u);
            (token, sparse_proposal(token, &sparse))
        }
        None => {
            let q = effective_q(&next.logits.into_host()?, next.mask.as_ref(), state)?;
            let token = q.sample(u);
            (token, dense_proposal(token, &q))
        }
    };
    state.history.push_unforwarded(token);
    Ok(wire)
}

#[cfg(test)]
mod tests {
    use specd_model::TableModel;
    use specd_node::SessionHistory;
    use specd_proto::v1::ProposalSource;
    use specd_sampling::SamplingParams;

    use super::*;

    const VOCAB: u32 = 5;
    const GAMMA: usize = 3;

    /// A draft whose q depends on the last two tokens, so that a wrong history shows.
    fn model() -> TableModel {
        let mut rules = Vec::new();
        for a in 0..VOCAB {
            for b in 0..VOCAB {
                let w: Vec<f64> = (0..VOCAB).map(|t| f64::from(1 + (a * 7 + b * 3 + t * 5) % 11)).collect();
                let total: f64 = w.iter().sum();
                let probs: Vec<f64> = w.iter().map(|x| x / total).collect();
                rules.push(serde_json::json!({"suffix": [a, b], "probs": probs}));
            }
        }
        let file = serde_json::json!({"vocab_size": VOCAB, "default": vec![0.2; VOCAB as usize], "rules": rules});
        TableModel::from_json("draft", file, None).unwrap()
    }

    fn session(model: &mut TableModel, seed: u64) -> SessionState {
        SessionState {
            model_session: model.open_session(None).unwrap(),
            history: SessionHistory::new(vec![1, 2]).unwrap(),
            params: SamplingParams::default(),
            seed,
            vocab_limit: None,
            lookahead: Vec::new(),
            cache_salt: String::new(),
            constraint: None,
        }
    }

    fn job(round: u32, rollback_to: usize, pending: Vec<u32>, optimistic: bool) -> ProposeJob {
        let truncation = Some(Truncation::new(0.05, 3).unwrap());
        ProposeJob { round, rollback_to, pending, gamma: GAMMA, truncation, optimistic, ngram: None }
    }

    /// Drafting ahead after round 0 without pushing: one block, for round 1.
    fn unpushed() -> Ahead<'static> {
        Ahead { after_round: 0, depth: 1, purpose: Purpose::Draft, push: None, ngram: None }
    }

    /// Round 0 optimistic, then `steps` steps of drafting ahead (at most what there is).
    fn after_round_zero(model: &mut TableModel, seed: u64, steps: usize) -> SessionState {
        let mut state = session(model, seed);
        let first = propose(model, &mut state, &job(0, 2, vec![], true)).unwrap();
        assert!(first.draft_ahead && !first.optimistic_hit);
        for _ in 0..steps {
            if !draft_ahead_step(model, &mut state, &mut unpushed()).unwrap() {
                break;
            }
        }
        state
    }

    #[test]
    fn a_block_drafted_ahead_is_the_block_its_request_would_draft() {
        let mut model = model();
        let mut hits = 0;
        for seed in 0..200u64 {
            let steps = (seed % (GAMMA as u64 + 3)) as usize;
            let mut ahead = after_round_zero(&mut model, seed, steps);
            let Some(guess) = ahead.lookahead.first().and_then(|a| a.guess) else {
                assert_eq!(steps, 0);
                continue;
            };
            let next = job(1, 2 + GAMMA, vec![guess], false);
            let served = propose(&mut model, &mut ahead, &next).unwrap();
            assert!(served.optimistic_hit, "seed {seed}");
            hits += 1;
            // The same request to a draft that never drafted ahead.
            let mut plain = session(&mut model, seed);
            propose(&mut model, &mut plain, &job(0, 2, vec![], false)).unwrap();
            let drafted = propose(&mut model, &mut plain, &next).unwrap();
            assert!(!drafted.optimistic_hit);
            assert_eq!(served.positions, drafted.positions, "seed {seed}, {steps} steps ahead");
            assert_eq!(ahead.history, plain.history);
            assert!(ahead.lookahead.is_empty() && !served.draft_ahead && !served.elided);
        }
        assert!(hits > 100);
    }

    #[test]
    fn with_ngram_a_match_proposes_one_hot_and_drafting_ahead_stays_exact() {
        let span = MatchSpan::new(1, 2).unwrap();
        let mut model = model();
        let (mut copied, mut sampled) = (0, 0);
        for seed in 0..100u64 {
            let ngram = |job: ProposeJob| ProposeJob { ngram: Some(span), ..job };
            let mut ahead = session(&mut model, seed);
            let first = propose(&mut model, &mut ahead, &ngram(job(0, 2, vec![], true))).unwrap();
            for position in &first.positions {
                if position.source == ProposalSource::Model as i32 {
                    sampled += 1;
                } else {
                    // q = one-hot: a support of size one with q = 1.
                    assert_eq!(
                        (position.support.as_slice(), position.q.as_slice()),
                        (&[position.token_id][..], &[1.0][..])
                    );
                    copied += 1;
                }
            }
            let mut drafting =
                Ahead { after_round: 0, depth: 1, purpose: Purpose::Draft, push: None, ngram: Some(span) };
            draft_ahead(&mut model, &mut ahead, &mut drafting, &AtomicBool::new(false)).unwrap();
            let guess = ahead.lookahead[0].guess.unwrap();
            let next = ngram(job(1, 2 + GAMMA, vec![guess], false));
            let served = propose(&mut model, &mut ahead, &next).unwrap();
            assert!(served.optimistic_hit, "seed {seed}");
            let mut plain = session(&mut model, seed);
            propose(&mut model, &mut plain, &ngram(job(0, 2, vec![], false))).unwrap();
            let drafted = propose(&mut model, &mut plain, &next).unwrap();
            assert_eq!(served.positions, drafted.positions, "seed {seed}");
        }
        assert!(copied > 0 && sampled > 0, "{copied} copied, {sampled} sampled");
    }

    #[test]
    fn a_wrong_guess_or_another_request_drops_the_block_drafted_ahead() {
        let mut model = model();
        for seed in 0..50u64 {
            let guess = after_round_zero(&mut model, seed, GAMMA + 1).lookahead[0].guess.unwrap();
            let misses = [
                job(1, 2 + GAMMA, vec![(guess + 1) % VOCAB], true),
                job(1, 2 + GAMMA - 1, vec![guess], true),
                job(2, 2 + GAMMA, vec![guess], true),
                ProposeJob { gamma: GAMMA - 1, ..job(1, 2 + GAMMA, vec![guess], true) },
                ProposeJob { truncation: None, ..job(1, 2 + GAMMA, vec![guess], true) },
            ];
            for next in misses {
                // A session of its own each time: clones of a state share its model session.
                let mut state = after_round_zero(&mut model, seed, GAMMA + 1);
                let got = propose(&mut model, &mut state, &next).unwrap();
                assert!(!got.optimistic_hit, "seed {seed}: {next:?}");
                let mut plain = session(&mut model, seed);
                propose(&mut model, &mut plain, &job(0, 2, vec![], false)).unwrap();
                let want = propose(&mut model, &mut plain, &next).unwrap();
                assert_eq!(got.positions, want.positions, "seed {seed}: {next:?}");
                assert_eq!(state.history, plain.history);
                // Asked again: the lookahead is for the round after this one.
                assert_eq!(state.lookahead.iter().map(|a| a.round).collect::<Vec<_>>(), [next.round + 1]);
            }
        }
    }

    #[test]
    fn drafting_ahead_stops_when_a_request_came_first() {
        let mut model = model();
        let mut state = after_round_zero(&mut model, 3, 1);
        // The next round is asked before the lookahead has a candidate: a miss on another token.
        propose(&mut model, &mut state, &job(1, 2, vec![4], false)).unwrap();
        assert!(state.lookahead.is_empty());
        assert!(!draft_ahead_step(&mut model, &mut state, &mut unpushed()).unwrap());
    }

    #[test]
    fn pushed_blocks_are_the_blocks_their_requests_would_draft() {
        let mut model = model();
        for seed in 0..50u64 {
            let mut state = session(&mut model, seed);
            propose(&mut model, &mut state, &job(0, 2, vec![], true)).unwrap();
            let mut pushed: Vec<Lookahead> = Vec::new();
            {
                let mut push = |block: &Lookahead| {
                    pushed.push(block.clone());
                    true
                };
                let mut ahead =
                    Ahead { after_round: 0, depth: 3, purpose: Purpose::Draft, push: Some(&mut push), ngram: None };
                draft_ahead(&mut model, &mut state, &mut ahead, &AtomicBool::new(false)).unwrap();
            }
            assert_eq!(pushed.iter().map(|b| b.round).collect::<Vec<_>>(), [1, 2, 3], "seed {seed}");
            // A draft that never drafted ahead, asked for each round with every candidate
            // accepted and the guess as the bonus token.
            let mut plain = session(&mut model, seed);
            propose(&mut model, &mut plain, &job(0, 2, vec![], false)).unwrap();
            for block in &pushed {
                assert_eq!(block.positions.len(), GAMMA);
                let next = job(block.round, block.rollback_to, vec![block.guess.unwrap()], true);
                let served = propose(&mut model, &mut state, &next).unwrap();
                assert!(served.optimistic_hit && served.elided && served.positions.is_empty(), "seed {seed}");
                let drafted = propose(&mut model, &mut plain, &ProposeJob { optimistic: false, ..next }).unwrap();
                assert!(!drafted.optimistic_hit);
                assert_eq!(block.positions, drafted.positions, "seed {seed}, round {}", block.round);
            }
            assert_eq!(state.history, plain.history);
        }
    }

    #[test]
    fn a_miss_drops_every_block_pushed_ahead() {
        let mut model = model();
        let mut state = session(&mut model, 7);
        propose(&mut model, &mut state, &job(0, 2, vec![], true)).unwrap();
        let mut guesses = Vec::new();
        {
            let mut push = |block: &Lookahead| {
                guesses.push(block.guess.unwrap());
                true
            };
            let mut ahead =
                Ahead { after_round: 0, depth: 2, purpose: Purpose::Draft, push: Some(&mut push), ngram: None };
            draft_ahead(&mut model, &mut state, &mut ahead, &AtomicBool::new(false)).unwrap();
        }
        assert_eq!(state.lookahead.len(), 2);
        // Round 1 ends with another bonus token: nothing drafted ahead is of use.
        let next = job(1, 2 + GAMMA, vec![(guesses[0] + 1) % VOCAB], true);
        let got = propose(&mut model, &mut state, &next).unwrap();
        assert!(!got.optimistic_hit && !got.elided && got.positions.len() == GAMMA);
        assert_eq!(state.lookahead.iter().map(|a| (a.round, a.pushed)).collect::<Vec<_>>(), [(2, false)]);
        let mut plain = session(&mut model, 7);
        propose(&mut model, &mut plain, &job(0, 2, vec![], false)).unwrap();
        assert_eq!(got.positions, propose(&mut model, &mut plain, &next).unwrap().positions);
        assert_eq!(state.history, plain.history);
    }
}
