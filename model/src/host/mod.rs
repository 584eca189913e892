//! The host engine: a Llama-family model (Llama, Mistral, Qwen2, Qwen3, Gemma 3) run on the
//! CPU without libtorch, for models whose passes are small enough that libtorch's cost per
//! operation is a large part of them: drafts, and small targets. Its arithmetic is
//! `specd_host_kernels`': the CPU's widest vector instructions, chosen at run time, and the
//! linear layers split across a pool of threads kept awake for the whole pass. Weights are
//! stored as bf16 where the checkpoint is bf16 (or `--dtype bf16` asks), which halves what a
//! pass reads; the arithmetic is f32 either way, on inputs rounded to bf16 where the CPU
//! multiplies bf16 pairs, and there the keys and values are stored in bf16 too.
//!
//! - `weights`: the checkpoint read and packed for the kernels.
//! - `forward`: one pass over one or more sessions' runs of tokens; `attention` its
//!   attention, `elementwise` its norms and activations.
//! - `cache`: a session's keys and values, in f32 or bf16.
//!
//! When `--engine auto` picks it: [`crate::engine_choice`].

mod attention;
mod cache;
mod elementwise;
mod forward;
mod weights;

use std::path::Path;

use specd_host_kernels::{Kernels, WeightFormat};

use crate::checkpoint_text::CheckpointText;
use crate::config::{Activation, LlamaConfig};
use crate::device::DType;
use crate::error::{ModelError, Result};
use crate::language_model::{
    ForwardItem, LanguageModel, Logits, ModelInfo, SessionId, check_tokens, check_tree_keep, rows_returned,
};
use crate::options::LoadOptions;
use crate::rope::Frequencies;
use crate::sessions::{SessionTable, resolve_capacity};
use crate::token_tree::TokenTree;
use attention::AttentionShape;
use cache::{HostCache, KvFormat};
use forward::{Dims, Net, Run, Scratch};
use weights::{HostWeights, WeightPolicy};

/// What the host engine's pass leaves out, if `cfg` needs any of it.
pub fn unsupported(cfg: &LlamaConfig) -> Option<String> {
    let f = &cfg.features;
    let missing = [
        (f.activation == Activation::Gelu, "exact GELU"),
        (
            cfg.num_key_value_heads == 0 || !cfg.num_attention_heads.is_multiple_of(cfg.num_key_value_heads),
            "these head counts",
        ),
    ];
    let missing: Vec<&str> = missing.iter().filter(|(needed, _)| *needed).map(|(_, what)| *what).collect();
    (!missing.is_empty()).then(|| format!("{} needs {}", cfg.architecture.class_name(), missing.join(", ")))
}

/// A Llama-family causal LM computed on the host, with its sessions' caches.
#[derive(Debug)]
pub struct HostLlama {
    cfg: LlamaConfig,
    info: ModelInfo,
    text: CheckpointText,
    net: Net,
    kernels: Kernels,
    /// How sessions' caches store keys and values.
    kv: KvFormat,
    sessions: SessionTable<HostCache>,
    scratch: Scratch,
}

impl HostLlama {
    /// Loads a Hugging Face checkpoint directory as [`crate::LlamaModel::load`] does, onto
    /// the host: `opts.device` must be the CPU; `opts.dtype` f32, bf16 (weights stored in
    /// bf16) or auto (bf16 where the checkpoint's weights are bf16 values, f32 otherwise);
    /// `opts.threads` threads (default: one per core). On a CPU with bf16 instructions, bf16
    /// matrices multiply inputs rounded to bf16 ([`WeightFormat::Bf16Pairs`]).
    pub fn load(dir: &Path, opts: &LoadOptions) -> Result<Self> {
        let cfg = LlamaConfig::from_dir(dir)?;
        if let Some(why) = host_refuses(&cfg, opts) {
            return Err(ModelError::InvalidInput(format!("the host engine cannot run {}: {why}", dir.display())));
        }
        let threads = opts.threads.unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()));
        let kernels = Kernels::new(threads).map_err(|e| ModelError::Device(e.to_string()))?;
        let text = CheckpointText::read(dir)?;
        let weights = HostWeights::load(
            dir,
            &cfg,
            WeightPolicy::from_dtype(opts.dtype, kernels.isa()),
            opts.allow_unused_weights,
        )?;
        // Matrices in more than one format (a checkpoint bf16 in part, under auto) count as f32.
        let format = weights
            .matrices()
            .map(|m| m.format())
            .reduce(|a, b| if a == b { a } else { WeightFormat::F32 })
            .unwrap_or(WeightFormat::F32);
        let dtype = if format.is_bf16() { DType::Bf16 } else { DType::F32 };
        // Where the products already round their inputs to bf16 (pairs), the keys and values
        // are kept in bf16 too, as torch keeps them for a bf16 model: half the bytes a pass
        // reads and a session holds. Elsewhere they are f32, so that bf16 weights compute
        // exactly what f32 computes on them.
        let kv = if format == WeightFormat::Bf16Pairs { KvFormat::Bf16 } else { KvFormat::F32 };
        let kv_dtype = if kv == KvFormat::Bf16 { DType::Bf16 } else { DType::F32 };
        let mut info = text.info(&cfg, kv_dtype, crate::engine::Engine::Host.name());
        info.dtype = dtype;
        let f = &cfg.features;
        let dims = Dims {
            hidden: cfg.hidden_size,
            intermediate: cfg.intermediate_size,
            vocab: cfg.vocab_size,
            eps: cfg.rms_norm_eps as f32,
            attention: AttentionShape {
                heads: cfg.num_attention_heads,
                kv_heads: cfg.num_key_value_heads,
                head_dim: cfg.head_dim,
                scale: f.query_pre_attn_scalar.map_or(1.0 / (cfg.head_dim as f32).sqrt(), |s| (1.0 / s.sqrt()) as f32),
            },
        };
        let net = Net {
            weights,
            dims,
            rope: Frequencies::new(cfg.head_dim, cfg.rope_theta, &cfg.rope_scaling),
            local_rope: f.local_rope.as_ref().map(|(theta, scaling)| Frequencies::new(cfg.head_dim, *theta, scaling)),
            windows: (0..cfg.num_hidden_layers).map(|l| cfg.layer_window(l)).collect(),
            // transformers keeps √hidden as a float32 tensor cast to the weights' dtype.
            embed_scale: f.scale_embeddings.then(|| (cfg.hidden_size as f64).sqrt() as f32),
            activation: f.activation,
            logit_cap: f.final_logit_softcapping.map(|c| c as f32),
        };
        tracing::info!(
            model = %info.name,
            instructions = kernels.isa().name(),
            threads = kernels.threads(),
            weights = format.name(),
            kv_cache = ?kv,
            "host engine loaded"
        );
        Ok(Self {
            info,
            text,
            net,
            kernels,
            kv,
            // A fraction of the free memory is measured after warm-up, by whoever warms the
            // model up (a node): `set_memory_budget`.
            sessions: SessionTable::new(opts.kv_budget.without_measuring()),
            scratch: Scratch::default(),
            cfg,
        })
    }

    /// The parsed configuration.
    pub fn config(&self) -> &LlamaConfig {
        &self.cfg
    }

    /// The instruction set and thread count its kernels run with, as in "avx512 × 2".
    pub fn kernels_description(&self) -> String {
        format!("{} × {}", self.kernels.isa().name(), self.kernels.threads())
    }
}

/// Why the host engine cannot run `cfg` with `opts`, if it cannot.
pub fn host_refuses(cfg: &LlamaConfig, opts: &LoadOptions) -> Option<String> {
    if opts.device != crate::device::DeviceSpec::Cpu {
        return Some(format!("it runs on the CPU, not {}", opts.device));
    }
    if !matches!(opts.dtype, DType::Auto | DType::F32 | DType::Bf16) {
        return Some(format!("it computes in f32 with f32 or bf16 weights, not {}", opts.dtype));
    }
    unsupported(cfg)
}

impl HostLlama {
    /// Grows the session's cache, by whole chunks within the budget, when `extra` more tokens
    /// do not fit in its reservation.
    fn make_room(&mut self, session: SessionId, extra: usize) -> Result<()> {
        let (max, per_token) = (self.cfg.max_position_embeddings, self.info.kv_bytes_per_token);
        if let Some(growth) = self.sessions.growth(session, extra, max, per_token)? {
            self.sessions.get_mut(session)?.state.grow(growth.capacity)?;
            self.sessions.grown(session, growth)?;
        }
        Ok(())
    }
}

impl LanguageModel for HostLlama {
    fn info(&self) -> &ModelInfo {
        &self.info
    }

    fn open_session(&mut self, capacity: Option<usize>) -> Result<SessionId> {
        let cap = resolve_capacity(capacity, self.cfg.max_position_embeddings)?;
        let bytes = self.info.kv_bytes_per_token * cap as u64;
        self.sessions.admit(bytes)?;
        let cfg = &self.cfg;
        let cache = HostCache::new(cfg.num_hidden_layers, cfg.num_key_value_heads, cfg.head_dim, cap, self.kv)?;
        self.sessions.insert(cache, cap, bytes)
    }

    fn session_len(&self, session: SessionId) -> Result<usize> {
        Ok(self.sessions.get(session)?.len)
    }

    fn fork_session(&mut self, source: SessionId, len: usize, capacity: Option<usize>) -> Result<SessionId> {
        let cap = resolve_capacity(capacity, self.cfg.max_position_embeddings)?;
        self.sessions.check_copy(source, len, cap)?;
        let bytes = self.info.kv_bytes_per_token * cap as u64;
        self.sessions.admit(bytes)?;
        let cache = self.sessions.get(source)?.state.copy_prefix(len, cap)?;
        self.sessions.insert_holding(cache, cap, bytes, len)
    }

    fn reserve(&mut self, session: SessionId, capacity: usize) -> Result<()> {
        let len = self.sessions.get(session)?.len;
        self.make_room(session, capacity.saturating_sub(len))
    }

    fn forward(&mut self, session: SessionId, tokens: &[u32]) -> Result<Logits> {
        self.forward_last(session, tokens, tokens.len())
    }

    fn forward_last(&mut self, session: SessionId, tokens: &[u32], rows: usize) -> Result<Logits> {
        let item = ForwardItem { session, tokens, rows };
        self.forward_batch(&[item]).pop().unwrap_or_else(|| Err(ModelError::InvalidInput("no pass".into())))
    }

    /// One pass for every item that can run: their tokens share each linear layer (the
    /// weights are read once for all of them), and each attends to its own cache.
    fn forward_batch(&mut self, items: &[ForwardItem<'_>]) -> Vec<Result<Logits>> {
        let mut results: Vec<Option<Result<Logits>>> = items
            .iter()
            .enumerate()
            .map(|(i, item)| {
                let checked = check_tokens(item.tokens, self.cfg.vocab_size)
                    .and_then(|()| self.sessions.get(item.session).map(|_| ()))
                    .and_then(|()| {
                        if items[..i].iter().any(|other| other.session == item.session) {
                            return Err(ModelError::InvalidInput(format!(
                                "session {} appears twice in one batch",
                                item.session
                            )));
                        }
                        self.make_room(item.session, item.tokens.len())
                    });
                checked.err().map(Err)
            })
            .collect();
        let ready: Vec<&ForwardItem<'_>> =
            items.iter().zip(&results).filter(|(_, r)| r.is_none()).map(|(i, _)| i).collect();
        let ids: Vec<SessionId> = ready.iter().map(|i| i.session).collect();
        let mut runs: Vec<Run<'_>> = self
            .sessions
            .many_mut(&ids)
            .into_iter()
            .zip(&ready)
            .filter_map(|(s, item)| {
                let s = s?;
                Some(Run {
                    past: s.len,
                    cache: &mut s.state,
                    tokens: item.tokens,
                    rows: rows_returned(item.rows, item.tokens.len()),
                    tree: None,
                })
            })
            .collect();
        let (net, kernels, scratch) = (&self.net, &self.kernels, &mut self.scratch);
        let logits = kernels.pass(|| net.pass(kernels, &mut runs, scratch));
        drop(runs);
        for (s, item) in self.sessions.many_mut(&ids).into_iter().zip(&ready) {
            if let Some(s) = s {
                s.len += item.tokens.len();
            }
        }
        let mut logits = logits.into_iter();
        for slot in results.iter_mut().filter(|r| r.is_none()) {
            *slot = Some(logits.next().map_or_else(
                || Err(ModelError::InvalidInput("a batch item without logits".into())),
                |rows| Logits::new(self.net.dims.vocab, rows),
            ));
        }
        results.into_iter().map(|r| r.unwrap_or_else(|| Err(ModelError::InvalidInput("no pass".into())))).collect()
    }

    /// One pass over the whole tree: its nodes take the slots after the session's tokens,
    /// each rotated to the position of its depth and seeing its own path only.
    fn forward_tree(&mut self, session: SessionId, tree: &TokenTree) -> Result<Logits> {
        check_tokens(tree.tokens(), self.cfg.vocab_size)?;
        self.make_room(session, tree.len())?;
        let Self { sessions, net, kernels, scratch, .. } = self;
        let s = sessions.get_mut(session)?;
        let mut runs =
            [Run { past: s.len, cache: &mut s.state, tokens: tree.tokens(), rows: tree.len(), tree: Some(tree) }];
        let logits = kernels.pass(|| net.pass(kernels, &mut runs, scratch));
        s.len += tree.len();
        let rows =
            logits.into_iter().next().ok_or_else(|| ModelError::InvalidInput("a tree pass without logits".into()))?;
        Logits::new(net.dims.vocab, rows)
    }

    fn keep_tree_path(&mut self, session: SessionId, base: usize, tree: &TokenTree, path: &[usize]) -> Result<()> {
        let s = self.sessions.get_mut(session)?;
        check_tree_keep(session, s.len, base, tree, path)?;
        s.state.keep_path(base, path);
        self.sessions.truncate(session, base + path.len())
    }

    fn truncate(&mut self, session: SessionId, len: usize) -> Result<()> {
        self.sessions.truncate(session, len)
    }

    fn release(&mut self, session: SessionId) -> Result<()> {
        self.sessions.remove(session)
    }

    fn set_memory_budget(&mut self, budget: Option<u64>) -> Result<()> {
        self.sessions.set_budget(budget);
        Ok(())
    }

    fn memory_in_use(&self) -> (u64, Option<u64>) {
        self.sessions.memory()
    }

    fn open_sessions(&self) -> usize {
        self.sessions.len()
    }

    fn encode(&self, text: &str) -> Result<Vec<u32>> {
        self.text.encode(text)
    }

    fn decode(&self, ids: &[u32]) -> Result<String> {
        self.text.decode(ids)
    }
}
