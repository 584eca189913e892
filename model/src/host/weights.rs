//! The host engine's weights: read through the checkpoint reader the libtorch models use
//! (the same names, shapes and checks, q/k/v and gate/up fused the same way, Gemma's
//! multimodal names mapped the same way), then packed for `specd_host_kernels` in the format
//! [`WeightPolicy`] picks.

use std::path::Path;

use specd_host_kernels::{Isa, PackedMatrix, WeightFormat, bf16_exact, bf16_value, from_bf16, to_bf16};
use tch::{Device, Kind, Tensor};

use crate::config::LlamaConfig;
use crate::device::DType;
use crate::error::Result;
use crate::host::elementwise::Norm;
use crate::libtorch::open_checkpoint;
use crate::weights::WeightStore;

/// How the matrices are stored, from `--dtype` and what the CPU multiplies.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum WeightPolicy {
    /// `f32`: as read.
    F32,
    /// `bf16`: every weight rounded to bf16 (matrices stored in the format given, the
    /// CPU's best for bf16; embeddings, norms and biases rounded too, so the weights are
    /// exactly the checkpoint's bf16 copy).
    Bf16(WeightFormat),
    /// `auto`: bf16 in the format given where storing the weights so loses nothing (a bf16
    /// checkpoint), `f32` otherwise.
    Lossless(WeightFormat),
}

impl WeightPolicy {
    /// The policy for `dtype`, storing bf16 matrices as pairs where the CPU multiplies bf16
    /// pairs in one instruction (`isa`): a bf16 checkpoint is then multiplied as torch and
    /// llama.cpp multiply it, inputs rounded to bf16, in about half the time a prompt's
    /// products take widened to f32 (BENCHMARKS.md).
    pub(crate) fn from_dtype(dtype: DType, isa: Isa) -> Self {
        let bf16 = isa.bf16_format();
        match dtype {
            DType::Bf16 => Self::Bf16(bf16),
            DType::Auto => Self::Lossless(bf16),
            _ => Self::F32,
        }
    }

    /// `tensor`'s values as f32, rounded to bf16 values under [`Self::Bf16`].
    fn read(self, tensor: &Tensor) -> Result<Vec<f32>> {
        let mut values = floats(tensor)?;
        if let Self::Bf16(_) = self {
            for v in &mut values {
                *v = bf16_value(*v);
            }
        }
        Ok(values)
    }

    /// How this policy stores the weights `w` (read by [`Self::read`]).
    fn format(self, w: &[f32]) -> WeightFormat {
        match self {
            Self::F32 => WeightFormat::F32,
            Self::Bf16(bf16) => bf16,
            Self::Lossless(bf16) if bf16_exact(w) => bf16,
            Self::Lossless(_) => WeightFormat::F32,
        }
    }

    fn pack(self, w: &[f32], outputs: usize, inputs: usize) -> PackedMatrix {
        PackedMatrix::new(w, outputs, inputs, self.format(w))
    }

    /// The embedding table, in bf16 where this policy would store it as a bf16 matrix: half
    /// the bytes, and the same values (they are bf16 values already).
    fn embedding(self, table: Vec<f32>, hidden: usize) -> Embedding {
        if self.format(&table).is_bf16() {
            Embedding::Bf16 { rows: table.iter().map(|&x| to_bf16(x)).collect(), hidden }
        } else {
            Embedding::F32 { rows: table, hidden }
        }
    }
}

/// The embedding table, `[vocab, hidden]` row-major: a token's row is its embedding.
#[derive(Debug)]
pub(crate) enum Embedding {
    F32 {
        rows: Vec<f32>,
        hidden: usize,
    },
    /// `to_bf16`'s bits.
    Bf16 {
        rows: Vec<u16>,
        hidden: usize,
    },
}

impl Embedding {
    /// Writes token `t`'s embedding into `dst` (`hidden` long).
    pub(crate) fn row_into(&self, t: usize, dst: &mut [f32]) {
        match self {
            Self::F32 { rows, hidden } => dst.copy_from_slice(&rows[t * hidden..][..*hidden]),
            Self::Bf16 { rows, hidden } => {
                for (d, &b) in dst.iter_mut().zip(&rows[t * hidden..][..*hidden]) {
                    *d = from_bf16(b);
                }
            }
        }
    }
}

/// One decoder layer.
#[derive(Debug)]
pub(crate) struct HostLayer {
    pub(crate) attn_norm: Norm,
    /// Per-head norms of q and k (Qwen3, Gemma 3).
    pub(crate) qk_norm: Option<(Norm, Norm)>,
    /// q, k, v stacked.
    pub(crate) qkv: PackedMatrix,
    pub(crate) qkv_bias: Option<Vec<f32>>,
    pub(crate) o: PackedMatrix,
    pub(crate) o_bias: Option<Vec<f32>>,
    /// Gemma's norm of the attention output, before the residual add.
    pub(crate) post_attn_norm: Option<Norm>,
    pub(crate) mlp_norm: Norm,
    /// gate, up stacked.
    pub(crate) gate_up: PackedMatrix,
    pub(crate) gate_up_bias: Option<Vec<f32>>,
    pub(crate) down: PackedMatrix,
    pub(crate) down_bias: Option<Vec<f32>>,
    /// Gemma's norm of the MLP output, before the residual add.
    pub(crate) post_mlp_norm: Option<Norm>,
}

#[derive(Debug)]
pub(crate) struct HostWeights {
    pub(crate) embed: Embedding,
    pub(crate) layers: Vec<HostLayer>,
    pub(crate) norm: Norm,
    /// The head, or the embedding matrix when they are tied.
    pub(crate) lm_head: PackedMatrix,
}

impl HostWeights {
    /// Reads the checkpoint in `dir`; a tensor it holds and the model does not use is an
    /// error unless `allow_unused`.
    pub(crate) fn load(dir: &Path, cfg: &LlamaConfig, policy: WeightPolicy, allow_unused: bool) -> Result<Self> {
        let mut store = open_checkpoint(dir, cfg, Device::Cpu, Kind::Float)?;
        let h = cfg.hidden_size as i64;
        let v = cfg.vocab_size as i64;
        let i = cfg.intermediate_size as i64;
        let hd = cfg.head_dim as i64;
        let qd = (cfg.num_attention_heads * cfg.head_dim) as i64;
        let kvd = (cfg.num_key_value_heads * cfg.head_dim) as i64;
        let features = &cfg.features;
        let plus_one = features.norm_plus_one;
        let norm = |store: &mut WeightStore, name: &str, size: i64| -> Result<Norm> {
            Ok(Norm::new(policy.read(&store.take(name, &[size])?)?, plus_one))
        };
        let embed = policy.read(&store.take("model.embed_tokens.weight", &[v, h])?)?;
        // A tied head is packed now, and the f32 table given up for its stored copy before
        // the layers load: the load never holds the f32 table beside all the other weights.
        let tied_head = cfg.tie_word_embeddings.then(|| policy.pack(&embed, v as usize, h as usize));
        let embed = policy.embedding(embed, h as usize);
        let mut layers = Vec::with_capacity(cfg.num_hidden_layers);
        for l in 0..cfg.num_hidden_layers {
            let p = format!("model.layers.{l}");
            let a = format!("{p}.self_attn");
            let m = format!("{p}.mlp");
            let stacked = |store: &mut WeightStore, parts: &[(String, i64)], cols: Option<i64>| -> Result<Vec<f32>> {
                let shapes: Vec<Vec<i64>> =
                    parts.iter().map(|(_, rows)| cols.map_or(vec![*rows], |c| vec![*rows, c])).collect();
                let named: Vec<(&str, &[i64])> =
                    parts.iter().zip(&shapes).map(|((name, _), shape)| (name.as_str(), shape.as_slice())).collect();
                policy.read(&store.take_stacked(&named)?)
            };
            let packed = |w: Vec<f32>, inputs: i64| policy.pack(&w, w.len() / inputs as usize, inputs as usize);
            let qkv_names = |suffix: &str| {
                vec![
                    (format!("{a}.q_proj.{suffix}"), qd),
                    (format!("{a}.k_proj.{suffix}"), kvd),
                    (format!("{a}.v_proj.{suffix}"), kvd),
                ]
            };
            let gate_up_names =
                |suffix: &str| vec![(format!("{m}.gate_proj.{suffix}"), i), (format!("{m}.up_proj.{suffix}"), i)];
            let bias = |store: &mut WeightStore, present: bool, name: String| -> Result<Option<Vec<f32>>> {
                if present { Ok(Some(policy.read(&store.take(&name, &[h])?)?)) } else { Ok(None) }
            };
            let qkv = packed(stacked(&mut store, &qkv_names("weight"), Some(h))?, h);
            let qkv_bias = if cfg.qkv_bias { Some(stacked(&mut store, &qkv_names("bias"), None)?) } else { None };
            let gate_up = packed(stacked(&mut store, &gate_up_names("weight"), Some(h))?, h);
            let gate_up_bias =
                if cfg.mlp_bias { Some(stacked(&mut store, &gate_up_names("bias"), None)?) } else { None };
            let qk_norm = if features.qk_norm {
                Some((
                    norm(&mut store, &format!("{a}.q_norm.weight"), hd)?,
                    norm(&mut store, &format!("{a}.k_norm.weight"), hd)?,
                ))
            } else {
                None
            };
            let (post_attn_norm, mlp_norm, post_mlp_norm) = if features.sandwich_norms {
                (
                    Some(norm(&mut store, &format!("{p}.post_attention_layernorm.weight"), h)?),
                    norm(&mut store, &format!("{p}.pre_feedforward_layernorm.weight"), h)?,
                    Some(norm(&mut store, &format!("{p}.post_feedforward_layernorm.weight"), h)?),
                )
            } else {
                (None, norm(&mut store, &format!("{p}.post_attention_layernorm.weight"), h)?, None)
            };
            layers.push(HostLayer {
                attn_norm: norm(&mut store, &format!("{p}.input_layernorm.weight"), h)?,
                qk_norm,
                qkv,
                qkv_bias,
                o: packed(policy.read(&store.take(&format!("{a}.o_proj.weight"), &[h, qd])?)?, qd),
                o_bias: bias(&mut store, cfg.o_bias, format!("{a}.o_proj.bias"))?,
                post_attn_norm,
                mlp_norm,
                gate_up,
                gate_up_bias,
                down: packed(policy.read(&store.take(&format!("{m}.down_proj.weight"), &[h, i])?)?, i),
                down_bias: bias(&mut store, cfg.mlp_bias, format!("{m}.down_proj.bias"))?,
                post_mlp_norm,
            });
        }
        let norm = norm(&mut store, "model.norm.weight", h)?;
        let lm_head = match tied_head {
            Some(head) => {
                // Some tied checkpoints still store a copy; the embedding is authoritative.
                store.take_optional("lm_head.weight", &[v, h])?;
                head
            }
            None => policy.pack(&policy.read(&store.take("lm_head.weight", &[v, h])?)?, v as usize, h as usize),
        };
        store.finish(allow_unused)?;
        Ok(Self { embed, layers, norm, lm_head })
    }

    /// Every matrix, for what the engine reports of them.
    pub(crate) fn matrices(&self) -> impl Iterator<Item = &PackedMatrix> {
        self.layers.iter().flat_map(|l| [&l.qkv, &l.o, &l.gate_up, &l.down]).chain(std::iter::once(&self.lm_head))
    }
}

fn floats(tensor: &Tensor) -> Result<Vec<f32>> {
    let tensor = tensor.f_contiguous()?;
    let n = tensor.numel();
    let mut out = vec![0f32; n];
    tensor.f_copy_data(&mut out, n)?;
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_embedding_is_kept_in_bf16_where_the_policy_stores_bf16_and_its_rows_read_the_same() {
        let hidden = 3;
        let bf16_values: Vec<f32> = [0.5, -1.25, 3.0, 0.15625, 7.0, -0.75].to_vec();
        let inexact: Vec<f32> = bf16_values.iter().map(|x| x / 3.0).collect();
        assert!(bf16_exact(&bf16_values) && !bf16_exact(&inexact));
        let format = WeightFormat::Bf16;
        let cases = [
            (WeightPolicy::F32, &bf16_values, false),
            (WeightPolicy::Lossless(format), &bf16_values, true),
            (WeightPolicy::Lossless(format), &inexact, false),
            (WeightPolicy::Bf16(format), &bf16_values, true),
        ];
        for (policy, table, bf16) in cases {
            let embedding = policy.embedding(table.clone(), hidden);
            assert_eq!(matches!(embedding, Embedding::Bf16 { .. }), bf16, "{policy:?}");
            for t in 0..2 {
                let mut row = [f32::NAN; 3];
                embedding.row_into(t, &mut row);
                assert_eq!(row.as_slice(), &table[t * hidden..][..hidden], "{policy:?}, token {t}");
            }
        }
    }
}
