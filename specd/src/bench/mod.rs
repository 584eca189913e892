//! `specd bench`: speculative against target-only decoding on the same prompts, interleaved
//! (A B A B …) so that both see the same machine state, with the analytic bound next to the
//! measured speedup.
//!
//! Every request sets `ignore_eos`, so both modes generate exactly `--max-new-tokens`
//! tokens per prompt and tokens/s compare like with like.

mod args;
mod chat;
mod embedded;
mod load;
mod measure;
mod netns;
mod prompts;
mod report;
mod sample;
mod statistics;
mod table;
mod totals;

pub use args::BenchArgs;

/// Runs the subcommand.
pub fn run(args: &BenchArgs) -> anyhow::Result<()> {
    args.validate()?;
    let prompts = prompts::load_prompts(args.prompts.as_deref(), &args.prompt_set)?;
    if args.netns.netns && args.netns.netns_child.is_none() {
        let target = args.node.to_args(None, None);
        // Placed here, where the draft model is read, as `--embedded` would place it.
        let draft_settings = args.draft.settings(&args.node.config(args.demo_dir.join("draft"))?);
        let mut draft = args.node.to_args(args.draft_delay_ms, Some(&draft_settings));
        draft.extend(args.proposer.to_args());
        let mut netns = args.netns.clone();
        if let Some(on) = args.optimistic {
            netns.coordinator_arg.push(format!("--optimistic={}", if on { "on" } else { "off" }));
        }
        if let Some(verification) = args.verify {
            netns.coordinator_arg.push(format!("--verify={verification}"));
        }
        if let Some(tree) = &args.tree {
            let flag = match tree {
                specd_coordinator::TreeSetting::Off => "off".to_owned(),
                specd_coordinator::TreeSetting::Auto => "auto".to_owned(),
                specd_coordinator::TreeSetting::Shape(shape) => shape.to_string(),
            };
            netns.coordinator_arg.push(format!("--tree={flag}"));
        }
        return netns::run(&netns, &args.demo_dir, target, draft, args.json);
    }
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;
    let report = runtime.block_on(async {
        if let Some(endpoint) = &args.netns.netns_child {
            let mut report = measure::measure(args, endpoint.clone(), &prompts).await?;
            args.netns.annotate(&mut report, args.draft_delay_ms);
            return Ok(report);
        }
        match &args.endpoint {
            Some(endpoint) => measure::measure(args, endpoint.clone(), &prompts).await,
            None => embedded::run(args, &prompts).await,
        }
    })?;
    if args.json {
        outln!("{report}");
        return Ok(());
    }
    if args.workload == "chat" {
        return Ok(chat::print_table(&report)?);
    }
    if args.concurrency > 1 {
        return Ok(load::print_table(&report)?);
    }
    Ok(table::print_table(&report)?)
}
