//! `specd-model`: what the draft and target nodes run.
//!
//! - [`language_model`]: the [`LanguageModel`] trait (sessions, forward with logits for every
//!   position or for the last few a node reads, O(1) truncate, release) and [`ModelInfo`]
//!   (vocab size, EOS ids, context length, tokenizer fingerprint).
//! - [`libtorch`]: the Llama family (Llama, Mistral, Qwen2, Qwen3, Gemma 3 text) on
//!   libtorch (`tch`), loaded from Hugging Face checkpoints without conversion;
//!   [`attention`] says how it attends (key lengths, kernel); [`config`] reads `config.json` and
//!   `generation_config.json`; `weights` reads safetensors (single or sharded); [`rope`] and
//!   `kv_cache` are the pieces of the forward pass.
//! - [`host`]: the same family computed on the CPU without libtorch, with the kernels of
//!   `specd-host-kernels` (the CPU's vector instructions, bf16 products where it has them, a
//!   pool of threads kept hot through a pass), where libtorch's cost per operation would be
//!   most of a pass; [`engine`] names the two (`--engine`) and [`engine_choice`] chooses
//!   between them by timing both at load.
//! - [`table`]: a model whose distributions are written out in a JSON file, used by the law
//!   tests to drive the whole system with known p and q. The file format is documented in
//!   [`table`]; in short `{"vocab_size": 3, "tokens": ["A","B","C"], "default": [0.6, 0.3,
//!   0.1], "rules": [{"prefix": [0], "probs": [...]}, {"suffix": [1], "probs": [...]}]}`,
//!   and its logits are `ln p` with [`table::ZERO_PROB_LOGIT`] for `p = 0`.
//! - [`token_tree`]: a tree of candidate tokens that one pass scores, each node attending
//!   to its ancestors ([`LanguageModel::forward_tree`], `keep_tree_path`);
//! - [`checksums`]: a checkpoint's `SHA256SUMS`, checked at load when it is there;
//! - [`tokenizer`]: `tokenizer.json` and the vocabulary fingerprint; `checkpoint_text`: a
//!   checkpoint's name and optional tokenizer, as both engines read and use them.
//! - [`worker`]: the dedicated model thread and its clonable [`ModelHandle`];
//!   [`batching`]: how that thread runs concurrent sessions' forward passes as one.
//! - [`device`]: `--device` and `--dtype` (`auto` resolved at load); [`cpu_features`]: what
//!   the CPU can do (bf16 matrix units); [`options`]: how to load a model ([`LoadOptions`]);
//!   [`load`]: open a model from a path.
//! - [`prefix_cache`]: what ended sessions computed for their committed tokens, kept for
//!   later sessions whose prompts begin the same way, within the KV budget;
//! - [`slowed`]: a model made slower per forward pass, standing in for a bigger one in
//!   benchmarks (`--forward-delay-ms`, `specd bench --draft-delay-ms`) and tests;
//! - `injected_oom` (the `testing` feature only): a model whose n-th pass fails with a real
//!   allocation failure.
//! - [`kv_budget`]: the KV-cache budget, a number of bytes or a fraction of the memory free
//!   once the model is loaded and warmed up, and where that is read (on CUDA the runtime,
//!   through `specd-cuda-memory`, with `nvidia-smi` as the fallback).
//! - [`error`]: the crate's one error type.
//!
//! Memory: each session preallocates its KV cache for its capacity when it opens (what its
//! request can reach, as the node computes it) and grows by whole chunks past it if it
//! must; the budget ([`LoadOptions::kv_budget`], a fraction of the free memory measured
//! after warm-up and set with [`LanguageModel::set_memory_budget`]) bounds the bytes of all
//! open sessions' caches (weights not included), and a session or a growth that would exceed it is
//! refused with [`ModelError::MemoryBudget`]. An allocation that fails inside a pass is
//! [`ModelError::OutOfMemory`]: that pass fails, the model serves on.

pub mod attention;
pub mod batching;
mod checkpoint_text;
pub mod checksums;
pub mod config;
pub mod cpu_features;
pub mod device;
pub mod engine;
pub mod engine_choice;
pub mod error;
pub mod host;
#[cfg(feature = "testing")]
pub mod injected_oom;
pub mod kv_budget;
mod kv_cache;
pub mod language_model;
pub mod libtorch;
pub mod load;
pub mod options;
pub mod pinning;
pub mod prefix_cache;
pub mod rope;
mod sessions;
pub mod slowed;
pub mod table;
pub mod token_tree;
pub mod tokenizer;
mod weights;
pub mod worker;

pub use attention::{AttentionKernel, AttentionOptions, KeyLengths};
pub use batching::{BatchPolicy, BatchTotals};
pub use config::{Activation, ArchFeatures, Architecture, LlamaConfig, LlamaShape, RopeScaling};
pub use device::{DType, DeviceSpec};
pub use engine::Engine;
pub use error::{ErrorClass, ModelError, Result};
pub use host::HostLlama;
#[cfg(feature = "testing")]
pub use injected_oom::InjectedOom;
pub use kv_budget::{FreeMemory, KvBudget, MemorySource};
pub use language_model::{
    ForwardItem, LanguageModel, Logits, ModelInfo, OpenedSession, PrefixCacheStats, PrefixRequest, SessionId,
};
pub use libtorch::LlamaModel;
pub use load::{BoxedModel, load_model};
pub use options::LoadOptions;
pub use pinning::{TeamPinning, pin_model_team};
pub use prefix_cache::{PrefixCache, PrefixCacheOptions};
pub use slowed::Slowed;
pub use table::TableModel;
pub use token_tree::TokenTree;
pub use tokenizer::TextTokenizer;
pub use worker::{ModelHandle, ModelWorker, QueuedJob};
