//! A Llama with trainable weights: the same forward pass as [`specd_model::libtorch`] over whole
//! windows `[batch, time]`, with Hugging Face parameter names so the weights export as they
//! are. Matmuls may run in bfloat16 (the CPU's AMX units make training several times
//! faster); weights, norms and the residual stream stay in float32.

use specd_model::LlamaConfig;
use specd_model::libtorch::rms_norm;
use specd_model::rope::{Rope, apply_rope};
use tch::nn::{self, Init};
use tch::{Kind, Tensor};

use crate::error::Result;

#[derive(Debug)]
struct Layer {
    attn_norm: Tensor,
    q: Tensor,
    k: Tensor,
    v: Tensor,
    o: Tensor,
    mlp_norm: Tensor,
    gate: Tensor,
    up: Tensor,
    down: Tensor,
}

/// The model; its variables live in the `VarStore` it was built on.
#[derive(Debug)]
pub struct TrainableLlama {
    cfg: LlamaConfig,
    embed: Tensor,
    layers: Vec<Layer>,
    norm: Tensor,
    rope: Rope,
}

impl TrainableLlama {
    /// Declares the variables under `root` (names as in a Hugging Face checkpoint). Weights
    /// start as N(0, 0.02²); the projections into the residual stream are scaled down by
    /// √(2 · layers) so that deep stacks start near the identity (GPT-2's initialisation).
    pub fn new(root: &nn::Path, cfg: &LlamaConfig) -> Result<Self> {
        let (h, i, v) = (cfg.hidden_size as i64, cfg.intermediate_size as i64, cfg.vocab_size as i64);
        let qd = (cfg.num_attention_heads * cfg.head_dim) as i64;
        let kvd = (cfg.num_key_value_heads * cfg.head_dim) as i64;
        let normal = |std: f64| Init::Randn { mean: 0.0, stdev: std };
        let residual_std = 0.02 / (2.0 * cfg.num_hidden_layers as f64).sqrt();
        let model = root / "model";
        let embed = (&model / "embed_tokens").f_var("weight", &[v, h], normal(0.02))?;
        let mut layers = Vec::with_capacity(cfg.num_hidden_layers);
        for l in 0..cfg.num_hidden_layers {
            let p = &model / "layers" / l;
            let a = &p / "self_attn";
            let m = &p / "mlp";
            layers.push(Layer {
                attn_norm: (&p / "input_layernorm").f_var("weight", &[h], Init::Const(1.0))?,
                q: (&a / "q_proj").f_var("weight", &[qd, h], normal(0.02))?,
                k: (&a / "k_proj").f_var("weight", &[kvd, h], normal(0.02))?,
                v: (&a / "v_proj").f_var("weight", &[kvd, h], normal(0.02))?,
                o: (&a / "o_proj").f_var("weight", &[h, qd], normal(residual_std))?,
                mlp_norm: (&p / "post_attention_layernorm").f_var("weight", &[h], Init::Const(1.0))?,
                gate: (&m / "gate_proj").f_var("weight", &[i, h], normal(0.02))?,
                up: (&m / "up_proj").f_var("weight", &[i, h], normal(0.02))?,
                down: (&m / "down_proj").f_var("weight", &[h, i], normal(residual_std))?,
            });
        }
        let norm = (&model / "norm").f_var("weight", &[h], Init::Const(1.0))?;
        let rope = Rope::new(cfg.head_dim, cfg.rope_theta, &cfg.rope_scaling, root.device())?;
        Ok(Self { cfg: cfg.clone(), embed, layers, norm, rope })
    }

    /// Logits `[batch, time, vocab]` in float32 for token ids `[batch, time]` (int64), each
    /// row causal from position 0. `compute` is the dtype of the matmuls.
    pub fn forward(&self, ids: &Tensor, compute: Kind) -> Result<Tensor> {
        self.head(&self.last_states(ids, compute)?, compute)
    }

    /// The logits of [`Self::forward`] from the states [`Self::last_states`] returned: the
    /// vocabulary's head alone, a small share of a pass's work.
    pub fn head(&self, states: &Tensor, compute: Kind) -> Result<Tensor> {
        let states = states.f_to_kind(compute)?;
        Ok(states.f_linear(&self.embed.f_to_kind(compute)?, None::<&Tensor>)?.f_to_kind(Kind::Float)?)
    }

    /// The last layer's states after the final norm, `[batch, time, hidden]` in float32:
    /// everything [`Self::forward`] computes but the vocabulary's head.
    pub fn last_states(&self, ids: &Tensor, compute: Kind) -> Result<Tensor> {
        let size = ids.size();
        let (b, t) = (size[0], size[1]);
        let cfg = &self.cfg;
        let (heads, kv_heads, hd) =
            (cfg.num_attention_heads as i64, cfg.num_key_value_heads as i64, cfg.head_dim as i64);
        let eps = cfg.rms_norm_eps;
        let w = |x: &Tensor| x.f_to_kind(compute);
        let (cos, sin) = self.rope.cos_sin(0, t as usize, compute)?;
        let mut x = Tensor::f_embedding(&self.embed, ids, -1, false, false)?;
        for l in &self.layers {
            let hs = rms_norm(&x, &l.attn_norm, eps)?.f_to_kind(compute)?;
            let split = |proj: &Tensor, n: i64| -> Result<Tensor> {
                Ok(hs.f_linear(&w(proj)?, None::<&Tensor>)?.f_view([b, t, n, hd])?.f_transpose(1, 2)?)
            };
            let q = apply_rope(&split(&l.q, heads)?, &cos, &sin)?;
            let k = apply_rope(&split(&l.k, kv_heads)?, &cos, &sin)?;
            let v = split(&l.v, kv_heads)?;
            let attn = Tensor::f_scaled_dot_product_attention(
                &q,
                &k,
                &v,
                None::<&Tensor>,
                0.0,
                true,
                None::<f64>,
                heads != kv_heads,
            )?
            .f_transpose(1, 2)?
            .f_reshape([b, t, heads * hd])?
            .f_linear(&w(&l.o)?, None::<&Tensor>)?;
            x = x.f_add(&attn.f_to_kind(Kind::Float)?)?;
            let hs = rms_norm(&x, &l.mlp_norm, eps)?.f_to_kind(compute)?;
            let gate = hs.f_linear(&w(&l.gate)?, None::<&Tensor>)?.f_silu()?;
            let up = hs.f_linear(&w(&l.up)?, None::<&Tensor>)?;
            let mlp = gate.f_mul(&up)?.f_linear(&w(&l.down)?, None::<&Tensor>)?;
            x = x.f_add(&mlp.f_to_kind(Kind::Float)?)?;
        }
        Ok(rms_norm(&x, &self.norm, eps)?)
    }
}
