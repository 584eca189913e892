//! The Llama family (Llama, Mistral, Qwen2, Qwen3, Gemma 3 text) on libtorch: one forward
//! pass scores a run of tokens against a session's KV cache. What the later families add
//! (q/k norms, Gemma's norms, embedding scale, GELU, windowed layers with their own RoPE,
//! soft-capped logits) is switched on by [`crate::config::ArchFeatures`].
//!
//! - `dims`: the layers' shape;
//! - `weights`: the checkpoint's tensors (or random ones, for benchmarks);
//! - `forward`: one pass over several sessions' runs of tokens; `layer`: one decoder layer
//!   (its norms, attention over the sessions' caches, the MLP) and [`rms_norm`];
//! - `segments`: the runs of a pass and the rotary tables and masks of their positions;
//! - `attention_plan`: how attention runs (key buckets, kernel, repeated KV heads), chosen
//!   at load from [`crate::attention::AttentionOptions`] and what libtorch would pick.
//!
//! The sessions' caches are [`crate::kv_cache`]'s, the rotary embeddings [`crate::rope`]'s.

mod attention_plan;
mod dims;
mod forward;
mod layer;
mod segments;
mod weights;

use std::path::Path;

use tch::{Device, Kind, Tensor};

use crate::checkpoint_text::CheckpointText;
use crate::config::LlamaConfig;
use crate::device::DType;
use crate::engine::Engine;
use crate::error::{ModelError, Result};
use crate::kv_cache::KvCache;
use crate::language_model::{
    ForwardItem, LanguageModel, Logits, ModelInfo, SessionId, check_tokens, check_tree_keep, rows_returned,
};
use crate::options::LoadOptions;
use crate::rope::{Rope, RopeTables};
use crate::sessions::{SessionTable, resolve_capacity};
use crate::token_tree::TokenTree;
use attention_plan::AttentionPlan;
use dims::Dims;
use forward::Net;
pub use layer::rms_norm;
use segments::Segment;
pub(crate) use weights::open_checkpoint;
use weights::{RandomWeights, WeightSource, Weights};

/// A Llama-family causal LM with its sessions' KV caches.
#[derive(Debug)]
pub struct LlamaModel {
    cfg: LlamaConfig,
    info: ModelInfo,
    text: CheckpointText,
    net: Net,
    sessions: SessionTable<KvCache>,
    /// See [`LoadOptions::logits_on_device`].
    logits_on_device: bool,
}

impl LlamaModel {
    /// Loads a Hugging Face checkpoint directory (`config.json`, safetensors weights,
    /// optional `tokenizer.json` and `generation_config.json`). `--dtype auto` is resolved
    /// here ([`DType::resolve`]); a tensor the model does not use is an error
    /// ([`ModelError::UnusedTensors`]) unless `opts.allow_unused_weights`.
    pub fn load(dir: &Path, opts: &LoadOptions) -> Result<Self> {
        let cfg = LlamaConfig::from_dir(dir)?;
        let opts = LoadOptions { dtype: opts.dtype.resolve(opts.device, cfg.checkpoint_dtype), ..opts.clone() };
        let device = opts.device.to_device()?;
        let text = CheckpointText::read(dir)?;
        let mut store = open_checkpoint(dir, &cfg, device, opts.dtype.kind())?;
        let model = Self::build(cfg, text, &mut store, &opts)?;
        store.finish(opts.allow_unused_weights)?;
        Ok(model)
    }

    /// A model of the given shape with random weights (N(0, 0.02²), unit norms), for
    /// benchmarks. Seeded through libtorch's global generator.
    pub fn random(cfg: LlamaConfig, seed: i64, opts: &LoadOptions) -> Result<Self> {
        tch::manual_seed(seed);
        let opts = LoadOptions { dtype: opts.dtype.resolve(opts.device, cfg.checkpoint_dtype), ..opts.clone() };
        let mut source = RandomWeights { device: opts.device.to_device()?, kind: opts.dtype.kind() };
        Self::build(cfg, CheckpointText { name: "random".into(), tokenizer: None }, &mut source, &opts)
    }

    fn build(cfg: LlamaConfig, text: CheckpointText, w: &mut dyn WeightSource, opts: &LoadOptions) -> Result<Self> {
        let device = opts.device.to_device()?;
        let kind = opts.dtype.kind();
        let weights = Weights::read(&cfg, w)?;
        let features = &cfg.features;
        let positions = cfg.max_position_embeddings;
        let rope =
            RopeTables::new(Rope::new(cfg.head_dim, cfg.rope_theta, &cfg.rope_scaling, device)?, kind, positions);
        let local_rope = match &features.local_rope {
            Some((theta, scaling)) => {
                Some(RopeTables::new(Rope::new(cfg.head_dim, *theta, scaling, device)?, kind, positions))
            }
            None => None,
        };
        // transformers keeps √hidden as a float32 tensor and casts it to the weights' dtype.
        let embed_scale = if features.scale_embeddings {
            Some(Tensor::from((cfg.hidden_size as f64).sqrt() as f32).f_to_device(device)?.f_to_kind(kind)?)
        } else {
            None
        };
        let dims = Dims {
            heads: cfg.num_attention_heads as i64,
            kv_heads: cfg.num_key_value_heads as i64,
            head_dim: cfg.head_dim as i64,
            intermediate: cfg.intermediate_size as i64,
            scale: features.query_pre_attn_scalar.map(|s| 1.0 / s.sqrt()),
            activation: features.activation,
        };
        let attention = AttentionPlan::choose(&opts.attention, &dims, opts.device, kind, device)?;
        tracing::info!(model = %text.name, "attention: {attention}");
        let net = Net {
            weights,
            dims,
            embed_scale,
            rope,
            local_rope,
            sliding_window: cfg.sliding_window,
            final_logit_softcapping: features.final_logit_softcapping,
            attention,
            device,
            kind,
        };
        let info = text.info(&cfg, opts.dtype, Engine::Libtorch.name());
        Ok(Self {
            cfg,
            info,
            text,
            net,
            // A fraction of the free memory is measured after warm-up, whose kernels and
            // workspaces take memory too, by whoever warms the model up (a node):
            // `set_memory_budget`.
            sessions: SessionTable::new(opts.kv_budget.without_measuring()),
            logits_on_device: opts.logits_on_device,
        })
    }

    /// The parsed configuration.
    pub fn config(&self) -> &LlamaConfig {
        &self.cfg
    }

    /// Bytes held by the weights.
    pub fn weight_bytes(&self) -> u64 {
        let elt = match self.net.kind {
            Kind::Half | Kind::BFloat16 => 2,
            Kind::Double => 8,
            _ => 4,
        };
        self.cfg.num_parameters() * elt
    }

    /// The dtype weights are kept in.
    pub fn dtype(&self) -> DType {
        match self.net.kind {
            Kind::Half => DType::F16,
            Kind::BFloat16 => DType::Bf16,
            Kind::Double => DType::F64,
            _ => DType::F32,
        }
    }

    /// Checks an item of a forward pass, makes room for it in the session's cache, and
    /// returns its segment (the session's length now).
    fn segment<'a>(&mut self, session: SessionId, tokens: &'a [u32], rows: usize) -> Result<Segment<'a>> {
        check_tokens(tokens, self.cfg.vocab_size)?;
        self.make_room(session, tokens.len())?;
        let rows = rows_returned(rows, tokens.len());
        let s = self.sessions.get(session)?;
        let keys = self.net.attention.keys(s.len + tokens.len(), s.capacity);
        Ok(Segment { session, past: s.len, tokens, rows, keys, tree: None })
    }

    /// Grows the session's cache, by whole chunks within the budget, when `extra` more tokens
    /// do not fit in its reservation.
    fn make_room(&mut self, session: SessionId, extra: usize) -> Result<()> {
        let growth =
            self.sessions.growth(session, extra, self.cfg.max_position_embeddings, self.info.kv_bytes_per_token)?;
        let Some(growth) = growth else { return Ok(()) };
        let s = self.sessions.get_mut(session)?;
        let len = s.len;
        s.state.grow(len, growth.capacity).map_err(ModelError::classify_allocation)?;
        self.sessions.grown(session, growth)
    }

    /// Runs `segments` in one pass, then moves each session's length past its run and splits
    /// the logits by run.
    fn forward_and_commit(&mut self, segments: &[Segment<'_>]) -> Result<Vec<Logits>> {
        let logits = self.net.pass(segments, &mut self.sessions).map_err(ModelError::classify_allocation)?;
        if self.logits_on_device {
            for s in segments {
                self.sessions.get_mut(s.session)?.len = s.past + s.tokens.len();
            }
            let mut start = 0;
            return segments
                .iter()
                .map(|s| {
                    let mine = logits.f_narrow(0, start, s.rows as i64)?;
                    start += s.rows as i64;
                    Logits::from_tensor(mine)
                })
                .collect();
        }
        let logits = logits.f_to_device(Device::Cpu)?.f_contiguous()?;
        let vocab = self.cfg.vocab_size;
        let total: usize = segments.iter().map(|s| s.rows).sum();
        let mut data = vec![0f32; total * vocab];
        logits.f_copy_data(&mut data, total * vocab)?;
        for s in segments {
            self.sessions.get_mut(s.session)?.len = s.past + s.tokens.len();
        }
        if let [_] = segments {
            // One session (every unbatched pass): its logits are the whole buffer, uncopied.
            return Ok(vec![Logits::new(vocab, data)?]);
        }
        let mut rest = data.as_slice();
        let mut out = Vec::with_capacity(segments.len());
        for s in segments {
            let (mine, tail) = rest.split_at(s.rows * vocab);
            rest = tail;
            out.push(Logits::new(vocab, mine.to_vec())?);
        }
        Ok(out)
    }
}

impl LanguageModel for LlamaModel {
    fn info(&self) -> &ModelInfo {
        &self.info
    }

    fn open_session(&mut self, capacity: Option<usize>) -> Result<SessionId> {
        let cap = resolve_capacity(capacity, self.cfg.max_position_embeddings)?;
        let bytes = self.info.kv_bytes_per_token * cap as u64;
        self.sessions.admit(bytes)?;
        let cache = KvCache::new(
            self.cfg.num_hidden_layers,
            self.cfg.num_key_value_heads,
            cap,
            self.cfg.head_dim,
            self.net.kind,
            self.net.device,
            self.net.attention.bucket.is_some(),
        )
        .map_err(ModelError::classify_allocation)?;
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
        let cache = self.sessions.get(source)?.state.copy_prefix(len, cap).map_err(ModelError::classify_allocation)?;
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
        let segment = self.segment(session, tokens, rows)?;
        let mut logits = self.forward_and_commit(&[segment])?;
        Ok(logits.remove(0))
    }

    fn forward_tree(&mut self, session: SessionId, tree: &TokenTree) -> Result<Logits> {
        let segment = Segment { tree: Some(tree), ..self.segment(session, tree.tokens(), tree.len())? };
        let mut logits = self.forward_and_commit(&[segment])?;
        Ok(logits.remove(0))
    }

    fn keep_tree_path(&mut self, session: SessionId, base: usize, tree: &TokenTree, path: &[usize]) -> Result<()> {
        let s = self.sessions.get_mut(session)?;
        check_tree_keep(session, s.len, base, tree, path)?;
        s.state.keep_rows(base, path)?;
        self.sessions.truncate(session, base + path.len())
    }

    fn forward_batch(&mut self, items: &[ForwardItem<'_>]) -> Vec<Result<Logits>> {
        let mut results: Vec<Option<Result<Logits>>> = Vec::with_capacity(items.len());
        let mut segments = Vec::with_capacity(items.len());
        let mut slots = Vec::with_capacity(items.len());
        for (i, item) in items.iter().enumerate() {
            let session = item.session;
            let checked = if segments.iter().any(|s: &Segment<'_>| s.session == session) {
                Err(ModelError::InvalidInput(format!("session {session} appears twice in one forward pass")))
            } else {
                self.segment(session, item.tokens, item.rows)
            };
            match checked {
                Ok(segment) => {
                    segments.push(segment);
                    slots.push(i);
                    results.push(None);
                }
                Err(err) => results.push(Some(Err(err))),
            }
        }
        if !segments.is_empty() {
            match self.forward_and_commit(&segments) {
                Ok(logits) => {
                    for (slot, l) in slots.into_iter().zip(logits) {
                        results[slot] = Some(Ok(l));
                    }
                }
                Err(err) => {
                    // Out of memory stays out of memory (RESOURCE_EXHAUSTED) for every run
                    // that shared the pass.
                    let out_of_memory = matches!(err, ModelError::OutOfMemory(_));
                    let message = err.to_string();
                    for slot in slots {
                        results[slot] = Some(Err(if out_of_memory {
                            ModelError::OutOfMemory(message.clone())
                        } else {
                            ModelError::BatchFailed(message.clone())
                        }));
                    }
                }
            }
        }
        results.into_iter().map(|r| r.expect("every item has a result")).collect()
    }

    fn warm_up(&mut self, max_tokens: usize) -> Result<usize> {
        // oneDNN (bf16 and f16 on a CPU) and cuBLAS choose and build a kernel per matmul shape
        // on first use, about 1 ms each: ~30 ms for a first pass of a new length on the demo
        // target, more than a whole pass. MKL's f32 and f64 kernels build nothing.
        let builds_kernels = matches!(self.net.kind, Kind::Half | Kind::BFloat16) || self.net.device.is_cuda();
        let max_tokens = max_tokens.min(self.cfg.max_position_embeddings);
        if !builds_kernels || max_tokens == 0 {
            return Ok(0);
        }
        let session = self.open_session(Some(max_tokens))?;
        let tokens = vec![0u32; max_tokens];
        let passes = (1..=max_tokens).try_for_each(|n| {
            self.forward(session, &tokens[..n])?;
            self.truncate(session, 0)
        });
        self.release(session)?;
        passes.map(|()| max_tokens)
    }

    fn set_memory_budget(&mut self, budget: Option<u64>) -> Result<()> {
        self.sessions.set_budget(budget);
        Ok(())
    }

    fn truncate(&mut self, session: SessionId, len: usize) -> Result<()> {
        self.sessions.truncate(session, len)
    }

    fn release(&mut self, session: SessionId) -> Result<()> {
        self.sessions.remove(session)
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
