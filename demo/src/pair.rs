//! Builds the pair stage by stage (tokenizer, target, draft), each written to its own
//! directory with the key it was built from, and reused while that key matches.

use std::path::{Path, PathBuf};
use std::time::Duration;

use serde_json::{Value, json};
use specd_model::DeviceSpec;
use tch::nn::VarStore;

use crate::checkpoint::StageCheckpoint;
use crate::error::{DemoError, Result};
use crate::evaluate::{self, PairReport};
use crate::export::{CheckpointKind, WeightsFormat};
use crate::given::{GivenModel, GivenPair};
use crate::matmul::MatmulKind;
use crate::net::TrainableLlama;
use crate::progress::Progress;
use crate::spec::DemoSpec;
use crate::teacher::TeacherStates;
use crate::train::{Windows, distillation_loss, next_token_loss, optimise};
use crate::{bpe, corpus, export};

/// Bumped whenever a change here changes the bytes a build writes (2: the optimiser's own
/// AdamW, whose state checkpoints save).
const FORMAT: u32 = 2;
const PAIR_FILE: &str = "specd-demo.json";

/// What to build and where.
#[derive(Debug, Clone)]
pub struct BuildOptions {
    pub out: PathBuf,
    /// A directory of `.py` files; the Python standard library when absent.
    pub corpus: Option<PathBuf>,
    pub seed: u64,
    pub spec: DemoSpec,
    /// The number format of the training's matmuls ([`MatmulKind::for_this_cpu`] by default).
    pub matmul: MatmulKind,
    /// Where the models train (and are evaluated); the files are written from the host.
    pub device: DeviceSpec,
    /// How often a training stage saves a checkpoint to resume from (zero: every step).
    pub checkpoint_every: Duration,
    /// Also write the pair as the repository ships it: the target in bf16, both models with
    /// `SHA256SUMS`, evaluated as stored.
    pub ship_to: Option<PathBuf>,
    /// Distil the draft against this shipped target (opened for `spec`) instead of training
    /// the tokenizer and a target: the build takes the target's tokenizer too. With its
    /// draft, start the draft from that draft's weights instead of fresh ones (a fresh
    /// optimiser, the preset's schedule over its draft steps): train it further.
    pub given: Option<GivenPair>,
    /// Distil against the target's states computed once over the corpus
    /// ([`TeacherStates`]) instead of running the target on every batch: for a draft whose
    /// steps see the corpus more than once. Part of the draft's cache key when set.
    pub teacher_states: bool,
}

/// The pair as written to [`BuildOptions::ship_to`].
#[derive(Debug, Clone)]
pub struct ShippedPair {
    pub dir: PathBuf,
    /// Held-out figures of the shipped files (the target's weights rounded to bf16).
    pub report: PairReport,
}

/// `key` with `"device": kind` added when the build does not train on the CPU: CPU keys
/// predate the flag, and a device's index does not change what is computed.
fn with_device(mut key: Value, device: DeviceSpec) -> Value {
    if let (DeviceSpec::Cuda(_), Some(map)) = (device, key.as_object_mut()) {
        map.insert("device".into(), "cuda".into());
    }
    key
}

/// A finished (or cached) pair.
#[derive(Debug, Clone)]
pub struct BuildOutcome {
    /// The target's directory: the build's stage, or the given target's.
    pub target_dir: PathBuf,
    /// The target the draft was distilled against where the build was given one.
    pub given_target: Option<GivenModel>,
    /// The draft the build trained further, where it was given one.
    pub given_draft: Option<GivenModel>,
    pub draft_dir: PathBuf,
    pub report: PairReport,
    pub target_parameters: u64,
    pub draft_parameters: u64,
    /// True when every stage came from the cache.
    pub cached: bool,
    pub corpus_root: PathBuf,
    /// SHA-256 over the corpus's file names and contents (every stage's key holds it).
    pub corpus_fingerprint: String,
    pub train_tokens: usize,
    pub shipped: Option<ShippedPair>,
}

fn parameters(vs: &VarStore) -> u64 {
    vs.trainable_variables().iter().map(|t| t.numel() as u64).sum()
}

/// Builds the pair into `opts.out/{target,draft}`, reusing cached stages.
pub fn build(opts: &BuildOptions, progress: &mut dyn Progress) -> Result<BuildOutcome> {
    opts.spec.validate().map_err(DemoError::InvalidInput)?;
    if opts.ship_to.as_ref().is_some_and(|dir| dir == &opts.out) {
        return Err(DemoError::InvalidInput(format!(
            "the shipped pair must go elsewhere than the build's own directory {}",
            opts.out.display()
        )));
    }
    std::fs::create_dir_all(&opts.out).map_err(|source| DemoError::Io { path: opts.out.clone(), source })?;
    let root = match &opts.corpus {
        Some(dir) => dir.clone(),
        None => corpus::python_stdlib()?,
    };
    progress.stage("reading corpus", 0);
    let corpus = corpus::load(&root, opts.spec.corpus_bytes)?;
    progress.note(&format!(
        "corpus: {} ({} training files, {} held out, {:.1} MB)",
        root.display(),
        corpus.train.len(),
        corpus.held_out.len(),
        corpus.train_bytes() as f64 / 1e6
    ));
    let spec = &opts.spec;
    let device = opts.device.to_device()?;
    let target_cfg = spec.llama_config(spec.target);
    let draft_cfg = spec.llama_config(spec.draft);
    let given = opts.given.as_ref().map(|pair| pair.target.clone());
    let given_draft = opts.given.as_ref().and_then(|pair| pair.draft.clone());
    let tokenizer_key = json!({"format": FORMAT, "stage": "tokenizer", "vocab_size": spec.vocab_size,
        "corpus": corpus.fingerprint, "corpus_bytes": spec.corpus_bytes});
    // A given target is known by its weights alone; a draft distilled against it is keyed on
    // them, and the corpus it reads is keyed in the draft's own key.
    let target_key = match &given {
        Some(given) => json!({"format": FORMAT, "stage": "target", "given": given.weights_sha256}),
        None => with_device(
            json!({"format": FORMAT, "stage": "target", "tokenizer": tokenizer_key, "seed": opts.seed,
            "context": spec.context, "shape": spec.target, "batch": spec.batch, "steps": spec.target_steps, "lr": spec.target_lr, "matmul": opts.matmul}),
            opts.device,
        ),
    };
    let mut draft_key = json!({"format": FORMAT, "stage": "draft", "target": target_key, "shape": spec.draft,
        "steps": spec.draft_steps, "lr": spec.draft_lr, "matmul": opts.matmul});
    if given.is_some() {
        draft_key["corpus"] = json!(corpus.fingerprint);
        draft_key["seed"] = json!(opts.seed);
    }
    if let Some(draft) = &given_draft {
        draft_key["from"] = json!(draft.weights_sha256);
    }
    // Absent when unset, so that drafts built before the option stay cached.
    if opts.teacher_states {
        draft_key["teacher"] = json!("states computed once, f16, aligned windows");
    }
    let draft_key = with_device(draft_key, opts.device);
    let tok_dir = opts.out.join("tokenizer");
    let target_dir = opts.out.join("target");
    let draft_dir = opts.out.join("draft");
    let is_current = |dir: &Path, key: &Value| export::read_build(dir).is_some_and(|b| b.get("key") == Some(key));
    let all_cached = (given.is_some() || is_current(&tok_dir, &tokenizer_key) && is_current(&target_dir, &target_key))
        && is_current(&draft_dir, &draft_key);

    // Tokenizer: the given target's, or one trained on the corpus.
    let tokenizer_json = given.as_ref().map_or_else(|| tok_dir.join("tokenizer.json"), GivenModel::tokenizer_json);
    let tokenizer = if given.is_some() {
        progress.note(&format!("tokenizer: {}'s", tokenizer_json.display()));
        tokenizers::Tokenizer::from_file(&tokenizer_json)
            .map_err(|e| DemoError::Tokenizer { path: tokenizer_json.clone(), message: e.to_string() })?
    } else if is_current(&tok_dir, &tokenizer_key) {
        progress.note("tokenizer: cached");
        tokenizers::Tokenizer::from_file(&tokenizer_json)
            .map_err(|e| DemoError::Tokenizer { path: tokenizer_json.clone(), message: e.to_string() })?
    } else {
        progress.stage("training tokenizer", 0);
        let tmp = export::temporary_sibling(&tok_dir);
        let _ = std::fs::remove_dir_all(&tmp);
        std::fs::create_dir_all(&tmp).map_err(|source| DemoError::Io { path: tmp.clone(), source })?;
        bpe::train(&corpus.train, spec.vocab_size, &tmp.join("tokenizer.json"))?;
        export::write_json(&tmp.join(export::BUILD_FILE), &json!({"key": tokenizer_key}))?;
        export::replace_dir(&tmp, &tok_dir)?;
        tokenizers::Tokenizer::from_file(&tokenizer_json)
            .map_err(|e| DemoError::Tokenizer { path: tokenizer_json.clone(), message: e.to_string() })?
    };
    progress.stage("tokenizing", 0);
    let train_stream = bpe::encode_stream(&tokenizer, &corpus.train)?;
    let held_stream = bpe::encode_stream(&tokenizer, &corpus.held_out)?;
    progress.note(&format!("tokens: {} training, {} held out", train_stream.len(), held_stream.len()));

    // Target: next-token prediction on the corpus.
    let compute = opts.matmul.kind();
    tch::manual_seed(opts.seed as i64);
    let mut target_vs = VarStore::new(device);
    let target = TrainableLlama::new(&target_vs.root(), &target_cfg)?;
    if let Some(given) = &given {
        progress.note(&format!("target: {} (sha256 {})", given.dir.display(), given.weights_sha256));
        export::read_weights_file(&target_vs, &given.weights())?;
    } else if is_current(&target_dir, &target_key) {
        progress.note("target: cached");
        export::read_weights(&target_vs, &target_dir)?;
    } else {
        progress.stage("training target", spec.target_steps);
        let mut windows = Windows::new(&train_stream, spec.context, spec.batch, opts.seed);
        let mut checkpoint = StageCheckpoint::new(&target_dir, &target_key, opts.checkpoint_every);
        let t = spec.context as i64;
        let loss = optimise(
            &target_vs,
            spec.target_steps,
            spec.target_lr,
            &mut windows,
            progress,
            Some(&mut checkpoint),
            |batch| {
                let logits = target.forward(&batch.ids.f_narrow(1, 0, t)?, compute)?;
                next_token_loss(&logits, &batch.ids.f_narrow(1, 1, t)?)
            },
        )?;
        progress.note(&format!("target: final training loss {loss:.3}"));
        let build = json!({"key": target_key});
        export::write_checkpoint(
            &target_dir,
            &target_cfg,
            &target_vs,
            &tokenizer_json,
            CheckpointKind::Stage { build: &build },
        )?;
        checkpoint.remove()?;
    }
    target_vs.freeze();

    // Draft: imitate the target's distributions on the same kind of windows.
    tch::manual_seed(opts.seed.wrapping_add(1) as i64);
    let draft_vs = VarStore::new(device);
    let draft = TrainableLlama::new(&draft_vs.root(), &draft_cfg)?;
    if is_current(&draft_dir, &draft_key) {
        progress.note("draft: cached");
        export::read_weights(&draft_vs, &draft_dir)?;
    } else {
        if let Some(given) = &given_draft {
            progress.note(&format!("draft: from {} (sha256 {})", given.dir.display(), given.weights_sha256));
            export::read_weights_file(&draft_vs, &given.weights())?;
        }
        let (draft_seed, t) = (opts.seed.wrapping_add(1), spec.context as i64);
        // Computed before the stage's bar: a resumed stage computes them again.
        let states = opts
            .teacher_states
            .then(|| TeacherStates::compute(&target, &train_stream, spec.context, compute, device, progress))
            .transpose()?;
        progress.stage("distilling draft", spec.draft_steps);
        let mut windows = match states {
            Some(_) => Windows::aligned(&train_stream, spec.context, spec.batch, draft_seed),
            None => Windows::new(&train_stream, spec.context, spec.batch, draft_seed),
        };
        let mut checkpoint = StageCheckpoint::new(&draft_dir, &draft_key, opts.checkpoint_every);
        let loss = optimise(
            &draft_vs,
            spec.draft_steps,
            spec.draft_lr,
            &mut windows,
            progress,
            Some(&mut checkpoint),
            |batch| {
                let ids = batch.ids.f_narrow(1, 0, t)?;
                let teacher = match &states {
                    Some(states) => states.logits(&target, batch, compute)?,
                    None => {
                        let _no_grad = tch::no_grad_guard();
                        target.forward(&ids, compute)?
                    }
                };
                distillation_loss(&draft.forward(&ids, compute)?, &teacher)
            },
        )?;
        progress.note(&format!("draft: final distillation loss {loss:.3}"));
        let build = json!({"key": draft_key});
        export::write_checkpoint(
            &draft_dir,
            &draft_cfg,
            &draft_vs,
            &tokenizer_json,
            CheckpointKind::Stage { build: &build },
        )?;
        checkpoint.remove()?;
    }

    progress.stage("evaluating on held-out files", 0);
    let windows = (spec.batch * 2).max(4);
    let held = Windows::new(&held_stream, spec.context, windows, opts.seed.wrapping_add(2))
        .next_batch()?
        .ids
        .f_to_device(device)?;
    let report = evaluate::evaluate(&target, &draft, &held)?;
    let shipped = match &opts.ship_to {
        None => None,
        Some(dir) => {
            progress.stage("writing the shipped pair", 0);
            round_to_bf16(&target_vs)?;
            let target_format = CheckpointKind::Shipped { format: WeightsFormat::Bf16 };
            export::write_checkpoint(&dir.join("target"), &target_cfg, &target_vs, &tokenizer_json, target_format)?;
            let draft_format = CheckpointKind::Shipped { format: WeightsFormat::F32 };
            export::write_checkpoint(&dir.join("draft"), &draft_cfg, &draft_vs, &tokenizer_json, draft_format)?;
            Some(ShippedPair { dir: dir.clone(), report: evaluate::evaluate(&target, &draft, &held)? })
        }
    };
    let outcome = BuildOutcome {
        target_dir: given.as_ref().map_or(target_dir, |given| given.dir.clone()),
        given_target: given,
        given_draft,
        draft_dir,
        report,
        target_parameters: parameters(&target_vs),
        draft_parameters: parameters(&draft_vs),
        cached: all_cached,
        corpus_root: root,
        corpus_fingerprint: corpus.fingerprint.clone(),
        train_tokens: train_stream.len(),
        shipped,
    };
    export::write_json(
        &opts.out.join(PAIR_FILE),
        &with_device(
            json!({"seed": opts.seed, "spec": spec, "matmul": opts.matmul, "corpus": corpus.fingerprint, "report": report,
            "target_parameters": outcome.target_parameters, "draft_parameters": outcome.draft_parameters,
            "teacher_states": opts.teacher_states,
            "target_from": outcome.given_target.as_ref().map(GivenModel::summary),
            "draft_from": outcome.given_draft.as_ref().map(GivenModel::summary)}),
            opts.device,
        ),
    )?;
    Ok(outcome)
}

/// Rounds every weight of `vs` to the nearest bf16 in place, so that the model computes what
/// its bf16 file will.
fn round_to_bf16(vs: &VarStore) -> Result<()> {
    let _no_grad = tch::no_grad_guard();
    for (_, mut t) in vs.variables() {
        let rounded = t.f_to_kind(tch::Kind::BFloat16)?.f_to_kind(t.kind())?;
        t.f_copy_(&rounded)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_device_kind_enters_a_key_off_the_cpu_and_its_index_never() {
        let key = json!({"stage": "target", "seed": 1});
        assert_eq!(with_device(key.clone(), DeviceSpec::Cpu), key, "CPU keys predate --device");
        let cuda = with_device(key.clone(), DeviceSpec::Cuda(0));
        assert_ne!(cuda, key);
        assert_eq!(cuda["device"], "cuda");
        assert_eq!(with_device(key, DeviceSpec::Cuda(3)), cuda);
    }
}
