//! Multi-head latent attention (MLA), from DeepSeek-V2
//! ([arXiv:2405.04434](https://arxiv.org/abs/2405.04434)) and DeepSeek-V3
//! ([arXiv:2412.19437](https://arxiv.org/abs/2412.19437)); equal to Hugging Face's
//! `DeepseekV3Attention`.
//!
//! Keys and values are not projected per head from the hidden states. Each token is
//! compressed into one small latent vector `c` (`kv_lora_rank` wide, after
//! `kv_a_layernorm`) and one rotary key `k_rope` (`qk_rope_head_dim` wide, shared by
//! every head); `kv_b_proj` expands the latent into each head's `k_nope` and `v`. RoPE is
//! *decoupled*: it rotates only `k_rope` and the query's rope part, so the latent stays
//! position-free.
//!
//! Two ways to compute the same attention:
//! - **expanded** (training, prefill): expand the latent into per-head keys
//!   `[k_nope ‖ k_rope]` (`d_qk = qk_nope + qk_rope`) and values (`d_v = v_head_dim`), then
//!   multi-head attention;
//! - **absorbed** (decoding): `q_nope·k_nope = q_nope·(W_uk c) = (W_ukᵀ q_nope)·c`, so the
//!   key half of `kv_b_proj` folds into the query, and `Σ p·(W_uv c) = W_uv (Σ p·c)` folds
//!   the value half into the output. The cached latent is then attended directly as MQA
//!   with one shared key/value head: keys `[c ‖ k_rope]` (`d_qk = kv_lora_rank +
//!   qk_rope_head_dim`, 576 for DeepSeek-V3) and values `c` (`d_v = kv_lora_rank`, 512).
//!   Both go through the attention core, so the fused kernel serves both.
//!
//! The [`LatentKvCache`] stores only `[c ‖ k_rope]` per token: the latent after
//! `kv_a_layernorm` (the norm depends on the token alone, and everything after it is
//! linear) and the key after RoPE (its rotation depends only on its own position). Both
//! paths read exactly these values, so cached decoding is exact.

mod cache;
mod config;
mod module;

pub use cache::{AbsorbedWeights, LatentKvCache};
pub use config::{CacheFootprint, LatentAttentionConfig};
pub use module::{LatentAttention, LatentPath};
