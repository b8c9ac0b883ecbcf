//! One layer of a LLaMA-family decoder: Pre-LN self-attention, then a Pre-LN
//! feed-forward, each added back to the residual stream.
//!
//! ```text
//! x ─► input_layernorm ─► self_attn ─► + ─► post_attention_layernorm ─► mlp ─► + ─►
//! └──────────────────────────────────┘  └─────────────────────────────────────┘
//! ```
//!
//! Field names are those of Hugging Face's `LlamaDecoderLayer` (and its Mistral, Qwen2,
//! Mixtral and DeepSeek cousins), so a checkpoint loads by name.

use burn::module::Module;
use burn::tensor::{Bool, Tensor};

use crate::attention::{KvCache, MultiHeadAttention};
use crate::ffn::SwiGlu;
use crate::norm::RmsNorm;

/// The attention of one layer.
#[derive(Module, Debug)]
pub enum SelfAttention {
    /// Multi-head attention with grouped key/value heads and RoPE (LLaMA, Mistral,
    /// Qwen2, Mixtral).
    Grouped(MultiHeadAttention),
}

/// The feed-forward part (HF `mlp`) of one layer.
#[derive(Module, Debug)]
pub enum Mlp {
    /// A gated feed-forward network (SwiGLU).
    Dense(SwiGlu),
}

/// The per-layer decoding state matching a layer's [`SelfAttention`].
#[derive(Clone, Debug)]
pub enum LayerCache {
    /// Keys and values (full, grouped or rolling over a sliding window).
    Kv(KvCache),
}

impl LayerCache {
    /// The absolute position of the next token.
    pub fn position(&self) -> usize {
        match self {
            Self::Kv(cache) => cache.position(),
        }
    }

    /// Bytes held by the cached tensors.
    pub fn bytes(&self) -> usize {
        match self {
            Self::Kv(cache) => cache.bytes(),
        }
    }

    /// Keeps only the batch rows in `indices` (beam search).
    pub fn select_batch(&mut self, indices: Tensor<1, burn::tensor::Int>) {
        match self {
            Self::Kv(cache) => cache.select_batch(indices),
        }
    }
}

/// What a layer's feed-forward part returns besides its output.
#[derive(Debug, Clone, Default)]
pub struct LayerAux {
    /// The layer's load-balancing loss, already weighted (MoE layers only).
    pub aux_loss: Option<Tensor<1>>,
}

/// A Pre-LN decoder layer with Hugging Face's names.
#[derive(Module, Debug)]
pub struct DecoderLayer {
    /// Self-attention.
    pub self_attn: SelfAttention,
    /// Feed-forward (dense or mixture of experts).
    pub mlp: Mlp,
    /// Norm before the attention.
    pub input_layernorm: RmsNorm,
    /// Norm before the feed-forward.
    pub post_attention_layernorm: RmsNorm,
}

impl DecoderLayer {
    /// The layer over a whole sequence, or over new positions with a cache.
    ///
    /// # Shapes
    /// - x: `[batch, seq, d_model]`
    /// - key_padding: `[batch, seq]`, `true` = padded (for the new positions only when
    ///   a cache is given)
    /// - output: `[batch, seq, d_model]`
    pub fn forward(
        &self,
        x: Tensor<3>,
        key_padding: Option<Tensor<2, Bool>>,
        cache: Option<&mut LayerCache>,
    ) -> (Tensor<3>, LayerAux) {
        let normed = self.input_layernorm.forward(x.clone());
        let attended = match (&self.self_attn, cache) {
            (SelfAttention::Grouped(attention), None) => attention.forward(normed, key_padding),
            (SelfAttention::Grouped(attention), Some(LayerCache::Kv(cache))) => {
                attention.forward_cached(normed, cache, key_padding)
            }
        };
        let x = x + attended;
        let normed = self.post_attention_layernorm.forward(x.clone());
        let (fed, aux) = match &self.mlp {
            Mlp::Dense(ffn) => (ffn.forward(normed), LayerAux::default()),
        };
        (x + fed, aux)
    }

    /// An empty cache for this layer's attention.
    pub fn new_cache(&self) -> LayerCache {
        match &self.self_attn {
            SelfAttention::Grouped(attention) => {
                LayerCache::Kv(KvCache::with_window(attention.window()))
            }
        }
    }
}
