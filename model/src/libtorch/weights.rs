//! The libtorch engine's weights: read from a checkpoint (q/k/v and gate/up fused at load
//! time, a Gemma 3 multimodal checkpoint's text model renamed) or drawn at random for
//! benchmarks.

use std::path::Path;

use tch::{Device, Kind, Tensor};

use crate::config::LlamaConfig;
use crate::error::Result;
use crate::libtorch::layer::{Layer, Norm};
use crate::weights::WeightStore;

/// The tensors of a model.
#[derive(Debug)]
pub(crate) struct Weights {
    pub(crate) embed: Tensor,
    pub(crate) layers: Vec<Layer>,
    pub(crate) norm: Norm,
    /// The embedding matrix itself when embeddings are tied.
    pub(crate) lm_head: Tensor,
}

/// Where weights come from: a checkpoint, or random numbers (benchmarks).
pub(crate) trait WeightSource {
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

/// Stacks tensors along dim 0 (weights of fused projections).
fn stack(parts: &[Tensor]) -> Result<Tensor> {
    Ok(Tensor::f_cat(parts, 0)?)
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

/// N(0, 0.02²) weights and unit norms, drawn from libtorch's global generator.
#[derive(Debug)]
pub(crate) struct RandomWeights {
    pub(crate) device: Device,
    pub(crate) kind: Kind,
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

/// The checkpoint in `dir`, its tensors converted to `kind` on `device` as they are taken;
/// a multimodal checkpoint's text model is named as a text-only one's, its vision tower
/// skipped.
pub(crate) fn open_checkpoint(dir: &Path, cfg: &LlamaConfig, device: Device, kind: Kind) -> Result<WeightStore> {
    let mut store = WeightStore::open(dir, device, kind)?;
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
    Ok(store)
}

impl Weights {
    /// Takes every tensor a model of `cfg` uses from `w`, under its Hugging Face name.
    pub(crate) fn read(cfg: &LlamaConfig, w: &mut dyn WeightSource) -> Result<Self> {
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
        Ok(Self { embed, layers, norm, lm_head })
    }
}
