//! One generation: a session actor that opens both nodes' sessions, runs rounds until a stop
//! condition, streams each round's tokens, and releases both nodes' sessions however it ends.

pub mod draft_link;
pub mod logprobs;
pub mod metrics;
pub mod propose;
pub mod round;
pub mod round_report;

use std::sync::Arc;
use std::time::{Duration, Instant};

use specd_proto::v1::{
    FinishReason, GenerateResponse, OpenSessionRequest, ProposalSource, ProposerTally, SamplingSettings,
    SpeculationStats, Usage,
};
use specd_telemetry::RequestMetrics;
use tokio::sync::mpsc;
use tonic::Status;

use specd_telemetry::attributes;
use tracing::Instrument;
use tracing_opentelemetry::OpenTelemetrySpanExt;

use specd_text::{ModelText, TextStream};

use crate::error::CoordinatorError;
use crate::nodes::{DraftClient, TargetClient, TargetRounds};
use crate::policy::governor::LoadMode;
use crate::policy::key::{LoadLevel, PolicyKey};
use crate::policy::{AdaptiveGamma, PolicyMemory, SteadyCosts};
use crate::request::{GammaChoice, GenerationSpec};
use crate::session::draft_link::DraftLink;
use crate::session::round::{BatchSum, Cursor, DraftStep, RoundInput, RoundReport, WireBytes, run_round};
use crate::session::round_report::source_name;

/// Everything one generation needs.
#[derive(Debug)]
pub struct SessionActor {
    pub session_id: String,
    pub spec: GenerationSpec,
    pub vocab_size: usize,
    pub target: TargetClient,
    /// Other target replicas, tried in order when `target` is lost mid-generation.
    pub spare_targets: Vec<TargetClient>,
    pub draft: Option<DraftClient>,
    pub out: mpsc::Sender<Result<GenerateResponse, Status>>,
    pub metrics: Option<RequestMetrics>,
    /// The client's deadline: the generation ends with DEADLINE_EXCEEDED when it passes.
    pub deadline: Option<Instant>,
    /// What earlier sessions' adaptive γ learnt; this one starts from it and adds to it.
    pub policy_memory: PolicyMemory,
    /// Generations running on the coordinator now (this one included).
    pub running: RunningCount,
    /// The model's tokenizer, when the output is decoded to text.
    pub text: Option<Arc<ModelText>>,
}

/// Reads how many generations the coordinator is running at the moment.
#[derive(Clone)]
pub struct RunningCount(pub Arc<dyn Fn() -> usize + Send + Sync>);

impl RunningCount {
    fn get(&self) -> usize {
        (self.0)().max(1)
    }
}

impl std::fmt::Debug for RunningCount {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "RunningCount({})", self.get())
    }
}

/// Releases the target's session when the generation ends, whichever way: finish, error,
/// timeout or a client that went away (the actor's future is then dropped). The draft's
/// sessions are released by their [`DraftLink`] the same way.
#[derive(Debug)]
struct ReleaseGuard {
    session_id: String,
    /// `None` once released.
    target: Option<TargetClient>,
}

impl ReleaseGuard {
    /// The session moves to `next`: the lost target's session is released in the background
    /// (if the node comes back, it gets nothing stale).
    fn move_to(&mut self, next: TargetClient) {
        if let Some(old) = self.target.replace(next) {
            let id = self.session_id.clone();
            tokio::spawn(
                async move {
                    let _ = old.release(id).await;
                }
                .instrument(tracing::Span::current()),
            );
        }
    }

    /// Releases now and waits for it, so that a draining server only stops once the nodes
    /// hold nothing of this generation; the drop below then has nothing left to do.
    async fn release_now(mut self) {
        let Some(target) = self.target.take() else { return };
        if let Err(err) = target.release(self.session_id.clone()).await {
            tracing::warn!(session = %self.session_id, %err, "target release failed");
        }
    }
}

impl Drop for ReleaseGuard {
    fn drop(&mut self) {
        let Some(target) = self.target.take() else { return };
        let id = self.session_id.clone();
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            tracing::warn!(session = %id, "no runtime to release node sessions on");
            return;
        };
        // Still the generation's span: the releases belong to its trace.
        let span = tracing::Span::current();
        let release = async move {
            if let Err(err) = target.release(id.clone()).await {
                tracing::warn!(session = %id, %err, "target release failed");
            }
        };
        runtime.spawn(release.instrument(span));
    }
}

/// The releases a finished generation still owes the nodes. They run after its last reply,
/// so that the client does not wait for them (across a 50 ms link to the draft, releasing is
/// a round trip, 6% of a 48-token generation), and before its stream closes, so that a
/// draining server still waits for them.
#[derive(Debug)]
pub struct PendingReleases {
    target: ReleaseGuard,
    draft: Option<DraftLink>,
}

impl PendingReleases {
    pub async fn release(self) {
        let draft = async {
            if let Some(link) = self.draft {
                link.close().await;
            }
        };
        tokio::join!(self.target.release_now(), draft);
    }
}

#[derive(Debug, Default)]
struct Stats {
    rounds: u64,
    draft_tokens: u64,
    accepted_tokens: u64,
    accepted_per_position: Vec<u64>,
    gamma: u32,
    draft_ns: u64,
    verify_ns: u64,
    wall_ns: u64,
    wire: WireBytes,
    draft_fallbacks: u64,
    target_failovers: u64,
    acceptance_sum: f64,
    evaluated_positions: u64,
    optimistic_attempts: u64,
    optimistic_hits: u64,
    target_batches: BatchSum,
    draft_batches: BatchSum,
    optimistic_pushed: u64,
    /// Candidates proposed and accepted, by what proposed them.
    by_proposer: std::collections::BTreeMap<ProposalSource, ProposerTally>,
    empty_proposals: u64,
    proposals_skipped: u64,
}

impl Stats {
    fn record(&mut self, report: &RoundReport) {
        self.rounds += 1;
        self.draft_tokens += report.gamma as u64;
        self.accepted_tokens += report.outcome.accepted as u64;
        if self.accepted_per_position.len() < report.gamma {
            self.accepted_per_position.resize(report.gamma, 0);
        }
        for slot in &mut self.accepted_per_position[..report.outcome.accepted] {
            *slot += 1;
        }
        self.gamma = report.gamma as u32;
        self.draft_ns += report.draft_ns;
        self.verify_ns += report.verify_ns;
        self.wall_ns += report.wall_ns;
        self.wire.add(&report.wire);
        self.acceptance_sum += report.outcome.expected_acceptance.iter().sum::<f64>();
        self.evaluated_positions += report.outcome.expected_acceptance.len() as u64;
        self.optimistic_attempts += u64::from(report.optimistic_attempt);
        self.optimistic_hits += u64::from(report.optimistic_hit);
        self.target_batches.add(report.target_batch);
        self.draft_batches.add(report.draft_batches);
        self.optimistic_pushed += u64::from(report.optimistic_pushed);
        for (i, &source) in report.sources.iter().enumerate() {
            let tally = self.by_proposer.entry(source).or_default();
            tally.proposed += 1;
            tally.accepted += u64::from(i < report.outcome.accepted);
        }
        self.empty_proposals += u64::from(report.empty_proposal());
        self.proposals_skipped += u64::from(report.proposal_skipped);
    }

    fn to_wire(&self) -> SpeculationStats {
        SpeculationStats {
            rounds: self.rounds,
            draft_tokens: self.draft_tokens,
            accepted_tokens: self.accepted_tokens,
            accepted_per_position: self.accepted_per_position.clone(),
            gamma: self.gamma,
            draft_ns: self.draft_ns,
            verify_ns: self.verify_ns,
            round_wall_ns: self.wall_ns,
            wire_bytes_sent: self.wire.sent(),
            wire_bytes_received: self.wire.received(),
            draft_fallbacks: self.draft_fallbacks,
            target_failovers: self.target_failovers,
            acceptance_sum: self.acceptance_sum,
            evaluated_positions: self.evaluated_positions,
            optimistic_attempts: self.optimistic_attempts,
            optimistic_hits: self.optimistic_hits,
            target_forward_passes: self.target_batches.forward_passes,
            target_batched_sequences: self.target_batches.batched_sequences,
            draft_forward_passes: self.draft_batches.forward_passes,
            draft_batched_sequences: self.draft_batches.batched_sequences,
            wire_bytes_sent_to_draft: self.wire.to_draft,
            wire_bytes_received_from_draft: self.wire.from_draft,
            wire_bytes_sent_to_target: self.wire.to_target,
            wire_bytes_received_from_target: self.wire.from_target,
            optimistic_pushed: self.optimistic_pushed,
            by_proposer: self.by_proposer.iter().map(|(&k, v)| (source_name(k).to_owned(), *v)).collect(),
            empty_proposals: self.empty_proposals,
            proposals_skipped: self.proposals_skipped,
        }
    }
}

impl SessionActor {
    /// The mode the governor has set for the sessions of `key` (the settings at `running`
    /// sessions' load level), or `None` where a session decides alone: it runs alone, or its
    /// γ is fixed (`adaptive` false).
    fn governed_mode(&self, adaptive: bool, running: usize, key: PolicyKey) -> Option<LoadMode> {
        (adaptive && running > 1).then(|| self.policy_memory.load_mode(key))
    }

    /// Runs the generation to its end, streaming into `out`. Stops early, releasing
    /// everything, when the receiver of `out` is dropped (client cancel). A generation that
    /// finished returns the releases it still owes the nodes: the caller runs them once it
    /// no longer counts the generation as running, and closes `out` after them.
    pub async fn run(&self) -> Option<PendingReleases> {
        let out = self.out.clone();
        let span = tracing::Span::current();
        let deadline = async {
            match self.deadline {
                Some(at) => tokio::time::sleep_until(at.into()).await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            () = deadline => {
                tracing::info!("the client's deadline passed: generation stopped");
                span.set_attribute(attributes::RESPONSE_FINISH_REASONS, attributes::finish_reasons("deadline"));
                metrics::finished(self.metrics.as_ref(), None);
                let _ = out.send(Err(Status::deadline_exceeded("the client's deadline passed"))).await;
                None
            }
            () = out.closed() => {
                tracing::info!("client went away: generation cancelled");
                span.set_attribute(attributes::RESPONSE_FINISH_REASONS, attributes::finish_reasons("cancelled"));
                metrics::finished(self.metrics.as_ref(), Some(FinishReason::Cancelled));
                None
            }
            result = self.generate() => match result {
                Ok(releases) => Some(releases),
                Err(err) => {
                    tracing::warn!(%err, "generation failed");
                    span.set_attribute(attributes::RESPONSE_FINISH_REASONS, attributes::finish_reasons("error"));
                    attributes::set_error(&span, err.to_string());
                    metrics::finished(self.metrics.as_ref(), None);
                    let _ = out.send(Err(err.into())).await;
                    None
                }
            },
        }
    }

    async fn generate(&self) -> Result<PendingReleases, CoordinatorError> {
        let spec = &self.spec;
        // What pays depends on the sampling settings (α) and on the load: with many sessions
        // the nodes' passes are shared and the machine's compute is the limit, alone the
        // latency of a pass is. Sessions learn from those of the same settings and load.
        let running = self.running.get();
        let settings = PolicyKey::of(&spec.params, running);
        let mut adaptive = match spec.gamma {
            GammaChoice::Adaptive { max } => Some(self.policy_memory.start(settings, max, running)),
            GammaChoice::Fixed(_) => None,
        };
        // No draft session for a generation that will not draft.
        let will_draft = adaptive.as_ref().map_or(spec.gamma.max(), |policy| policy.max()) > 0;
        let draft = self.draft.as_ref().filter(|_| will_draft);
        let mut guard = ReleaseGuard { session_id: self.session_id.clone(), target: Some(self.target.clone()) };
        let mut spares = self.spare_targets.iter();
        let open = OpenSessionRequest {
            session_id: self.session_id.clone(),
            prompt_token_ids: spec.prompt.clone(),
            sampling: Some(SamplingSettings::from(&spec.params)),
            seed: spec.seed,
            vocab_limit: self.vocab_size as u32,
            // What the session can reach, for the nodes' KV reservation: the prompt, every
            // token asked for, and the largest block a round verifies past them.
            max_tokens: u32::try_from(spec.prompt.len() + spec.max_new_tokens + spec.gamma.max() as usize + 1)
                .unwrap_or(u32::MAX),
        };
        // Drafting ahead (optimistic drafting), the draft runs up to PUSH_DEPTH blocks of γ + 1
        // past the round's: it reserves for those too.
        let ahead = if spec.optimistic { propose::PUSH_DEPTH * (spec.gamma.max() + 1) } else { 0 };
        let draft_open = OpenSessionRequest { max_tokens: open.max_tokens.saturating_add(ahead), ..open.clone() };
        let copies = self.policy_memory.copy_choice(settings);
        let mut draft_link = draft.map(|d| DraftLink::start(d.clone(), draft_open, copies));
        let target_rounds = async {
            self.target.open_session(open.clone()).await?;
            self.target.open_rounds().await
        };
        let mut target_rounds = match target_rounds.await {
            Ok(rounds) => rounds,
            // The replica picked went away before the session started (it was draining, or
            // discovery has not caught up yet): start on a spare instead.
            Err(err) if err.is_node_loss() && !self.spare_targets.is_empty() => {
                let (next, rounds) = self.fail_over(err, &mut spares, &open, &spec.prompt).await?;
                guard.move_to(next);
                rounds
            }
            Err(err) => return Err(err),
        };
        if let Some(link) = draft_link.as_mut() {
            // A fixed γ asked for every round to draft; the adaptive policy weighs waiting,
            // and a load level whose sessions decode plainly has nothing to wait for.
            let governed_plain = self.governed_mode(adaptive.is_some(), running, settings) == Some(LoadMode::Plain);
            let grace = match &adaptive {
                Some(_) if governed_plain => Some(Duration::ZERO),
                Some(policy) => policy.draft_open_grace(),
                None => None,
            };
            link.wait_until_open(grace).await;
        }
        let mut target_cursor = Cursor { valid: spec.prompt.len(), pending: Vec::new() };
        let mut committed = spec.prompt.clone();
        let mut output: Vec<u32> = Vec::new();
        let mut stats = Stats::default();
        let mut text = self
            .text
            .as_ref()
            .filter(|_| spec.detokenize)
            .map(|model| TextStream::new(Arc::clone(model.tokenizer()), &spec.prompt, spec.stop_strings.clone()));
        let mut round = 0u32;
        // Whether the next round's target pass also fills the cache with everything committed
        // (the first round, and the first on a replica failed over to).
        let mut target_refills = true;
        let finish = loop {
            let base = spec.prompt.len() + output.len();
            let remaining = spec.max_new_tokens - output.len();
            // Under load, whether sessions draft at all is decided for the load level as a
            // whole, from what it measured in aggregate (crate::policy::governor). A round it makes
            // plain is not the session's policy's: the policy neither advances (an explorer
            // keeps its measuring rounds for a period that drafts) nor learns from it.
            let running = self.running.get();
            let level_key = PolicyKey { load: LoadLevel::of(running), ..settings };
            let load_mode = self.governed_mode(adaptive.is_some(), running, level_key);
            let loaded_level = load_mode.map(|_| level_key);
            let governed_plain = load_mode == Some(LoadMode::Plain);
            // A round commits up to γ+1 tokens: never draft past what is still wanted.
            let wanted = match (&mut adaptive, spec.gamma) {
                _ if governed_plain => 0,
                (Some(policy), _) => policy.next_gamma(),
                (None, gamma) => gamma.max(),
            };
            let gamma = wanted.min(remaining.saturating_sub(1) as u32);
            if gamma > 0
                && let Some(link) = draft_link.as_mut()
            {
                link.reconnect_if_due(&committed);
            }
            // A round that would have drafted but runs target-only while the draft session
            // opens is not the policy's either: an explorer keeps its measuring rounds.
            let awaiting_draft = gamma > 0 && draft_link.as_mut().is_some_and(DraftLink::opening);
            let steady =
                SteadyCosts { target: !target_refills, draft: draft_link.as_mut().is_some_and(DraftLink::steady) };
            // Not a session that opened since: the policy was told this round is not its.
            let draft = draft_link
                .as_mut()
                .filter(|_| !awaiting_draft)
                .and_then(DraftLink::session)
                .map(|session| DraftStep { session, gamma });
            // A draft sure to propose nothing (an n-gram draft and no match) is not asked: the
            // round runs target-only, an empty proposal without the round trip. Not the
            // policy's round either: it chose a γ the draft could not fill.
            let nothing_to_propose = gamma > 0 && draft.as_ref().is_some_and(|d| d.session.has_nothing_for(&committed));
            let input = RoundInput {
                spec,
                session_id: &self.session_id,
                round,
                vocab_size: self.vocab_size,
                target: &mut target_rounds,
                target_cursor: &target_cursor,
                draft: draft.filter(|_| !nothing_to_propose),
            };
            let mut report = match run_round(input).await {
                Err(CoordinatorError::TargetLost(err)) => {
                    // Nothing of this round was committed or sent: run it again on another
                    // replica, re-filled with everything committed so far.
                    let (next, rounds) = self.fail_over(*err, &mut spares, &open, &committed).await?;
                    stats.target_failovers += 1;
                    guard.move_to(next);
                    target_rounds = rounds;
                    target_cursor = Cursor { valid: committed.len(), pending: Vec::new() };
                    target_refills = true;
                    continue;
                }
                Err(CoordinatorError::DraftLost(err)) => {
                    // Nothing was committed: the same round again, without the draft.
                    if let Some(link) = draft_link.as_mut() {
                        link.lost(&err);
                        stats.draft_fallbacks = link.fallbacks;
                    }
                    continue;
                }
                result => result?,
            };
            report.proposal_skipped = nothing_to_propose;
            stats.record(&report);
            // A round that filled the cache costs the prompt's pass, whichever mode the level
            // is in: counted, it would make the mode measured first (the period the sessions
            // start in) look slower than it is. Rounds that waited for a draft session to open
            // count: that wait is what drafting costs a period's sessions.
            if let (Some(level), Some(mode), false) = (loaded_level, load_mode, target_refills) {
                self.policy_memory.record_loaded_round(level, mode, report.outcome.tokens.len(), report.wall_ns);
            }
            target_refills = false;
            // The draft's model may join a session's rounds late (`model+ngram`): the round it
            // first drafts in also runs the prompt through it.
            let steady = SteadyCosts {
                draft: steady.draft && !draft_link.as_mut().is_some_and(|link| link.first_model_pass(&report)),
                ..steady
            };
            if let Some(policy) =
                adaptive.as_mut().filter(|_| !governed_plain && !awaiting_draft && !nothing_to_propose)
            {
                policy.observe(&report, steady);
                self.policy_memory.remember(settings, policy, &report.policy_acceptances());
            }
            target_cursor.advance(base, &report.outcome);
            if let Some(link) = draft_link.as_mut() {
                link.after_round(base, &report);
                if let Some(copies) = link.copy_choice() {
                    self.policy_memory.remember_copies(settings, copies);
                }
            }
            let before = output.len();
            let mut finish = None;
            let mut delta_text = String::new();
            let mut delta_logprobs = Vec::new();
            for (j, &token) in report.outcome.tokens.iter().enumerate() {
                delta_logprobs.extend(report.logprobs.get(j).cloned());
                output.push(token);
                committed.push(token);
                // Text a token completes is released at once, except what may still become
                // a stop string or is an incomplete character; a stop string ends the output
                // with the token that completed it.
                if let Some(text) = text.as_mut() {
                    let pushed = text.push(token)?;
                    delta_text.push_str(&pushed.text);
                    if pushed.stopped {
                        finish = Some(FinishReason::Stop);
                        break;
                    }
                }
                finish = self.stop_reason(token, output.len());
                if finish.is_some() {
                    break;
                }
            }
            if let (Some(text), Some(_)) = (text.as_mut(), finish) {
                delta_text.push_str(&text.finish()?);
            }
            let message = GenerateResponse {
                request_id: spec.request_id.clone(),
                text: delta_text,
                token_ids: output[before..].to_vec(),
                stats: Some(stats.to_wire()),
                logprobs: delta_logprobs,
                ..Default::default()
            };
            metrics::round(self.metrics.as_ref(), &report, message.token_ids.len());
            if self.out.send(Ok(message)).await.is_err() {
                break FinishReason::Cancelled;
            }
            if let Some(reason) = finish {
                break reason;
            }
            round += 1;
        };
        tracing::info!(
            session = %self.session_id,
            request = %spec.request_id,
            finish = ?finish,
            completion_tokens = output.len(),
            rounds = stats.rounds,
            accepted = stats.accepted_tokens,
            drafted = stats.draft_tokens,
            draft_ms = Duration::from_nanos(stats.draft_ns).as_secs_f64() * 1e3,
            verify_ms = Duration::from_nanos(stats.verify_ns).as_secs_f64() * 1e3,
            adaptive = adaptive.as_ref().map(AdaptiveGamma::summary),
            "generation finished"
        );
        let span = tracing::Span::current();
        span.set_attribute(attributes::RESPONSE_FINISH_REASONS, attributes::finish_reasons(finish_name(finish)));
        span.set_attribute(attributes::USAGE_OUTPUT_TOKENS, output.len() as i64);
        span.set_attribute(attributes::ROUNDS, stats.rounds as i64);
        let last = GenerateResponse {
            request_id: spec.request_id.clone(),
            finish_reason: finish as i32,
            usage: Some(Usage { prompt_tokens: spec.prompt.len() as u32, completion_tokens: output.len() as u32 }),
            stats: Some(stats.to_wire()),
            ..Default::default()
        };
        metrics::finished(self.metrics.as_ref(), Some(finish));
        let _ = self.out.send(Ok(last)).await;
        Ok(PendingReleases { target: guard, draft: draft_link })
    }

    /// Opens the session, holding `committed`, on the next spare target that answers; the
    /// loss itself when there is none left.
    async fn fail_over(
        &self,
        lost: CoordinatorError,
        spares: &mut std::slice::Iter<'_, TargetClient>,
        open: &OpenSessionRequest,
        committed: &[u32],
    ) -> Result<(TargetClient, TargetRounds), CoordinatorError> {
        tracing::warn!(%lost, "target lost");
        for next in spares.by_ref() {
            let request = OpenSessionRequest { prompt_token_ids: committed.to_vec(), ..open.clone() };
            let opened = async {
                next.open_session(request).await?;
                next.open_rounds().await
            };
            match opened.await {
                Ok(rounds) => {
                    tracing::info!(address = %next.address, tokens = committed.len(), "moved to another target");
                    return Ok((next.clone(), rounds));
                }
                Err(err) => tracing::warn!(address = %next.address, %err, "spare target unavailable too"),
            }
        }
        Err(CoordinatorError::TargetLost(Box::new(lost)))
    }

    fn stop_reason(&self, token: u32, generated: usize) -> Option<FinishReason> {
        if self.spec.stop_token_ids.contains(&token) {
            Some(FinishReason::Stop)
        } else if self.spec.eos_token_ids.contains(&token) {
            Some(FinishReason::Eos)
        } else if generated >= self.spec.max_new_tokens {
            Some(FinishReason::Length)
        } else {
            None
        }
    }
}

fn finish_name(reason: FinishReason) -> &'static str {
    match reason {
        FinishReason::Length => "length",
        FinishReason::Eos => "eos",
        FinishReason::Stop => "stop",
        FinishReason::Cancelled => "cancelled",
        FinishReason::Unspecified => "unspecified",
    }
}
