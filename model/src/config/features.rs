//! What sets an architecture's forward pass apart from Llama's: the switches the engines
//! read, and that the config readers (Gemma 3's among them) set.

use super::rope_scaling::RopeScaling;

/// The MLP's activation.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Activation {
    /// SiLU (Llama, Mistral, Qwen).
    #[default]
    Silu,
    /// GELU with the tanh approximation (`gelu_pytorch_tanh`, Gemma).
    GeluTanh,
    /// Exact GELU (`gelu`).
    Gelu,
}

/// What sets an architecture's forward pass apart from Llama's; the default is Llama's.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct ArchFeatures {
    /// RMS norms over each head's q and k, after the projection and before RoPE (Qwen3,
    /// Gemma 3).
    pub qk_norm: bool,
    /// RMS norms scale by `1 + w`, computed in float32 (Gemma).
    pub norm_plus_one: bool,
    /// Norms after attention and around the MLP as well as before (Gemma's
    /// `post_attention_layernorm`, `pre_feedforward_layernorm`, `post_feedforward_layernorm`).
    pub sandwich_norms: bool,
    /// Embeddings multiplied by √hidden, cast to the run's dtype (Gemma).
    pub scale_embeddings: bool,
    pub activation: Activation,
    /// Attention scores scaled by `query_pre_attn_scalar^-1/2` instead of `head_dim^-1/2`.
    pub query_pre_attn_scalar: Option<f64>,
    /// Logits become `c * tanh(logits / c)`.
    pub final_logit_softcapping: Option<f64>,
    /// Per layer, whether [`crate::config::LlamaConfig::sliding_window`] applies to it; empty: it applies to
    /// every layer (Mistral). Gemma 3 interleaves windowed ("sliding_attention") layers with
    /// global ones.
    pub sliding_layers: Vec<bool>,
    /// RoPE base and scaling of the windowed layers where they differ from the global
    /// layers' (Gemma 3's `rope_local_base_freq`).
    pub local_rope: Option<(f64, RopeScaling)>,
    /// The text model of a `Gemma3ForConditionalGeneration` checkpoint: its weights are
    /// named under `model.language_model.` or `language_model.model.`, and its vision
    /// tower's are not used.
    pub multimodal_wrapper: bool,
}
