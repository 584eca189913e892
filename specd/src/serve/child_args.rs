//! The flags that give a child `specd target` or `specd draft` process the node options this
//! process parsed: `specd bench --netns` starts its nodes with them.
//!
//! Every flag of [`NodeOptions`], `DraftOptions` and [`ProposerOptions`] must be passed on
//! here; the round-trip test below fails for one that is not.

use super::draft_options::{DraftSettings, ProposerOptions};
use super::node_options::NodeOptions;

impl NodeOptions {
    /// The flags that give a `specd target` or `specd draft` process these options
    /// (`specd bench --netns`), with the forward delay replaced where given, and for the
    /// draft its own settings over the shared ones, as
    /// [`super::draft_options::DraftOptions::apply`] gives them (`specd draft --device` is
    /// where the draft runs).
    pub(crate) fn to_args(&self, forward_delay_ms: Option<f64>, draft: Option<&DraftSettings>) -> Vec<String> {
        let threads = draft.map_or(self.threads, |d| d.threads);
        let device = draft.map_or(self.device, |d| d.placement.device);
        let dtype = draft.map_or(self.dtype, |d| d.placement.dtype);
        let engine = draft.map_or(self.engine, |d| d.placement.engine);
        let mut args = vec![
            format!("--device={device}"),
            format!("--dtype={dtype}"),
            format!("--engine={engine}"),
            format!("--max-sessions={}", self.max_sessions),
            format!("--forward-delay-ms={}", forward_delay_ms.unwrap_or(self.forward_delay_ms)),
            format!("--session-ttl-s={}", self.session_ttl_s),
        ];
        args.push(format!("--max-batch-sequences={}", self.max_batch_sequences));
        args.push(format!("--max-batch-tokens={}", self.max_batch_tokens));
        args.push(format!("--batch-window-us={}", self.batch_window_us));
        args.extend(self.kv_budget_mib.map(|m| format!("--kv-budget-mib={m}")));
        args.push(format!("--kv-memory-fraction={}", self.kv_memory_fraction));
        args.extend(threads.map(|t| format!("--threads={t}")));
        args.extend(self.sampling_threads.map(|t| format!("--sampling-threads={t}")));
        args.push(format!("--distributions={}", self.distributions));
        args.push(format!("--pin-threads={}", self.pin_threads));
        args.extend(self.allow_unused_weights.then(|| "--allow-unused-weights".to_owned()));
        args.push(format!("--attention-keys={}", self.attention_keys));
        args.push(format!("--attention-kernel={}", self.attention_kernel));
        args.push(format!("--prefix-cache={}", if self.prefix_cache { "on" } else { "off" }));
        args.push(format!("--prefix-cache-min-tokens={}", self.prefix_cache_min_tokens));
        args
    }
}

impl ProposerOptions {
    /// The flags that give a `specd draft` process this proposer (`specd bench --netns`).
    pub(crate) fn to_args(&self) -> Vec<String> {
        vec![
            format!("--proposer={}", self.proposer),
            format!("--ngram-min={}", self.ngram_min),
            format!("--ngram-max={}", self.ngram_max),
            format!("--suffix-budget-tokens={}", self.suffix_budget_tokens),
        ]
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use clap::{CommandFactory, Parser};

    use super::super::draft_options::DraftOptions;
    use super::{NodeOptions, ProposerOptions};
    use crate::{Cli, Command};

    /// The options a process that starts both nodes parses (`specd bench` flattens these
    /// three), from which it starts its `specd target` and `specd draft` children.
    #[derive(Debug, Parser)]
    struct Parent {
        #[command(flatten)]
        node: NodeOptions,
        #[command(flatten)]
        draft: DraftOptions,
        #[command(flatten)]
        proposer: ProposerOptions,
    }

    /// A value other than the default for every flag of [`Parent`], by long name; `None`
    /// for a switch that takes no value. A flag added to one of the three option structs
    /// needs a line here, and then a line in its `to_args`, or the round trips below fail.
    /// No flag is excluded: each of them changes how a child node runs.
    const NON_DEFAULT: &[(&str, Option<&str>)] = &[
        ("device", Some("cuda:1")),
        ("dtype", Some("f16")),
        ("engine", Some("host")),
        ("allow-unused-weights", None),
        ("attention-keys", Some("64")),
        ("attention-kernel", Some("efficient")),
        ("max-sessions", Some("7")),
        ("kv-budget-mib", Some("512")),
        ("kv-memory-fraction", Some("0.5")),
        ("forward-delay-ms", Some("2.5")),
        ("session-ttl-s", Some("12.5")),
        ("threads", Some("3")),
        ("sampling-threads", Some("2")),
        ("distributions", Some("device")),
        ("pin-threads", Some("false")),
        ("max-batch-sequences", Some("3")),
        ("max-batch-tokens", Some("100")),
        ("batch-window-us", Some("250")),
        ("prefix-cache", Some("off")),
        ("prefix-cache-min-tokens", Some("64")),
        ("draft-device", Some("cuda:0")),
        ("draft-threads", Some("2")),
        ("draft-dtype", Some("f32")),
        ("draft-engine", Some("libtorch")),
        ("proposer", Some("model+ngram")),
        ("ngram-min", Some("3")),
        ("ngram-max", Some("5")),
        ("suffix-budget-tokens", Some("1000")),
    ];

    /// The long names of every flag [`Parent`] takes, from clap's own description of it.
    fn every_flag() -> Vec<String> {
        let command = Parent::command();
        let flags: Vec<String> = command.get_arguments().filter_map(|arg| arg.get_long()).map(str::to_owned).collect();
        assert!(flags.len() >= NON_DEFAULT.len(), "clap lists fewer flags than NON_DEFAULT: {flags:?}");
        flags
    }

    fn argv(long: &str) -> Vec<String> {
        let value = NON_DEFAULT.iter().find(|(name, _)| *name == long).map(|(_, value)| *value);
        let value = value.unwrap_or_else(|| {
            panic!("--{long} has no non-default value in NON_DEFAULT: give it one, and pass it on in to_args")
        });
        match value {
            Some(value) => vec![format!("--{long}={value}")],
            None => vec![format!("--{long}")],
        }
    }

    fn parse_parent(flags: &[String]) -> Parent {
        Parent::try_parse_from(std::iter::once("specd".to_owned()).chain(flags.iter().cloned())).unwrap()
    }

    /// Every flag set to its non-default value.
    fn everything_set() -> Parent {
        parse_parent(&every_flag().iter().flat_map(|long| argv(long)).collect::<Vec<_>>())
    }

    /// `specd ROLE --model m ARGS`, parsed as the child process parses it.
    fn parse_child(role: &str, args: &[String]) -> Command {
        let head = ["specd", role, "--model", "m"].map(str::to_owned);
        match Cli::try_parse_from(head.into_iter().chain(args.iter().cloned())) {
            Ok(cli) => cli.command,
            Err(e) => panic!("`specd {role}` refuses {args:?}: {e}"),
        }
    }

    #[test]
    fn every_flag_has_a_value_that_is_not_its_default() {
        let defaults = format!("{:?}", parse_parent(&[]));
        for long in every_flag() {
            let changed = format!("{:?}", parse_parent(&argv(&long)));
            assert_ne!(changed, defaults, "--{long}'s value in NON_DEFAULT is its default");
        }
        let flags = every_flag();
        for (long, _) in NON_DEFAULT {
            assert!(flags.iter().any(|f| f == long), "NON_DEFAULT names --{long}, which no longer exists");
        }
    }

    #[test]
    fn a_target_child_gets_every_node_flag() {
        let parent = everything_set();
        let Command::Target(child) = parse_child("target", &parent.node.to_args(None, None)) else { unreachable!() };
        assert_eq!(format!("{:?}", child.node), format!("{:?}", parent.node));
    }

    #[test]
    fn a_draft_child_gets_every_node_draft_and_proposer_flag() {
        let parent = everything_set();
        let draft_delay_ms = 250.0;
        let settings = parent.draft.settings(&parent.node.config("m".into()).unwrap());
        let mut args = parent.node.to_args(Some(draft_delay_ms), Some(&settings));
        args.extend(parent.proposer.to_args());
        let Command::Draft(child) = parse_child("draft", &args) else { unreachable!() };
        // The draft's own options stand in for the shared ones, and its delay for theirs.
        let mut node = parent.node.clone();
        node.device = parent.draft.draft_device.unwrap();
        node.threads = parent.draft.draft_threads;
        node.dtype = parent.draft.draft_dtype.unwrap();
        node.engine = parent.draft.draft_engine.unwrap();
        node.forward_delay_ms = draft_delay_ms;
        assert_eq!(format!("{:?}", child.node), format!("{node:?}"));
        assert_eq!(format!("{:?}", child.proposer), format!("{:?}", parent.proposer));
        // So the child runs the draft as `specd bench --embedded` runs it in its own process.
        let mut embedded = parent.draft.apply(parent.node.config("m".into()).unwrap());
        embedded.forward_delay = Duration::from_millis(250);
        assert_eq!(format!("{:?}", child.node.config("m".into()).unwrap()), format!("{embedded:?}"));
    }
}
