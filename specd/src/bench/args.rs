//! `specd bench`'s flags, their checks, and the request they make of a prompt.

use std::path::PathBuf;

use clap::Args;
use serde_json::json;
use specd_proto::v1::generate_request::Prompt;
use specd_proto::v1::{GenerateRequest, SamplingParams, Speculation, StoppingCriteria};

use super::netns::{NetnsOptions, draft_delay};
use crate::cli_error::invalid;
use crate::constraint_args::ConstraintFlags;
use crate::serve::{DraftOptions, GammaFlag, NodeOptions, ProposerOptions, RoundTransport, parse_gamma, parse_on_off};

/// The next bench request's `cache_salt` ([`unique_salt`]).
static NEXT_SALT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// A `cache_salt` no other request of this process carries: its request shares nothing with
/// any other in the nodes' prefix caches.
pub(super) fn unique_salt() -> String {
    format!("bench-{}-{}", std::process::id(), NEXT_SALT.fetch_add(1, std::sync::atomic::Ordering::Relaxed))
}

/// Measure speculative decoding against target-only decoding on the same prompts.
///
/// For each repeat and prompt it runs one target-only request (γ = 0) and one speculative
/// request, alternating which goes first, and reports tokens/s of both, the speedup (median,
/// min, max over repeats), the acceptance α, tokens per round, the draft step and verify
/// pass times, and the analytic bound (1 − α^(γ+1)) / ((1 − α)(γc + 1)) of Leviathan et al.
/// (2023) with c = draft step ÷ target-only pass.
///
/// Examples:
///   specd bench --embedded --temperature 0 --json
///   specd bench --endpoint http://127.0.0.1:50051 --gamma 4 --repeat 5
///   specd bench --netns --rtt-ms 20 --demo-dir models/demo --json     (as root)
///   specd bench --embedded --concurrency 8 --max-new-tokens 64          (load)
#[derive(Debug, Args)]
#[command(verbatim_doc_comment)]
pub struct BenchArgs {
    /// A running coordinator to measure.
    #[arg(
        long,
        env = "SPECD_ENDPOINT",
        required_unless_present_any = ["embedded", "netns"],
        conflicts_with_all = ["embedded", "netns"]
    )]
    pub(super) endpoint: Option<String>,
    /// Start the three roles in this process on loopback with the demo pair.
    #[arg(long, env = "SPECD_BENCH_EMBEDDED", conflicts_with = "netns")]
    pub(super) embedded: bool,
    #[command(flatten)]
    pub(super) netns: NetnsOptions,
    /// The demo pair's directory, for --embedded and --netns: the shipped pair, or a build's
    /// `specd models demo --out` (models/demo-build by default).
    #[arg(long, env = "SPECD_DEMO_DIR", default_value = "models/demo")]
    pub(super) demo_dir: PathBuf,
    /// Bearer token, for a coordinator started with --api-token.
    #[arg(long, env = "SPECD_CLIENT_API_TOKEN", hide_env_values = true)]
    pub(super) api_token: Option<String>,
    /// Prompts file: prompts separated by lines holding only `---` (default: built-in code
    /// prompts).
    #[arg(long, env = "SPECD_BENCH_PROMPTS")]
    pub(super) prompts: Option<PathBuf>,
    /// The built-in prompts when --prompts is not given: `code` (continue code) or
    /// `grounded` (edit, extend or quote code given in the prompt).
    #[arg(long, env = "SPECD_BENCH_PROMPT_SET", default_value = "code", value_parser = ["code", "grounded"])]
    pub(super) prompt_set: String,
    /// Draft length of the speculative runs: a number, or `auto` (the coordinator's policy).
    #[arg(long, env = "SPECD_BENCH_GAMMA", default_value = "auto", value_parser = parse_gamma)]
    pub(super) gamma: GammaFlag,
    /// Sampling temperature of both modes; 0 is greedy.
    #[arg(long, env = "SPECD_TEMPERATURE", default_value_t = 0.8)]
    pub(super) temperature: f64,
    /// Tokens generated per request.
    #[arg(long, env = "SPECD_BENCH_MAX_NEW_TOKENS", default_value_t = 128)]
    pub(super) max_new_tokens: u32,
    /// Passes over the prompts; the speedup's median, min and max are over these.
    #[arg(long, env = "SPECD_BENCH_REPEAT", default_value_t = 3)]
    pub(super) repeat: usize,
    /// Base seed; request i of a pass uses seed + i in both modes.
    #[arg(long, env = "SPECD_SEED", default_value_t = 1)]
    pub(super) seed: u64,
    /// Print one JSON object instead of a table.
    #[arg(long, env = "SPECD_JSON")]
    pub(super) json: bool,
    #[command(flatten)]
    pub(super) node: NodeOptions,
    /// Optimistic drafting for --embedded and --netns (`on` or `off`; default: the
    /// coordinator's default, off). With --endpoint it is the coordinator's setting.
    #[arg(long, env = "SPECD_BENCH_OPTIMISTIC", value_parser = parse_on_off, conflicts_with = "endpoint")]
    pub(super) optimistic: Option<bool>,
    /// The verification rule for --embedded and --netns (`token` or `block`; default: the
    /// coordinator's default, block). With --endpoint it is the coordinator's setting. The
    /// report compares both rules on the same drafts whichever runs.
    #[arg(long, env = "SPECD_BENCH_VERIFY", conflicts_with = "endpoint")]
    pub(super) verify: Option<specd_sampling::Verification>,
    /// The coordinator's --tree for --embedded and --netns (`off`, `auto` or `W1,W2,...`;
    /// default: its default, off). With --endpoint it is the coordinator's setting.
    #[arg(long, env = "SPECD_BENCH_TREE", value_parser = crate::serve::parse_tree, conflicts_with = "endpoint")]
    pub(super) tree: Option<specd_coordinator::TreeSetting>,
    /// For --embedded: how the coordinator sends each round to the nodes in its process,
    /// `in-process` (handed over on channels, as `specd up` does by default) or `grpc` (over
    /// loopback, as to remote nodes).
    #[arg(
        long,
        env = "SPECD_BENCH_ROUND_TRANSPORT",
        value_enum,
        default_value_t = RoundTransport::InProcess,
        conflicts_with_all = ["endpoint", "netns"]
    )]
    pub(super) round_transport: RoundTransport,
    /// For --embedded and --netns.
    #[command(flatten)]
    pub(super) draft: DraftOptions,
    /// Every request's output constraint (both modes: the speedup under it).
    #[command(flatten)]
    pub(super) constraint: ConstraintFlags,
    /// The draft node's proposer, for --embedded and --netns.
    #[command(flatten)]
    pub(super) proposer: ProposerOptions,
    /// Milliseconds added to every forward pass of the draft model only (a deliberately slow
    /// draft), for --embedded and --netns; overrides --forward-delay-ms for the draft.
    #[arg(long, env = "SPECD_DRAFT_DELAY_MS")]
    pub(super) draft_delay_ms: Option<f64>,
    /// Clients sending requests at once. Above 1 the report is about load: aggregate
    /// tokens/s, per-request latency percentiles and the nodes' mean batch size, for both
    /// modes, next to one client alone.
    #[arg(long, env = "SPECD_BENCH_CONCURRENCY", default_value_t = 1)]
    pub(super) concurrency: usize,
    /// What the clients send. `prompts`: each prompt alone, speculative against target-only.
    /// `chat`: --conversations conversations of --turns turns, all opening with one system
    /// prompt of about --system-tokens tokens (built from the prompt set), each turn resending
    /// the conversation so far plus a user message; it reports time to first token per turn,
    /// total time and tokens/s with the nodes' prefix caches reused and not, speculative and
    /// target-only.
    #[arg(long, env = "SPECD_BENCH_WORKLOAD", default_value = "prompts", value_parser = ["prompts", "chat"])]
    pub(super) workload: String,
    /// Conversations of the chat workload.
    #[arg(long, env = "SPECD_BENCH_CONVERSATIONS", default_value_t = 4)]
    pub(super) conversations: usize,
    /// Turns per conversation of the chat workload.
    #[arg(long, env = "SPECD_BENCH_TURNS", default_value_t = 4)]
    pub(super) turns: usize,
    /// The chat workload's shared system prompt, in tokens (at least; whole copies of the
    /// prompt set). The last turn's prompt and reply must fit the model's context.
    #[arg(long, env = "SPECD_BENCH_SYSTEM_TOKENS", default_value_t = 1024)]
    pub(super) system_tokens: u32,
}

impl BenchArgs {
    /// The draft's proposer where this bench starts the nodes; `None` with --endpoint
    /// (the endpoint's draft proposes however it was started).
    pub(super) fn proposer_name(&self) -> Option<String> {
        (self.embedded || self.netns.netns).then(|| self.proposer.proposer.to_string())
    }

    /// Whether this process runs the models (`--embedded`); with `--netns` they run in
    /// processes of their own.
    pub fn runs_models_here(&self) -> bool {
        self.embedded
    }

    /// How the models' idle CPU workers wait ([`crate::openmp`]) when they run in this
    /// process; elsewhere their nodes' logs say.
    pub fn openmp_wait(&self) -> serde_json::Value {
        if self.runs_models_here() { crate::openmp::describe().into() } else { serde_json::Value::Null }
    }

    pub(super) fn validate(&self) -> anyhow::Result<()> {
        if self.repeat == 0 {
            return Err(invalid("--repeat must be at least 1"));
        }
        if !(1..=1024).contains(&self.concurrency) {
            return Err(invalid(format!("--concurrency {} must be between 1 and 1024", self.concurrency)));
        }
        if self.workload == "chat" {
            if self.concurrency > 1 {
                return Err(invalid("--workload chat runs one client: leave --concurrency at 1"));
            }
            if self.conversations == 0 || self.turns == 0 || self.system_tokens == 0 {
                return Err(invalid("--conversations, --turns and --system-tokens must be at least 1"));
            }
        }
        if self.max_new_tokens == 0 {
            return Err(invalid("--max-new-tokens must be at least 1"));
        }
        if !(self.temperature.is_finite() && self.temperature >= 0.0) {
            return Err(invalid(format!("--temperature {} must be ≥ 0", self.temperature)));
        }
        self.netns.validate()?;
        draft_delay(self.draft_delay_ms)?;
        if (self.embedded || self.netns.netns) && !self.demo_dir.join("target/config.json").is_file() {
            return Err(invalid(format!(
                "no demo pair in {} (models/demo holds the shipped pair when the checkout has it; \
                 `specd models demo` builds one into models/demo-build: pass --demo-dir models/demo-build)",
                self.demo_dir.display()
            )));
        }
        Ok(())
    }

    /// The models' dtype where this command started them, with the draft's and where it
    /// runs when they are not the target's; unknown behind --endpoint.
    pub(super) fn dtype_label(&self) -> serde_json::Value {
        if self.endpoint.is_some() {
            return serde_json::Value::Null;
        }
        let target = self.node.dtype();
        let shared = match self.node.config(self.demo_dir.join("draft")) {
            Ok(shared) if self.proposer.proposer.needs_model() => shared,
            _ => return json!(target.to_string()),
        };
        let draft = self.draft.settings(&shared).placement;
        if draft.device != shared.device {
            json!(format!("{target} (draft {} on {}, {} engine)", draft.dtype, draft.device, draft.engine))
        } else if draft.dtype != target {
            json!(format!("{target} (draft {})", draft.dtype))
        } else {
            json!(target.to_string())
        }
    }

    pub(super) fn request(&self, prompt: &str, gamma: Option<u32>, seed: u64) -> tonic::Request<GenerateRequest> {
        // Every request its own salt: the nodes' prefix caches share nothing between them,
        // so that the mode that runs a prompt second does not find it cached.
        self.request_with(prompt, gamma, seed, unique_salt(), self.max_new_tokens)
    }

    /// A request of `max_new_tokens` tokens under `cache_salt`.
    pub(super) fn request_with(
        &self,
        prompt: &str,
        gamma: Option<u32>,
        seed: u64,
        cache_salt: String,
        max_new_tokens: u32,
    ) -> tonic::Request<GenerateRequest> {
        let message = GenerateRequest {
            request_id: String::new(),
            prompt: Some(Prompt::Text(prompt.to_owned())),
            sampling: Some(SamplingParams {
                temperature: Some(self.temperature),
                seed: Some(seed),
                ..Default::default()
            }),
            stopping: Some(StoppingCriteria {
                max_new_tokens: Some(max_new_tokens),
                ignore_eos: true,
                ..Default::default()
            }),
            speculation: Some(Speculation { gamma, dense: false }),
            logprobs: None,
            cache_salt,
            constraint: self.constraint.to_wire(),
        };
        let mut request = tonic::Request::new(message);
        if let Some(token) = &self.api_token
            && let Ok(value) = format!("Bearer {token}").parse()
        {
            request.metadata_mut().insert("authorization", value);
        }
        request
    }
}
