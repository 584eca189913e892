//! `specd cost`: the cost model of docs/rule.md — does drafting pay, and with which γ.

use clap::Args;
use serde_json::json;
use specd_sampling::cost::{CostModel, MAX_GAMMA};
use specd_sampling::law::{PrefixModel, WireFormat, expected_accepted};
use specd_sampling::tree_law::{TreeRound, TreeShape, tree_expected_accepted};
use specd_sampling::tree_rule::ChildDraws;
use specd_sampling::{DenseDist, SamplingError, Verification};

use crate::cli_error::invalid;
use crate::distribution_arg::parse_distribution;

/// Expected speed of speculative decoding from acceptance and timings.
///
/// With per-token acceptance α a round of draft length γ commits (1 - α^(γ+1)) / (1 - α)
/// tokens on average. A round costs γ draft steps, the round trip to the draft node (--rtt-ms)
/// and one target verify pass; target-only decoding costs one target pass per token. The best
/// γ maximises tokens per second; γ = 0 (no speculation) wins when the draft does not pay.
///
/// Example (docs/rule.md): 1.75 tokens per round, 80 ms per token, 1.25x:
///   specd cost --gamma 2 --alpha 0.5 --target-ms 100 --draft-ms 20
/// With a 50 ms draft step the same γ gives 0.875x and the best γ is 0.
///
/// α alone fixes what token verification yields, not block verification's: with the
/// distributions themselves (--target and --draft, the same at every position) the report
/// adds the exact expected tokens per round of both rules, by enumerating every block:
///   specd cost --gamma 3 --alpha 0.85 --target-ms 100 --draft-ms 20 \
///     --target 0.6,0.3,0.1 --draft 0.5,0.25,0.25
#[derive(Debug, Args)]
#[command(verbatim_doc_comment, allow_negative_numbers = true)]
pub struct CostArgs {
    /// Draft length: candidates per round (0 = target-only).
    #[arg(long, env = "SPECD_COST_GAMMA")]
    gamma: u32,
    /// Per-token acceptance probability α, in [0, 1).
    #[arg(long, env = "SPECD_COST_ALPHA")]
    alpha: f64,
    /// Milliseconds of one target pass (a verify pass scores the whole block at about this cost).
    #[arg(long, env = "SPECD_COST_TARGET_MS")]
    target_ms: f64,
    /// Milliseconds of one draft step.
    #[arg(long, env = "SPECD_COST_DRAFT_MS")]
    draft_ms: f64,
    /// Round trip between the coordinator and the draft node, paid once per speculative round.
    #[arg(long, env = "SPECD_COST_RTT_MS", default_value_t = 0.0)]
    rtt_ms: f64,
    /// Largest γ considered for the best draft length.
    #[arg(long, env = "SPECD_COST_MAX_GAMMA", default_value_t = 16)]
    max_gamma: u32,
    /// The target's next-token distribution at every position ("0.6,0.3,0.1"), with
    /// --draft: report each verification rule's exact tokens per round at --gamma.
    #[arg(long, env = "SPECD_COST_TARGET", requires = "draft")]
    target: Option<String>,
    /// The draft's distribution over the same tokens, with --target.
    #[arg(long, env = "SPECD_COST_DRAFT", requires = "target")]
    draft: Option<String>,
    /// With --target and --draft: also a tree of drafts with these children per depth
    /// ("2,1": two children of the prefix, one below each), verified by recursive rejection
    /// sampling without replacement (docs/rule.md), and the target positions it costs.
    #[arg(long, env = "SPECD_COST_TREE", requires = "target", value_delimiter = ',')]
    tree: Vec<usize>,
    /// Print one JSON object instead of the table.
    #[arg(long, env = "SPECD_JSON")]
    json: bool,
}

/// The most drafted blocks (V^γ) the exact per-rule expectation enumerates.
const MAX_ENUMERATED_BLOCKS: usize = 1_000_000;
/// The most numbers it holds at once: every block keeps its 2γ + 1 distributions of V
/// numbers (5·10^7 f64 is 400 MB).
const MAX_ENUMERATED_NUMBERS: f64 = 5e7;

/// The same p and q after every prefix.
struct SamePair {
    p: DenseDist,
    q: DenseDist,
}

impl PrefixModel for SamePair {
    fn target(&self, _: &[u32]) -> DenseDist {
        self.p.clone()
    }
    fn draft(&self, _: &[u32]) -> DenseDist {
        self.q.clone()
    }
}

/// Tokens per round of each rule at γ, exactly, when --target and --draft are given.
fn tokens_per_round_by_rule(args: &CostArgs) -> anyhow::Result<Option<serde_json::Value>> {
    let (Some(target), Some(draft)) = (&args.target, &args.draft) else { return Ok(None) };
    let p = parse_distribution("--target", target)?;
    let q = parse_distribution("--draft", draft)?;
    if p.vocab_size() != q.vocab_size() {
        return Err(invalid(format!(
            "--target has {} entries but --draft has {}: both must cover the same tokens",
            p.vocab_size(),
            q.vocab_size()
        )));
    }
    let blocks = (p.vocab_size() as f64).powi(args.gamma as i32);
    let numbers = blocks * f64::from(2 * args.gamma + 1) * p.vocab_size() as f64;
    if blocks > MAX_ENUMERATED_BLOCKS as f64 || numbers > MAX_ENUMERATED_NUMBERS {
        return Err(invalid(format!(
            "{} tokens at γ = {} make {blocks:.0} blocks to enumerate, too many to hold (at most {MAX_ENUMERATED_BLOCKS} blocks and {MAX_ENUMERATED_NUMBERS:e} numbers): use fewer tokens or a smaller --gamma",
            p.vocab_size(),
            args.gamma
        )));
    }
    let vocab = p.vocab_size();
    let model = SamePair { p, q };
    let gamma = args.gamma as usize;
    let tokens = |v| 1.0 + expected_accepted(&model, &[], gamma, WireFormat::Dense, v);
    let (token, block) = (tokens(Verification::Token), tokens(Verification::Block));
    let mut report = json!({ "token": token, "block": block, "block_over_token": block / token });
    if !args.tree.is_empty() {
        let shape = TreeShape { widths: args.tree.clone() };
        if shape.widths.contains(&0) || shape.widths.len() > MAX_GAMMA as usize {
            return Err(invalid(format!(
                "--tree {:?}: every depth needs at least one child, and at most {MAX_GAMMA} depths",
                shape.widths
            )));
        }
        // Ordered draws at a node grow as V^width; each child's subtree is enumerated once.
        let work: f64 = shape.widths.iter().map(|&w| (vocab as f64).powi(w as i32)).product();
        if work > MAX_ENUMERATED_BLOCKS as f64 {
            return Err(invalid(format!(
                "--tree {:?} over {vocab} tokens is too large to enumerate exactly: use fewer tokens or children",
                shape.widths
            )));
        }
        let round = TreeRound { shape: &shape, draws: ChildDraws::WithoutReplacement, wire: WireFormat::Dense };
        let tree = 1.0 + tree_expected_accepted(&model, &[], round);
        report["tree"] = json!({
            "widths": shape.widths,
            "target_positions": shape.candidates() + 1,
            "tokens_per_round": tree,
            "over_chain_token": tree / token,
        });
    }
    Ok(Some(report))
}

pub fn run(args: &CostArgs) -> anyhow::Result<()> {
    if args.max_gamma > MAX_GAMMA {
        return Err(invalid(format!("--max-gamma {} is above the maximum {MAX_GAMMA}", args.max_gamma)));
    }
    if args.gamma > args.max_gamma {
        return Err(invalid(format!("--gamma {} is above the maximum {} (--max-gamma)", args.gamma, args.max_gamma)));
    }
    let model = CostModel::new(args.alpha, args.target_ms, args.draft_ms, args.rtt_ms).map_err(|err| match err {
        SamplingError::InvalidParameter { name, value, expected } => {
            invalid(format!("--{} {value}: {expected}", name.replace('_', "-")))
        }
        other => invalid(other.to_string()),
    })?;
    let g = args.gamma;
    let (best_gamma, best_speedup) = model.best_gamma(args.max_gamma);
    let by_rule = tokens_per_round_by_rule(args)?;
    if args.json {
        let report = json!({
            "gamma": g,
            "alpha": args.alpha,
            "target_ms": args.target_ms,
            "draft_ms": args.draft_ms,
            "rtt_ms": args.rtt_ms,
            "tokens_per_round": model.tokens_per_round(g),
            "round_ms": model.round_ms(g),
            "ms_per_token": model.ms_per_token(g),
            "target_only_ms_per_token": model.ms_per_token(0),
            "speedup": model.speedup(g),
            "analytic_bound": model.analytic_bound(g),
            "best_gamma": best_gamma,
            "best_speedup": best_speedup,
            "best_ms_per_token": model.ms_per_token(best_gamma),
            "speculation": if best_gamma == 0 { "off" } else { "on" },
            "tokens_per_round_by_rule": by_rule,
        });
        outln!("{report}");
        return Ok(());
    }
    outln!(
        "α = {}, target pass {} ms, draft step {} ms, round trip {} ms\n",
        args.alpha,
        args.target_ms,
        args.draft_ms,
        args.rtt_ms
    );
    outln!("{:>5} {:>16} {:>10} {:>12} {:>9}", "γ", "tokens/round", "round ms", "ms/token", "speedup");
    for gamma in 0..=args.max_gamma.min(g.max(best_gamma) + 2) {
        let marks = match (gamma == g, gamma == best_gamma) {
            (true, true) => "  <- asked, best",
            (true, false) => "  <- asked",
            (false, true) => "  <- best",
            _ => "",
        };
        outln!(
            "{gamma:>5} {:>16.4} {:>10.3} {:>12.3} {:>8.3}x{marks}",
            model.tokens_per_round(gamma),
            model.round_ms(gamma),
            model.ms_per_token(gamma),
            model.speedup(gamma)
        );
    }
    outln!();
    outln!(
        "At γ = {g}: {:.4} tokens per round, {:.3} ms per round, {:.3} ms per token, {:.3}x over target-only.",
        model.tokens_per_round(g),
        model.round_ms(g),
        model.ms_per_token(g),
        model.speedup(g)
    );
    if let Some(by_rule) = &by_rule {
        let n = |key: &str| by_rule[key].as_f64().unwrap_or(f64::NAN);
        outln!(
            "With these p and q at every position, γ = {g}: token verification {:.4} tokens per round, block verification {:.4} ({:.4}x).",
            n("token"),
            n("block"),
            n("block_over_token")
        );
        if let Some(tree) = by_rule.get("tree") {
            outln!(
                "A tree of widths {} ({} target positions, the chain's {}): {:.4} tokens per round ({:.4}x the chain's token verification).",
                tree["widths"],
                tree["target_positions"],
                g + 1,
                tree["tokens_per_round"].as_f64().unwrap_or(f64::NAN),
                tree["over_chain_token"].as_f64().unwrap_or(f64::NAN)
            );
        }
    }
    if best_gamma == 0 {
        outln!("Best γ = 0: the draft does not pay here, so speculation switches itself off (1x).");
    } else {
        outln!("Best γ = {best_gamma}: {best_speedup:.3}x over target-only.");
    }
    Ok(())
}
