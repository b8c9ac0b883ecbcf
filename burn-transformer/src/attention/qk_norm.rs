//! QK-norm: an RMSNorm of the projected queries and keys, which keeps the attention
//! logits bounded as training goes on (Dehghani et al., 2023; Wortsman et al., 2023).
//!
//! Three placements exist in the models people load:
//! - [`QkNormPlacement::PerHead`] (Qwen3, Gemma-3): one norm of width `head_dim`,
//!   shared by every head, applied to each head's vector;
//! - [`QkNormPlacement::AcrossHeads`] (OLMo-2): one norm over the whole projection
//!   (`n_heads · head_dim` for queries, `n_kv_heads · head_dim` for keys), before it
//!   is split into heads;
//! - [`QkNormPlacement::PerHeadAfterRope`] (Hunyuan): per head, on the rotated vectors.
//!
//! The first two come before RoPE.

use burn::config::Config;
use burn::tensor::Device;

use crate::error::ConfigError;
use crate::norm::{RmsNorm, RmsNormConfig};

/// Which vectors QK-norm normalizes.
#[derive(Config, Debug, Copy, PartialEq, Eq)]
pub enum QkNormPlacement {
    /// Each head's vector, with one weight of width `head_dim` (Qwen3 `q_norm` /
    /// `k_norm`).
    PerHead,
    /// The whole projection, before the split into heads (OLMo-2).
    AcrossHeads,
    /// Each head's vector as [`PerHead`](Self::PerHead), but after RoPE (Hunyuan's
    /// `query_layernorm` / `key_layernorm`).
    PerHeadAfterRope,
}

/// Configuration of QK-norm in an attention layer.
#[derive(Config, Debug)]
pub struct QkNormConfig {
    /// Which vectors are normalized. Default: per head.
    #[config(default = "QkNormPlacement::PerHead")]
    pub placement: QkNormPlacement,
    /// Added to the mean square. Default: 1e-6.
    #[config(default = 1e-6)]
    pub eps: f64,
    /// Scale by `1 + weight` (Gemma's RMSNorm). Default: false.
    #[config(default = false)]
    pub unit_offset: bool,
}

impl QkNormConfig {
    /// The norms of queries and keys for `n_heads` query and `n_kv_heads` key heads
    /// of width `head_dim`.
    ///
    /// # Errors
    /// [`ConfigError`] for a negative or non-finite `eps`.
    pub(crate) fn try_init(
        &self,
        n_heads: usize,
        n_kv_heads: usize,
        head_dim: usize,
        device: &Device,
    ) -> Result<(RmsNorm, RmsNorm), ConfigError> {
        let norm = |width: usize| {
            RmsNormConfig::new(width)
                .with_eps(self.eps)
                .with_unit_offset(self.unit_offset)
                .try_init(device)
        };
        Ok(match self.placement {
            QkNormPlacement::PerHead | QkNormPlacement::PerHeadAfterRope => {
                (norm(head_dim)?, norm(head_dim)?)
            }
            QkNormPlacement::AcrossHeads => {
                (norm(n_heads * head_dim)?, norm(n_kv_heads * head_dim)?)
            }
        })
    }
}
