//! `specd`: one binary for every role and tool of exact speculative decoding.
//!
//! Subcommands live in their own modules:
//! - [`serve`]: `up`, `target`, `draft`, `coordinator`: the roles as gRPC servers;
//! - [`generate`]: a client of the public Generation API;
//! - [`constraint_args`]: a request's output constraint as flags (generate, bench);
//! - [`bench`]: speculative against target-only decoding, with the analytic bound;
//!   with `--netns` the roles run in network namespaces;
//! - [`delay_proxy`]: the hidden `delay-proxy`, a TCP proxy adding latency (for --netns);
//! - [`audit`]: a two-sample χ² check of the output law against a running cluster;
//! - [`logits`]: score tokens with a model;
//! - [`models`]: build the demo model pair;
//! - [`rule`]: the exact acceptance/residual rule on one position, with the naive counterexample;
//! - [`cost`]: the cost model (tokens per round, speedup, best draft length);
//! - [`openmp`]: a process about to run a target model keeps libtorch's idle CPU workers
//!   awake across a drafting gap (it starts itself again with `GOMP_SPINCOUNT` set).
//!
//! Exit codes: 0 on success, 2 on invalid input (one line on stderr), 1 on any other failure.

/// `println!` that hands a write error to the caller with `?` instead of panicking, so that
/// `specd … | head` ends quietly when the reader goes away (Rust ignores SIGPIPE; see
/// `cli_error::exit_code`).
macro_rules! outln {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        writeln!(std::io::stdout().lock(), $($arg)*)?
    }};
}

mod audit;
mod bench;
mod cli_error;
mod client_args;
mod constraint_args;
mod cost;
mod delay_proxy;
mod distribution_arg;
mod generate;
mod logits;
mod models;
mod openmp;
mod rule;
mod serve;

use clap::{Parser, Subcommand};

/// Exact speculative decoding split across machines.
///
/// A draft node proposes blocks of tokens with the distributions it drew them from, a target
/// node scores the whole block in one forward pass, and a coordinator applies the exact
/// acceptance/residual rule (Leviathan et al. 2023, Chen et al. 2023) so that the output is
/// distributed exactly as target-only sampling.
#[derive(Debug, Parser)]
#[command(name = "specd", version, about, long_about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    Up(serve::UpArgs),
    Target(serve::TargetArgs),
    Draft(serve::DraftArgs),
    Coordinator(serve::CoordinatorArgs),
    Generate(generate::GenerateArgs),
    Audit(audit::AuditArgs),
    Bench(bench::BenchArgs),
    Logits(logits::LogitsArgs),
    Models(models::ModelsArgs),
    Rule(rule::RuleArgs),
    Cost(cost::CostArgs),
    #[command(hide = true)]
    DelayProxy(delay_proxy::DelayProxyArgs),
}

impl Command {
    /// Whether this process runs a target model that waits for the draft between passes
    /// (see [`openmp`]). A standalone draft is left as it is: its idle workers would spin
    /// through every verify pass, on the target's cores where the two share a host.
    fn runs_a_target_model(&self) -> bool {
        match self {
            Self::Up(args) => args.serves(),
            Self::Target(args) => args.serves(),
            Self::Bench(args) => args.runs_models_here(),
            Self::Draft(_)
            | Self::Coordinator(_)
            | Self::Logits(_)
            | Self::Generate(_)
            | Self::Audit(_)
            | Self::Models(_)
            | Self::Rule(_)
            | Self::Cost(_)
            | Self::DelayProxy(_) => false,
        }
    }
}

fn main() -> std::process::ExitCode {
    let cli = Cli::parse();
    if cli.command.runs_a_target_model() {
        // Before any work: this may replace the process by itself with a new environment.
        openmp::ensure_spin_count();
    }
    let result = match cli.command {
        Command::Up(args) => serve::run_up(&args),
        Command::Target(args) => serve::run_target(&args),
        Command::Draft(args) => serve::run_draft(&args),
        Command::Coordinator(args) => serve::run_coordinator(&args),
        Command::Generate(args) => generate::run(&args),
        Command::Audit(args) => audit::run(&args),
        Command::Logits(args) => logits::run(&args),
        Command::Models(args) => models::run(&args),
        Command::Bench(args) => bench::run(&args),
        Command::Rule(args) => rule::run(&args),
        Command::Cost(args) => cost::run(&args),
        Command::DelayProxy(args) => delay_proxy::run(&args),
    };
    cli_error::exit_code(result)
}

#[cfg(test)]
mod tests {
    use clap::Parser as _;

    use super::Cli;

    fn runs_a_target_model(args: &[&str]) -> bool {
        Cli::try_parse_from(std::iter::once("specd").chain(args.iter().copied())).unwrap().command.runs_a_target_model()
    }

    /// The environment variables a subcommand's flags read.
    fn env_names(subcommand: &str) -> std::collections::BTreeSet<String> {
        use clap::CommandFactory as _;
        let cli = Cli::command();
        let sub = cli.find_subcommand(subcommand).unwrap_or_else(|| panic!("no subcommand {subcommand}"));
        sub.get_arguments().filter_map(|a| a.get_env()).map(|e| e.to_string_lossy().into_owned()).collect()
    }

    #[test]
    fn clients_read_no_variable_a_server_reads() {
        // A coordinator's SPECD_GAMMA is its default for every request; a client reading it
        // too would pin γ on the requests of whoever set it for the server in the same shell.
        let servers: std::collections::BTreeSet<String> =
            ["coordinator", "up", "target", "draft"].into_iter().flat_map(env_names).collect();
        assert!(servers.contains("SPECD_GAMMA") && servers.contains("SPECD_API_TOKEN"), "{servers:?}");
        for client in ["generate", "audit"] {
            let shared: Vec<String> = env_names(client).intersection(&servers).cloned().collect();
            assert!(shared.is_empty(), "{client} reads {shared:?}, which a server also reads");
        }
        // bench --embedded runs the nodes itself, with their flags and names, but takes the
        // requests' settings under its own.
        let coordinator = env_names("coordinator");
        let shared: Vec<String> = env_names("bench").intersection(&coordinator).cloned().collect();
        assert!(shared.is_empty(), "bench reads {shared:?}, which the coordinator also reads");
    }

    #[test]
    fn only_processes_that_run_a_target_model_start_again() {
        let up = ["up", "--target-model", "t", "--draft-model", "d"];
        assert!(runs_a_target_model(&up));
        assert!(runs_a_target_model(&["target", "--model", "m.json"]));
        assert!(runs_a_target_model(&["bench", "--embedded"]));
        assert!(!runs_a_target_model(&[&up[..], &["--check-config"]].concat()));
        assert!(!runs_a_target_model(&["target", "--model", "m.json", "--check-config"]));
        assert!(!runs_a_target_model(&["draft", "--model", "m.json"]));
        assert!(!runs_a_target_model(&["bench", "--endpoint", "http://127.0.0.1:1"]));
        assert!(!runs_a_target_model(&["bench", "--netns"]));
        assert!(!runs_a_target_model(&["coordinator", "--target", "http://127.0.0.1:1"]));
        assert!(!runs_a_target_model(&["logits", "--model", "m.json", "--tokens", "1"]));
    }
}
