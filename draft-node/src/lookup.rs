//! A draft node with no model (`--proposer ngram|suffix`): its sessions are token histories,
//! its proposals are copied tokens, each with q = one-hot (a support of size one with q = 1),
//! and no model thread or libtorch runs. A lookup takes microseconds, so it runs in the
//! request's own task. A round where nothing matches gets an empty block: the coordinator
//! runs it target-only.
//!
//! The suffix proposer's index is shared by the node's sessions: a session's committed
//! sequence goes into it when the session is released (or reaped when idle).

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use specd_node::{NodeError, NodeSessionError, SessionHistory, SessionRegistry};
use specd_proto::convert::deterministic_proposal;
use specd_proto::v1::{NodeInfo, OpenSessionRequest, ProposalSource};
use specd_sampling::SamplingParams;

use crate::propose::{BatchTally, Proposal, ProposeJob};
use crate::proposer::ngram::{MatchSpan, lookup};
use crate::proposer::suffix::{self, SuffixIndex};
use crate::proposer::{ProposerConfig, ProposerKind};

/// The suffix index's size: tokens of finished sessions held and bytes used, each with its
/// bound.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IndexSize {
    pub held_tokens: usize,
    pub budget_tokens: usize,
    pub bytes: usize,
    pub byte_bound: usize,
}

/// One session: its history (committed tokens, then the last block proposed) and how much
/// of it is committed.
#[derive(Debug)]
struct LookupSession {
    history: SessionHistory,
    committed: usize,
    /// The request's seed: the suffix index leaves out sequences written with it.
    seed: u64,
}

/// A draft node's sessions and proposer, without a model. Cheap to clone.
#[derive(Debug, Clone)]
pub struct LookupNode {
    config: ProposerConfig,
    sessions: Arc<SessionRegistry<LookupSession>>,
    index: Arc<Mutex<SuffixIndex>>,
}

impl LookupNode {
    /// A node of `config.kind` (`ngram` or `suffix`) holding at most `max_sessions`.
    pub fn new(config: ProposerConfig, max_sessions: usize) -> Self {
        assert!(!config.kind.needs_model(), "a lookup node runs no model");
        let index = SuffixIndex::new(config.span.max, config.suffix_budget_tokens);
        Self { config, sessions: Arc::new(SessionRegistry::new(max_sessions)), index: Arc::new(Mutex::new(index)) }
    }

    /// Lets the suffix index propose from sequences of a session's own seed: **wrong**, for
    /// the test that shows the law check catches it.
    pub fn let_same_seed_propose(&self) {
        self.index.lock().expect("suffix index lock").let_same_seed_propose();
    }

    pub fn kind(&self) -> ProposerKind {
        self.config.kind
    }

    /// The match lengths of a proposer that proposes nothing without an n-gram match at the
    /// end of the session's sequence (ngram; a suffix node draws on other sessions too): a
    /// coordinator that knows them skips asking where the committed sequence has none.
    pub fn proposes_only_after_match(&self) -> Option<MatchSpan> {
        (self.config.kind == ProposerKind::Ngram).then_some(self.config.span)
    }

    /// The suffix index's size now and its bounds.
    pub fn index_size(&self) -> IndexSize {
        let index = self.index.lock().expect("suffix index lock");
        IndexSize {
            held_tokens: index.held_tokens(),
            budget_tokens: self.config.suffix_budget_tokens,
            bytes: index.approx_bytes(),
            byte_bound: index.byte_bound(),
        }
    }

    pub fn active_sessions(&self) -> usize {
        self.sessions.len()
    }

    /// Releases, every `ttl / 4`, the sessions unused for `ttl`. Stops when the node is dropped.
    pub fn spawn_reaper(&self, ttl: Duration) {
        let (sessions, config, index) = (Arc::downgrade(&self.sessions), self.config, Arc::clone(&self.index));
        let period = (ttl / 4).max(Duration::from_millis(50));
        tokio::spawn(async move {
            loop {
                tokio::time::sleep(period).await;
                let Some(sessions) = sessions.upgrade() else { return };
                for id in sessions.idle(ttl) {
                    if let Some(session) = sessions.remove(&id) {
                        remember(config, &index, &*session.lock().await);
                        tracing::info!(session = %id, idle_s = ttl.as_secs_f64(), "released an idle session");
                    }
                }
            }
        });
    }

    pub fn info(&self) -> NodeInfo {
        NodeInfo {
            role: "draft".into(),
            model_id: self.config.kind.to_string(),
            device: "cpu".into(),
            // No limit of its own: the target's is the session's.
            context_length: u32::MAX,
            active_sessions: self.sessions.len() as u32,
            kv_cache_bytes: self.index_size().bytes as u64,
            proposer: self.config.kind.to_string(),
            ..Default::default()
        }
    }

    pub fn open(&self, request: OpenSessionRequest) -> Result<(), NodeError> {
        // The proposals do not depend on them, but a request the model nodes refuse is
        // refused here too.
        let sampling = request.sampling.ok_or_else(|| NodeError::InvalidRequest("sampling is missing".into()))?;
        SamplingParams::try_from(&sampling)?;
        self.sessions.check_new(&request.session_id).map_err(NodeSessionError::from)?;
        let history = SessionHistory::resumed(request.prompt_token_ids, request.prompt_len as usize)?;
        let committed = history.len();
        self.sessions
            .insert(request.session_id, LookupSession { history, committed, seed: request.seed })
            .map_err(|(e, _)| NodeSessionError::from(e))?;
        Ok(())
    }

    /// Follows the rollback point, then copies up to γ tokens.
    pub async fn propose(&self, session_id: &str, job: &ProposeJob) -> Result<Proposal, NodeError> {
        let started = Instant::now();
        if job.truncation.is_none() {
            return Err(NodeError::InvalidRequest(
                "a draft with no model has no vocabulary to send a dense q over: use the sparse wire format".into(),
            ));
        }
        let session = self.sessions.get(session_id).ok_or_else(|| NodeSessionError::Unknown(session_id.to_owned()))?;
        let mut session = session.lock().await;
        session.history.catch_up(job.rollback_to, &job.pending)?;
        session.committed = session.history.len();
        let history = &session.history;
        let (tokens, source) = match self.config.kind {
            ProposerKind::Ngram => lookup(history.tokens(), history.prompt().len(), self.config.span, job.gamma)
                .map_or((Vec::new(), ProposalSource::PromptMatch), |l| (l.tokens, l.source)),
            _ => {
                let index = self.index.lock().expect("suffix index lock");
                (index.propose(session.seed, history.tokens(), self.config.span, job.gamma), suffix::SOURCE)
            }
        };
        let positions = tokens.iter().map(|&t| deterministic_proposal(t, source)).collect();
        for &token in &tokens {
            session.history.push_unforwarded(token);
        }
        Ok(Proposal {
            positions,
            draft_ns: started.elapsed().as_nanos() as u64,
            optimistic_hit: false,
            elided: false,
            draft_ahead: false,
            passes: BatchTally::default(),
        })
    }

    /// Releases the session, its committed sequence going into the suffix index; `false`
    /// when it was not open. `last`: the rollback point and the tokens committed since, which
    /// complete the sequence with the output of the rounds after the last proposal.
    pub async fn release(&self, session_id: &str, last: Option<(usize, &[u32])>) -> bool {
        let Some(session) = self.sessions.remove(session_id) else { return false };
        let mut session = session.lock().await;
        if let Some((rollback_to, pending)) = last {
            match session.history.catch_up(rollback_to, pending) {
                Ok(_) => session.committed = session.history.len(),
                Err(err) => tracing::warn!(
                    session = %session_id, %err,
                    "the final sequence does not follow the session's: the index keeps what the last proposal saw"
                ),
            }
        }
        remember(self.config, &self.index, &session);
        true
    }
}

/// A finished session's committed sequence into the suffix index (a suffix node only).
fn remember(config: ProposerConfig, index: &Mutex<SuffixIndex>, session: &LookupSession) {
    if config.kind == ProposerKind::Suffix {
        index.lock().expect("suffix index lock").insert(session.seed, &session.history.tokens()[..session.committed]);
    }
}

#[cfg(test)]
mod tests {
    use specd_proto::v1::SamplingSettings;

    use super::*;

    fn open(node: &LookupNode, id: &str, prompt: Vec<u32>) {
        let sampling = SamplingSettings { top_p: 1.0, repetition_penalty: 1.0, ..Default::default() };
        let request = OpenSessionRequest {
            session_id: id.into(),
            prompt_token_ids: prompt,
            sampling: Some(sampling),
            seed: 7,
            ..Default::default()
        };
        node.open(request).unwrap();
    }

    #[tokio::test]
    async fn a_release_with_the_final_cursor_keeps_the_whole_sequence() {
        let node = LookupNode::new(ProposerConfig { kind: ProposerKind::Suffix, ..Default::default() }, 8);
        open(&node, "a", vec![1, 2, 3]);
        // No proposal ever saw the 4 tokens the last rounds committed: only the release
        // carries them.
        assert!(node.release("a", Some((3, &[4, 5, 6, 7]))).await);
        assert_eq!(node.index_size().held_tokens, 7);
        // Without a cursor (an older coordinator), what the session saw.
        open(&node, "b", vec![1, 2, 3]);
        assert!(node.release("b", None).await);
        assert_eq!(node.index_size().held_tokens, 10);
        // A cursor that does not follow the session's sequence changes nothing.
        open(&node, "c", vec![1, 2]);
        assert!(node.release("c", Some((5, &[9]))).await);
        assert_eq!(node.index_size().held_tokens, 12);
        assert!(!node.release("c", None).await, "released twice");
    }
}
