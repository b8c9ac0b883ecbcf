//! QK-norm: a norm of the projected queries and keys, which keeps the attention
//! logits bounded as training goes on (Dehghani et al., 2023; Wortsman et al., 2023).
//!
//! Three placements exist in the models people load:
//! - [`QkNormPlacement::PerHead`] (Qwen3, Gemma-3, Phi, StableLM, Command R+): each
//!   head's vector, normalized over `head_dim`;
//! - [`QkNormPlacement::AcrossHeads`] (OLMo-2): one norm over the whole projection
//!   (`n_heads · head_dim` for queries, `n_kv_heads · head_dim` for keys), before it
//!   is split into heads;
//! - [`QkNormPlacement::PerHeadAfterRope`] (Hunyuan, nanochat): per head, on the rotated
//!   vectors.
//!
//! The first two come before RoPE. The norm is an RMSNorm in most models and a
//! LayerNorm in Phi and Persimmon (with a shift) and in Command R+ and StableLM-2-12B,
//! whose heads each have weights of their own ([`QkNormConfig::weights_per_head`]);
//! the others share one weight between all heads, and nanochat's has none
//! ([`QkNormConfig::scale`]).

use burn::config::Config;
use burn::module::Module;
use burn::tensor::{Device, Tensor};

use crate::error::ConfigError;
use crate::norm::{
    LayerNormConfig, Norm, NormConfig, PerHeadNorm, PerHeadNormConfig, RmsNormConfig,
};

const MODULE: &str = "QkNormConfig";

/// Which vectors QK-norm normalizes.
#[derive(Config, Debug, Copy, PartialEq, Eq)]
pub enum QkNormPlacement {
    /// Each head's vector, normalized over `head_dim` (Qwen3 `q_norm` / `k_norm`).
    PerHead,
    /// The whole projection, before the split into heads (OLMo-2).
    AcrossHeads,
    /// Each head's vector as [`PerHead`](Self::PerHead), but after RoPE (Hunyuan's
    /// `query_layernorm` / `key_layernorm`).
    PerHeadAfterRope,
}

/// Which norm QK-norm applies.
#[derive(Config, Debug, Copy, PartialEq, Eq)]
pub enum QkNormKind {
    /// RMSNorm: scale only (Qwen3, OLMo-2, Gemma-3, Hunyuan).
    Rms,
    /// LayerNorm: subtract the mean, scale, and shift when [`QkNormConfig::bias`] says
    /// (Phi, Persimmon, Command R+, StableLM).
    Layer,
}

/// Configuration of QK-norm in an attention layer.
#[derive(Config, Debug)]
pub struct QkNormConfig {
    /// Which vectors are normalized. Default: per head.
    #[config(default = "QkNormPlacement::PerHead")]
    pub placement: QkNormPlacement,
    /// RMSNorm or LayerNorm. Default: RMSNorm.
    #[config(default = "QkNormKind::Rms")]
    pub kind: QkNormKind,
    /// Added to the mean square (or variance). Default: 1e-6.
    #[config(default = 1e-6)]
    pub eps: f64,
    /// Scale by `1 + weight` (Gemma's RMSNorm). Default: false.
    #[config(default = false)]
    pub unit_offset: bool,
    /// A learned shift after the scale (Phi's `nn.LayerNorm`); LayerNorm only.
    /// Default: false.
    #[config(default = false)]
    pub bias: bool,
    /// A learned scale (false: nanochat's QK-norm, which has no parameters).
    /// Default: true.
    #[config(default = true)]
    pub scale: bool,
    /// Each head has weights of its own, `[heads, head_dim]` (Command R+'s `q_norm`,
    /// StableLM's `q_layernorm.norms`), rather than one `[head_dim]` weight shared by
    /// every head; per-head placements only. Default: false.
    #[config(default = false)]
    pub weights_per_head: bool,
}

impl QkNormConfig {
    /// Checks the configuration.
    ///
    /// # Errors
    /// [`ConfigError::Invalid`] for a negative or non-finite `eps`, a shift on an
    /// RMSNorm, or weights per head on a norm across heads or without a scale.
    pub fn validate(&self) -> Result<(), ConfigError> {
        ConfigError::check_non_negative(MODULE, "eps", self.eps)?;
        if self.bias && self.kind == QkNormKind::Rms {
            return Err(ConfigError::Invalid {
                module: MODULE,
                field: "bias",
                reason: "an RMSNorm has no shift: set `kind` to `Layer`, or `bias` to false".into(),
            });
        }
        if self.weights_per_head && !self.scale {
            return Err(ConfigError::Invalid {
                module: MODULE,
                field: "weights_per_head",
                reason: "a norm without a scale has no weights to give each head: set \
                         `scale` to true, or `weights_per_head` to false"
                    .into(),
            });
        }
        if self.weights_per_head && self.placement == QkNormPlacement::AcrossHeads {
            return Err(ConfigError::Invalid {
                module: MODULE,
                field: "weights_per_head",
                reason: "a norm across heads has no heads of its own: use a per-head \
                         placement, or set `weights_per_head` to false"
                    .into(),
            });
        }
        Ok(())
    }

    /// The norms of queries and keys for `n_heads` query and `n_kv_heads` key heads
    /// of width `head_dim`.
    ///
    /// # Errors
    /// See [`QkNormConfig::validate`].
    pub(crate) fn try_init(
        &self,
        n_heads: usize,
        n_kv_heads: usize,
        head_dim: usize,
        device: &Device,
    ) -> Result<(QkNorm, QkNorm), ConfigError> {
        self.validate()?;
        let norm = |heads: usize| -> Result<QkNorm, ConfigError> {
            if self.weights_per_head {
                let config = PerHeadNormConfig::new(heads, head_dim)
                    .with_eps(self.eps)
                    .with_centered(self.kind == QkNormKind::Layer)
                    .with_bias(self.bias)
                    .with_unit_offset(self.unit_offset);
                return Ok(QkNorm::PerHead(config.try_init(device)?));
            }
            let width = match self.placement {
                QkNormPlacement::PerHead | QkNormPlacement::PerHeadAfterRope => head_dim,
                QkNormPlacement::AcrossHeads => heads * head_dim,
            };
            let config = match self.kind {
                QkNormKind::Rms => NormConfig::Rms(
                    RmsNormConfig::new(width)
                        .with_eps(self.eps)
                        .with_unit_offset(self.unit_offset)
                        .with_scale(self.scale),
                ),
                QkNormKind::Layer => NormConfig::Layer(
                    LayerNormConfig::new(width)
                        .with_eps(self.eps)
                        .with_bias(self.bias)
                        .with_unit_offset(self.unit_offset)
                        .with_scale(self.scale),
                ),
            };
            Ok(QkNorm::Shared(config.try_init(device)?))
        };
        Ok((norm(n_heads)?, norm(n_kv_heads)?))
    }
}

/// The QK-norm of the queries or of the keys.
#[derive(Module, Debug)]
pub enum QkNorm {
    /// One norm for every head (HF `q_norm.weight` `[head_dim]`), or for the whole
    /// projection across heads.
    Shared(Norm),
    /// Weights of its own for each head (HF `q_norm.weight` `[heads, head_dim]`).
    PerHead(PerHeadNorm),
}

impl QkNorm {
    /// Normalizes `x`.
    ///
    /// # Shapes
    /// - x: `[batch, heads, seq, head_dim]` (per-head placements) or
    ///   `[batch, seq, heads · head_dim]` (across heads, shared weights only)
    /// - output: the same
    pub fn forward<const D: usize>(&self, x: Tensor<D>) -> Tensor<D> {
        match self {
            Self::Shared(norm) => norm.forward(x),
            Self::PerHead(norm) => norm.forward(x),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A shift on an RMSNorm, or weights per head on a norm across heads, is refused
    /// naming the field and the fix.
    #[test]
    fn contradictory_settings_are_refused_by_name() {
        let shifted_rms = QkNormConfig::new().with_bias(true);
        let error = shifted_rms.validate().unwrap_err().to_string();
        assert!(
            error.contains("`bias`") && error.contains("Layer"),
            "{error}"
        );
        let bare_per_head = QkNormConfig::new()
            .with_scale(false)
            .with_weights_per_head(true);
        let error = bare_per_head.validate().unwrap_err().to_string();
        assert!(error.contains("`scale`"), "{error}");
        let across = QkNormConfig::new()
            .with_placement(QkNormPlacement::AcrossHeads)
            .with_weights_per_head(true);
        let error = across.validate().unwrap_err().to_string();
        assert!(error.contains("`weights_per_head`"), "{error}");
        let negative = QkNormConfig::new().with_eps(-1.0);
        assert!(negative.validate().is_err());
    }

    /// Each setting builds the norm it names, with the widths of its placement.
    #[test]
    fn each_setting_builds_its_norm() {
        let device = Device::flex();
        let shapes = |config: QkNormConfig| {
            let (q, k) = config.try_init(4, 2, 8, &device).unwrap();
            [q, k].map(|norm| match norm {
                QkNorm::Shared(Norm::Rms(norm)) => (
                    "rms",
                    norm.weight
                        .map_or(Vec::new(), |weight| weight.dims().to_vec()),
                    false,
                ),
                QkNorm::Shared(Norm::Layer(norm)) => (
                    "layer",
                    norm.weight.unwrap().dims().to_vec(),
                    norm.bias.is_some(),
                ),
                QkNorm::PerHead(norm) => (
                    if norm.centered {
                        "per-head layer"
                    } else {
                        "per-head rms"
                    },
                    norm.weight.dims().to_vec(),
                    norm.bias.is_some(),
                ),
            })
        };
        let layer = || QkNormConfig::new().with_kind(QkNormKind::Layer);
        assert_eq!(
            shapes(QkNormConfig::new().with_placement(QkNormPlacement::AcrossHeads)),
            [("rms", vec![32], false), ("rms", vec![16], false)]
        );
        assert_eq!(
            shapes(layer().with_bias(true)),
            [("layer", vec![8], true), ("layer", vec![8], true)]
        );
        assert_eq!(
            shapes(layer().with_weights_per_head(true)),
            [
                ("per-head layer", vec![4, 8], false),
                ("per-head layer", vec![2, 8], false)
            ]
        );
        assert_eq!(
            shapes(QkNormConfig::new().with_scale(false)),
            [("rms", vec![], false), ("rms", vec![], false)]
        );
        assert_eq!(
            shapes(QkNormConfig::new().with_weights_per_head(true)),
            [
                ("per-head rms", vec![4, 8], false),
                ("per-head rms", vec![2, 8], false)
            ]
        );
    }
}
