//! The host engine: a Llama-family model (Llama, Mistral, Qwen2) run in plain Rust `f32`
//! on the model's thread, for drafts small enough that libtorch's cost per operation is
//! most of their pass. The demo draft's pass is about 150 libtorch operations of a few
//! microseconds each over 0.95 M parameters; here it is a few loops over 3.8 MB.
//!
//! - `weights`: the checkpoint read as `f32` vectors (through the libtorch models' reader).
//! - `forward`: one pass over a session's run of tokens; `kernels`: its arithmetic.
//! - `cache`: a session's keys and values.
//!
//! Which checkpoints it runs, and when `--engine auto` picks it: [`crate::engine_choice`].

mod cache;
mod forward;
mod kernels;
mod weights;

use std::path::Path;

use crate::checkpoint_text::CheckpointText;
use crate::config::LlamaConfig;
use crate::device::DType;
use crate::error::{ModelError, Result};
use crate::language_model::{LanguageModel, Logits, ModelInfo, SessionId, check_tokens, rows_returned};
use crate::options::LoadOptions;
use crate::rope::Frequencies;
use crate::sessions::{SessionTable, resolve_capacity};
use cache::HostCache;
use forward::{Dims, Net, Scratch};
use weights::HostWeights;

/// What the host engine's pass leaves out, if `cfg` needs any of it: the later families'
/// additions (q/k norms, Gemma's norms and embedding scale, GELU, soft-capping, per-layer
/// RoPE) run on libtorch only.
pub fn unsupported(cfg: &LlamaConfig) -> Option<String> {
    let f = &cfg.features;
    let missing = [
        (f.qk_norm, "q/k norms"),
        (f.norm_plus_one || f.sandwich_norms, "Gemma's norms"),
        (f.scale_embeddings, "scaled embeddings"),
        (f.activation != crate::config::Activation::Silu, "an activation other than SiLU"),
        (f.query_pre_attn_scalar.is_some(), "query_pre_attn_scalar"),
        (f.final_logit_softcapping.is_some(), "logit soft-capping"),
        (f.local_rope.is_some() || !f.sliding_layers.is_empty(), "per-layer attention windows"),
        (f.multimodal_wrapper, "a multimodal checkpoint"),
        (
            cfg.num_key_value_heads == 0 || !cfg.num_attention_heads.is_multiple_of(cfg.num_key_value_heads),
            "these head counts",
        ),
    ];
    let missing: Vec<&str> = missing.iter().filter(|(needed, _)| *needed).map(|(_, what)| *what).collect();
    (!missing.is_empty()).then(|| format!("{} needs {}", cfg.architecture.class_name(), missing.join(", ")))
}

/// A Llama-family causal LM computed on the host in `f32`, with its sessions' caches.
#[derive(Debug)]
pub struct HostLlama {
    cfg: LlamaConfig,
    info: ModelInfo,
    text: CheckpointText,
    net: Net,
    sessions: SessionTable<HostCache>,
    scratch: Scratch,
}

impl HostLlama {
    /// Loads a Hugging Face checkpoint directory as [`crate::LlamaModel::load`] does, into
    /// `f32` on the host; `opts.device` must be the CPU and `opts.dtype` f32 or auto.
    pub fn load(dir: &Path, opts: &LoadOptions) -> Result<Self> {
        let cfg = LlamaConfig::from_dir(dir)?;
        if let Some(why) = host_refuses(&cfg, opts) {
            return Err(ModelError::InvalidInput(format!("the host engine cannot run {}: {why}", dir.display())));
        }
        let text = CheckpointText::read(dir)?;
        let weights = HostWeights::load(dir, &cfg, opts.allow_unused_weights)?;
        let info = text.info(&cfg, DType::F32, crate::engine::Engine::Host.name());
        let dims = Dims {
            hidden: cfg.hidden_size,
            intermediate: cfg.intermediate_size,
            heads: cfg.num_attention_heads,
            kv_heads: cfg.num_key_value_heads,
            head_dim: cfg.head_dim,
            vocab: cfg.vocab_size,
            eps: cfg.rms_norm_eps as f32,
        };
        let net = Net {
            weights,
            dims,
            rope: Frequencies::new(cfg.head_dim, cfg.rope_theta, &cfg.rope_scaling),
            windows: (0..cfg.num_hidden_layers).map(|l| cfg.layer_window(l)).collect(),
        };
        Ok(Self {
            info,
            text,
            net,
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
}

/// Why the host engine cannot run `cfg` with `opts`, if it cannot.
pub(crate) fn host_refuses(cfg: &LlamaConfig, opts: &LoadOptions) -> Option<String> {
    if opts.device != crate::device::DeviceSpec::Cpu {
        return Some(format!("it runs on the CPU, not {}", opts.device));
    }
    if !matches!(opts.dtype, DType::Auto | DType::F32) {
        return Some(format!("it computes in f32, not {}", opts.dtype));
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
        let cache = HostCache::new(cfg.num_hidden_layers, cfg.num_key_value_heads, cfg.head_dim, cap)?;
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
        check_tokens(tokens, self.cfg.vocab_size)?;
        self.make_room(session, tokens.len())?;
        let s = self.sessions.get_mut(session)?;
        let past = s.len;
        let rows = rows_returned(rows, tokens.len());
        let logits = self.net.pass(&mut s.state, past, tokens, rows, &mut self.scratch);
        s.len = past + tokens.len();
        Logits::new(self.net.dims.vocab, logits)
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
