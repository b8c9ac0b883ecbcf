//! The configuration of multi-head latent attention: sizes, rotary embedding, softmax
//! scale, the path cached calls take, and the cache footprint it implies.

use std::fmt;

use burn::config::Config;
use burn::module::Initializer;
use burn::nn::{DropoutConfig, LinearConfig};
use burn::tensor::{DType, Device};

use super::module::{LatentAttention, LatentPath};
use crate::attention::{AttentionImpl, QueryTemperatureConfig};
use crate::error::ConfigError;
use crate::norm::RmsNormConfig;
use crate::position::{RopeConfig, RopeLayout, RopeScaling, yarn_get_mscale};

const MODULE: &str = "LatentAttentionConfig";

/// Configuration of [`LatentAttention`]. Field names follow Hugging Face's
/// `DeepseekV3Config`.
#[derive(Config, Debug)]
pub struct LatentAttentionConfig {
    /// Width of the hidden states (HF `hidden_size`).
    pub d_model: usize,
    /// Number of query heads (HF `num_attention_heads`).
    pub n_heads: usize,
    /// Width of the compressed key/value latent (HF `kv_lora_rank`).
    pub kv_lora_rank: usize,
    /// Per-head width of the position-free key part (HF `qk_nope_head_dim`).
    pub qk_nope_head_dim: usize,
    /// Width of the rotary key part, one head shared by all heads, and of each query
    /// head's rotary part (HF `qk_rope_head_dim`). Even.
    pub qk_rope_head_dim: usize,
    /// Per-head width of the values (HF `v_head_dim`).
    pub v_head_dim: usize,
    /// Rank of the low-rank query path `q_a_proj → q_a_layernorm → q_b_proj` (HF
    /// `q_lora_rank`). Default: none, a direct `q_proj` (DeepSeek-V2-Lite).
    #[config(default = "None")]
    pub q_lora_rank: Option<usize>,
    /// Bias on `q_a_proj` (or `q_proj`: never, as in HF), `kv_a_proj_with_mqa` and
    /// `o_proj` (HF `attention_bias`). Default: false.
    #[config(default = false)]
    pub attention_bias: bool,
    /// Epsilon of `q_a_layernorm` and `kv_a_layernorm`. Default: 1e-6 (HF builds these
    /// two norms with `DeepseekV3RMSNorm`'s default, not `rms_norm_eps`).
    #[config(default = 1e-6)]
    pub norm_eps: f64,
    /// The rotary embedding of the rope parts. Its `head_dim` must equal
    /// `qk_rope_head_dim` and it must rotate all of it. Default: theta 10000, no scaling,
    /// interleaved pairs (HF `rope_interleave: true`, DeepSeek's layout).
    #[config(default = "None")]
    pub rope: Option<RopeConfig>,
    /// Causal masking. Default: true (a decoder).
    #[config(default = true)]
    pub causal: bool,
    /// Scale of `q·kᵀ`. Default: `(qk_nope + qk_rope)^-0.5`, times `mscale²` when the
    /// rope scaling is YaRN with `mscale_all_dim` set, where `mscale = 0.1·mscale_all_dim·
    /// ln(factor) + 1` (HF `yarn_get_mscale`; 1 for `factor ≤ 1`).
    #[config(default = "None")]
    pub scale: Option<f64>,
    /// Queries scaled by position after RoPE, both parts alike (Mistral-4's
    /// `llama_4_scaling_beta`, see [`QueryTemperatureConfig`]). Default: none.
    #[config(default = "None")]
    pub query_temperature: Option<QueryTemperatureConfig>,
    /// Dropout on the attention probabilities during training (HF `attention_dropout`).
    /// Default: 0.
    #[config(default = 0.0)]
    pub dropout: f64,
    /// The path of [`LatentAttention::forward_cached`]. Default: automatic, per call
    /// (expanded for a prompt, absorbed for decoding steps).
    #[config(default = "LatentPath::Auto")]
    pub cached_path: LatentPath,
    /// Which attention implementation to use. Default: automatic.
    #[config(default = "AttentionImpl::Auto")]
    pub implementation: AttentionImpl,
    /// Initializer of the projection weights. Default: normal, std 0.02 (HF
    /// `initializer_range`).
    #[config(default = "Initializer::Normal { mean: 0.0, std: 0.02 }")]
    pub initializer: Initializer,
}

impl LatentAttentionConfig {
    /// Width of one head's query and key: `qk_nope_head_dim + qk_rope_head_dim`.
    pub fn qk_head_dim(&self) -> usize {
        self.qk_nope_head_dim + self.qk_rope_head_dim
    }

    /// The rotary embedding after defaults.
    pub fn rope_config(&self) -> RopeConfig {
        self.rope.clone().unwrap_or_else(|| {
            RopeConfig::new(self.qk_rope_head_dim).with_layout(RopeLayout::Interleaved)
        })
    }

    /// The softmax scale after defaults (see [`scale`](Self::scale)).
    pub fn softmax_scale(&self) -> f64 {
        if let Some(scale) = self.scale {
            return scale;
        }
        let base = 1.0 / (self.qk_head_dim() as f64).sqrt();
        // HF `yarn_apply_mscale`: only when `mscale_all_dim` is set and non-zero.
        match self.rope_config().scaling {
            RopeScaling::Yarn {
                factor,
                mscale_all_dim: Some(mscale_all_dim),
                ..
            } if mscale_all_dim != 0.0 => {
                let mscale = yarn_get_mscale(factor, mscale_all_dim);
                base * mscale * mscale
            }
            _ => base,
        }
    }

    /// Bytes per token and layer of this attention's latent cache, next to the caches
    /// the same heads would need as MHA (every head caches `qk_nope + qk_rope` key and
    /// `v_head_dim` value features) and as GQA with `gqa_kv_heads` key/value heads.
    pub fn cache_bytes_per_token(&self, dtype: DType, gqa_kv_heads: usize) -> CacheFootprint {
        let bytes = dtype.size();
        let per_head = self.qk_head_dim() + self.v_head_dim;
        CacheFootprint {
            latent: (self.kv_lora_rank + self.qk_rope_head_dim) * bytes,
            mha: self.n_heads * per_head * bytes,
            gqa: gqa_kv_heads * per_head * bytes,
            gqa_kv_heads,
        }
    }

    /// Checks the configuration without allocating anything.
    ///
    /// # Errors
    /// - [`ConfigError::Zero`]: a size is 0 (`q_lora_rank` when set, too).
    /// - [`ConfigError::Invalid`]: the rope's `head_dim` is not `qk_rope_head_dim`, it
    ///   rotates only part of it, or `scale` / `norm_eps` is not finite.
    /// - [`ConfigError::Probability`]: `dropout` outside [0, 1).
    /// - The rope's own errors ([`RopeConfig::validate`]), e.g. an odd `qk_rope_head_dim`.
    pub fn validate(&self) -> Result<(), ConfigError> {
        for (field, value) in [
            ("d_model", self.d_model),
            ("n_heads", self.n_heads),
            ("kv_lora_rank", self.kv_lora_rank),
            ("qk_nope_head_dim", self.qk_nope_head_dim),
            ("qk_rope_head_dim", self.qk_rope_head_dim),
            ("v_head_dim", self.v_head_dim),
        ] {
            ConfigError::check_positive(MODULE, field, value)?;
        }
        if let Some(rank) = self.q_lora_rank {
            ConfigError::check_positive(MODULE, "q_lora_rank", rank)?;
        }
        ConfigError::check_probability(MODULE, "dropout", self.dropout)?;
        ConfigError::check_non_negative(MODULE, "norm_eps", self.norm_eps)?;
        if let Some(scale) = self.scale {
            ConfigError::check_finite(MODULE, "scale", scale)?;
        }
        if let Some(temperature) = &self.query_temperature {
            temperature.validate()?;
        }
        let rope = self.rope_config();
        rope.validate()?;
        if rope.head_dim != self.qk_rope_head_dim || rope.rotary_dim() != rope.head_dim {
            return Err(ConfigError::Invalid {
                module: MODULE,
                field: "rope",
                reason: format!(
                    "must rotate exactly qk_rope_head_dim = {} features, got head_dim {} with \
                     rotary_dim {}",
                    self.qk_rope_head_dim,
                    rope.head_dim,
                    rope.rotary_dim()
                ),
            });
        }
        Ok(())
    }

    /// Builds the module, or returns why the configuration is invalid.
    ///
    /// # Errors
    /// See [`validate`](Self::validate).
    pub fn try_init(&self, device: &Device) -> Result<LatentAttention, ConfigError> {
        self.validate()?;
        let linear = |d_in: usize, d_out: usize, bias: bool| {
            LinearConfig::new(d_in, d_out)
                .with_bias(bias)
                .with_initializer(self.initializer.clone())
                .init(device)
        };
        let norm = |d: usize| RmsNormConfig::new(d).with_eps(self.norm_eps).init(device);
        let q_out = self.n_heads * self.qk_head_dim();
        let (q_proj, q_a_proj, q_a_layernorm, q_b_proj) = match self.q_lora_rank {
            None => (Some(linear(self.d_model, q_out, false)), None, None, None),
            Some(rank) => (
                None,
                Some(linear(self.d_model, rank, self.attention_bias)),
                Some(norm(rank)),
                Some(linear(rank, q_out, false)),
            ),
        };
        Ok(LatentAttention {
            q_proj,
            q_a_proj,
            q_a_layernorm,
            q_b_proj,
            kv_a_proj_with_mqa: linear(
                self.d_model,
                self.kv_lora_rank + self.qk_rope_head_dim,
                self.attention_bias,
            ),
            kv_a_layernorm: norm(self.kv_lora_rank),
            kv_b_proj: linear(
                self.kv_lora_rank,
                self.n_heads * (self.qk_nope_head_dim + self.v_head_dim),
                false,
            ),
            o_proj: linear(
                self.n_heads * self.v_head_dim,
                self.d_model,
                self.attention_bias,
            ),
            rope: self.rope_config().try_init(device)?,
            dropout: DropoutConfig::new(self.dropout).init(),
            n_heads: self.n_heads,
            kv_lora_rank: self.kv_lora_rank,
            qk_nope_head_dim: self.qk_nope_head_dim,
            qk_rope_head_dim: self.qk_rope_head_dim,
            v_head_dim: self.v_head_dim,
            causal: self.causal,
            scale: self.softmax_scale(),
            query_temperature: self.query_temperature.clone(),
            cached_path: self.cached_path,
            implementation: self.implementation,
        })
    }
}

crate::builders::init_or_panic!(LatentAttentionConfig => LatentAttention);

/// Cache bytes per token and layer: MLA's latent next to MHA and GQA with the same heads
/// (see [`LatentAttentionConfig::cache_bytes_per_token`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CacheFootprint {
    /// `(kv_lora_rank + qk_rope_head_dim) · bytes`.
    pub latent: usize,
    /// `n_heads · (qk_head_dim + v_head_dim) · bytes`.
    pub mha: usize,
    /// `gqa_kv_heads · (qk_head_dim + v_head_dim) · bytes`.
    pub gqa: usize,
    /// The number of key/value heads of the GQA comparison.
    pub gqa_kv_heads: usize,
}

impl fmt::Display for CacheFootprint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let ratio = |other: usize| other as f64 / self.latent.max(1) as f64;
        write!(
            f,
            "KV cache bytes per token and layer: MLA latent {} | GQA ({} kv heads) {} ({:.1}x) | \
             MHA {} ({:.1}x)",
            self.latent,
            self.gqa_kv_heads,
            self.gqa,
            ratio(self.gqa),
            self.mha,
            ratio(self.mha)
        )
    }
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;

    /// A config with every dimension different, so a mixed-up axis cannot pass.
    pub(in crate::attention::latent) fn small_config() -> LatentAttentionConfig {
        LatentAttentionConfig::new(40, 5, 12, 6, 4, 7)
            .with_q_lora_rank(Some(10))
            .with_attention_bias(true)
            .with_initializer(Initializer::Normal {
                mean: 0.0,
                std: 0.3,
            })
    }

    #[test]
    fn softmax_scale_folds_in_yarn_mscale_squared_when_mscale_all_dim_is_set() {
        let yarn = |mscale_all_dim| {
            RopeConfig::new(4)
                .with_layout(RopeLayout::Interleaved)
                .with_scaling(RopeScaling::Yarn {
                    factor: 4.0,
                    original_max_position_embeddings: Some(16),
                    attention_factor: None,
                    beta_fast: None,
                    beta_slow: None,
                    mscale: Some(0.707),
                    mscale_all_dim,
                    truncate: None,
                })
        };
        // qk_head_dim = 6 + 4.
        let base = 1.0 / 10f64.sqrt();
        assert_eq!(small_config().softmax_scale(), base);
        let plain = small_config().with_rope(Some(yarn(None)));
        assert_eq!(plain.softmax_scale(), base);
        let zero = small_config().with_rope(Some(yarn(Some(0.0))));
        assert_eq!(zero.softmax_scale(), base);
        let mscale = 0.1 * 0.5 * 4f64.ln() + 1.0;
        let scaled = small_config().with_rope(Some(yarn(Some(0.5))));
        assert!((scaled.softmax_scale() - base * mscale * mscale).abs() < 1e-15);
        assert_eq!(small_config().with_scale(Some(0.25)).softmax_scale(), 0.25);
    }

    #[test]
    fn invalid_configs_return_typed_errors() {
        assert_eq!(
            small_config().with_q_lora_rank(Some(0)).validate(),
            Err(ConfigError::Zero {
                module: MODULE,
                field: "q_lora_rank"
            })
        );
        assert!(matches!(
            small_config()
                .with_rope(Some(RopeConfig::new(8)))
                .validate(),
            Err(ConfigError::Invalid { field: "rope", .. })
        ));
        assert!(matches!(
            LatentAttentionConfig::new(8, 2, 4, 4, 3, 4).validate(),
            Err(ConfigError::Odd { .. })
        ));
        assert!(matches!(
            small_config().with_dropout(1.0).validate(),
            Err(ConfigError::Probability { .. })
        ));
    }

    #[test]
    #[should_panic(expected = "LatentAttentionConfig: `kv_lora_rank` must be greater than 0")]
    fn init_panics_with_the_validation_message() {
        LatentAttentionConfig::new(8, 2, 0, 4, 4, 4).init(&Device::flex());
    }
}
