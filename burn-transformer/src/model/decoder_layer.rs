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

use crate::attention::{KvCache, LatentAttention, LatentKvCache, MultiHeadAttention};
use crate::ffn::{Moe, SwiGlu};
use crate::norm::RmsNorm;

/// The attention of one layer.
// One value per layer, built once: boxing the larger variant would buy nothing.
#[allow(clippy::large_enum_variant)]
#[derive(Module, Debug)]
pub enum SelfAttention {
    /// Multi-head attention with grouped key/value heads and RoPE (LLaMA, Mistral,
    /// Qwen2, Mixtral).
    Grouped(MultiHeadAttention),
    /// Multi-head latent attention with a compressed KV cache (DeepSeek-V2/V3).
    Latent(LatentAttention),
}

/// The feed-forward part (HF `mlp`) of one layer.
// One value per layer, built once: boxing the larger variant would buy nothing.
#[allow(clippy::large_enum_variant)]
#[derive(Module, Debug)]
pub enum Mlp {
    /// A gated feed-forward network (SwiGLU).
    Dense(SwiGlu),
    /// A sparse mixture of SwiGLU experts (Mixtral's `block_sparse_moe`, DeepSeek's
    /// MoE `mlp`). Its load-balancing loss, times the layer's `aux_loss_coef`, is
    /// returned in [`LayerAux`].
    Moe(Moe),
}

/// The per-layer decoding state matching a layer's [`SelfAttention`].
// One value per layer, built once: boxing the larger variant would buy nothing.
#[allow(clippy::large_enum_variant)]
#[derive(Clone, Debug)]
pub enum LayerCache {
    /// Keys and values (full, grouped or rolling over a sliding window).
    Kv(KvCache),
    /// The latent and the shared rotary key of every position (MLA).
    Latent(LatentKvCache),
}

impl LayerCache {
    /// The absolute position of the next token.
    pub fn position(&self) -> usize {
        match self {
            Self::Kv(cache) => cache.position(),
            Self::Latent(cache) => cache.position(),
        }
    }

    /// Bytes held by the cached tensors.
    pub fn bytes(&self) -> usize {
        match self {
            Self::Kv(cache) => cache.bytes(),
            Self::Latent(cache) => cache.bytes(),
        }
    }

    /// Keeps only the batch rows in `indices` (beam search).
    pub fn select_batch(&mut self, indices: Tensor<1, burn::tensor::Int>) {
        match self {
            Self::Kv(cache) => cache.select_batch(indices),
            Self::Latent(cache) => cache.select_batch(indices),
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
    /// Weight of an MoE `mlp`'s load-balancing loss in the training loss (HF
    /// `router_aux_loss_coef`); unused by dense layers.
    #[module(skip)]
    pub aux_loss_coef: f64,
}

impl DecoderLayer {
    /// The layer over a whole sequence, or over new positions with a cache.
    ///
    /// # Shapes
    /// - x: `[batch, seq, d_model]`
    /// - key_padding: `[batch, seq]`, `true` = padded (for the new positions only when
    ///   a cache is given)
    /// - output: `[batch, seq, d_model]`
    ///
    /// # Panics
    /// If `cache` is not of this layer's kind (make it with [`new_cache`](Self::new_cache)).
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
            (SelfAttention::Latent(attention), None) => attention.forward(normed, key_padding),
            (SelfAttention::Latent(attention), Some(LayerCache::Latent(cache))) => {
                attention.forward_cached(normed, cache, key_padding)
            }
            // A cache comes from `new_cache` of the same layer; any other pairing is a
            // programmer error that would silently drop the history.
            (_, Some(_)) => panic!("a layer was given a cache of another attention kind"),
        };
        let x = x + attended;
        let normed = self.post_attention_layernorm.forward(x.clone());
        let (fed, aux) = match &self.mlp {
            Mlp::Dense(ffn) => (ffn.forward(normed), LayerAux::default()),
            Mlp::Moe(moe) => {
                let output = moe.forward(normed);
                let coef = self.aux_loss_coef;
                let aux_loss = (coef != 0.0).then(|| output.aux_loss * coef);
                (output.output, LayerAux { aux_loss })
            }
        };
        (x + fed, aux)
    }

    /// An empty cache for this layer's attention.
    pub fn new_cache(&self) -> LayerCache {
        match &self.self_attn {
            SelfAttention::Grouped(attention) => {
                LayerCache::Kv(KvCache::with_window(attention.window()))
            }
            SelfAttention::Latent(_) => LayerCache::Latent(LatentKvCache::new()),
        }
    }
}
