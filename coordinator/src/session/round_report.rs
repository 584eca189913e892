//! What a round leaves behind: its report (outcome, costs, what proposed each candidate),
//! the wire and batching tallies, and each node's [`Cursor`] into the committed sequence.
//! Plain data that depends on no other part of the session, so that the round, the draft's
//! side of a round (propose, draft_link) and the policy all read it without depending on one
//! another.

use std::borrow::Cow;

use specd_proto::v1::{OutputLogprob, ProposalSource};
use specd_sampling::BlockOutcome;

/// What a node holds of the committed sequence C: its first `valid` tokens, and `pending`
/// committed tokens after them that it has not been sent yet.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Cursor {
    pub valid: usize,
    pub pending: Vec<u32>,
}

impl Cursor {
    /// After a round that this node took part in: the accepted prefix stays valid, the
    /// corrected token is pending. After a tree, which the node holds as no sequence, every
    /// token the round committed is pending (the node keeps the accepted path's cache rows
    /// itself, `specd_node::SessionHistory`).
    pub fn advance(&mut self, base: usize, report: &RoundReport) {
        let outcome = &report.outcome;
        if report.tree {
            self.valid = base;
            self.pending = outcome.tokens.clone();
        } else {
            self.valid = base + outcome.accepted;
            self.pending = vec![outcome.emitted()];
        }
    }

    /// After a round this node sat out: everything committed is pending.
    pub fn append(&mut self, tokens: &[u32]) {
        self.pending.extend_from_slice(tokens);
    }
}

/// Encoded protobuf bytes of a round's messages, by the node at the other end.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct WireBytes {
    pub to_draft: u64,
    pub from_draft: u64,
    pub to_target: u64,
    pub from_target: u64,
}

impl WireBytes {
    pub fn sent(&self) -> u64 {
        self.to_draft + self.to_target
    }

    pub fn received(&self) -> u64 {
        self.from_draft + self.from_target
    }

    pub fn add(&mut self, other: &WireBytes) {
        self.to_draft += other.to_draft;
        self.from_draft += other.from_draft;
        self.to_target += other.to_target;
        self.from_target += other.from_target;
    }
}

/// The name a candidate's source is counted under in the stats (`by_proposer`) and
/// `/metrics`: the same names the draft's proposers are configured by.
pub fn source_name(source: ProposalSource) -> &'static str {
    match source {
        ProposalSource::Model => "model",
        ProposalSource::PromptMatch => "prompt_match",
        ProposalSource::OutputMatch => "output_match",
        ProposalSource::Suffix => "suffix",
    }
}

/// A finished round and what it cost.
#[derive(Debug)]
pub struct RoundReport {
    pub outcome: BlockOutcome,
    /// When the client asked: one per token of `outcome.tokens`.
    pub logprobs: Vec<OutputLogprob>,
    pub gamma: usize,
    pub draft_ns: u64,
    pub verify_ns: u64,
    pub wall_ns: u64,
    /// Encoded protobuf bytes of the round's requests and replies.
    pub wire: WireBytes,
    /// The Propose followed one that asked the draft to draft ahead.
    pub optimistic_attempt: bool,
    /// The draft answered from the block it had drafted ahead.
    pub optimistic_hit: bool,
    /// That block came pushed: the round did not wait for the draft.
    pub optimistic_pushed: bool,
    /// The target's forward pass of this round and how many sessions shared it.
    pub target_batch: BatchSum,
    /// The draft's forward passes of this round and the sessions that shared them.
    pub draft_batches: BatchSum,
    /// The draft was asked for this round's block (it then follows the committed sequence
    /// to this round's base, whatever it proposed).
    pub drafted: bool,
    /// What proposed each candidate, in block order: [`ProposalSource::Model`] for a draw
    /// from the draft's model, a copy otherwise.
    pub sources: Vec<ProposalSource>,
    /// The draft was not asked because it was sure to propose nothing (an n-gram draft and
    /// no match: `DraftSession::has_nothing_for`).
    pub proposal_skipped: bool,
    /// The draft draws from a model and copies n-gram matches too
    /// (`DraftSession::copies_besides_model`): [`Self::policy_acceptances`].
    pub copies_apart: bool,
    /// The candidates were a tree (`gamma` of them in all), not a chain.
    pub tree: bool,
}

impl RoundReport {
    /// A round of the draft's `sources` (none: target-only) that ended in `outcome`, with
    /// these times and nothing else set: what the policy's tests feed it.
    #[cfg(test)]
    pub fn for_tests(outcome: BlockOutcome, sources: Vec<ProposalSource>, times_ns: [u64; 3]) -> Self {
        let [draft_ns, verify_ns, wall_ns] = times_ns;
        Self {
            outcome,
            logprobs: Vec::new(),
            gamma: sources.len(),
            draft_ns,
            verify_ns,
            wall_ns,
            wire: Default::default(),
            optimistic_attempt: false,
            optimistic_hit: false,
            target_batch: Default::default(),
            draft_batches: Default::default(),
            optimistic_pushed: false,
            drafted: !sources.is_empty(),
            sources,
            proposal_skipped: false,
            copies_apart: false,
            tree: false,
        }
    }

    /// Σ min(p, q) of the evaluated positions the adaptive policy learns α from: all of them,
    /// but the model's draws alone where the draft also copies (`model+ngram`). A copy is
    /// accepted with the target's p of its one token, which says nothing of what the model's
    /// draws are worth, and whether copies pay is weighed apart (`policy/copies.rs`). Learnt
    /// together, a grounded prompt's first rounds, copies of matches in the prompt accepted
    /// at a few percent at T = 0.8, could pull α below break-even before the copies were
    /// stopped, and the sessions after started from it and drafted no more.
    pub fn policy_acceptances(&self) -> Cow<'_, [f64]> {
        let evaluated = &self.outcome.expected_acceptance;
        if !self.copies_apart {
            return Cow::Borrowed(evaluated);
        }
        evaluated
            .iter()
            .zip(&self.sources)
            .filter(|(_, source)| matches!(source, ProposalSource::Model))
            .map(|(a, _)| *a)
            .collect()
    }

    /// The candidates whose drafting the adaptive policy prices as steps: all of the block,
    /// but the model's draws alone where the draft also copies ([`Self::policy_acceptances`]).
    /// A copy costs the draft next to nothing; a round of copies taken as steps priced the
    /// model's next draws as nearly free.
    pub fn policy_draws(&self) -> usize {
        if self.copies_apart { self.model_draws() } else { self.gamma }
    }

    /// The candidates the draft's model drew.
    pub fn model_draws(&self) -> usize {
        self.sources.iter().filter(|source| matches!(source, ProposalSource::Model)).count()
    }

    /// The draft proposed nothing (a deterministic proposer without a match), or was sure
    /// to and was not asked: the round ran target-only.
    pub fn empty_proposal(&self) -> bool {
        self.drafted && self.gamma == 0 || self.proposal_skipped
    }
}

/// Forward passes and Σ over them of the sequences that shared each (batching across
/// sessions on a node).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct BatchSum {
    pub forward_passes: u64,
    pub batched_sequences: u64,
}

impl BatchSum {
    pub fn add(&mut self, other: BatchSum) {
        self.forward_passes += other.forward_passes;
        self.batched_sequences += other.batched_sequences;
    }
}
