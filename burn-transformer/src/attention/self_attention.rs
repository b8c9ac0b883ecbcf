//! A choice of self-attention, for blocks and models configured at run time: grouped
//! multi-head attention (MHA/GQA/MQA), multi-head latent attention (MLA) or a linear
//! attention (Gated DeltaNet), with the decoding cache or state that matches each.

use burn::config::Config;
use burn::module::Module;
use burn::tensor::{Bool, Device, Int, Tensor};

use super::{
    AttentionImpl, GatedDeltaNet, GatedDeltaNetConfig, KvCache, LatentAttention,
    LatentAttentionConfig, LatentKvCache, MultiHeadAttention, MultiHeadAttentionConfig,
    RecurrentCache, SharedKv,
};
use crate::error::ConfigError;

/// Which self-attention a block uses.
#[derive(Config, Debug)]
pub enum SelfAttentionConfig {
    /// Multi-head attention with grouped key/value heads (MHA, GQA, MQA).
    MultiHead(MultiHeadAttentionConfig),
    /// Multi-head latent attention with a compressed KV cache (DeepSeek-V2/V3).
    Latent(LatentAttentionConfig),
    /// Gated DeltaNet, a linear attention with a fixed-size state (Qwen3-Next's and
    /// Qwen3.5's `linear_attention` layers).
    GatedDeltaNet(GatedDeltaNetConfig),
}

impl SelfAttentionConfig {
    /// The model width the attention reads and writes.
    pub fn d_model(&self) -> usize {
        match self {
            Self::MultiHead(config) => config.d_model,
            Self::Latent(config) => config.d_model,
            Self::GatedDeltaNet(config) => config.d_model,
        }
    }

    /// Checks the configuration.
    ///
    /// # Errors
    /// The error of the chosen attention's `validate`.
    pub fn validate(&self) -> Result<(), ConfigError> {
        match self {
            Self::MultiHead(config) => config.validate(),
            Self::Latent(config) => config.validate(),
            Self::GatedDeltaNet(config) => config.validate(),
        }
    }

    /// Builds the attention, or returns why the configuration is invalid.
    ///
    /// # Errors
    /// See [`validate`](Self::validate).
    pub fn try_init(&self, device: &Device) -> Result<SelfAttention, ConfigError> {
        Ok(match self {
            Self::MultiHead(config) => SelfAttention::MultiHead(config.try_init(device)?),
            Self::Latent(config) => SelfAttention::Latent(config.try_init(device)?),
            Self::GatedDeltaNet(config) => SelfAttention::GatedDeltaNet(config.try_init(device)?),
        })
    }
}

/// A self-attention chosen at run time.
///
/// Burn names an enum module's parameters with the variant
/// (`self_attn.MultiHead.q_proj.weight`); Hugging Face keys have no such level, and
/// the checkpoint loader skips it. (Hugging Face names a linear attention
/// `linear_attn`; the loaders of its families rename it.)
// One per block, built once: boxing the larger variant would buy nothing.
#[allow(clippy::large_enum_variant)]
#[derive(Module, Debug)]
pub enum SelfAttention {
    /// Multi-head attention with grouped key/value heads.
    MultiHead(MultiHeadAttention),
    /// Multi-head latent attention.
    Latent(LatentAttention),
    /// Gated DeltaNet.
    GatedDeltaNet(GatedDeltaNet),
}

/// The decoding state of a [`SelfAttention`], of the matching kind.
// One per block, built once: boxing the larger variant would buy nothing.
#[allow(clippy::large_enum_variant)]
#[derive(Clone, Debug)]
pub enum SelfAttentionCache {
    /// Keys and values (full, grouped or rolling over a sliding window).
    Kv(KvCache),
    /// The latent and the shared rotary key of every position.
    Latent(LatentKvCache),
    /// A linear attention's fixed-size state.
    Recurrent(RecurrentCache),
}

impl SelfAttentionCache {
    /// The absolute position of the next token.
    pub fn position(&self) -> usize {
        match self {
            Self::Kv(cache) => cache.position(),
            Self::Latent(cache) => cache.position(),
            Self::Recurrent(cache) => cache.position(),
        }
    }

    /// Bytes held by the cached tensors.
    pub fn bytes(&self) -> usize {
        match self {
            Self::Kv(cache) => cache.bytes(),
            Self::Latent(cache) => cache.bytes(),
            Self::Recurrent(cache) => cache.bytes(),
        }
    }

    /// Keeps only the batch rows in `indices`, in that order (beam search).
    ///
    /// # Shapes
    /// - indices: `[new_batch]`
    pub fn select_batch(&mut self, indices: Tensor<1, Int>) {
        match self {
            Self::Kv(cache) => cache.select_batch(indices),
            Self::Latent(cache) => cache.select_batch(indices),
            Self::Recurrent(cache) => cache.select_batch(indices),
        }
    }
}

impl SelfAttention {
    /// Self-attention over a whole sequence.
    ///
    /// # Shapes
    /// - x: `[batch, seq, d_model]`
    /// - key_padding: `[batch, seq]`, `true` for padded positions
    /// - output: `[batch, seq, d_model]`
    ///
    /// # Panics
    /// If a grouped attention reuses another layer's keys and values (see
    /// [`forward_sharing`](Self::forward_sharing)).
    pub fn forward(&self, x: Tensor<3>, key_padding: Option<Tensor<2, Bool>>) -> Tensor<3> {
        self.forward_sharing(x, key_padding, &mut SharedKv::default())
    }

    /// [`forward`](Self::forward) that shares keys and values with the other layers of
    /// a pass through `shared` (grouped attention, [`KvSharing`](super::KvSharing);
    /// latent and linear attention share none).
    ///
    /// # Shapes
    /// As [`forward`](Self::forward).
    ///
    /// # Panics
    /// If the layer reuses a slot that nothing published in `shared`.
    pub fn forward_sharing(
        &self,
        x: Tensor<3>,
        key_padding: Option<Tensor<2, Bool>>,
        shared: &mut SharedKv,
    ) -> Tensor<3> {
        match self {
            Self::MultiHead(attention) => attention.forward_sharing(x, key_padding, shared),
            Self::Latent(attention) => attention.forward(x, key_padding),
            Self::GatedDeltaNet(attention) => attention.forward(x, key_padding),
        }
    }

    /// Self-attention over new positions, reading and extending `cache`.
    ///
    /// # Shapes
    /// - x: `[batch, new, d_model]`
    /// - key_padding: `[batch, new]` for the new positions, `true` = padded
    /// - output: `[batch, new, d_model]`
    ///
    /// # Panics
    /// If `cache` is of the other kind (make it with [`new_cache`](Self::new_cache)): a
    /// mismatched cache would silently drop the history; as [`forward`](Self::forward).
    pub fn forward_cached(
        &self,
        x: Tensor<3>,
        cache: &mut SelfAttentionCache,
        key_padding: Option<Tensor<2, Bool>>,
    ) -> Tensor<3> {
        self.forward_cached_sharing(x, cache, key_padding, &mut SharedKv::default())
    }

    /// [`forward_cached`](Self::forward_cached) that shares keys and values through
    /// `shared` as [`forward_sharing`](Self::forward_sharing) does.
    ///
    /// # Shapes
    /// As [`forward_cached`](Self::forward_cached).
    ///
    /// # Panics
    /// As [`forward_cached`](Self::forward_cached) and
    /// [`forward_sharing`](Self::forward_sharing).
    pub fn forward_cached_sharing(
        &self,
        x: Tensor<3>,
        cache: &mut SelfAttentionCache,
        key_padding: Option<Tensor<2, Bool>>,
        shared: &mut SharedKv,
    ) -> Tensor<3> {
        match (self, cache) {
            (Self::MultiHead(attention), SelfAttentionCache::Kv(cache)) => {
                attention.forward_cached_sharing(x, cache, key_padding, shared)
            }
            (Self::Latent(attention), SelfAttentionCache::Latent(cache)) => {
                attention.forward_cached(x, cache, key_padding)
            }
            (Self::GatedDeltaNet(attention), SelfAttentionCache::Recurrent(cache)) => {
                attention.forward_cached(x, cache, key_padding)
            }
            _ => panic!("self-attention was given a cache of another attention kind"),
        }
    }

    /// [`forward`](Self::forward) that also returns the attention probabilities
    /// `[batch, n_heads, seq, seq]` (reference path, no dropout), for inspection; a
    /// linear attention returns its mixing weights
    /// ([`GatedDeltaNet::forward_with_weights`]), one row per value head.
    ///
    /// # Shapes
    /// - as [`forward`](Self::forward), plus the weights `[batch, n_heads, seq, seq]`
    ///
    /// # Panics
    /// As [`forward`](Self::forward).
    pub fn forward_with_weights(
        &self,
        x: Tensor<3>,
        key_padding: Option<Tensor<2, Bool>>,
    ) -> (Tensor<3>, Tensor<4>) {
        self.forward_with_weights_sharing(x, key_padding, &mut SharedKv::default())
    }

    /// [`forward_with_weights`](Self::forward_with_weights) that shares keys and values
    /// through `shared` as [`forward_sharing`](Self::forward_sharing) does.
    ///
    /// # Shapes
    /// As [`forward_with_weights`](Self::forward_with_weights).
    ///
    /// # Panics
    /// As [`forward_sharing`](Self::forward_sharing).
    pub fn forward_with_weights_sharing(
        &self,
        x: Tensor<3>,
        key_padding: Option<Tensor<2, Bool>>,
        shared: &mut SharedKv,
    ) -> (Tensor<3>, Tensor<4>) {
        match self {
            Self::MultiHead(attention) => {
                attention.forward_with_weights_sharing(x, key_padding, shared)
            }
            Self::Latent(attention) => attention.forward_with_weights(x, key_padding),
            Self::GatedDeltaNet(attention) => attention.forward_with_weights(x, key_padding),
        }
    }

    /// An empty cache of the matching kind (rolling for a sliding window, a
    /// fixed-size state for a linear attention).
    pub fn new_cache(&self) -> SelfAttentionCache {
        match self {
            Self::MultiHead(attention) => {
                SelfAttentionCache::Kv(KvCache::with_window(attention.window()))
            }
            Self::Latent(_) => SelfAttentionCache::Latent(LatentKvCache::new()),
            Self::GatedDeltaNet(_) => SelfAttentionCache::Recurrent(RecurrentCache::new()),
        }
    }

    /// The attention with another implementation of the attention core, weights kept.
    pub fn with_implementation(self, implementation: AttentionImpl) -> Self {
        match self {
            Self::MultiHead(attention) => {
                Self::MultiHead(attention.with_implementation(implementation))
            }
            Self::Latent(attention) => Self::Latent(attention.with_implementation(implementation)),
            // A linear attention calls no attention core.
            Self::GatedDeltaNet(attention) => Self::GatedDeltaNet(attention),
        }
    }
}
