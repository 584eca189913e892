//! `specd rule`: the exact acceptance/residual rule on one position, number by number.

use clap::Args;
use serde_json::{Value, json};
use specd_sampling::chi2::chi_square_test;
use specd_sampling::law::{PositionLaw, position_law};
use specd_sampling::naive::naive_verify_block_dense;
use specd_sampling::{DenseCandidate, DenseDist, Purpose, RoundKey, StreamKey, verify_block_dense};

use crate::cli_error::invalid;
use crate::distribution_arg::parse_distribution;

/// Most simulated draws `--simulate` accepts (one round key per draw).
const MAX_SIMULATIONS: u64 = 100_000_000;

/// Walk through the exact speculative sampling rule for one position.
///
/// Given the target's distribution p and the draft's q over the same tokens, a candidate
/// x ~ q is accepted with probability min(1, p(x)/q(x)); on rejection a token is drawn from
/// the residual r = max(0, p - q) / Σ max(0, p - q). The emitted token is then distributed
/// exactly as p. Resampling from p on rejection instead ("naive") is not: the command shows
/// both, and with --simulate it runs the real sampler and a χ² test against p.
///
/// Example (docs/rule.md):
///   specd rule --target 0.6,0.3,0.1 --draft 0.5,0.25,0.25 --simulate 100000 --seed 1
#[derive(Debug, Args)]
#[command(verbatim_doc_comment)]
pub struct RuleArgs {
    /// Target distribution p: comma-separated probabilities summing to 1.
    #[arg(long, env = "SPECD_RULE_TARGET", value_name = "P1,P2,..", allow_hyphen_values = true)]
    target: String,
    /// Draft distribution q over the same tokens (zeros allowed: never proposed).
    #[arg(long, env = "SPECD_RULE_DRAFT", value_name = "Q1,Q2,..", allow_hyphen_values = true)]
    draft: String,
    /// Run the real sampler this many times (and the naive rule as many) and test both
    /// against p with Pearson's χ²; 0 disables.
    #[arg(long, env = "SPECD_RULE_SIMULATE", default_value_t = 0, value_name = "N")]
    simulate: u64,
    /// Seed of the counter-based generator used by --simulate.
    #[arg(long, env = "SPECD_RULE_SEED", default_value_t = 0)]
    seed: u64,
    /// Print one JSON object instead of the table.
    #[arg(long, env = "SPECD_JSON")]
    json: bool,
}

/// Empirical frequencies of the first committed token and the χ² p-value against p.
struct Simulation {
    empirical: Vec<f64>,
    p_value: f64,
}

pub fn run(args: &RuleArgs) -> anyhow::Result<()> {
    let p = parse_distribution("--target", &args.target)?;
    let q = parse_distribution("--draft", &args.draft)?;
    if p.vocab_size() != q.vocab_size() {
        return Err(invalid(format!(
            "--target has {} entries but --draft has {}: both must cover the same tokens",
            p.vocab_size(),
            q.vocab_size()
        )));
    }
    if args.simulate > MAX_SIMULATIONS {
        return Err(invalid(format!("--simulate {} is above the maximum {MAX_SIMULATIONS}", args.simulate)));
    }
    let law = position_law(&p, &q);
    let simulations = if args.simulate > 0 {
        let exact = simulate(&p, &q, args.simulate, args.seed, Rule::Exact)?;
        let naive = simulate(&p, &q, args.simulate, args.seed, Rule::Naive)?;
        Some((exact, naive))
    } else {
        None
    };
    if args.json {
        outln!("{}", report_json(&p, &q, &law, args, simulations.as_ref()));
    } else {
        print_table(&p, &q, &law, args, simulations.as_ref())?;
    }
    Ok(())
}

#[derive(Clone, Copy)]
enum Rule {
    Exact,
    Naive,
}

/// Runs one-candidate rounds with round keys 0..n and tallies the first committed token.
fn simulate(p: &DenseDist, q: &DenseDist, n: u64, seed: u64, rule: Rule) -> anyhow::Result<Simulation> {
    let targets = [p.clone(), p.clone()];
    let mut counts = vec![0u64; p.vocab_size()];
    for round in 0..n {
        let round = round as u32;
        let token = q.sample(StreamKey::new(seed, round, 1, Purpose::Draft).uniform());
        let candidates = [DenseCandidate { token, q }];
        let key = RoundKey { seed, round };
        let outcome = match rule {
            Rule::Exact => verify_block_dense(&candidates, &targets, key)?,
            Rule::Naive => naive_verify_block_dense(&candidates, &targets, key)?,
        };
        counts[outcome.tokens[0] as usize] += 1;
    }
    let p_value = chi_square_test(&counts, p.probs())?.p_value;
    let empirical = counts.iter().map(|&c| c as f64 / n as f64).collect();
    Ok(Simulation { empirical, p_value })
}

fn report_json(
    p: &DenseDist,
    q: &DenseDist,
    law: &PositionLaw,
    args: &RuleArgs,
    simulations: Option<&(Simulation, Simulation)>,
) -> Value {
    let mut out = json!({
        "tokens": labels(p.vocab_size()),
        "target": p.probs(),
        "draft": q.probs(),
        "acceptance": law.acceptance,
        "accepted_mass": law.accepted_mass,
        "beta": law.beta,
        "rejection": law.rejection,
        "residual": law.residual,
        "output_law": law.output,
        "naive_law": law.naive_output,
        "independent_match_acceptance": law.independent_match_acceptance,
    });
    if let Some((exact, naive)) = simulations {
        let fields = json!({
            "simulate": args.simulate,
            "seed": args.seed,
            "empirical": exact.empirical,
            "chi2_p_value": exact.p_value,
            "naive_empirical": naive.empirical,
            "naive_chi2_p_value": naive.p_value,
        });
        if let (Value::Object(out), Value::Object(fields)) = (&mut out, fields) {
            out.extend(fields);
        }
    }
    out
}

/// A, B, C, … for small vocabularies (as in docs/rule.md), t0, t1, … beyond 26 tokens.
fn labels(n: usize) -> Vec<String> {
    if n <= 26 {
        (0..n).map(|i| char::from(b'A' + i as u8).to_string()).collect()
    } else {
        (0..n).map(|i| format!("t{i}")).collect()
    }
}

fn print_table(
    p: &DenseDist,
    q: &DenseDist,
    law: &PositionLaw,
    args: &RuleArgs,
    sims: Option<&(Simulation, Simulation)>,
) -> std::io::Result<()> {
    let names = labels(p.vocab_size());
    outln!("Exact speculative sampling, one position (Leviathan et al. 2023; Chen et al. 2023)\n");
    outln!(
        "{:>6} {:>9} {:>9} {:>14} {:>14} {:>9} {:>11} {:>10}",
        "token",
        "p",
        "q",
        "min(1,p/q)",
        "accepted mass",
        "residual",
        "output law",
        "naive law"
    );
    for (i, name) in names.iter().enumerate() {
        let acceptance = law.acceptance[i].map_or_else(|| "never".to_string(), |a| format!("{a:.6}"));
        let residual = law.residual.as_ref().map_or_else(|| "-".to_string(), |r| format!("{:.6}", r[i]));
        outln!(
            "{name:>6} {:>9.6} {:>9.6} {acceptance:>14} {:>14.6} {residual:>9} {:>11.6} {:>10.6}",
            p.probs()[i],
            q.probs()[i],
            law.accepted_mass[i],
            law.output[i],
            law.naive_output[i],
        );
    }
    outln!();
    outln!("1. A candidate x ~ q is accepted with probability min(1, p(x)/q(x)); it is proposed and");
    outln!("   accepted with mass q(x)·min(1, p(x)/q(x)) = min(p(x), q(x)) (column 'accepted mass').");
    outln!(
        "2. β = Σ min(p, q) = {:.6} is the acceptance probability; a rejection happens with 1 - β = {:.6}.",
        law.beta,
        law.rejection
    );
    match &law.residual {
        Some(_) => outln!(
            "3. On rejection the token is drawn from r = max(0, p - q) / Σ max(0, p - q), whose mass is also {:.6}.",
            law.rejection
        ),
        None => outln!("3. p = q: Σ max(0, p - q) = 0, the residual is never needed (every candidate is accepted)."),
    }
    outln!("4. Output law = accepted mass + (1 - β)·r = p exactly: {}.", fmt_list(&law.output));
    outln!("   Resampling from p instead gives accepted mass + (1 - β)·p = {}: wrong.", fmt_list(&law.naive_output));
    outln!(
        "   Requiring two independent draws to match would accept only Σ p·q = {:.6} of candidates.",
        law.independent_match_acceptance
    );
    if let Some((exact, naive)) = sims {
        outln!();
        outln!("Simulated {} rounds with seed {} (counter-based generator):", args.simulate, args.seed);
        outln!("   exact rule: {}  χ² p-value {:.4}", fmt_list(&exact.empirical), exact.p_value);
        outln!("   naive rule: {}  χ² p-value {:.4e}", fmt_list(&naive.empirical), naive.p_value);
    }
    Ok(())
}

fn fmt_list(values: &[f64]) -> String {
    let items: Vec<String> = values.iter().map(|v| format!("{v:.6}")).collect();
    format!("({})", items.join(", "))
}
