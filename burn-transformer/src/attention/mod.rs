//! Attention: the one core function, and the modules built on it.

mod cache;
mod core;
mod latent;
mod linear;
mod multi_head;
mod qk_norm;
mod query_temperature;
mod self_attention;
mod shared_kv;

pub use self::cache::{CrossKvCache, KvCache};
pub use self::core::{
    AttentionImpl, AttentionOptions, DECODE_QUERIES, attention, attention_weights,
    attention_with_weights, reference_attention,
};
pub use self::latent::{
    AbsorbedWeights, CacheFootprint, LatentAttention, LatentAttentionConfig, LatentKvCache,
    LatentPath,
};
pub use self::linear::{GatedDeltaNet, GatedDeltaNetConfig, RecurrentCache, ShortConv};
pub use self::multi_head::{MultiHeadAttention, MultiHeadAttentionConfig};
pub use self::qk_norm::{QkNorm, QkNormConfig, QkNormKind, QkNormPlacement};
pub use self::query_temperature::QueryTemperatureConfig;
pub use self::self_attention::{SelfAttention, SelfAttentionCache, SelfAttentionConfig};
pub use self::shared_kv::{AttendedKv, KvSharing, SharedKv};
pub use crate::ops::mask::padding_mask_from_lengths;
