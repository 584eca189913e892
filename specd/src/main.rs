//! `specd`: one binary for every role and tool of exact speculative decoding.
//!
//! Subcommands live in their own modules:
//! - [`logits`]: score tokens with a model;
//! - [`rule`]: the exact acceptance/residual rule on one position, with the naive counterexample;
//! - [`cost`]: the cost model (tokens per round, speedup, best draft length).
//!
//! Exit codes: 0 on success, 2 on invalid input (one line on stderr), 1 on any other failure.

mod cli_error;
mod cost;
mod distribution_arg;
mod logits;
mod rule;

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
    Logits(logits::LogitsArgs),
    Rule(rule::RuleArgs),
    Cost(cost::CostArgs),
}

fn main() -> std::process::ExitCode {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Logits(args) => logits::run(&args),
        Command::Rule(args) => rule::run(&args),
        Command::Cost(args) => cost::run(&args),
    };
    cli_error::exit_code(result)
}
