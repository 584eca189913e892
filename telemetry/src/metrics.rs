//! The registry and the metrics each role records.
//!
//! Counters and histograms are the coordinator's (the nodes do not know rounds end to end);
//! the nodes own their gauges and their prefix caches' series, read from the model thread
//! when Prometheus scrapes.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, OnceLock, PoisonError};
use std::time::{Duration, Instant};

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

use crate::error::TelemetryError;

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RoleLabel {
    role: &'static str,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct PositionLabel {
    position: u64,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ProposerLabel {
    proposer: &'static str,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct FilingLabel {
    outcome: &'static str,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct FinishLabel {
    finish_reason: &'static str,
}

/// How a generation ended: the `finish_reason` label of `specd_requests_total`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum FinishReason {
    Length,
    Eos,
    Stop,
    Cancelled,
    Error,
}

impl FinishReason {
    pub const ALL: [Self; 5] = [Self::Length, Self::Eos, Self::Stop, Self::Cancelled, Self::Error];

    /// The label value: `length`, `eos`, `stop`, `cancelled` or `error`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Length => "length",
            Self::Eos => "eos",
            Self::Stop => "stop",
            Self::Cancelled => "cancelled",
            Self::Error => "error",
        }
    }
}

type Hook = Arc<dyn Fn() -> Pin<Box<dyn Future<Output = ()> + Send>> + Send + Sync>;

struct Inner {
    registry: Mutex<Registry>,
    active_sessions: Family<RoleLabel, Gauge>,
    kv_cache_bytes: OnceLock<Family<RoleLabel, Gauge>>,
    kv_budget_bytes: OnceLock<Family<RoleLabel, Gauge>>,
    prefix_cache: OnceLock<PrefixCacheFamilies>,
    coordinator: OnceLock<CoordinatorMetrics>,
    hooks: Mutex<Vec<Hook>>,
}

/// A process's metrics registry. Cheap to clone: the state is shared. Each role registers
/// its own metrics on first use, so a node's process does not show the coordinator's.
#[derive(Clone)]
pub struct Metrics {
    inner: Arc<Inner>,
}

impl fmt::Debug for Metrics {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Metrics").finish_non_exhaustive()
    }
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

impl Metrics {
    /// An empty registry with `specd_active_sessions{role}`.
    pub fn new() -> Self {
        let mut registry = Registry::default();
        let active_sessions = Family::<RoleLabel, Gauge>::default();
        registry.register(
            "specd_active_sessions",
            "Generations in flight (role=coordinator) or sessions open on a node (role=target|draft)",
            active_sessions.clone(),
        );
        let inner = Inner {
            registry: Mutex::new(registry),
            active_sessions,
            kv_cache_bytes: OnceLock::new(),
            kv_budget_bytes: OnceLock::new(),
            prefix_cache: OnceLock::new(),
            coordinator: OnceLock::new(),
            hooks: Mutex::default(),
        };
        Self { inner: Arc::new(inner) }
    }

    /// The coordinator's metrics, registered on the first call.
    pub fn coordinator(&self) -> CoordinatorMetrics {
        self.inner
            .coordinator
            .get_or_init(|| {
                let active = self.inner.active_sessions.get_or_create(&RoleLabel { role: "coordinator" }).clone();
                CoordinatorMetrics::register(&mut lock(&self.inner.registry), active)
            })
            .clone()
    }

    /// The gauges of a node of `role` (`target` or `draft`). Set them from a scrape hook
    /// ([`Self::on_scrape`]) or whenever they change.
    pub fn node(&self, role: &'static str) -> NodeGauges {
        let kv = self.inner.kv_cache_bytes.get_or_init(|| {
            let family = Family::<RoleLabel, Gauge>::default();
            lock(&self.inner.registry).register(
                "specd_kv_cache_bytes",
                "Bytes of KV cache held by a node's open sessions",
                family.clone(),
            );
            family
        });
        let budget = self.inner.kv_budget_bytes.get_or_init(|| {
            let family = Family::<RoleLabel, Gauge>::default();
            lock(&self.inner.registry).register(
                "specd_kv_budget_bytes",
                "Bytes of KV cache a node's sessions may reserve together (no series: unbounded)",
                family.clone(),
            );
            family
        });
        let label = RoleLabel { role };
        NodeGauges {
            active_sessions: self.inner.active_sessions.get_or_create(&label).clone(),
            kv_cache_bytes: kv.get_or_create(&label).clone(),
            kv_budget_bytes: budget.clone(),
            label,
        }
    }

    /// The prefix-cache series of a node of `role`, registered on the first call.
    pub fn prefix_cache(&self, role: &'static str) -> PrefixCacheSeries {
        let families = self.inner.prefix_cache.get_or_init(|| {
            let mut registry = lock(&self.inner.registry);
            let mut counter = |name: &str, help: &str| {
                let family = Family::<RoleLabel, Counter>::default();
                registry.register(name, help, family.clone());
                family
            };
            let lookups = counter("specd_prefix_cache_lookups", "Sessions a node opened through its prefix cache");
            let hits = counter("specd_prefix_cache_hits", "Sessions that started from a cached prefix");
            let hit_tokens = counter("specd_prefix_cache_hit_tokens", "Prompt tokens served from the prefix cache");
            let evictions =
                counter("specd_prefix_cache_evictions", "Prefix-cache entries dropped to make room for live sessions");
            let mut gauge = |name: &str, help: &str| {
                let family = Family::<RoleLabel, Gauge>::default();
                registry.register(name, help, family.clone());
                family
            };
            let bytes =
                gauge("specd_prefix_cache_bytes", "Bytes of KV cache the prefix cache holds (part of the budget)");
            let entries = gauge("specd_prefix_cache_entries", "Prefixes the prefix cache holds");
            PrefixCacheFamilies { lookups, hits, hit_tokens, evictions, bytes, entries }
        });
        let label = RoleLabel { role };
        PrefixCacheSeries {
            lookups: families.lookups.get_or_create(&label).clone(),
            hits: families.hits.get_or_create(&label).clone(),
            hit_tokens: families.hit_tokens.get_or_create(&label).clone(),
            evictions: families.evictions.get_or_create(&label).clone(),
            bytes: families.bytes.get_or_create(&label).clone(),
            entries: families.entries.get_or_create(&label).clone(),
        }
    }

    /// Runs `hook` before every scrape (to sample gauges that are costly to keep current).
    pub fn on_scrape<F, Fut>(&self, hook: F)
    where
        F: Fn() -> Fut + Send + Sync + 'static,
        Fut: Future<Output = ()> + Send + 'static,
    {
        lock(&self.inner.hooks).push(Arc::new(move || Box::pin(hook())));
    }

    /// Runs the scrape hooks, then writes the registry in the OpenMetrics text format.
    pub async fn encode(&self) -> Result<String, TelemetryError> {
        let hooks: Vec<Hook> = lock(&self.inner.hooks).clone();
        for hook in hooks {
            hook().await;
        }
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &lock(&self.inner.registry))?;
        Ok(text)
    }
}

struct PrefixCacheFamilies {
    lookups: Family<RoleLabel, Counter>,
    hits: Family<RoleLabel, Counter>,
    hit_tokens: Family<RoleLabel, Counter>,
    evictions: Family<RoleLabel, Counter>,
    bytes: Family<RoleLabel, Gauge>,
    entries: Family<RoleLabel, Gauge>,
}

/// What a node's prefix cache has done since it started, and holds now.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PrefixCacheSample {
    pub lookups: u64,
    pub hits: u64,
    pub hit_tokens: u64,
    pub evictions: u64,
    pub bytes: u64,
    pub entries: u64,
}

/// A node's prefix-cache series (`specd_prefix_cache_*{role}`).
#[derive(Debug, Clone)]
pub struct PrefixCacheSeries {
    lookups: Counter,
    hits: Counter,
    hit_tokens: Counter,
    evictions: Counter,
    bytes: Gauge,
    entries: Gauge,
}

impl PrefixCacheSeries {
    /// Brings the series to `sample`, whose counts only grow (the cache counts them itself).
    pub fn record(&self, sample: PrefixCacheSample) {
        for (counter, total) in [
            (&self.lookups, sample.lookups),
            (&self.hits, sample.hits),
            (&self.hit_tokens, sample.hit_tokens),
            (&self.evictions, sample.evictions),
        ] {
            counter.inc_by(total.saturating_sub(counter.get()));
        }
        self.bytes.set(i64::try_from(sample.bytes).unwrap_or(i64::MAX));
        self.entries.set(i64::try_from(sample.entries).unwrap_or(i64::MAX));
    }
}

/// A node's gauges: sessions, the KV bytes they reserve, and the budget on those.
#[derive(Debug, Clone)]
pub struct NodeGauges {
    active_sessions: Gauge,
    kv_cache_bytes: Gauge,
    /// A family, so that an unbounded node shows no series rather than a 0 that reads as
    /// "nothing fits".
    kv_budget_bytes: Family<RoleLabel, Gauge>,
    label: RoleLabel,
}

impl NodeGauges {
    pub fn set(&self, active_sessions: usize, kv_cache_bytes: u64) {
        self.active_sessions.set(i64::try_from(active_sessions).unwrap_or(i64::MAX));
        self.kv_cache_bytes.set(i64::try_from(kv_cache_bytes).unwrap_or(i64::MAX));
    }

    /// The node's KV budget (`None`: unbounded, no series).
    pub fn set_kv_budget(&self, bytes: Option<u64>) {
        match bytes {
            Some(bytes) => {
                self.kv_budget_bytes.get_or_create(&self.label).set(i64::try_from(bytes).unwrap_or(i64::MAX));
            }
            None => {
                self.kv_budget_bytes.remove(&self.label);
            }
        }
    }
}

/// What one round cost and achieved, in the coordinator's terms.
#[derive(Debug, Clone, Default)]
pub struct RoundSample {
    /// Draft length γ of the round (0: target-only).
    pub gamma: usize,
    /// Draft tokens accepted (the first `accepted` positions).
    pub accepted: usize,
    pub draft_ns: u64,
    pub verify_ns: u64,
    /// The round's wall time at the coordinator.
    pub wall_ns: u64,
    /// The round's Propose followed one that asked the draft to draft ahead, and the draft
    /// answered from the block it had drafted ahead (optimistic drafting).
    pub optimistic_attempt: bool,
    pub optimistic_hit: bool,
    /// What proposed each candidate, in block order ("model", "prompt_match",
    /// "output_match", "suffix"): the first `accepted` were accepted.
    pub sources: Vec<&'static str>,
    /// The draft was asked for candidates and proposed none: the round ran target-only.
    pub empty_proposal: bool,
}

/// The coordinator's counters, histograms and its `specd_active_sessions` series.
#[derive(Debug, Clone)]
pub struct CoordinatorMetrics {
    rounds: Counter,
    draft_tokens: Counter,
    accepted_tokens: Counter,
    accepted_per_position: Family<PositionLabel, Counter>,
    optimistic_attempts: Counter,
    optimistic_hits: Counter,
    proposed_by: Family<ProposerLabel, Counter>,
    accepted_by: Family<ProposerLabel, Counter>,
    empty_proposals: Counter,
    emitted_tokens: Counter,
    requests: Family<FinishLabel, Counter>,
    draft_filings: Family<FilingLabel, Counter>,
    round_draft: Histogram,
    round_verify: Histogram,
    round_network: Histogram,
    round: Histogram,
    time_to_first_token: Histogram,
    inter_token_latency: Histogram,
    active: Gauge,
}

fn seconds(ns: u64) -> f64 {
    Duration::from_nanos(ns).as_secs_f64()
}

impl CoordinatorMetrics {
    fn register(registry: &mut Registry, active: Gauge) -> Self {
        // 50 µs .. 1.6 s for round phases and per-token latency; 1 ms .. 33 s for TTFT.
        let phase = || Histogram::new(exponential_buckets(5e-5, 2.0, 16));
        let this = Self {
            rounds: Counter::default(),
            draft_tokens: Counter::default(),
            accepted_tokens: Counter::default(),
            accepted_per_position: Family::default(),
            optimistic_attempts: Counter::default(),
            optimistic_hits: Counter::default(),
            proposed_by: Family::default(),
            accepted_by: Family::default(),
            empty_proposals: Counter::default(),
            emitted_tokens: Counter::default(),
            requests: Family::default(),
            draft_filings: Family::default(),
            round_draft: phase(),
            round_verify: phase(),
            round_network: phase(),
            round: phase(),
            time_to_first_token: Histogram::new(exponential_buckets(1e-3, 2.0, 16)),
            inter_token_latency: phase(),
            active,
        };
        // Counters are registered without `_total`: the encoder appends it.
        registry.register("specd_rounds", "Speculative rounds run", this.rounds.clone());
        registry.register(
            "specd_draft_tokens",
            "Draft tokens proposed (sum of γ over rounds)",
            this.draft_tokens.clone(),
        );
        registry.register("specd_accepted_tokens", "Draft tokens accepted", this.accepted_tokens.clone());
        registry.register(
            "specd_accepted_tokens_per_pos",
            "Draft tokens accepted at each position 1..γ of a block",
            this.accepted_per_position.clone(),
        );
        registry.register(
            "specd_optimistic_attempts",
            "Speculative rounds after one that asked the draft to draft ahead",
            this.optimistic_attempts.clone(),
        );
        registry.register(
            "specd_optimistic_hits",
            "Rounds the draft answered from the block it had drafted ahead",
            this.optimistic_hits.clone(),
        );
        registry.register(
            "specd_proposed_tokens_by_proposer",
            "Draft tokens proposed, by what proposed them (model, prompt_match, output_match, suffix)",
            this.proposed_by.clone(),
        );
        registry.register(
            "specd_accepted_tokens_by_proposer",
            "Draft tokens accepted, by what proposed them",
            this.accepted_by.clone(),
        );
        registry.register(
            "specd_empty_proposals",
            "Rounds whose draft proposed nothing (no match): run target-only",
            this.empty_proposals.clone(),
        );
        registry.register(
            "specd_emitted_tokens",
            "Tokens sent to clients (accepted plus corrected or bonus tokens, after stop conditions)",
            this.emitted_tokens.clone(),
        );
        registry.register("specd_requests", "Generations ended, by finish reason", this.requests.clone());
        registry.register(
            "specd_draft_filings",
            "Generations decoded without the draft, then filed in its prefix cache, by outcome (filed, failed)",
            this.draft_filings.clone(),
        );
        registry.register("specd_round_draft_seconds", "Draft phase of a round", this.round_draft.clone());
        registry.register("specd_round_verify_seconds", "Target verify pass of a round", this.round_verify.clone());
        registry.register(
            "specd_round_network_seconds",
            "Round wall time minus draft and verify: transport, encoding and the rule",
            this.round_network.clone(),
        );
        registry.register("specd_round_seconds", "Wall time of a round at the coordinator", this.round.clone());
        registry.register(
            "specd_time_to_first_token_seconds",
            "From a request's arrival to its first message with tokens",
            this.time_to_first_token.clone(),
        );
        registry.register(
            "specd_inter_token_latency_seconds",
            "Round wall time divided by the tokens it emitted, once per emitted token",
            this.inter_token_latency.clone(),
        );
        for reason in FinishReason::ALL {
            let _ = this.requests.get_or_create(&FinishLabel { finish_reason: reason.as_str() });
        }
        for outcome in [DraftFilings::FILED, DraftFilings::FAILED] {
            let _ = this.draft_filings.get_or_create(&FilingLabel { outcome });
        }
        this
    }

    /// A generation starts: counts it in `specd_active_sessions` until the returned
    /// recorder is dropped, and starts its time-to-first-token clock.
    pub fn request_started(&self) -> RequestMetrics {
        self.active.inc();
        RequestMetrics {
            metrics: self.clone(),
            started: Instant::now(),
            first_token: AtomicBool::new(true),
            finished: AtomicBool::new(false),
        }
    }

    fn round_done(&self, round: &RoundSample) {
        self.rounds.inc();
        self.draft_tokens.inc_by(round.gamma as u64);
        self.accepted_tokens.inc_by(round.accepted as u64);
        self.optimistic_attempts.inc_by(u64::from(round.optimistic_attempt));
        self.optimistic_hits.inc_by(u64::from(round.optimistic_hit));
        for position in 1..=round.accepted as u64 {
            self.accepted_per_position.get_or_create(&PositionLabel { position }).inc();
        }
        for (i, &proposer) in round.sources.iter().enumerate() {
            self.proposed_by.get_or_create(&ProposerLabel { proposer }).inc();
            if i < round.accepted {
                self.accepted_by.get_or_create(&ProposerLabel { proposer }).inc();
            }
        }
        self.empty_proposals.inc_by(u64::from(round.empty_proposal));
        let network = round.wall_ns.saturating_sub(round.draft_ns).saturating_sub(round.verify_ns);
        self.round_draft.observe(seconds(round.draft_ns));
        self.round_verify.observe(seconds(round.verify_ns));
        self.round_network.observe(seconds(network));
        self.round.observe(seconds(round.wall_ns));
    }
}

/// One generation's recorder: made by [`CoordinatorMetrics::request_started`] when the
/// request arrives; leaves `specd_active_sessions` when dropped.
#[derive(Debug)]
pub struct RequestMetrics {
    metrics: CoordinatorMetrics,
    started: Instant,
    first_token: AtomicBool,
    finished: AtomicBool,
}

impl RequestMetrics {
    /// A round ended and `emitted` of its tokens go to the client now.
    pub fn round(&self, round: &RoundSample, emitted: usize) {
        let metrics = &self.metrics;
        metrics.round_done(round);
        if emitted == 0 {
            return;
        }
        metrics.emitted_tokens.inc_by(emitted as u64);
        if self.first_token.swap(false, Ordering::Relaxed) {
            metrics.time_to_first_token.observe(self.started.elapsed().as_secs_f64());
        }
        let per_token = seconds(round.wall_ns) / emitted as f64;
        for _ in 0..emitted {
            metrics.inter_token_latency.observe(per_token);
        }
    }

    /// The generation ended; counted once, whatever is called later.
    pub fn finish(&self, reason: FinishReason) {
        if !self.finished.swap(true, Ordering::Relaxed) {
            self.metrics.requests.get_or_create(&FinishLabel { finish_reason: reason.as_str() }).inc();
        }
    }

    /// What counts this generation's filing on the draft, which runs after the generation
    /// has ended and this recorder may be gone.
    pub fn draft_filings(&self) -> DraftFilings {
        DraftFilings(self.metrics.draft_filings.clone())
    }
}

/// Counts a generation's turn filed on the draft after the generation, in
/// `specd_draft_filings_total` by outcome.
#[derive(Debug, Clone)]
pub struct DraftFilings(Family<FilingLabel, Counter>);

impl DraftFilings {
    const FILED: &'static str = "filed";
    const FAILED: &'static str = "failed";

    /// One filing ended: the draft took it (`filed`), or a call failed.
    pub fn record(&self, filed: bool) {
        let outcome = if filed { Self::FILED } else { Self::FAILED };
        self.0.get_or_create(&FilingLabel { outcome }).inc();
    }
}

impl Drop for RequestMetrics {
    fn drop(&mut self) {
        self.metrics.active.dec();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn value(text: &str, series: &str) -> Option<f64> {
        text.lines().find_map(|l| l.strip_prefix(series)?.strip_prefix(' ')?.parse().ok())
    }

    #[tokio::test]
    async fn a_request_shows_up_under_the_documented_names() {
        let metrics = Metrics::new();
        let coordinator = metrics.coordinator();
        let request = coordinator.request_started();
        let round = RoundSample {
            gamma: 4,
            accepted: 2,
            draft_ns: 1_000_000,
            verify_ns: 2_000_000,
            wall_ns: 4_000_000,
            optimistic_attempt: true,
            optimistic_hit: true,
            sources: vec!["prompt_match", "prompt_match", "model", "output_match"],
            empty_proposal: false,
        };
        request.round(&round, 3);
        let empty = RoundSample {
            gamma: 0,
            accepted: 0,
            optimistic_attempt: false,
            optimistic_hit: false,
            sources: Vec::new(),
            empty_proposal: true,
            ..round.clone()
        };
        request.round(&empty, 1);
        let text = metrics.encode().await.unwrap();
        assert_eq!(value(&text, "specd_active_sessions{role=\"coordinator\"}"), Some(1.0), "{text}");
        request.finish(FinishReason::Length);
        request.finish(FinishReason::Error);
        let filings = request.draft_filings();
        drop(request);
        filings.record(true);
        filings.record(true);
        let text = metrics.encode().await.unwrap();
        for (series, want) in [
            ("specd_rounds_total", 2.0),
            ("specd_proposed_tokens_by_proposer_total{proposer=\"prompt_match\"}", 2.0),
            ("specd_accepted_tokens_by_proposer_total{proposer=\"prompt_match\"}", 2.0),
            ("specd_proposed_tokens_by_proposer_total{proposer=\"output_match\"}", 1.0),
            ("specd_empty_proposals_total", 1.0),
            ("specd_draft_tokens_total", 4.0),
            ("specd_accepted_tokens_total", 2.0),
            ("specd_optimistic_attempts_total", 1.0),
            ("specd_optimistic_hits_total", 1.0),
            ("specd_accepted_tokens_per_pos_total{position=\"1\"}", 1.0),
            ("specd_accepted_tokens_per_pos_total{position=\"2\"}", 1.0),
            ("specd_emitted_tokens_total", 4.0),
            ("specd_requests_total{finish_reason=\"length\"}", 1.0),
            ("specd_requests_total{finish_reason=\"error\"}", 0.0),
            ("specd_draft_filings_total{outcome=\"filed\"}", 2.0),
            ("specd_draft_filings_total{outcome=\"failed\"}", 0.0),
            ("specd_round_seconds_count", 2.0),
            ("specd_round_network_seconds_sum", 0.002),
            ("specd_time_to_first_token_seconds_count", 1.0),
            ("specd_inter_token_latency_seconds_count", 4.0),
            ("specd_active_sessions{role=\"coordinator\"}", 0.0),
        ] {
            assert_eq!(value(&text, series), Some(want), "{series} in\n{text}");
        }
        assert!(!text.contains("specd_kv_cache_bytes"), "no node in this process:\n{text}");
    }

    #[tokio::test]
    async fn a_node_shows_its_kv_budget_only_when_it_has_one() {
        let metrics = Metrics::new();
        let node = metrics.node("target");
        node.set(1, 10);
        node.set_kv_budget(Some(1 << 30));
        let text = metrics.encode().await.unwrap();
        assert_eq!(value(&text, "specd_kv_budget_bytes{role=\"target\"}"), Some((1u64 << 30) as f64), "{text}");
        node.set_kv_budget(None);
        let text = metrics.encode().await.unwrap();
        assert_eq!(value(&text, "specd_kv_budget_bytes{role=\"target\"}"), None, "{text}");
    }
}
