//! Attention: the one core function, and the modules built on it.

mod cache;
mod core;
mod latent;
mod multi_head;

pub use self::cache::{CrossKvCache, KvCache};
pub use self::core::{
    AttentionImpl, AttentionOptions, attention, attention_weights, is_hidden,
    padding_mask_from_lengths, reference_attention, structural_mask,
};
pub use self::latent::{
    AbsorbedWeights, CacheFootprint, LatentAttention, LatentAttentionConfig, LatentKvCache,
    LatentPath,
};
pub use self::multi_head::{MultiHeadAttention, MultiHeadAttentionConfig};

#[cfg(test)]
pub(crate) use self::core::composed_softmax;
