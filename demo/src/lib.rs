//! `specd-demo` builds the demo model pair offline: a byte-level BPE tokenizer and a Llama **target**
//! trained on Python sources, then a much smaller Llama **draft** distilled from the target's
//! distributions (imitating p directly gives far higher acceptance than learning the data).
//!
//! - [`spec`]: the shapes and budgets ([`Preset::Demo`], [`Preset::Tiny`]); [`matmul`]: the
//!   number format of the training's matrix products, chosen by the CPU;
//! - [`corpus`]: the Python standard library's sources (or any directory of `.py` files);
//! - [`bpe`]: the tokenizer; [`net`]: the trainable model; [`train`]: the optimiser loop,
//!   with [`adamw`], whose state [`checkpoint`] saves so that a stopped stage resumes;
//!   [`teacher`]: the target's states over the corpus, computed once for a long distillation;
//! - [`evaluate`]: held-out losses and acceptance; [`export`]: Hugging Face directories;
//! - [`progress`]: how the build reports itself;
//! - [`pair`]: the build itself, stage by stage; [`given`]: a shipped target the
//!   build distils a new draft against instead of training one; [`step_time`]: how long a
//!   training step takes, for `--minutes`;
//! - [`error`]: the crate's one error type.
//!
//! Training runs on [`BuildOptions::device`]: the CPU by default, or a CUDA device (`specd
//! models demo --device cuda:0`), where the initial weights come from CUDA's generator and
//! the kernels sum in other orders, so the bytes differ from a CPU build's and, with the
//! atomics of CUDA's embedding backward, from one CUDA build to the next. The device kind
//! is therefore part of the target's and the draft's cache keys when it is not the CPU
//! (CPU keys are unchanged, so existing CPU builds stay cached); the device's index is not,
//! since it does not change what is computed.
//!
//! Each stage (tokenizer, target, draft) is written to its own directory with the key it
//! was built from; a later build with the same spec, seed and corpus reuses every stage
//! whose key matches, and a stage stopped part-way resumes from its last checkpoint with the
//! bytes an uninterrupted build would have written.

pub mod adamw;
pub mod bpe;
pub mod checkpoint;
pub mod corpus;
pub mod error;
pub mod evaluate;
pub mod export;
pub mod given;
pub mod matmul;
pub mod net;
pub mod pair;
pub mod progress;
pub mod spec;
pub mod step_time;
pub mod teacher;
pub mod train;

pub use error::{DemoError, Result};
pub use evaluate::PairReport;
pub use matmul::MatmulKind;
pub use pair::{BuildOptions, BuildOutcome, ShippedPair, build};
pub use progress::{Progress, Quiet};
pub use spec::{DemoSpec, Preset, Shape};
pub use step_time::seconds_per_step;
