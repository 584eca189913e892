//! One generation: a session actor that opens both nodes' sessions, runs rounds until a stop
//! condition, streams each round's tokens, and releases both nodes' sessions however it ends.
//!
//! The actor's loop is a sequence of named steps, each in a file of its own where it decides
//! something: [`open`] (the sessions it asks for), [`target`] and [`failover`] (the target's
//! session, and moving it to a spare), [`choose`] (each round's γ and whose round it is),
//! [`round`] (running it), [`commit`] (its tokens, and when the output ends), [`stream`] (the
//! messages the client is sent), [`finish`] and [`release`] (what an ended generation records
//! and owes the nodes), with [`stats`] summing the rounds up.

pub mod choose;
pub mod commit;
pub mod draft_filing;
pub mod draft_link;
pub mod draft_tree;
pub mod failover;
pub mod finish;
pub mod logprobs;
pub mod metrics;
pub mod open;
pub mod propose;
pub mod release;
pub mod round;
pub mod round_report;
pub mod stats;
pub mod stream;
pub mod target;
pub mod tree_verify;

use std::sync::Arc;
use std::time::Instant;

use specd_proto::v1::{FinishReason, GenerateResponse};
use specd_sampling::TreeShape;
use specd_telemetry::RequestMetrics;
use tokio::sync::mpsc;
use tonic::Status;

use specd_telemetry::attributes;
use tracing_opentelemetry::OpenTelemetrySpanExt;

use specd_text::{ModelText, TextStream};

use crate::error::CoordinatorError;
use crate::nodes::prefix_routes::RouteNote;
use crate::nodes::{DraftChoice, TargetClient};
use crate::policy::governor::LoadMode;
use crate::policy::key::{LoadLevel, PolicyKey};
use crate::policy::trees::{TreeTrial, auto_shape};
use crate::policy::{AdaptiveGamma, PolicyMemory, SteadyCosts};
use crate::request::{GammaChoice, GenerationSpec, TreeSetting};
use crate::session::choose::{RoundPlan, round_gamma, wanted_gamma};
use crate::session::commit::{Output, StopConditions};
use crate::session::draft_filing::DraftFiling;
use crate::session::draft_link::DraftLink;
use crate::session::failover::{Recovery, after_round_error};
use crate::session::finish::record_finished;
use crate::session::open::{OpenRequests, draft_open_grace};
use crate::session::release::{DraftOwed, PendingReleases};
use crate::session::round::{DraftStep, RoundInput, RoundReport, run_round};
use crate::session::stats::Stats;
use crate::session::stream::{last_message, round_message};
use crate::session::target::TargetSession;

/// Everything one generation needs.
#[derive(Debug)]
pub struct SessionActor {
    pub session_id: String,
    pub spec: GenerationSpec,
    pub vocab_size: usize,
    pub target: TargetClient,
    /// Other target replicas, tried in order when `target` is lost mid-generation.
    pub spare_targets: Vec<TargetClient>,
    /// Records which target replica holds the prompt once the session opens there.
    pub target_route: RouteNote,
    /// Where the generation drafts, if it does.
    pub draft: Option<DraftChoice>,
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

/// What a generation holds from one round to the next.
#[derive(Debug)]
struct Generation<'a> {
    /// The policy key of the session's settings at the load it started at: what its adaptive
    /// policy starts from and adds to.
    settings: PolicyKey,
    /// `None`: a fixed γ.
    adaptive: Option<AdaptiveGamma>,
    /// `--tree auto`: whether trees pay in this session, measured.
    trees: Option<TreeTrial>,
    target: TargetSession<'a>,
    /// `None`: the generation does not draft.
    draft: Option<DraftLink>,
    /// A generation that does not draft, with a draft to file its turn on.
    filing: Option<DraftFiling>,
    output: Output,
    stats: Stats,
    /// The next round's index.
    round: u32,
}

/// The tree a round at γ wants under the generation's `setting`: its shape, or under `auto`
/// the session's measured choice.
fn wanted_tree(setting: &TreeSetting, trial: Option<&TreeTrial>, gamma: u32) -> Option<TreeShape> {
    match setting {
        TreeSetting::Off => None,
        TreeSetting::Shape(shape) => Some(shape.clone()),
        TreeSetting::Auto => trial.filter(|t| t.wants_tree()).and_then(|_| auto_shape(gamma)),
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
        let mut generation = self.open().await?;
        let finish = loop {
            let mut plan = self.plan_round(&mut generation);
            let Some(report) = self.run_planned(&mut generation, &mut plan).await? else { continue };
            self.learn(&mut generation, &plan, &report);
            if let Some(finish) = self.commit_and_stream(&mut generation, &report).await? {
                break finish;
            }
            generation.round += 1;
        };
        Ok(self.finish(generation, finish).await)
    }

    /// Starts the generation: its adaptive policy from what earlier sessions learnt, the
    /// draft's session opening in the background, the target's session open, and the draft's
    /// waited for as long as it pays.
    async fn open(&self) -> Result<Generation<'_>, CoordinatorError> {
        let spec = &self.spec;
        // What pays depends on the sampling settings (α) and on the load: with many sessions
        // the nodes' passes are shared and the machine's compute is the limit, alone the
        // latency of a pass is. Sessions learn from those of the same settings and load.
        let running = self.running.get();
        let settings = PolicyKey::of(&spec.params, running);
        let adaptive = match spec.gamma {
            GammaChoice::Adaptive { max } => Some(self.policy_memory.start(settings, max, running)),
            GammaChoice::Fixed(_) => None,
        };
        // No draft session for a generation that will not draft.
        let will_draft = adaptive.as_ref().map_or(spec.gamma.max(), |policy| policy.max()) > 0;
        let requests = OpenRequests::of(spec, &self.session_id, self.vocab_size);
        let copies = self.policy_memory.copy_choice(settings);
        // A generation the policy decodes target-only files its turn on the draft when it
        // ends, for the turns after it that draft (crate::session::draft_filing); one that
        // asked for γ = 0 asked for no draft at all.
        let (mut draft, filing) = match &self.draft {
            Some(choice) if will_draft => (Some(DraftLink::start(choice, requests.draft, copies)), None),
            Some(choice) if adaptive.is_some() => {
                let counted = self.metrics.as_ref().map(RequestMetrics::draft_filings);
                (None, Some(DraftFiling::new(choice, requests.draft, counted)))
            }
            Some(_) | None => (None, None),
        };
        let target =
            TargetSession::open(&self.target, &self.spare_targets, &self.target_route, requests.target).await?;
        if let Some(link) = draft.as_mut() {
            let governed_plain = self.governed_mode(adaptive.is_some(), running, settings) == Some(LoadMode::Plain);
            link.wait_until_open(draft_open_grace(adaptive.as_ref(), governed_plain)).await;
        }
        let text = self
            .text
            .as_ref()
            .filter(|_| spec.detokenize)
            .map(|model| TextStream::new(Arc::clone(model.tokenizer()), &spec.prompt, spec.stop_strings.clone()));
        let output = Output::new(&spec.prompt, text, spec.constraint.as_ref().map(|c| c.state.clone()));
        let trees = (spec.tree == TreeSetting::Auto).then(|| self.policy_memory.tree_trial(settings));
        let mut stats = Stats::new(spec.verification);
        stats.target_cached_tokens = target.cached_tokens;
        Ok(Generation { settings, adaptive, trees, target, draft, filing, output, stats, round: 0 })
    }

    /// Plans the next round: its γ, the load level's mode, and whether the draft can take
    /// part.
    fn plan_round(&self, generation: &mut Generation<'_>) -> RoundPlan {
        let remaining = self.spec.max_new_tokens - generation.output.generated();
        // Under load, whether sessions draft at all is decided for the load level as a
        // whole, from what it measured in aggregate (crate::policy::governor).
        let running = self.running.get();
        let level = PolicyKey { load: LoadLevel::of(running), ..generation.settings };
        let load_mode = self.governed_mode(generation.adaptive.is_some(), running, level);
        let wanted = wanted_gamma(generation.adaptive.as_mut(), self.spec.gamma, load_mode == Some(LoadMode::Plain));
        let gamma = round_gamma(wanted, remaining);
        if gamma > 0
            && let Some(link) = generation.draft.as_mut()
        {
            link.reconnect_if_due(generation.output.committed());
        }
        // A round that would have drafted but runs target-only while the draft session
        // opens is not the policy's either: an explorer keeps its measuring rounds.
        let awaiting_draft = gamma > 0 && generation.draft.as_mut().is_some_and(DraftLink::opening);
        let steady = SteadyCosts {
            target: !generation.target.refills,
            draft: generation.draft.as_mut().is_some_and(DraftLink::steady),
        };
        RoundPlan { gamma, level, load_mode, awaiting_draft, nothing_to_propose: false, steady }
    }

    /// Runs the planned round; `None` when it failed in a way the session recovers from (on
    /// a spare target, or without the draft) and runs again.
    async fn run_planned(
        &self,
        generation: &mut Generation<'_>,
        plan: &mut RoundPlan,
    ) -> Result<Option<RoundReport>, CoordinatorError> {
        // Not a session that opened since: the policy was told this round is not its.
        let draft =
            generation.draft.as_mut().filter(|_| !plan.awaiting_draft).and_then(DraftLink::session).map(|session| {
                DraftStep {
                    session,
                    gamma: plan.gamma,
                    tree: wanted_tree(&self.spec.tree, generation.trees.as_ref(), plan.gamma),
                }
            });
        // A draft sure to propose nothing (an n-gram draft and no match) is not asked: the
        // round runs target-only, an empty proposal without the round trip.
        let committed = generation.output.committed();
        plan.nothing_to_propose =
            plan.gamma > 0 && draft.as_ref().is_some_and(|d| d.session.has_nothing_for(committed));
        let input = RoundInput {
            spec: &self.spec,
            session_id: &self.session_id,
            round: generation.round,
            vocab_size: self.vocab_size,
            target: &mut generation.target.rounds,
            target_cursor: &generation.target.cursor,
            target_scores_trees: generation.target.scores_trees,
            draft: draft.filter(|_| !plan.nothing_to_propose),
        };
        match run_round(input).await {
            Ok(mut report) => {
                report.proposal_skipped = plan.nothing_to_propose;
                Ok(Some(report))
            }
            Err(err) => match after_round_error(err) {
                Recovery::FailOver(lost) => {
                    // Nothing of this round was committed or sent: run it again on another
                    // replica, re-filled with everything committed so far.
                    generation.target.fail_over(lost, generation.output.committed()).await?;
                    generation.stats.target_failovers += 1;
                    Ok(None)
                }
                Recovery::WithoutDraft(err) => {
                    // Nothing was committed: the same round again, without the draft.
                    if let Some(link) = generation.draft.as_mut() {
                        link.lost(&err);
                        generation.stats.draft_fallbacks = link.fallbacks;
                    }
                    Ok(None)
                }
                Recovery::Fail(err) => Err(err),
            },
        }
    }

    /// What a finished round teaches the session: its stats, the load level's period, the
    /// adaptive policy and the memory behind it, and where each node stands in the committed
    /// sequence.
    fn learn(&self, generation: &mut Generation<'_>, plan: &RoundPlan, report: &RoundReport) {
        let base = generation.output.committed().len();
        generation.stats.record(report);
        if let Some(link) = &generation.draft {
            generation.stats.draft_cached_tokens = link.cached_tokens;
        }
        if let Some((level, mode)) = plan.loaded_round(generation.target.refills) {
            self.policy_memory.record_loaded_round(level, mode, report.outcome.tokens.len(), report.wall_ns);
        }
        let refilled = std::mem::take(&mut generation.target.refills);
        // The draft's model may join a session's rounds late (`model+ngram`): the round it
        // first drafts in also runs the prompt through it.
        let first_draft_pass = generation.draft.as_mut().is_some_and(|link| link.first_model_pass(report));
        let steady = SteadyCosts { draft: plan.steady.draft && !first_draft_pass, ..plan.steady };
        // A round that prefilled either node is no measure of what a tree or a chain costs.
        if let Some(trees) = generation.trees.as_mut().filter(|_| !refilled && !first_draft_pass) {
            trees.observe(report);
            self.policy_memory.remember_tree_trial(generation.settings, trees);
        }
        // A tree round's costs are a tree's (more target positions, more draft passes): γ's
        // policy learns α from it but not what a chain of γ costs.
        let steady = if report.tree { SteadyCosts { target: false, draft: false } } else { steady };
        if let Some(policy) = generation.adaptive.as_mut().filter(|_| plan.policy_owns()) {
            policy.observe(report, steady);
            self.policy_memory.remember(generation.settings, policy, &report.policy_acceptances());
        }
        generation.target.cursor.advance(base, report);
        if let Some(link) = generation.draft.as_mut() {
            link.after_round(base, report);
            if let Some(copies) = link.copy_choice() {
                self.policy_memory.remember_copies(generation.settings, copies);
            }
        }
    }

    /// Commits the round's tokens and sends them to the client; why the generation ends, once
    /// it does (the client gone: cancelled).
    async fn commit_and_stream(
        &self,
        generation: &mut Generation<'_>,
        report: &RoundReport,
    ) -> Result<Option<FinishReason>, CoordinatorError> {
        let stops = StopConditions::of(&self.spec);
        let committed = generation.output.commit(&report.outcome.tokens, &report.logprobs, stops)?;
        let finish = committed.finish;
        let message = round_message(&self.spec.request_id, committed, generation.stats.to_wire());
        metrics::round(self.metrics.as_ref(), report, message.token_ids.len());
        if self.out.send(Ok(message)).await.is_err() {
            return Ok(Some(FinishReason::Cancelled));
        }
        Ok(finish)
    }

    /// Records how the generation ended and sends its last message; the releases it still
    /// owes the nodes.
    async fn finish(&self, generation: Generation<'_>, finish: FinishReason) -> PendingReleases {
        let generated = generation.output.generated();
        record_finished(
            &self.session_id,
            &self.spec,
            finish,
            generated,
            &generation.stats,
            generation.adaptive.as_ref(),
        );
        let last =
            last_message(&self.spec.request_id, finish, self.spec.prompt.len(), generated, generation.stats.to_wire());
        metrics::finished(self.metrics.as_ref(), Some(finish));
        let _ = self.out.send(Ok(last)).await;
        let draft = match (generation.draft, generation.filing) {
            (Some(link), _) => DraftOwed::Sessions(link),
            (None, Some(filing)) => DraftOwed::Filing(filing, generation.output.committed().to_vec()),
            (None, None) => DraftOwed::Nothing,
        };
        PendingReleases::new(generation.target.into_release(), draft)
    }
}
