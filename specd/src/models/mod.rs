//! `specd models demo`: build the demo model pair offline (see `specd_demo`), with a
//! progress bar per training stage, then print the pair's held-out figures.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use specd_demo::{self as demo, BuildOptions, DemoSpec, MatmulKind, Preset, Progress};
use specd_model::DeviceSpec;

use crate::cli_error::invalid;
use crate::serve::parse_device;

mod card;

/// Build models: `specd models demo` builds the demo pair offline.
#[derive(Debug, clap::Args)]
pub struct ModelsArgs {
    #[command(subcommand)]
    pub command: ModelsCommand,
}

#[derive(Debug, clap::Subcommand)]
pub enum ModelsCommand {
    Demo(DemoArgs),
}

/// Build the demo pair: a byte-level BPE tokenizer and a Llama target trained on Python
/// sources (the standard library of the `python3` on PATH, or --corpus), then a much smaller
/// Llama draft distilled from the target's distributions. Writes Hugging Face directories
/// OUT/target and OUT/draft that `specd up`, `specd target`/`draft` and transformers load.
///
/// The same seed, preset and corpus give the same bytes. Every stage is cached in OUT with
/// the key it was built from, so running again returns at once, and an interrupted build
/// resumes at the stage it was in. The default took 20 minutes on 2 cores of an AMD EPYC
/// with AVX-512 BF16 and no AMX (bf16 matmuls); a CPU with AMX takes less.
#[derive(Debug, clap::Args)]
pub struct DemoArgs {
    /// Where to write tokenizer/, target/, draft/ and specd-demo.json (the stages, each
    /// cached with its key). The repository's shipped pair is models/demo.
    #[arg(long, env = "SPECD_DEMO_BUILD_DIR", default_value = "models/demo-build")]
    pub out: PathBuf,
    /// Directory of .py files to train on (default: Python's standard library).
    #[arg(long, env = "SPECD_DEMO_CORPUS")]
    pub corpus: Option<PathBuf>,
    /// Seed of the initial weights and of the order training windows are drawn in.
    #[arg(long, env = "SPECD_DEMO_SEED", default_value_t = 1)]
    pub seed: u64,
    /// `demo` (tens of minutes on 2 cores), `shipped` (the recipe of the pair in the
    /// repository's models/demo: hours on 2 cores, resumable) or `tiny` (seconds; for tests).
    #[arg(long, env = "SPECD_DEMO_PRESET", default_value = "demo", value_parser = parse_preset)]
    pub preset: Preset,
    /// Instead of the preset's step counts, fit the training into about this many minutes
    /// on this machine (measured before training; the chosen counts are printed so that
    /// --target-steps and --draft-steps can repeat the build exactly).
    #[arg(long, env = "SPECD_DEMO_MINUTES", conflicts_with_all = ["target_steps", "draft_steps"])]
    pub minutes: Option<f64>,
    /// Optimiser steps for the target (overrides the preset).
    #[arg(long, env = "SPECD_DEMO_TARGET_STEPS")]
    pub target_steps: Option<usize>,
    /// Optimiser steps for the draft (overrides the preset).
    #[arg(long, env = "SPECD_DEMO_DRAFT_STEPS")]
    pub draft_steps: Option<usize>,
    /// The draft's peak learning rate (overrides the preset's; part of the draft's cache key).
    /// A draft trained further (--draft-from) may want less than the preset's, which is sized
    /// for fresh weights.
    #[arg(long, env = "SPECD_DEMO_DRAFT_LR")]
    pub draft_lr: Option<f64>,
    /// Where to train: cpu or cuda:N. A GPU build's bytes differ from a CPU build's (and
    /// between GPU builds: CUDA's embedding backward sums with atomics), so the device kind
    /// is part of the models' cache keys; its index is not.
    #[arg(long, env = "SPECD_DEMO_DEVICE", default_value = "cpu", value_parser = parse_device)]
    pub device: DeviceSpec,
    /// Number format of the training's matrix products: `auto` is bf16 on a GPU and on a
    /// CPU with bf16 instructions (AVX-512 BF16 or AMX), and f32 on a CPU without, where
    /// bf16 is emulated. Part of every stage's cache key.
    #[arg(long, env = "SPECD_DEMO_MATMUL", default_value = "auto", value_parser = parse_matmul)]
    pub matmul: MatmulChoice,
    /// Minutes between the checkpoints a training stage saves (beside its directory, as
    /// `.target.partial`): a build stopped part-way resumes from the last one and writes the
    /// same bytes as one never stopped. 0 saves after every step.
    #[arg(long, env = "SPECD_DEMO_CHECKPOINT_MINUTES", default_value_t = 5.0)]
    pub checkpoint_minutes: f64,
    /// Also write the pair as the repository ships it into this directory: the target's
    /// weights in bf16, a SHA256SUMS in each model's directory (checked at load), and the
    /// model card (card.json, README.md) with the figures of the files as stored.
    #[arg(long, env = "SPECD_DEMO_SHIP_TO")]
    pub ship_to: Option<PathBuf>,
    /// Distil the draft against this target instead of training a tokenizer and a target:
    /// a target directory a build shipped with the same preset (e.g. models/demo/target),
    /// checked against its SHA256SUMS and the preset's shape first. Only the draft is trained
    /// (--draft-steps), with the target's own tokenizer; the card records the target's origin.
    #[arg(long, env = "SPECD_DEMO_TARGET_FROM", conflicts_with_all = ["minutes", "target_steps"])]
    pub target_from: Option<PathBuf>,
    /// Train this shipped draft further instead of one from fresh weights: --draft-steps more
    /// steps on the preset's schedule, with a fresh optimiser, against --target-from's target
    /// (which it needs, with the same tokenizer), e.g. models/demo/draft.
    #[arg(long, env = "SPECD_DEMO_DRAFT_FROM", requires = "target_from")]
    pub draft_from: Option<PathBuf>,
    /// Distil the draft against the target's last states, computed in one pass over the
    /// corpus before the draft's first step and kept in memory (tokens × the target's hidden
    /// size × 2 bytes: 2.3 GB for the shipped preset), instead of running the whole target on
    /// every batch: each step then runs only the target's vocabulary head. It pays when the
    /// draft's steps see the corpus more than once (steps × batch × context above the corpus's
    /// tokens): on the shipped preset a step takes about a third of the time. Windows then
    /// start at multiples of the context; part of the draft's cache key. Not with --minutes,
    /// whose budget is timed on steps that run the whole target.
    #[arg(long, env = "SPECD_DEMO_TEACHER_STATES", conflicts_with = "minutes")]
    pub teacher_states: bool,
    /// Print the result as JSON.
    #[arg(long, env = "SPECD_JSON")]
    pub json: bool,
}

/// `--matmul`: a kind, or the rule of [`MatmulKind::for_this_cpu`].
#[derive(Debug, Clone, Copy)]
pub enum MatmulChoice {
    Auto,
    Fixed(MatmulKind),
}

impl MatmulChoice {
    fn resolve(self, device: DeviceSpec) -> MatmulKind {
        match self {
            Self::Auto => MatmulKind::for_device(device),
            Self::Fixed(kind) => kind,
        }
    }
}

fn parse_matmul(s: &str) -> Result<MatmulChoice, String> {
    if s == "auto" { Ok(MatmulChoice::Auto) } else { s.parse().map(MatmulChoice::Fixed) }
}

fn preset_name(preset: Preset) -> &'static str {
    match preset {
        Preset::Demo => "demo",
        Preset::Shipped => "shipped",
        Preset::Tiny => "tiny",
    }
}

/// This process's command line, each argument quoted where a shell would need it.
fn command_line() -> String {
    let quote = |a: String| {
        if !a.is_empty() && a.chars().all(|c| c.is_ascii_alphanumeric() || "-_./=:,".contains(c)) {
            a
        } else {
            format!("'{}'", a.replace('\'', "'\\''"))
        }
    };
    let mut args = std::env::args();
    let program = args
        .next()
        .map(|p| std::path::Path::new(&p).file_name().map_or(p.clone(), |n| n.to_string_lossy().into_owned()));
    program.into_iter().chain(args).map(quote).collect::<Vec<_>>().join(" ")
}

fn parse_preset(s: &str) -> Result<Preset, String> {
    match s {
        "demo" => Ok(Preset::Demo),
        "shipped" => Ok(Preset::Shipped),
        "tiny" => Ok(Preset::Tiny),
        other => Err(format!("unknown preset {other:?} (demo, shipped or tiny)")),
    }
}

/// Share of `--minutes` given to each model's training; the rest is the tokenizer, the
/// evaluation and writing files.
const TARGET_SHARE: f64 = 0.62;
const DRAFT_SHARE: f64 = 0.28;

/// Training steps of each model that fit a time budget.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct StepBudget {
    target_steps: usize,
    draft_steps: usize,
}

/// `--minutes`' rule: each model gets its share of the budget, divided by the seconds one of
/// its steps measured on this host; at least one step each.
fn steps_for_minutes(minutes: f64, target_step_s: f64, draft_step_s: f64) -> StepBudget {
    let budget = minutes * 60.0;
    let steps = |share: f64, step_s: f64| ((budget * share / step_s.max(1e-9)).floor() as usize).max(1);
    StepBudget { target_steps: steps(TARGET_SHARE, target_step_s), draft_steps: steps(DRAFT_SHARE, draft_step_s) }
}

impl DemoArgs {
    fn spec(&self, matmul: MatmulKind) -> anyhow::Result<DemoSpec> {
        let mut spec = self.preset.spec();
        if let Some(steps) = self.target_steps {
            spec.target_steps = steps;
        }
        if let Some(steps) = self.draft_steps {
            spec.draft_steps = steps;
        }
        if let Some(lr) = self.draft_lr {
            if !(lr.is_finite() && lr > 0.0) {
                return Err(invalid(format!("--draft-lr must be positive, got {lr}")));
            }
            spec.draft_lr = lr;
        }
        if let Some(minutes) = self.minutes {
            if !(minutes.is_finite() && minutes > 0.0) {
                return Err(invalid(format!("--minutes must be positive, got {minutes}")));
            }
            eprintln!(
                "measuring a training step of each model ({} matmuls on {}) to fit {minutes} minutes…",
                matmul.name(),
                self.device
            );
            let target_s = demo::seconds_per_step(&spec, spec.target, None, matmul, self.device)?;
            let draft_s = demo::seconds_per_step(&spec, spec.draft, Some(spec.target), matmul, self.device)?;
            let fit = steps_for_minutes(minutes, target_s, draft_s);
            spec.target_steps = fit.target_steps;
            spec.draft_steps = fit.draft_steps;
            eprintln!(
                "{:.2} s per target step, {:.2} s per draft step: --target-steps {} --draft-steps {}",
                target_s, draft_s, spec.target_steps, spec.draft_steps
            );
        }
        if spec.target_steps == 0 || spec.draft_steps == 0 {
            return Err(invalid("step counts must be at least 1"));
        }
        spec.validate().map_err(invalid)?;
        Ok(spec)
    }
}

/// Draws one bar per training stage on stderr (hidden when stderr is not a terminal, where
/// a line per stage and every tenth of the steps is logged instead).
struct Bars {
    bar: Option<ProgressBar>,
    stage: String,
    steps: usize,
    started: Instant,
    /// Steps already done when this process took the stage up (a resumed checkpoint's), so
    /// that the rate and the ETA count only this run's steps.
    resumed_at: Option<usize>,
}

impl Bars {
    fn new() -> Self {
        Self { bar: None, stage: String::new(), steps: 0, started: Instant::now(), resumed_at: None }
    }

    fn finish(&mut self) {
        if let Some(bar) = self.bar.take() {
            bar.finish();
        }
    }
}

impl Progress for Bars {
    fn stage(&mut self, name: &str, steps: usize) {
        self.finish();
        self.stage = name.to_owned();
        self.steps = steps;
        self.started = Instant::now();
        self.resumed_at = None;
        if steps == 0 {
            eprintln!("{name}…");
            return;
        }
        let bar = ProgressBar::with_draw_target(Some(steps as u64), ProgressDrawTarget::stderr());
        bar.set_style(
            ProgressStyle::with_template("{prefix:>18} [{bar:30}] {pos}/{len} {msg} ETA {eta}")
                .unwrap_or_else(|_| ProgressStyle::default_bar())
                .progress_chars("=> "),
        );
        bar.set_prefix(name.to_owned());
        if bar.is_hidden() {
            eprintln!("{name}: {steps} steps");
        }
        bar.enable_steady_tick(Duration::from_millis(500));
        self.bar = Some(bar);
    }

    fn step(&mut self, step: usize, loss: Option<f64>, tokens_per_s: f64) {
        let msg = match loss {
            Some(loss) => format!("loss {loss:.3}, {tokens_per_s:.0} tok/s"),
            None => format!("{tokens_per_s:.0} tok/s"),
        };
        let resumed_at = *self.resumed_at.get_or_insert_with(|| {
            self.started = Instant::now();
            step - 1
        });
        match &self.bar {
            Some(bar) if !bar.is_hidden() => {
                if step - 1 == resumed_at && resumed_at > 0 {
                    bar.set_position(resumed_at as u64);
                    bar.reset_eta();
                }
                bar.set_position(step as u64);
                bar.set_message(msg);
            }
            _ => {
                if step == self.steps || step.is_multiple_of((self.steps / 10).max(1)) {
                    let elapsed = self.started.elapsed().as_secs_f64();
                    let eta = elapsed / (step - resumed_at) as f64 * (self.steps - step) as f64;
                    eprintln!("{}: step {step}/{}, {msg}, ETA {eta:.0} s", self.stage, self.steps);
                }
            }
        }
    }

    fn note(&mut self, text: &str) {
        match &self.bar {
            Some(bar) if !bar.is_hidden() => bar.println(text),
            _ => eprintln!("{text}"),
        }
    }
}

/// Runs the subcommand.
pub fn run(args: &ModelsArgs) -> anyhow::Result<()> {
    let ModelsCommand::Demo(args) = &args.command;
    if let Some(dir) = &args.corpus
        && !dir.is_dir()
    {
        return Err(invalid(format!("--corpus {} is not a directory", dir.display())));
    }
    if args.ship_to.as_ref().is_some_and(|dir| dir == &args.out) {
        return Err(invalid(format!(
            "--ship-to {} is --out's directory: the shipped pair must go elsewhere than the build's stages",
            args.out.display()
        )));
    }
    // Refused before any work (exit code 2) when the device is not there.
    args.device.to_device().map_err(|e| invalid(format!("--device {}: {e}", args.device)))?;
    let matmul = args.matmul.resolve(args.device);
    eprintln!(
        "training on {} with matmuls in {} ({})",
        args.device,
        matmul.name(),
        match args.matmul {
            MatmulChoice::Auto if args.device != DeviceSpec::Cpu => "auto: bf16 on a GPU",
            MatmulChoice::Auto if matmul == MatmulKind::Bf16 => "auto: this CPU has bf16 instructions",
            MatmulChoice::Auto => "auto: this CPU has no bf16 instructions, so bf16 would be emulated",
            MatmulChoice::Fixed(_) => "--matmul",
        }
    );
    let spec = args.spec(matmul)?;
    if !(args.checkpoint_minutes.is_finite() && args.checkpoint_minutes >= 0.0) {
        return Err(invalid(format!("--checkpoint-minutes must be 0 or more, got {}", args.checkpoint_minutes)));
    }
    // Given models are checked before any work, so that a wrong one is refused as input.
    let given = args
        .target_from
        .as_deref()
        .map(|dir| demo::given::GivenPair::open(dir, args.draft_from.as_deref(), &spec))
        .transpose()
        .map_err(|e| invalid(e.to_string()))?;
    let opts = BuildOptions {
        out: args.out.clone(),
        corpus: args.corpus.clone(),
        seed: args.seed,
        spec,
        matmul,
        device: args.device,
        checkpoint_every: Duration::from_secs_f64(args.checkpoint_minutes * 60.0),
        ship_to: args.ship_to.clone(),
        given,
        teacher_states: args.teacher_states,
    };
    let provenance = card::Provenance {
        command: command_line(),
        seed: args.seed,
        preset: preset_name(args.preset).into(),
        spec: opts.spec.clone(),
        matmul,
        device: args.device,
    };
    let started = Instant::now();
    let mut bars = Bars::new();
    let outcome = demo::build(&opts, &mut bars)?;
    bars.finish();
    let r = outcome.report;
    if let Some(shipped) = &outcome.shipped {
        let card = card::card(&provenance, &outcome, &shipped.report);
        card::write(&shipped.dir, &card)?;
    }
    if args.json {
        let json = serde_json::json!({
            "target": outcome.target_dir, "draft": outcome.draft_dir, "cached": outcome.cached,
            "target_parameters": outcome.target_parameters, "draft_parameters": outcome.draft_parameters,
            "report": r, "matmul": matmul, "device": args.device.to_string(), "seconds": started.elapsed().as_secs_f64(),
            "shipped": outcome.shipped.as_ref().map(|s| serde_json::json!({"dir": s.dir, "report": s.report})),
        });
        outln!("{json}");
        return Ok(());
    }
    outln!(
        "{} in {:.0} s: target {} ({:.1} M parameters), draft {} ({:.2} M parameters)",
        if outcome.cached { "cached" } else { "built" },
        started.elapsed().as_secs_f64(),
        outcome.target_dir.display(),
        outcome.target_parameters as f64 / 1e6,
        outcome.draft_dir.display(),
        outcome.draft_parameters as f64 / 1e6,
    );
    outln!(
        "held-out loss (nats/token, {} positions): target {:.3}, draft {:.3}",
        r.positions,
        r.target_loss,
        r.draft_loss
    );
    outln!(
        "acceptance α = mean Σ min(p, q): {:.3} at T = 1, {:.3} at T = 0.8, {:.3} greedy",
        r.alpha_t1,
        r.alpha_t08,
        r.alpha_greedy
    );
    if let Some(shipped) = &outcome.shipped {
        let s = shipped.report;
        outln!(
            "shipped to {} (target in bf16): held-out loss {:.3} and {:.3}; α {:.3} at T = 0.8, {:.3} greedy",
            shipped.dir.display(),
            s.target_loss,
            s.draft_loss,
            s.alpha_t08,
            s.alpha_greedy
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn minutes_become_steps_by_each_models_measured_step_time() {
        // 10 minutes, a target step of 3 s and a draft step of 1 s: 62 % of 600 s is 372 s,
        // 124 target steps; 28 % is 168 s, 168 draft steps.
        assert_eq!(steps_for_minutes(10.0, 3.0, 1.0), StepBudget { target_steps: 124, draft_steps: 168 });
        // A host twice as fast gets twice the steps for the same minutes.
        assert_eq!(steps_for_minutes(10.0, 1.5, 0.5), StepBudget { target_steps: 248, draft_steps: 336 });
        // What the steps cost together stays within the budget.
        let fit = steps_for_minutes(7.3, 2.9, 0.7);
        let spent = fit.target_steps as f64 * 2.9 + fit.draft_steps as f64 * 0.7;
        assert!(spent <= 7.3 * 60.0 * (TARGET_SHARE + DRAFT_SHARE), "{spent}");
        // A budget too small for one step still trains one of each.
        assert_eq!(steps_for_minutes(0.001, 30.0, 30.0), StepBudget { target_steps: 1, draft_steps: 1 });
    }
}
