//! `specd bench`: speculative against target-only decoding on the same prompts, interleaved
//! (A B A B …) so that both see the same machine state, with the analytic bound next to the
//! measured speedup.
//!
//! Every request sets `ignore_eos`, so both modes generate exactly `--max-new-tokens`
//! tokens per prompt and tokens/s compare like with like.

use std::path::{Path, PathBuf};
use std::time::Duration;

use clap::Args;
use serde_json::json;
use specd_proto::v1::generate_request::Prompt;
use specd_proto::v1::generation_client::GenerationClient;
use specd_proto::v1::{GenerateRequest, SamplingParams, Speculation, StoppingCriteria};

use crate::bench_netns::{NetnsOptions, draft_delay};
use crate::bench_sample::{Sample, run_one};
use crate::cli_error::invalid;
use crate::serve::{
    DraftOptions, GammaFlag, LoopbackNodes, NodeOptions, PolicyOptions, ProposerOptions, bind, parse_gamma,
    parse_on_off,
};

/// The default prompts: beginnings of Python code, written for this benchmark.
const DEFAULT_PROMPTS: &str = include_str!("../bench/prompts.txt");
/// `--prompt-set grounded`: work grounded in its input (edit, extend or quote the code the
/// prompt gives), where copying from the prompt pays (n-gram drafting).
const GROUNDED_PROMPTS: &str = include_str!("../bench/grounded_prompts.txt");
/// Separates prompts in a prompts file (a line of its own).
const PROMPT_SEPARATOR: &str = "---";

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
    endpoint: Option<String>,
    /// Start the three roles in this process on loopback with the demo pair.
    #[arg(long, env = "SPECD_BENCH_EMBEDDED", conflicts_with = "netns")]
    embedded: bool,
    #[command(flatten)]
    netns: NetnsOptions,
    /// The demo pair's directory (`specd models demo --out`), for --embedded and --netns.
    #[arg(long, env = "SPECD_DEMO_DIR", default_value = "models/demo")]
    demo_dir: PathBuf,
    /// Bearer token, for a coordinator started with --api-token.
    #[arg(long, env = "SPECD_API_TOKEN", hide_env_values = true)]
    api_token: Option<String>,
    /// Prompts file: prompts separated by lines holding only `---` (default: built-in code
    /// prompts).
    #[arg(long, env = "SPECD_BENCH_PROMPTS")]
    prompts: Option<PathBuf>,
    /// The built-in prompts when --prompts is not given: `code` (continue code) or
    /// `grounded` (edit, extend or quote code given in the prompt).
    #[arg(long, env = "SPECD_BENCH_PROMPT_SET", default_value = "code", value_parser = ["code", "grounded"])]
    prompt_set: String,
    /// Draft length of the speculative runs: a number, or `auto` (the coordinator's policy).
    #[arg(long, env = "SPECD_GAMMA", default_value = "auto", value_parser = parse_gamma)]
    gamma: GammaFlag,
    /// Sampling temperature of both modes; 0 is greedy.
    #[arg(long, env = "SPECD_TEMPERATURE", default_value_t = 0.8)]
    pub(crate) temperature: f64,
    /// Tokens generated per request.
    #[arg(long, env = "SPECD_MAX_NEW_TOKENS", default_value_t = 128)]
    pub(crate) max_new_tokens: u32,
    /// Passes over the prompts; the speedup's median, min and max are over these.
    #[arg(long, env = "SPECD_BENCH_REPEAT", default_value_t = 3)]
    pub(crate) repeat: usize,
    /// Base seed; request i of a pass uses seed + i in both modes.
    #[arg(long, env = "SPECD_SEED", default_value_t = 1)]
    pub(crate) seed: u64,
    /// Print one JSON object instead of a table.
    #[arg(long, env = "SPECD_JSON")]
    pub(crate) json: bool,
    #[command(flatten)]
    node: NodeOptions,
    /// Optimistic drafting for --embedded and --netns (`on` or `off`; default: the
    /// coordinator's default, off). With --endpoint it is the coordinator's setting.
    #[arg(long, env = "SPECD_BENCH_OPTIMISTIC", value_parser = parse_on_off, conflicts_with = "endpoint")]
    optimistic: Option<bool>,
    /// For --embedded and --netns.
    #[command(flatten)]
    draft: DraftOptions,
    /// The draft node's proposer, for --embedded and --netns.
    #[command(flatten)]
    proposer: ProposerOptions,
    /// Milliseconds added to every forward pass of the draft model only (a deliberately slow
    /// draft), for --embedded and --netns; overrides --forward-delay-ms for the draft.
    #[arg(long, env = "SPECD_DRAFT_DELAY_MS")]
    draft_delay_ms: Option<f64>,
    /// Clients sending requests at once. Above 1 the report is about load: aggregate
    /// tokens/s, per-request latency percentiles and the nodes' mean batch size, for both
    /// modes, next to one client alone.
    #[arg(long, env = "SPECD_BENCH_CONCURRENCY", default_value_t = 1)]
    pub(crate) concurrency: usize,
}

/// How often greedy speculative output equals target-only output on the same prompt. Exact
/// in law does not mean identical in bits: a verify pass scores several tokens at once, and
/// its floating-point sums may round differently from one-token passes, which can flip an
/// argmax between two near-tied tokens (more often in bf16 than in f32).
#[derive(Debug, Default)]
struct GreedyAgreement {
    pairs: u64,
    identical: u64,
    /// Tokens before the first difference, summed over pairs.
    common_prefix: u64,
    compared: u64,
}

impl GreedyAgreement {
    fn add(&mut self, target_only: &[u32], speculative: &[u32]) {
        let prefix = target_only.iter().zip(speculative).take_while(|(a, b)| a == b).count();
        self.pairs += 1;
        self.identical += u64::from(target_only == speculative);
        self.common_prefix += prefix as u64;
        self.compared += target_only.len().max(speculative.len()) as u64;
    }

    fn report(&self) -> serde_json::Value {
        json!({
            "pairs": self.pairs,
            "identical_fraction": self.identical as f64 / self.pairs.max(1) as f64,
            "common_prefix_fraction": self.common_prefix as f64 / self.compared.max(1) as f64,
        })
    }
}

/// The sums of one mode over a pass (or all passes).
#[derive(Debug, Default, Clone)]
struct Totals {
    tokens: u64,
    wall: Duration,
    rounds: u64,
    draft_tokens: u64,
    draft_ns: u64,
    verify_ns: u64,
    acceptance_sum: f64,
    evaluated: u64,
    wire_bytes: u64,
    /// Sent to the draft, received from it, sent to the target, received from it.
    wire_bytes_by_role: [u64; 4],
    optimistic_attempts: u64,
    optimistic_hits: u64,
    optimistic_pushed: u64,
    /// Candidates proposed and accepted, by proposer (prompt and output matches apart).
    by_proposer: std::collections::BTreeMap<String, (u64, u64)>,
    empty_proposals: u64,
}

impl Totals {
    fn add(&mut self, s: &Sample) {
        self.tokens += s.tokens;
        self.wall += s.wall;
        self.rounds += s.stats.rounds;
        self.draft_tokens += s.stats.draft_tokens;
        self.draft_ns += s.stats.draft_ns;
        self.verify_ns += s.stats.verify_ns;
        self.acceptance_sum += s.stats.acceptance_sum;
        self.evaluated += s.stats.evaluated_positions;
        self.wire_bytes += s.stats.wire_bytes_sent + s.stats.wire_bytes_received;
        let st = &s.stats;
        let by_role = [
            st.wire_bytes_sent_to_draft,
            st.wire_bytes_received_from_draft,
            st.wire_bytes_sent_to_target,
            st.wire_bytes_received_from_target,
        ];
        for (total, x) in self.wire_bytes_by_role.iter_mut().zip(by_role) {
            *total += x;
        }
        self.optimistic_attempts += s.stats.optimistic_attempts;
        self.optimistic_hits += s.stats.optimistic_hits;
        self.optimistic_pushed += s.stats.optimistic_pushed;
        for (proposer, tally) in &s.stats.by_proposer {
            let sum = self.by_proposer.entry(proposer.clone()).or_default();
            (sum.0, sum.1) = (sum.0 + tally.proposed, sum.1 + tally.accepted);
        }
        self.empty_proposals += s.stats.empty_proposals;
    }

    fn tokens_per_s(&self) -> f64 {
        self.tokens as f64 / self.wall.as_secs_f64().max(1e-9)
    }

    fn per_round(&self, x: f64) -> f64 {
        if self.rounds == 0 { 0.0 } else { x / self.rounds as f64 }
    }
}

/// One mode's totals over whole requests, and over their rounds after the first
/// ([`Sample::after_first_round`]): the decoding the per-round costs and the bound are about.
#[derive(Debug, Default)]
struct ModeTotals {
    whole: Totals,
    decode: Totals,
    first_round_wall: Duration,
    requests: u64,
}

impl ModeTotals {
    fn add(&mut self, s: &Sample) {
        self.whole.add(s);
        self.decode.add(&s.after_first_round());
        self.first_round_wall += s.first_round.as_ref().map_or(s.wall, |f| f.wall);
        self.requests += 1;
    }

    fn first_round_ms(&self) -> f64 {
        self.first_round_wall.as_secs_f64() * 1e3 / self.requests.max(1) as f64
    }
}

fn load_prompts(path: Option<&Path>, set: &str) -> anyhow::Result<Vec<String>> {
    let text = match path {
        Some(p) => std::fs::read_to_string(p).map_err(|e| invalid(format!("--prompts {}: {e}", p.display())))?,
        None if set == "grounded" => GROUNDED_PROMPTS.to_owned(),
        None => DEFAULT_PROMPTS.to_owned(),
    };
    let mut prompts = Vec::new();
    let mut current = String::new();
    for line in text.split_inclusive('\n') {
        if line.trim_end() == PROMPT_SEPARATOR {
            prompts.push(std::mem::take(&mut current));
        } else {
            current.push_str(line);
        }
    }
    prompts.push(current);
    // The separator's own newline ends the previous prompt; a prompt keeps its trailing
    // newline only when it is followed by an empty line.
    let prompts: Vec<String> = prompts
        .into_iter()
        .map(|p| p.strip_suffix('\n').map(str::to_owned).unwrap_or(p))
        .filter(|p| !p.trim().is_empty())
        .collect();
    if prompts.is_empty() {
        return Err(invalid("the prompts file holds no prompt"));
    }
    Ok(prompts)
}

impl BenchArgs {
    /// The draft's proposer where this bench starts the nodes; `None` with --endpoint
    /// (the endpoint's draft proposes however it was started).
    fn proposer_name(&self) -> Option<String> {
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

    fn validate(&self) -> anyhow::Result<()> {
        if self.repeat == 0 {
            return Err(invalid("--repeat must be at least 1"));
        }
        if !(1..=1024).contains(&self.concurrency) {
            return Err(invalid(format!("--concurrency {} must be between 1 and 1024", self.concurrency)));
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
                "no demo pair in {} (build it with `specd models demo --out {}`, or `make demo`)",
                self.demo_dir.display(),
                self.demo_dir.display()
            )));
        }
        Ok(())
    }

    /// The models' dtype where this command started them; unknown behind --endpoint.
    pub(crate) fn dtype_label(&self) -> serde_json::Value {
        match self.endpoint {
            Some(_) => serde_json::Value::Null,
            None => match self.draft.draft_dtype.filter(|d| *d != self.node.dtype()) {
                Some(draft) => json!(format!("{} (draft {draft})", self.node.dtype())),
                None => json!(self.node.dtype().to_string()),
            },
        }
    }

    pub(crate) fn request(&self, prompt: &str, gamma: Option<u32>, seed: u64) -> tonic::Request<GenerateRequest> {
        let message = GenerateRequest {
            request_id: String::new(),
            prompt: Some(Prompt::Text(prompt.to_owned())),
            sampling: Some(SamplingParams {
                temperature: Some(self.temperature),
                seed: Some(seed),
                ..Default::default()
            }),
            stopping: Some(StoppingCriteria {
                max_new_tokens: Some(self.max_new_tokens),
                ignore_eos: true,
                ..Default::default()
            }),
            speculation: Some(Speculation { gamma, dense: false }),
            logprobs: None,
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

/// (1 − α^(γ+1)) / ((1 − α)(γc + 1)), Leviathan et al. (2023) Theorem 3.8, for a real γ
/// (the mean of an adaptive schedule); γ + 1 at α = 1.
fn analytic_bound(alpha: f64, gamma: f64, c: f64) -> f64 {
    let tokens = if alpha >= 1.0 { gamma + 1.0 } else { (1.0 - alpha.powf(gamma + 1.0)) / (1.0 - alpha) };
    tokens / (gamma * c + 1.0)
}

/// Median, min and max of per-pass ratios, and the ratio of the totals over all passes.
pub(crate) fn spread(ratios: &[f64], overall: f64) -> serde_json::Value {
    json!({
        "median": median(ratios),
        "min": ratios.iter().copied().fold(f64::INFINITY, f64::min),
        "max": ratios.iter().copied().fold(f64::NEG_INFINITY, f64::max),
        "overall": overall,
    })
}

/// Median of a non-empty list.
pub(crate) fn median(values: &[f64]) -> f64 {
    let mut v = values.to_vec();
    v.sort_by(f64::total_cmp);
    let n = v.len();
    if n % 2 == 1 { v[n / 2] } else { (v[n / 2 - 1] + v[n / 2]) / 2.0 }
}

async fn measure(args: &BenchArgs, endpoint: String, prompts: &[String]) -> anyhow::Result<serde_json::Value> {
    let mut client = GenerationClient::connect(endpoint.clone())
        .await
        .map_err(|e| anyhow::anyhow!("cannot reach the coordinator at {endpoint}: {e}"))?;
    let spec_gamma = match args.gamma {
        GammaFlag::Fixed(g) => Some(g),
        GammaFlag::Auto => None,
    };
    // One unmeasured pair first: connections, allocator, the models' first passes.
    run_one(&mut client, args.request(&prompts[0], Some(0), args.seed)).await?;
    run_one(&mut client, args.request(&prompts[0], spec_gamma, args.seed)).await?;
    if args.concurrency > 1 {
        return crate::bench_load::measure(args, &client, &endpoint, prompts, spec_gamma).await;
    }
    let (mut base_all, mut spec_all) = (ModeTotals::default(), ModeTotals::default());
    let mut runs = Vec::new();
    let mut agreement = GreedyAgreement::default();
    for r in 0..args.repeat {
        let (mut base, mut spec) = (ModeTotals::default(), ModeTotals::default());
        for (i, prompt) in prompts.iter().enumerate() {
            let seed = args.seed.wrapping_add(i as u64);
            let base_first = (r + i) % 2 == 0;
            let (mut base_ids, mut spec_ids) = (Vec::new(), Vec::new());
            for turn in 0..2 {
                // Each sample counts towards its pass and towards the totals of all passes.
                if (turn == 0) == base_first {
                    let sample = run_one(&mut client, args.request(prompt, Some(0), seed)).await?;
                    base.add(&sample);
                    base_all.add(&sample);
                    base_ids = sample.token_ids;
                } else {
                    let sample = run_one(&mut client, args.request(prompt, spec_gamma, seed)).await?;
                    spec.add(&sample);
                    spec_all.add(&sample);
                    spec_ids = sample.token_ids;
                }
            }
            agreement.add(&base_ids, &spec_ids);
        }
        let ratio = spec.whole.tokens_per_s() / base.whole.tokens_per_s();
        let decode_ratio = spec.decode.tokens_per_s() / base.decode.tokens_per_s();
        if !args.json {
            eprintln!(
                "pass {}/{}: target-only {:.1} tok/s, speculative {:.1} tok/s, speedup {ratio:.2}× ({decode_ratio:.2}× after the first rounds)",
                r + 1,
                args.repeat,
                base.whole.tokens_per_s(),
                spec.whole.tokens_per_s()
            );
        }
        runs.push(json!({
            "target_only_tokens_per_s": base.whole.tokens_per_s(),
            "speculative_tokens_per_s": spec.whole.tokens_per_s(),
            "speedup": ratio,
            "decode_target_only_tokens_per_s": base.decode.tokens_per_s(),
            "decode_speculative_tokens_per_s": spec.decode.tokens_per_s(),
            "decode_speedup": decode_ratio,
        }));
    }
    let ratios: Vec<f64> = runs.iter().filter_map(|r| r["speedup"].as_f64()).collect();
    let decode_ratios: Vec<f64> = runs.iter().filter_map(|r| r["decode_speedup"].as_f64()).collect();
    let whole = &spec_all.whole;
    // α and per-round costs from the rounds after each request's first, which also runs the
    // prompt through the models: the decoding steps the bound is made of.
    let (base_decode, spec_decode) = (&base_all.decode, &spec_all.decode);
    let alpha =
        if spec_decode.evaluated == 0 { 0.0 } else { spec_decode.acceptance_sum / spec_decode.evaluated as f64 };
    let mean_gamma = spec_decode.per_round(spec_decode.draft_tokens as f64);
    let draft_step_ms = if spec_decode.draft_tokens == 0 {
        0.0
    } else {
        spec_decode.draft_ns as f64 / spec_decode.draft_tokens as f64 / 1e6
    };
    let target_pass_ms = base_decode.per_round(base_decode.verify_ns as f64) / 1e6;
    let verify_pass_ms = spec_decode.per_round(spec_decode.verify_ns as f64) / 1e6;
    let c = if target_pass_ms > 0.0 { draft_step_ms / target_pass_ms } else { 0.0 };
    let bound = analytic_bound(alpha, mean_gamma, c);
    let speedup_median = median(&ratios);
    let decode_median = median(&decode_ratios);
    // The bound prices a verify pass like one target step; on a CPU a pass over γ + 1 tokens
    // costs more. The same accounting with the measured verify pass says how much of the gap
    // to the bound that explains (the rest is network, hand-offs and the client).
    let tokens_per_round = spec_decode.per_round(spec_decode.tokens as f64);
    let round_ms = mean_gamma * draft_step_ms + verify_pass_ms;
    let bound_measured_verify = if round_ms > 0.0 { tokens_per_round * target_pass_ms / round_ms } else { 0.0 };
    Ok(json!({
        "endpoint": endpoint,
        "prompts": prompts.len(),
        "repeat": args.repeat,
        "max_new_tokens": args.max_new_tokens,
        "temperature": args.temperature,
        "gamma": match args.gamma { GammaFlag::Fixed(g) => json!(g), GammaFlag::Auto => json!("auto") },
        "mean_gamma": mean_gamma,
        "target_only_tokens_per_s": base_all.whole.tokens_per_s(),
        "speculative_tokens_per_s": whole.tokens_per_s(),
        "speedup": spread(&ratios, whole.tokens_per_s() / base_all.whole.tokens_per_s()),
        // The same after each request's first round, and that round's time.
        "decode_speedup": spread(&decode_ratios, spec_decode.tokens_per_s() / base_decode.tokens_per_s()),
        "first_round_ms": { "target_only": base_all.first_round_ms(), "speculative": spec_all.first_round_ms() },
        "alpha": alpha,
        "mean_tokens_per_round": tokens_per_round,
        "draft_step_ms": draft_step_ms,
        "verify_pass_ms": verify_pass_ms,
        "target_only_pass_ms": target_pass_ms,
        "c": c,
        "bound": bound,
        "efficiency": if bound > 0.0 { speedup_median / bound } else { 0.0 },
        "decode_efficiency": if bound > 0.0 { decode_median / bound } else { 0.0 },
        "verify_cost_ratio": if target_pass_ms > 0.0 { verify_pass_ms / target_pass_ms } else { 0.0 },
        "bound_with_measured_verify": bound_measured_verify,
        "wire_bytes_per_round": whole.per_round(whole.wire_bytes as f64),
        "wire_bytes_per_round_by_role": {
            "draft": {
                "sent": whole.per_round(whole.wire_bytes_by_role[0] as f64),
                "received": whole.per_round(whole.wire_bytes_by_role[1] as f64),
            },
            "target": {
                "sent": whole.per_round(whole.wire_bytes_by_role[2] as f64),
                "received": whole.per_round(whole.wire_bytes_by_role[3] as f64),
            },
        },
        // What proposed the candidates: a target that loops on its own output makes n-gram
        // drafting look good for the wrong reason, so matches in the prompt and in the output
        // are counted apart.
        "proposer": args.proposer_name(),
        "by_proposer": whole.by_proposer.iter().map(|(k, (proposed, accepted))| {
            (k.clone(), json!({ "proposed": proposed, "accepted": accepted }))
        }).collect::<serde_json::Map<_, _>>(),
        "empty_proposals": whole.empty_proposals,
        "optimistic_attempts": whole.optimistic_attempts,
        "optimistic_hit_rate": if whole.optimistic_attempts == 0 {
            0.0
        } else {
            whole.optimistic_hits as f64 / whole.optimistic_attempts as f64
        },
        "optimistic_pushed_rate": if whole.optimistic_attempts == 0 {
            0.0
        } else {
            whole.optimistic_pushed as f64 / whole.optimistic_attempts as f64
        },
        // Only greedy outputs are comparable: sampled ones draw different random numbers.
        "greedy_agreement": if args.temperature == 0.0 { agreement.report() } else { serde_json::Value::Null },
        "dtype": args.dtype_label(),
        "openmp_wait": args.openmp_wait(),
        "runs": runs,
    }))
}

fn print_table(report: &serde_json::Value) -> std::io::Result<()> {
    let f = |key: &str| report[key].as_f64().unwrap_or(f64::NAN);
    let s = &report["speedup"];
    let g = |key: &str| s[key].as_f64().unwrap_or(f64::NAN);
    outln!(
        "{} prompts × {} passes, {} new tokens each, T = {}, γ = {} (mean {:.2})",
        report["prompts"],
        report["repeat"],
        report["max_new_tokens"],
        report["temperature"],
        report["gamma"],
        f("mean_gamma")
    );
    outln!(
        "target-only   {:>8.1} tokens/s  ({:.2} ms per pass)",
        f("target_only_tokens_per_s"),
        f("target_only_pass_ms")
    );
    outln!(
        "speculative   {:>8.1} tokens/s  ({:.2} tokens per round, verify pass {:.2} ms, draft step {:.2} ms)",
        f("speculative_tokens_per_s"),
        f("mean_tokens_per_round"),
        f("verify_pass_ms"),
        f("draft_step_ms")
    );
    outln!("speedup       {:.2}× median ({:.2}–{:.2})", g("median"), g("min"), g("max"));
    let d = &report["decode_speedup"];
    let first = &report["first_round_ms"];
    outln!(
        "after the first round {:.2}× median ({:.2}–{:.2}); first round {:.1} ms target-only, {:.1} ms speculative (it also runs the prompt)",
        d["median"].as_f64().unwrap_or(f64::NAN),
        d["min"].as_f64().unwrap_or(f64::NAN),
        d["max"].as_f64().unwrap_or(f64::NAN),
        first["target_only"].as_f64().unwrap_or(f64::NAN),
        first["speculative"].as_f64().unwrap_or(f64::NAN)
    );
    if report["network"] == "netns" {
        outln!(
            "network       namespaces, RTT draft ↔ coordinator {} ms, coordinator ↔ target {} ms;  {:.0} wire bytes per round",
            f("rtt_ms"),
            f("target_rtt_ms"),
            f("wire_bytes_per_round")
        );
        let role = &report["wire_bytes_per_round_by_role"];
        let b = |who: &str, way: &str| role[who][way].as_f64().unwrap_or(f64::NAN);
        outln!(
            "wire bytes    per round: draft {:.0} sent / {:.0} received, target {:.0} sent / {:.0} received",
            b("draft", "sent"),
            b("draft", "received"),
            b("target", "sent"),
            b("target", "received")
        );
    }
    outln!(
        "acceptance α  {:.3};  bound (1−α^(γ+1))/((1−α)(γc+1)) = {:.2}× with c = {:.3};  measured / bound = {:.2} ({:.2} after the first round)",
        f("alpha"),
        f("bound"),
        f("c"),
        f("efficiency"),
        f("decode_efficiency")
    );
    outln!(
        "a verify pass costs {:.2} target-only passes; with that cost the bound is {:.2}×",
        f("verify_cost_ratio"),
        f("bound_with_measured_verify")
    );
    let agreement = &report["greedy_agreement"];
    if let Some(identical) = agreement["identical_fraction"].as_f64() {
        outln!(
            "greedy outputs identical to target-only: {:.0}% of {} requests ({:.1}% of tokens before a first difference; {})",
            100.0 * identical,
            agreement["pairs"],
            100.0 * agreement["common_prefix_fraction"].as_f64().unwrap_or(f64::NAN),
            report["dtype"].as_str().unwrap_or("dtype of the endpoint's nodes")
        );
    }
    if let Some(by) = report["by_proposer"].as_object().filter(|by| by.keys().any(|k| k != "model")) {
        let parts: Vec<String> = by.iter().map(|(k, t)| format!("{k} {}/{}", t["accepted"], t["proposed"])).collect();
        outln!(
            "accepted/proposed by proposer: {}; {} rounds proposed nothing",
            parts.join(", "),
            report["empty_proposals"]
        );
    }
    if report["optimistic_attempts"].as_u64().unwrap_or(0) > 0 {
        outln!(
            "optimistic drafting: {:.1}% of rounds served from a block drafted ahead, {:.1}% from one pushed (no wait)",
            100.0 * f("optimistic_hit_rate"),
            100.0 * f("optimistic_pushed_rate")
        );
    }
    Ok(())
}

/// Runs the subcommand.
pub fn run(args: &BenchArgs) -> anyhow::Result<()> {
    args.validate()?;
    let prompts = load_prompts(args.prompts.as_deref(), &args.prompt_set)?;
    if args.netns.netns && args.netns.netns_child.is_none() {
        let target = args.node.to_args(None, None);
        let mut draft = args.node.to_args(args.draft_delay_ms, Some(&args.draft));
        draft.extend(args.proposer.to_args());
        let mut netns = args.netns.clone();
        if let Some(on) = args.optimistic {
            netns.coordinator_arg.push(format!("--optimistic={}", if on { "on" } else { "off" }));
        }
        return crate::bench_netns::run(&netns, &args.demo_dir, target, draft, args.json);
    }
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;
    let report = runtime.block_on(async {
        if let Some(endpoint) = &args.netns.netns_child {
            let mut report = measure(args, endpoint.clone(), &prompts).await?;
            args.netns.annotate(&mut report, args.draft_delay_ms);
            return Ok(report);
        }
        match &args.endpoint {
            Some(endpoint) => measure(args, endpoint.clone(), &prompts).await,
            None => {
                let target = args.node.config(args.demo_dir.join("target"))?;
                let mut draft = args.draft.apply(args.node.config(args.demo_dir.join("draft"))?);
                if let Some(delay) = draft_delay(args.draft_delay_ms)? {
                    draft.forward_delay = delay;
                }
                let nodes = LoopbackNodes::start(target, draft, args.proposer.config()?).await?;
                let policy = PolicyOptions::defaults()?;
                let mut config = policy.config(vec![nodes.target_url.clone()], vec![nodes.draft_url.clone()])?;
                if let Some(on) = args.optimistic {
                    config.optimistic = on;
                }
                let service = specd_coordinator::connect(&config).await?;
                let listener = bind("127.0.0.1:0".parse()?).await?;
                let endpoint = format!("http://{}", listener.local_addr()?);
                let (stop, mut stopped) = tokio::sync::watch::channel(false);
                let server = tokio::spawn(specd_coordinator::serve(listener, service, async move {
                    let _ = stopped.wait_for(|s| *s).await;
                }));
                let report = measure(args, endpoint, &prompts).await;
                let _ = stop.send(true);
                let _ = server.await;
                nodes.stop(Duration::from_secs(5)).await;
                report
            }
        }
    })?;
    if args.json {
        outln!("{report}");
        return Ok(());
    }
    if args.concurrency > 1 {
        return Ok(crate::bench_load::print_table(&report)?);
    }
    Ok(print_table(&report)?)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prompts_split_on_separator_lines_and_keep_their_indentation() {
        let p = load_prompts(None, "code").unwrap();
        assert!(p.len() >= 6);
        assert!(p[0].starts_with("def fibonacci(n):\n    \"\"\""));
        assert!(!p[0].ends_with('\n'));
        assert!(p.iter().all(|x| !x.contains("\n---\n")));
        let grounded = load_prompts(None, "grounded").unwrap();
        assert!(grounded.len() >= 6 && grounded.iter().all(|x| !x.contains("\n---\n")));
    }

    #[test]
    fn bound_matches_the_papers_closed_form() {
        // α = 0.8, γ = 4, c = 0.05: expected tokens 1 + α + … + α⁴ = 3.3616, over γc + 1 = 1.2.
        assert!((analytic_bound(0.8, 4.0, 0.05) - 3.3616 / 1.2).abs() < 1e-12);
        assert_eq!(analytic_bound(0.5, 0.0, 0.3), 1.0);
    }

    #[test]
    fn greedy_agreement_counts_identical_outputs_and_the_prefix_before_a_difference() {
        let mut agreement = GreedyAgreement::default();
        agreement.add(&[1, 2, 3, 4], &[1, 2, 3, 4]);
        agreement.add(&[1, 2, 3, 4], &[1, 9, 3, 4]);
        let report = agreement.report();
        assert_eq!(report["pairs"], 2);
        assert_eq!(report["identical_fraction"], 0.5);
        assert_eq!(report["common_prefix_fraction"], 5.0 / 8.0);
    }

    #[test]
    fn median_of_even_and_odd_lists() {
        assert_eq!(median(&[3.0, 1.0, 2.0]), 2.0);
        assert_eq!(median(&[4.0, 1.0, 2.0, 3.0]), 2.5);
    }
}
