//! The host engine's weights: read through the checkpoint reader the libtorch models use
//! (the same names, shapes and checks, q/k/v and gate/up fused the same way), then kept as
//! plain `f32` vectors.

use std::path::Path;

use tch::{Device, Kind, Tensor};

use crate::config::LlamaConfig;
use crate::error::Result;
use crate::host::kernels::Packed;
use crate::weights::WeightStore;

/// One decoder layer, each matrix [`Packed`] for [`crate::host::kernels::linear`].
#[derive(Debug)]
pub(crate) struct HostLayer {
    pub(crate) attn_norm: Vec<f32>,
    /// q, k, v stacked.
    pub(crate) qkv: Packed,
    pub(crate) qkv_bias: Option<Vec<f32>>,
    pub(crate) o: Packed,
    pub(crate) o_bias: Option<Vec<f32>>,
    pub(crate) mlp_norm: Vec<f32>,
    /// gate, up stacked.
    pub(crate) gate_up: Packed,
    pub(crate) gate_up_bias: Option<Vec<f32>>,
    pub(crate) down: Packed,
    pub(crate) down_bias: Option<Vec<f32>>,
}

#[derive(Debug)]
pub(crate) struct HostWeights {
    /// `[vocab, hidden]`, as stored: a token's row is its embedding.
    pub(crate) embed: Vec<f32>,
    pub(crate) layers: Vec<HostLayer>,
    pub(crate) norm: Vec<f32>,
    /// The head, or the embedding matrix when they are tied.
    pub(crate) lm_head: Packed,
}

impl HostWeights {
    /// Reads the checkpoint in `dir`; a tensor it holds and the model does not use is an
    /// error unless `allow_unused`.
    pub(crate) fn load(dir: &Path, cfg: &LlamaConfig, allow_unused: bool) -> Result<Self> {
        let mut store = WeightStore::open(dir, Device::Cpu, Kind::Float)?;
        let h = cfg.hidden_size as i64;
        let v = cfg.vocab_size as i64;
        let i = cfg.intermediate_size as i64;
        let qd = (cfg.num_attention_heads * cfg.head_dim) as i64;
        let kvd = (cfg.num_key_value_heads * cfg.head_dim) as i64;
        let embed = floats(&store.take("model.embed_tokens.weight", &[v, h])?)?;
        let mut layers = Vec::with_capacity(cfg.num_hidden_layers);
        for l in 0..cfg.num_hidden_layers {
            let p = format!("model.layers.{l}");
            let a = format!("{p}.self_attn");
            let m = format!("{p}.mlp");
            let fused = |store: &mut WeightStore, parts: &[(String, i64)], cols: Option<i64>| -> Result<Vec<f32>> {
                let shapes: Vec<Vec<i64>> =
                    parts.iter().map(|(_, rows)| cols.map_or(vec![*rows], |c| vec![*rows, c])).collect();
                let named: Vec<(&str, &[i64])> =
                    parts.iter().zip(&shapes).map(|((name, _), shape)| (name.as_str(), shape.as_slice())).collect();
                floats(&store.take_stacked(&named)?)
            };
            let packed = |stacked: Vec<f32>| Packed::new(&stacked, stacked.len() / h as usize, h as usize);
            let matrix = |store: &mut WeightStore, name: String, rows: i64, cols: i64| -> Result<Packed> {
                Ok(Packed::new(&floats(&store.take(&name, &[rows, cols])?)?, rows as usize, cols as usize))
            };
            let qkv_names = |suffix: &str| {
                vec![
                    (format!("{a}.q_proj.{suffix}"), qd),
                    (format!("{a}.k_proj.{suffix}"), kvd),
                    (format!("{a}.v_proj.{suffix}"), kvd),
                ]
            };
            let gate_up_names =
                |suffix: &str| vec![(format!("{m}.gate_proj.{suffix}"), i), (format!("{m}.up_proj.{suffix}"), i)];
            let qkv = packed(fused(&mut store, &qkv_names("weight"), Some(h))?);
            let qkv_bias = if cfg.qkv_bias { Some(fused(&mut store, &qkv_names("bias"), None)?) } else { None };
            let gate_up = packed(fused(&mut store, &gate_up_names("weight"), Some(h))?);
            let gate_up_bias = if cfg.mlp_bias { Some(fused(&mut store, &gate_up_names("bias"), None)?) } else { None };
            let bias = |store: &mut WeightStore, present: bool, name: String| -> Result<Option<Vec<f32>>> {
                if present { Ok(Some(floats(&store.take(&name, &[h])?)?)) } else { Ok(None) }
            };
            layers.push(HostLayer {
                attn_norm: floats(&store.take(&format!("{p}.input_layernorm.weight"), &[h])?)?,
                qkv,
                qkv_bias,
                o: matrix(&mut store, format!("{a}.o_proj.weight"), h, qd)?,
                o_bias: bias(&mut store, cfg.o_bias, format!("{a}.o_proj.bias"))?,
                mlp_norm: floats(&store.take(&format!("{p}.post_attention_layernorm.weight"), &[h])?)?,
                gate_up,
                gate_up_bias,
                down: matrix(&mut store, format!("{m}.down_proj.weight"), h, i)?,
                down_bias: bias(&mut store, cfg.mlp_bias, format!("{m}.down_proj.bias"))?,
            });
        }
        let norm = floats(&store.take("model.norm.weight", &[h])?)?;
        let lm_head = if cfg.tie_word_embeddings {
            // Some tied checkpoints still store a copy; the embedding is authoritative.
            store.take_optional("lm_head.weight", &[v, h])?;
            Packed::new(&embed, v as usize, h as usize)
        } else {
            Packed::new(&floats(&store.take("lm_head.weight", &[v, h])?)?, v as usize, h as usize)
        };
        store.finish(allow_unused)?;
        Ok(Self { embed, layers, norm, lm_head })
    }
}

fn floats(tensor: &Tensor) -> Result<Vec<f32>> {
    let tensor = tensor.f_contiguous()?;
    let n = tensor.numel();
    let mut out = vec![0f32; n];
    tensor.f_copy_data(&mut out, n)?;
    Ok(out)
}
