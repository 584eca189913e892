//! The Llama family (Llama, Mistral, Qwen2, Qwen3, Gemma 3 text) on libtorch: one forward
//! pass scores a run of tokens against a session's KV cache. What the later families add
//! (q/k norms, Gemma's norms, embedding scale, GELU, windowed layers with their own RoPE,
//! soft-capped logits) is switched on by [`crate::config::ArchFeatures`].

use std::path::Path;

use tch::{Device, Kind, Tensor};

use crate::checkpoint_text::CheckpointText;
use crate::config::{Activation, LlamaConfig};
use crate::device::DType;
use crate::error::{ModelError, Result};
use crate::kv_cache::KvCache;
use crate::language_model::{ForwardItem, LanguageModel, Logits, ModelInfo, SessionId, check_tokens, rows_returned};
use crate::options::LoadOptions;
use crate::rope::{Rope, apply_rope};
use crate::sessions::{SessionTable, resolve_capacity};
use crate::weights::WeightStore;

/// One decoder layer. q/k/v and gate/up are fused at load time (one matmul each instead of
/// three and two), which matters most for small runs of tokens.
#[derive(Debug)]
struct Layer {
    attn_norm: Norm,
    /// Per-head RMS norms of q and k (Qwen3, Gemma 3).
    qk_norm: Option<(Norm, Norm)>,
    /// Gemma's norm of the attention output, before the residual add.
    post_attn_norm: Option<Norm>,
    /// Gemma's norm of the MLP output, before the residual add.
    post_mlp_norm: Option<Norm>,
    /// Whether the sliding window applies (Gemma 3's local layers; every layer of a
    /// windowed Mistral).
    windowed: bool,
    /// `[q_dim + 2 * kv_dim, hidden]`: q, k, v stacked.
    qkv: Tensor,
    qkv_bias: Option<Tensor>,
    o: Tensor,
    o_bias: Option<Tensor>,
    mlp_norm: Norm,
    /// `[2 * intermediate, hidden]`: gate, up stacked.
    gate_up: Tensor,
    gate_up_bias: Option<Tensor>,
    down: Tensor,
    down_bias: Option<Tensor>,
}

/// Stacks tensors along dim 0 (weights of fused projections).
fn stack(parts: &[Tensor]) -> Result<Tensor> {
    Ok(Tensor::f_cat(parts, 0)?)
}

/// A Llama-family causal LM with its sessions' KV caches.
#[derive(Debug)]
pub struct LlamaModel {
    cfg: LlamaConfig,
    info: ModelInfo,
    text: CheckpointText,
    embed: Tensor,
    layers: Vec<Layer>,
    norm: Norm,
    /// The embedding matrix itself when embeddings are tied.
    lm_head: Tensor,
    /// √hidden in the run's dtype (Gemma), by which embeddings are multiplied.
    embed_scale: Option<Tensor>,
    rope: Rope,
    /// The windowed layers' RoPE where it differs (Gemma 3).
    local_rope: Option<Rope>,
    device: Device,
    kind: Kind,
    sessions: SessionTable<KvCache>,
    /// See [`LoadOptions::logits_on_device`].
    logits_on_device: bool,
}

/// Where weights come from: a checkpoint, or random numbers (benchmarks).
trait WeightSource {
    fn get(&mut self, name: &str, shape: &[i64]) -> Result<Tensor>;
    fn get_optional(&mut self, name: &str, shape: &[i64]) -> Result<Option<Tensor>>;
    fn get_bias(&mut self, present: bool, name: &str, shape: &[i64]) -> Result<Option<Tensor>> {
        if present { self.get(name, shape).map(Some) } else { Ok(None) }
    }
    /// The tensors `parts` stacked along dim 0 (a fused projection).
    fn get_stacked(&mut self, parts: &[(&str, &[i64])]) -> Result<Tensor> {
        let tensors = parts.iter().map(|(name, shape)| self.get(name, shape)).collect::<Result<Vec<_>>>()?;
        stack(&tensors)
    }
}

impl WeightSource for WeightStore {
    fn get(&mut self, name: &str, shape: &[i64]) -> Result<Tensor> {
        self.take(name, shape)
    }
    fn get_stacked(&mut self, parts: &[(&str, &[i64])]) -> Result<Tensor> {
        self.take_stacked(parts)
    }
    fn get_optional(&mut self, name: &str, shape: &[i64]) -> Result<Option<Tensor>> {
        self.take_optional(name, shape)
    }
}

#[derive(Debug)]
struct RandomWeights {
    device: Device,
    kind: Kind,
}

impl WeightSource for RandomWeights {
    fn get(&mut self, name: &str, shape: &[i64]) -> Result<Tensor> {
        let t = if name.ends_with("norm.weight") {
            Tensor::f_ones(shape, (Kind::Float, self.device))?
        } else {
            Tensor::f_randn(shape, (Kind::Float, self.device))?.f_mul_scalar(0.02)?
        };
        Ok(t.f_to_kind(self.kind)?)
    }
    fn get_optional(&mut self, _name: &str, _shape: &[i64]) -> Result<Option<Tensor>> {
        Ok(None)
    }
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
        let mut store = WeightStore::open(dir, device, opts.dtype.kind())?;
        if cfg.features.multimodal_wrapper {
            store.rename_and_skip(
                &[
                    ("model.language_model.", "model."),
                    ("language_model.model.", "model."),
                    ("language_model.lm_head.", "lm_head."),
                ],
                &["model.vision_tower.", "vision_tower.", "model.multi_modal_projector.", "multi_modal_projector."],
            );
        }
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
        let h = cfg.hidden_size as i64;
        let v = cfg.vocab_size as i64;
        let i = cfg.intermediate_size as i64;
        let qd = (cfg.num_attention_heads * cfg.head_dim) as i64;
        let kvd = (cfg.num_key_value_heads * cfg.head_dim) as i64;
        let embed = w.get("model.embed_tokens.weight", &[v, h])?;
        let features = &cfg.features;
        let hd = cfg.head_dim as i64;
        let eps = cfg.rms_norm_eps;
        let norm = |w: &mut dyn WeightSource, name: &str, size: i64| -> Result<Norm> {
            Norm::new(w.get(name, &[size])?, features.norm_plus_one, eps)
        };
        let mut layers = Vec::with_capacity(cfg.num_hidden_layers);
        for l in 0..cfg.num_hidden_layers {
            let p = format!("model.layers.{l}");
            let a = format!("{p}.self_attn");
            let m = format!("{p}.mlp");
            let (q, k, v) = (format!("{a}.q_proj"), format!("{a}.k_proj"), format!("{a}.v_proj"));
            let qkv = w.get_stacked(&[
                (&format!("{q}.weight"), &[qd, h]),
                (&format!("{k}.weight"), &[kvd, h]),
                (&format!("{v}.weight"), &[kvd, h]),
            ])?;
            let qkv_bias = if cfg.qkv_bias {
                Some(w.get_stacked(&[
                    (&format!("{q}.bias"), &[qd]),
                    (&format!("{k}.bias"), &[kvd]),
                    (&format!("{v}.bias"), &[kvd]),
                ])?)
            } else {
                None
            };
            let (gate, up) = (format!("{m}.gate_proj"), format!("{m}.up_proj"));
            let gate_up = w.get_stacked(&[(&format!("{gate}.weight"), &[i, h]), (&format!("{up}.weight"), &[i, h])])?;
            let gate_up_bias = if cfg.mlp_bias {
                Some(w.get_stacked(&[(&format!("{gate}.bias"), &[i]), (&format!("{up}.bias"), &[i])])?)
            } else {
                None
            };
            let qk_norm = if features.qk_norm {
                Some((norm(w, &format!("{a}.q_norm.weight"), hd)?, norm(w, &format!("{a}.k_norm.weight"), hd)?))
            } else {
                None
            };
            // Gemma's four norms: post_attention_layernorm follows attention there, and
            // pre_feedforward_layernorm is the one before the MLP.
            let (post_attn_norm, mlp_norm, post_mlp_norm) = if features.sandwich_norms {
                (
                    Some(norm(w, &format!("{p}.post_attention_layernorm.weight"), h)?),
                    norm(w, &format!("{p}.pre_feedforward_layernorm.weight"), h)?,
                    Some(norm(w, &format!("{p}.post_feedforward_layernorm.weight"), h)?),
                )
            } else {
                (None, norm(w, &format!("{p}.post_attention_layernorm.weight"), h)?, None)
            };
            layers.push(Layer {
                attn_norm: norm(w, &format!("{p}.input_layernorm.weight"), h)?,
                qk_norm,
                post_attn_norm,
                post_mlp_norm,
                windowed: cfg.layer_window(l).is_some(),
                qkv,
                qkv_bias,
                o: w.get(&format!("{a}.o_proj.weight"), &[h, qd])?,
                o_bias: w.get_bias(cfg.o_bias, &format!("{a}.o_proj.bias"), &[h])?,
                mlp_norm,
                gate_up,
                gate_up_bias,
                down: w.get(&format!("{m}.down_proj.weight"), &[h, i])?,
                down_bias: w.get_bias(cfg.mlp_bias, &format!("{m}.down_proj.bias"), &[h])?,
            });
        }
        let norm = norm(w, "model.norm.weight", h)?;
        let lm_head = if cfg.tie_word_embeddings {
            // Some tied checkpoints still store a copy; the embedding is authoritative.
            w.get_optional("lm_head.weight", &[v, h])?;
            embed.shallow_clone()
        } else {
            w.get("lm_head.weight", &[v, h])?
        };
        let rope = Rope::new(cfg.head_dim, cfg.rope_theta, &cfg.rope_scaling, device)?;
        let local_rope = match &features.local_rope {
            Some((theta, scaling)) => Some(Rope::new(cfg.head_dim, *theta, scaling, device)?),
            None => None,
        };
        // transformers keeps √hidden as a float32 tensor and casts it to the weights' dtype.
        let embed_scale = if features.scale_embeddings {
            Some(Tensor::from((cfg.hidden_size as f64).sqrt() as f32).f_to_device(device)?.f_to_kind(kind)?)
        } else {
            None
        };
        let info = text.info(&cfg, opts.dtype, crate::engine::Engine::Libtorch.name());
        Ok(Self {
            cfg,
            info,
            text,
            embed,
            layers,
            norm,
            lm_head,
            embed_scale,
            rope,
            local_rope,
            device,
            kind,
            // Resolved after the weights are loaded: a fraction of the free memory is of what
            // they leave.
            sessions: SessionTable::new(opts.kv_budget.resolve(opts.device)?),
            logits_on_device: opts.logits_on_device,
        })
    }

    /// The parsed configuration.
    pub fn config(&self) -> &LlamaConfig {
        &self.cfg
    }

    /// Bytes held by the weights.
    pub fn weight_bytes(&self) -> u64 {
        let elt = match self.kind {
            Kind::Half | Kind::BFloat16 => 2,
            Kind::Double => 8,
            _ => 4,
        };
        self.cfg.num_parameters() * elt
    }

    /// The dtype weights are kept in.
    pub fn dtype(&self) -> DType {
        match self.kind {
            Kind::Half => DType::F16,
            Kind::BFloat16 => DType::Bf16,
            Kind::Double => DType::F64,
            _ => DType::F32,
        }
    }

    /// One forward pass over several sessions' runs of tokens (a ragged batch): the runs are
    /// concatenated for the embedding, the projections and the MLP, and each run attends to
    /// its own session's cache. The head runs on each run's last `rows` positions only.
    /// Returns `[Σ rows, vocab]` float32 logits on the model's device, the runs' rows in order.
    fn forward_segments(&mut self, segments: &[Segment<'_>]) -> Result<Tensor> {
        let cfg = &self.cfg;
        let features = &cfg.features;
        let (heads, kv_heads, hd) =
            (cfg.num_attention_heads as i64, cfg.num_key_value_heads as i64, cfg.head_dim as i64);
        let ids: Vec<i64> = segments.iter().flat_map(|s| s.tokens.iter().map(|&t| i64::from(t))).collect();
        let total = ids.len() as i64;
        let ids = Tensor::from_slice(&ids).f_to_device(self.device)?;
        let mut x = self.embed.f_index_select(0, &ids)?.f_unsqueeze(0)?;
        if let Some(scale) = &self.embed_scale {
            x = x.f_mul(scale)?;
        }
        // Global layers, then (where some layers are windowed) the windowed layers: the
        // rotary tables of every segment's positions and each segment's mask.
        let global = if self.layers.iter().any(|l| !l.windowed) {
            Some(self.position_tables(segments, &self.rope, None)?)
        } else {
            None
        };
        let local = if self.layers.iter().any(|l| l.windowed) {
            Some(self.position_tables(segments, self.local_rope.as_ref().unwrap_or(&self.rope), cfg.sliding_window)?)
        } else {
            None
        };
        let gqa = heads != kv_heads;
        let scale = features.query_pre_attn_scalar.map(|s| 1.0 / s.sqrt());
        for (li, l) in self.layers.iter().enumerate() {
            // Each kind's tables exist where a layer of that kind does.
            let tables =
                if l.windowed { local.as_ref().or(global.as_ref()) } else { global.as_ref().or(local.as_ref()) };
            let tables = tables.ok_or_else(|| ModelError::InvalidInput("a model without layers".into()))?;
            let hs = l.attn_norm.apply(&x)?;
            let qkv = hs.f_linear(&l.qkv, l.qkv_bias.as_ref())?;
            let q = qkv.f_narrow(-1, 0, heads * hd)?.f_view([1, total, heads, hd])?;
            let k = qkv.f_narrow(-1, heads * hd, kv_heads * hd)?.f_reshape([1, total, kv_heads, hd])?;
            let (q, k) = match &l.qk_norm {
                Some((qn, kn)) => (qn.apply(&q)?, kn.apply(&k)?),
                None => (q, k),
            };
            let (q, k) = (q.f_transpose(1, 2)?, k.f_transpose(1, 2)?);
            let v = qkv
                .f_narrow(-1, (heads + kv_heads) * hd, kv_heads * hd)?
                .f_reshape([1, total, kv_heads, hd])?
                .f_transpose(1, 2)?;
            let q = apply_rope(&q, &tables.cos, &tables.sin)?;
            let k = apply_rope(&k, &tables.cos, &tables.sin)?;
            let mut outputs = Vec::with_capacity(segments.len());
            let mut start = 0i64;
            for (s, mask) in segments.iter().zip(&tables.masks) {
                let n = s.tokens.len() as i64;
                let cache = &mut self.sessions.get_mut(s.session)?.state;
                let (k_all, v_all) = cache.append(li, s.past, &k.f_narrow(2, start, n)?, &v.f_narrow(2, start, n)?)?;
                let attn = Tensor::f_scaled_dot_product_attention(
                    &q.f_narrow(2, start, n)?,
                    &k_all,
                    &v_all,
                    mask.as_ref(),
                    0.0,
                    false,
                    scale,
                    gqa,
                )?;
                outputs.push(attn.f_transpose(1, 2)?.f_reshape([1, n, heads * hd])?);
                start += n;
            }
            let attn = if outputs.len() == 1 { outputs.remove(0) } else { Tensor::f_cat(&outputs, 1)? };
            let attn = attn.f_linear(&l.o, l.o_bias.as_ref())?;
            let attn = match &l.post_attn_norm {
                Some(norm) => norm.apply(&attn)?,
                None => attn,
            };
            x = x.f_add(&attn)?;
            let hs = l.mlp_norm.apply(&x)?;
            let gate_up = hs.f_linear(&l.gate_up, l.gate_up_bias.as_ref())?;
            let inter = cfg.intermediate_size as i64;
            let gate = gate_up.f_narrow(-1, 0, inter)?;
            let gate = match features.activation {
                Activation::Silu => gate.f_silu()?,
                Activation::GeluTanh => gate.f_gelu("tanh")?,
                Activation::Gelu => gate.f_gelu("none")?,
            };
            let up = gate_up.f_narrow(-1, inter, inter)?;
            let mlp = gate.f_mul(&up)?.f_linear(&l.down, l.down_bias.as_ref())?;
            let mlp = match &l.post_mlp_norm {
                Some(norm) => norm.apply(&mlp)?,
                None => mlp,
            };
            x = x.f_add(&mlp)?;
        }
        let x = last_rows(&x, segments)?;
        let x = self.norm.apply(&x)?;
        let logits = x.f_linear(&self.lm_head, None::<&Tensor>)?;
        let logits = match features.final_logit_softcapping {
            Some(cap) => logits.f_div_scalar(cap)?.f_tanh()?.f_mul_scalar(cap)?,
            None => logits,
        };
        Ok(logits.f_squeeze_dim(0)?.f_to_kind(Kind::Float)?)
    }

    /// The rotary tables of `rope` for every segment's positions, concatenated, and each
    /// segment's mask with `window`.
    fn position_tables(&self, segments: &[Segment<'_>], rope: &Rope, window: Option<usize>) -> Result<PositionTables> {
        let mut cos = Vec::with_capacity(segments.len());
        let mut sin = Vec::with_capacity(segments.len());
        let mut masks = Vec::with_capacity(segments.len());
        for s in segments {
            let (c, n) = rope.cos_sin(s.past, s.tokens.len(), self.kind)?;
            cos.push(c);
            sin.push(n);
            masks.push(attention_mask(s.past, s.tokens.len(), window, self.kind, self.device)?);
        }
        // Rotary embeddings are per position, so they apply to the concatenated runs at once.
        let (cos, sin) = if segments.len() == 1 {
            (cos.remove(0), sin.remove(0))
        } else {
            (Tensor::f_cat(&cos, 0)?, Tensor::f_cat(&sin, 0)?)
        };
        Ok(PositionTables { cos, sin, masks })
    }

    /// Checks an item of a forward pass, makes room for it in the session's cache, and
    /// returns its segment (the session's length now).
    fn segment<'a>(&mut self, session: SessionId, tokens: &'a [u32], rows: usize) -> Result<Segment<'a>> {
        check_tokens(tokens, self.cfg.vocab_size)?;
        self.make_room(session, tokens.len())?;
        let rows = rows_returned(rows, tokens.len());
        Ok(Segment { session, past: self.sessions.get(session)?.len, tokens, rows })
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
        let logits = self.forward_segments(segments).map_err(ModelError::classify_allocation)?;
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

/// The rotary tables and masks of one kind of layer for one pass.
#[derive(Debug)]
struct PositionTables {
    /// `[Σ n, head_dim]` each.
    cos: Tensor,
    sin: Tensor,
    /// One per segment ([`attention_mask`]).
    masks: Vec<Option<Tensor>>,
}

/// One session's run of tokens in a forward pass, at positions `past..past + tokens.len()`.
#[derive(Debug, Clone, Copy)]
struct Segment<'a> {
    session: SessionId,
    past: usize,
    tokens: &'a [u32],
    /// The head runs on the last `rows` tokens (1 ≤ rows ≤ tokens.len()).
    rows: usize,
}

/// The hidden states `[1, Σ n, hidden]` of each segment's last `rows` positions, in order:
/// the rows the head runs on.
fn last_rows(x: &Tensor, segments: &[Segment<'_>]) -> Result<Tensor> {
    if segments.iter().all(|s| s.rows == s.tokens.len()) {
        return Ok(x.shallow_clone());
    }
    let mut parts = Vec::with_capacity(segments.len());
    let mut end = 0i64;
    for s in segments {
        end += s.tokens.len() as i64;
        parts.push(x.f_narrow(1, end - s.rows as i64, s.rows as i64)?);
    }
    Ok(if let [one] = parts.as_slice() { one.shallow_clone() } else { Tensor::f_cat(&parts, 1)? })
}

/// An RMS norm with its weight: Llama's `w * normed` in the input's dtype, or Gemma's
/// `(1 + w) * normed` in float32 (the weight kept as `1 + w` in float32).
#[derive(Debug)]
struct Norm {
    weight: Tensor,
    plus_one: bool,
    eps: f64,
}

impl Norm {
    fn new(weight: Tensor, plus_one: bool, eps: f64) -> Result<Self> {
        let weight = if plus_one { weight.f_to_kind(Kind::Float)?.f_add_scalar(1.0)? } else { weight };
        Ok(Self { weight, plus_one, eps })
    }

    /// Normalises the last dimension of `x`; the result has `x`'s dtype.
    fn apply(&self, x: &Tensor) -> Result<Tensor> {
        if !self.plus_one {
            return rms_norm(x, &self.weight, self.eps);
        }
        let xf = x.f_to_kind(Kind::Float)?;
        let var = xf.f_square()?.f_mean_dim(-1, true, Kind::Float)?;
        let normed = xf.f_mul(&var.f_add_scalar(self.eps)?.f_rsqrt()?)?;
        Ok(normed.f_mul(&self.weight)?.f_to_kind(x.kind())?)
    }
}

/// `weight * (x / sqrt(mean(x²) + eps))`, the mean taken in float32 as in transformers.
pub(crate) fn rms_norm(x: &Tensor, weight: &Tensor, eps: f64) -> Result<Tensor> {
    let kind = x.kind();
    let xf = x.f_to_kind(Kind::Float)?;
    let var = xf.f_square()?.f_mean_dim(-1, true, Kind::Float)?;
    let normed = xf.f_mul(&var.f_add_scalar(eps)?.f_rsqrt()?)?;
    Ok(weight.f_mul(&normed.f_to_kind(kind)?)?)
}

/// Additive `[n, past + n]` mask in `kind` (0 where a query may attend, -inf elsewhere) for
/// queries at `past..past + n`, or `None` when every key is visible (a single query with no
/// active sliding window). Attention would turn a boolean mask into this one in every
/// layer; built once per pass, it saves about 0.5–1% of a 4-token verify pass on the demo
/// target (BENCHMARKS.md).
fn attention_mask(past: usize, n: usize, window: Option<usize>, kind: Kind, device: Device) -> Result<Option<Tensor>> {
    let total = past + n;
    let window_active = window.is_some_and(|w| total > w);
    if n == 1 && !window_active {
        return Ok(None);
    }
    let q = Tensor::f_arange_start(past as i64, total as i64, (Kind::Int64, device))?.f_unsqueeze(1)?;
    let k = Tensor::f_arange(total as i64, (Kind::Int64, device))?.f_unsqueeze(0)?;
    let mut mask = k.f_le_tensor(&q)?;
    if let Some(w) = window {
        let recent = q.f_sub(&k)?.f_lt(w as i64)?;
        mask = mask.f_logical_and(&recent)?;
    }
    let open = Tensor::f_zeros([n as i64, total as i64], (kind, device))?;
    Ok(Some(open.f_masked_fill(&mask.f_logical_not()?, f64::NEG_INFINITY)?))
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
            self.kind,
            self.device,
        )
        .map_err(ModelError::classify_allocation)?;
        self.sessions.insert(cache, cap, bytes)
    }

    fn session_len(&self, session: SessionId) -> Result<usize> {
        Ok(self.sessions.get(session)?.len)
    }

    fn forward(&mut self, session: SessionId, tokens: &[u32]) -> Result<Logits> {
        self.forward_last(session, tokens, tokens.len())
    }

    fn forward_last(&mut self, session: SessionId, tokens: &[u32], rows: usize) -> Result<Logits> {
        let segment = self.segment(session, tokens, rows)?;
        let mut logits = self.forward_and_commit(&[segment])?;
        Ok(logits.remove(0))
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
        let builds_kernels = matches!(self.kind, Kind::Half | Kind::BFloat16) || self.device.is_cuda();
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
