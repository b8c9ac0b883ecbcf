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

use std::fmt;

use burn::config::Config;
use burn::module::{Initializer, Module};
use burn::nn::{Dropout, DropoutConfig, Linear, LinearConfig};
use burn::tensor::{Bool, DType, Device, Int, Tensor};
use serde_json::{Map, Value};

use super::core::{AttentionImpl, AttentionOptions, attention, attention_with_weights};
use crate::error::ConfigError;
use crate::norm::{RmsNorm, RmsNormConfig};
use crate::position::{Rope, RopeConfig, RopeLayout, RopeScaling};

const MODULE: &str = "LatentAttentionConfig";

/// Which computation a cached call of [`LatentAttention`] uses.
#[derive(Config, Debug, Copy, PartialEq, Eq)]
pub enum LatentPath {
    /// Expand the cached latent into per-head keys and values (`d_qk = qk_nope +
    /// qk_rope`, `d_v = v_head_dim`). Fewer FLOPs when many queries arrive at once
    /// (prefill).
    Expanded,
    /// Fold `kv_b_proj` into the query and the output and attend over the latent as MQA
    /// (`d_qk = kv_lora_rank + qk_rope`, `d_v = kv_lora_rank`). Reads only the compact
    /// cache: the fast path for decoding.
    Absorbed,
}

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
    /// Dropout on the attention probabilities during training (HF `attention_dropout`).
    /// Default: 0.
    #[config(default = 0.0)]
    pub dropout: f64,
    /// The path of [`LatentAttention::forward_cached`]. Default: absorbed.
    #[config(default = "LatentPath::Absorbed")]
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
    /// DeepSeek-V3 (and R1): 7168 wide, 128 heads, q rank 1536, kv rank 512, head dims
    /// 128 + 64 (rope) for q·k and 128 for v, YaRN ×40 from 4096 positions.
    pub fn deepseek_v3() -> Self {
        Self::new(7168, 128, 512, 128, 64, 128)
            .with_q_lora_rank(Some(1536))
            .with_rope(Some(deepseek_rope(163_840, 1.0, 1.0)))
    }

    /// DeepSeek-V2-Lite: 2048 wide, 16 heads, a direct `q_proj`, kv rank 512, the same
    /// head dims as V3, YaRN ×40 with `mscale = mscale_all_dim = 0.707`.
    pub fn deepseek_v2_lite() -> Self {
        Self::new(2048, 16, 512, 128, 64, 128).with_rope(Some(deepseek_rope(163_840, 0.707, 0.707)))
    }

    /// Reads the attention of a Hugging Face DeepSeek-V2/V3 `config.json`:
    /// `hidden_size`, `num_attention_heads`, `kv_lora_rank`, `qk_nope_head_dim`,
    /// `qk_rope_head_dim`, `v_head_dim`, `q_lora_rank` (null for a direct `q_proj`),
    /// `attention_bias` (default false), `attention_dropout` (default 0),
    /// `rope_interleave` (default true) and the rotary embedding through
    /// [`RopeConfig::from_hf_config`] (its head size set to `qk_rope_head_dim`).
    ///
    /// # Errors
    /// [`ConfigError::Invalid`] naming the key that is missing or malformed.
    pub fn from_hf_config(config: &Value) -> Result<Self, ConfigError> {
        let object = config.as_object().ok_or_else(|| ConfigError::Invalid {
            module: MODULE,
            field: "config",
            reason: "expected a JSON object".into(),
        })?;
        let required = |key: &'static str| -> Result<usize, ConfigError> {
            json_usize(object, key)?.ok_or_else(|| ConfigError::Invalid {
                module: MODULE,
                field: key,
                reason: "missing".into(),
            })
        };
        let qk_rope_head_dim = required("qk_rope_head_dim")?;
        let interleave = json_bool(object, "rope_interleave")?.unwrap_or(true);
        let mut rope = RopeConfig::from_hf_config(config)?;
        // HF's DeepSeek config sets head_dim = qk_rope_head_dim: only that part rotates.
        rope.head_dim = qk_rope_head_dim;
        rope.layout = if interleave {
            RopeLayout::Interleaved
        } else {
            RopeLayout::HalfSplit
        };
        let dropout = match object.get("attention_dropout") {
            None | Some(Value::Null) => 0.0,
            Some(value) => value.as_f64().ok_or_else(|| ConfigError::Invalid {
                module: MODULE,
                field: "attention_dropout",
                reason: format!("expected a number, got {value}"),
            })?,
        };
        Ok(Self::new(
            required("hidden_size")?,
            required("num_attention_heads")?,
            required("kv_lora_rank")?,
            required("qk_nope_head_dim")?,
            qk_rope_head_dim,
            required("v_head_dim")?,
        )
        .with_q_lora_rank(json_usize(object, "q_lora_rank")?)
        .with_attention_bias(json_bool(object, "attention_bias")?.unwrap_or(false))
        .with_dropout(dropout)
        .with_rope(Some(rope)))
    }

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
        if !(self.norm_eps.is_finite() && self.norm_eps >= 0.0) {
            return Err(ConfigError::Invalid {
                module: MODULE,
                field: "norm_eps",
                reason: format!("must be finite and non-negative, got {}", self.norm_eps),
            });
        }
        if let Some(scale) = self.scale
            && !scale.is_finite()
        {
            return Err(ConfigError::Invalid {
                module: MODULE,
                field: "scale",
                reason: format!("must be finite, got {scale}"),
            });
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
            cached_path: self.cached_path,
            implementation: self.implementation,
        })
    }

    /// Builds the module.
    ///
    /// # Panics
    /// If the configuration is invalid, with the message of [`validate`](Self::validate).
    pub fn init(&self, device: &Device) -> LatentAttention {
        self.try_init(device)
            .unwrap_or_else(|error| panic!("{error}"))
    }
}

/// DeepSeek's published rotary embedding: theta 10000, interleaved, YaRN ×40 from 4096.
fn deepseek_rope(max_positions: usize, mscale: f64, mscale_all_dim: f64) -> RopeConfig {
    RopeConfig::new(64)
        .with_max_position_embeddings(max_positions)
        .with_layout(RopeLayout::Interleaved)
        .with_scaling(RopeScaling::Yarn {
            factor: 40.0,
            original_max_position_embeddings: Some(4096),
            attention_factor: None,
            beta_fast: Some(32.0),
            beta_slow: Some(1.0),
            mscale: Some(mscale),
            mscale_all_dim: Some(mscale_all_dim),
            truncate: None,
        })
}

/// HF's `yarn_get_mscale`: `0.1·mscale·ln(scale) + 1`, or 1 when `scale ≤ 1`.
fn yarn_get_mscale(scale: f64, mscale: f64) -> f64 {
    if scale <= 1.0 {
        1.0
    } else {
        0.1 * mscale * scale.ln() + 1.0
    }
}

fn json_usize(
    object: &Map<String, Value>,
    key: &'static str,
) -> Result<Option<usize>, ConfigError> {
    match object.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(value) => {
            value
                .as_u64()
                .map(|v| Some(v as usize))
                .ok_or_else(|| ConfigError::Invalid {
                    module: MODULE,
                    field: key,
                    reason: format!("expected a non-negative integer, got {value}"),
                })
        }
    }
}

fn json_bool(object: &Map<String, Value>, key: &'static str) -> Result<Option<bool>, ConfigError> {
    match object.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(value) => value
            .as_bool()
            .map(Some)
            .ok_or_else(|| ConfigError::Invalid {
                module: MODULE,
                field: key,
                reason: format!("expected true or false, got {value}"),
            }),
    }
}

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

/// Multi-head latent attention (DeepSeek-V2/V3). Build it with [`LatentAttentionConfig`].
///
/// Field names are Hugging Face's `DeepseekV3Attention` keys, so a checkpoint's
/// `model.layers.N.self_attn.*` load by name. Exactly one query path is present:
/// `q_proj`, or `q_a_proj` + `q_a_layernorm` + `q_b_proj`.
#[derive(Module, Debug)]
pub struct LatentAttention {
    /// `[d_model] -> [n_heads · (qk_nope + qk_rope)]`, without `q_lora_rank`.
    pub q_proj: Option<Linear>,
    /// `[d_model] -> [q_lora_rank]`.
    pub q_a_proj: Option<Linear>,
    /// RMSNorm over the query latent.
    pub q_a_layernorm: Option<RmsNorm>,
    /// `[q_lora_rank] -> [n_heads · (qk_nope + qk_rope)]`.
    pub q_b_proj: Option<Linear>,
    /// `[d_model] -> [kv_lora_rank + qk_rope]`: the latent, then the shared rotary key.
    pub kv_a_proj_with_mqa: Linear,
    /// RMSNorm over the key/value latent.
    pub kv_a_layernorm: RmsNorm,
    /// `[kv_lora_rank] -> [n_heads · (qk_nope + v_head_dim)]`: per head, `k_nope` then `v`.
    pub kv_b_proj: Linear,
    /// `[n_heads · v_head_dim] -> [d_model]`.
    pub o_proj: Linear,
    /// The rotary embedding of the rope parts.
    pub rope: Rope,
    /// Dropout on attention probabilities (inactive in eval / without autodiff).
    pub dropout: Dropout,
    #[module(skip)]
    n_heads: usize,
    #[module(skip)]
    kv_lora_rank: usize,
    #[module(skip)]
    qk_nope_head_dim: usize,
    #[module(skip)]
    qk_rope_head_dim: usize,
    #[module(skip)]
    v_head_dim: usize,
    #[module(skip)]
    causal: bool,
    #[module(skip)]
    scale: f64,
    #[module(skip)]
    cached_path: LatentPath,
    #[module(skip)]
    implementation: AttentionImpl,
}

/// `kv_b_proj` split per head and arranged for the absorbed path.
#[derive(Clone, Debug)]
pub struct AbsorbedWeights {
    /// `W_ukᵀ`: `[1, n_heads, qk_nope_head_dim, kv_lora_rank]`, maps `q_nope` to the
    /// latent space.
    pub w_uk_t: Tensor<4>,
    /// `W_uv`: `[1, n_heads, kv_lora_rank, v_head_dim]`, maps the attended latent to
    /// each head's value space.
    pub w_uv: Tensor<4>,
}

impl AbsorbedWeights {
    /// The same weights as contiguous, detached tensors (read back and uploaded once):
    /// the per-head splits are strided views of `kv_b_proj`, which a matmul may copy
    /// on every call. For inference caches; gradients do not flow through the result.
    pub fn materialized(self) -> Self {
        let fresh = |t: Tensor<4>| Tensor::from_data(t.to_data(), &t.device());
        Self {
            w_uk_t: fresh(self.w_uk_t),
            w_uv: fresh(self.w_uv),
        }
    }
}

impl LatentAttention {
    /// Number of query heads.
    pub fn n_heads(&self) -> usize {
        self.n_heads
    }

    /// Width of the key/value latent.
    pub fn kv_lora_rank(&self) -> usize {
        self.kv_lora_rank
    }

    /// Width of the shared rotary key.
    pub fn qk_rope_head_dim(&self) -> usize {
        self.qk_rope_head_dim
    }

    /// The scale of `q·kᵀ` (including YaRN's mscale²).
    pub fn scale(&self) -> f64 {
        self.scale
    }

    /// The module with another implementation of the attention core, weights kept.
    pub fn with_implementation(mut self, implementation: AttentionImpl) -> Self {
        self.implementation = implementation;
        self
    }

    /// Causal self-attention over `x`, on the expanded path (as HF's forward).
    ///
    /// # Shapes
    /// - x: `[batch, seq, d_model]`
    /// - key_padding: `[batch, seq]`, `true` for padded positions
    /// - output: `[batch, seq, d_model]`
    pub fn forward(&self, x: Tensor<3>, key_padding: Option<Tensor<2, Bool>>) -> Tensor<3> {
        self.forward_path(x, key_padding, LatentPath::Expanded)
    }

    /// Self-attention over `x` on the chosen path, without a cache. Both paths give the
    /// same values (up to float rounding).
    ///
    /// # Shapes
    /// As [`forward`](Self::forward).
    pub fn forward_path(
        &self,
        x: Tensor<3>,
        key_padding: Option<Tensor<2, Bool>>,
        path: LatentPath,
    ) -> Tensor<3> {
        let (q_nope, q_rope) = self.queries(x.clone(), 0);
        let entries = self.latent_entries(x, 0);
        let output = match path {
            LatentPath::Expanded => self.attend_expanded(q_nope, q_rope, entries, key_padding),
            LatentPath::Absorbed => {
                let weights = self.absorbed_weights();
                self.attend_absorbed(q_nope, q_rope, entries, key_padding, &weights)
            }
        };
        self.merge_heads(output)
    }

    /// [`forward`](Self::forward) that also returns the attention probabilities, for
    /// inspection: both from the reference path on the expanded heads, without dropout.
    ///
    /// # Shapes
    /// - x: `[batch, seq, d_model]`
    /// - key_padding: `[batch, seq]`, `true` for padded positions
    /// - output: `[batch, seq, d_model]` and the weights `[batch, n_heads, seq, seq]`
    pub fn forward_with_weights(
        &self,
        x: Tensor<3>,
        key_padding: Option<Tensor<2, Bool>>,
    ) -> (Tensor<3>, Tensor<4>) {
        let (q_nope, q_rope) = self.queries(x.clone(), 0);
        let entries = self.latent_entries(x, 0);
        let (queries, keys, values) = self.expanded_heads(q_nope, q_rope, entries);
        let options = self.options(key_padding).with_dropout(0.0);
        let (output, weights) = attention_with_weights(queries, keys, values, &options);
        (self.merge_heads(output), weights)
    }

    /// Self-attention over the new positions `x`, attending also to everything in
    /// `cache`, which is then extended with their latents. Uses the configured
    /// [`cached_path`](LatentAttentionConfig::cached_path). Equals
    /// [`forward`](Self::forward) on the whole sequence, one chunk at a time.
    ///
    /// # Shapes
    /// - x: `[batch, new, d_model]`
    /// - key_padding: `[batch, new]` for the new positions, `true` = padded
    /// - output: `[batch, new, d_model]`
    pub fn forward_cached(
        &self,
        x: Tensor<3>,
        cache: &mut LatentKvCache,
        key_padding: Option<Tensor<2, Bool>>,
    ) -> Tensor<3> {
        self.forward_cached_path(x, cache, key_padding, self.cached_path)
    }

    /// [`forward_cached`](Self::forward_cached) on an explicit path.
    ///
    /// # Shapes
    /// As [`forward_cached`](Self::forward_cached).
    pub fn forward_cached_path(
        &self,
        x: Tensor<3>,
        cache: &mut LatentKvCache,
        key_padding: Option<Tensor<2, Bool>>,
        path: LatentPath,
    ) -> Tensor<3> {
        let offset = cache.position();
        let (q_nope, q_rope) = self.queries(x.clone(), offset);
        let entries = self.latent_entries(x, offset);
        let (entries, padding) = cache.append(entries, key_padding);
        let output = match path {
            LatentPath::Expanded => self.attend_expanded(q_nope, q_rope, entries, padding),
            LatentPath::Absorbed => {
                // The module does not change during a generation: split `kv_b_proj` once
                // per cache instead of once per step (a copy of the whole matrix).
                let weights = cache
                    .absorbed
                    .get_or_insert_with(|| self.absorbed_weights().materialized())
                    .clone();
                self.attend_absorbed(q_nope, q_rope, entries, padding, &weights)
            }
        };
        self.merge_heads(output)
    }

    /// `kv_b_proj`'s key and value halves, per head, for the absorbed path.
    pub fn absorbed_weights(&self) -> AbsorbedWeights {
        let (rank, heads, nope, v) = (
            self.kv_lora_rank,
            self.n_heads,
            self.qk_nope_head_dim,
            self.v_head_dim,
        );
        // Burn stores Linear weights `[d_in, d_out]`: [rank, heads · (nope + v)].
        let weight = self.kv_b_proj.weight.val();
        let per_head = weight.reshape([rank, heads, nope + v]).swap_dims(0, 1); // [heads, rank, nope + v]
        let w_uk_t = per_head
            .clone()
            .narrow(2, 0, nope)
            .swap_dims(1, 2) // [heads, nope, rank]
            .unsqueeze_dim::<4>(0); // [1, heads, nope, rank]
        let w_uv = per_head.narrow(2, nope, v).unsqueeze_dim::<4>(0); // [1, heads, rank, v]
        AbsorbedWeights { w_uk_t, w_uv }
    }

    /// The queries' position-free and rotated parts, rotated from `offset`.
    ///
    /// # Shapes
    /// - x: `[batch, seq, d_model]`
    /// - output: `[batch, n_heads, seq, qk_nope]` and `[batch, n_heads, seq, qk_rope]`
    fn queries(&self, x: Tensor<3>, offset: usize) -> (Tensor<4>, Tensor<4>) {
        let [batch, seq, _] = x.dims();
        let q = match (
            &self.q_proj,
            &self.q_a_proj,
            &self.q_a_layernorm,
            &self.q_b_proj,
        ) {
            (Some(q_proj), _, _, _) => q_proj.forward(x),
            (None, Some(a), Some(norm), Some(b)) => b.forward(norm.forward(a.forward(x))),
            _ => panic!(
                "LatentAttention: needs either q_proj or q_a_proj + q_a_layernorm + q_b_proj"
            ),
        };
        let qk = self.qk_nope_head_dim + self.qk_rope_head_dim;
        let q = q.reshape([batch, seq, self.n_heads, qk]).swap_dims(1, 2); // [batch, n_heads, seq, qk]
        let q_nope = q.clone().narrow(3, 0, self.qk_nope_head_dim);
        let q_rope = q.narrow(3, self.qk_nope_head_dim, self.qk_rope_head_dim);
        (q_nope, self.rope.forward(q_rope, offset))
    }

    /// What the cache stores for the positions of `x`: the normalized latent and the
    /// rotated shared key, side by side.
    ///
    /// # Shapes
    /// - x: `[batch, seq, d_model]`
    /// - output: `[batch, 1, seq, kv_lora_rank + qk_rope]`
    fn latent_entries(&self, x: Tensor<3>, offset: usize) -> Tensor<4> {
        let [batch, seq, _] = x.dims();
        let compressed = self.kv_a_proj_with_mqa.forward(x); // [batch, seq, rank + rope]
        let latent = self
            .kv_a_layernorm
            .forward(compressed.clone().narrow(2, 0, self.kv_lora_rank))
            .reshape([batch, 1, seq, self.kv_lora_rank]); // [batch, 1, seq, rank]
        let k_rope = compressed
            .narrow(2, self.kv_lora_rank, self.qk_rope_head_dim)
            .reshape([batch, 1, seq, self.qk_rope_head_dim]); // [batch, 1, seq, rope]
        let k_rope = self.rope.forward(k_rope, offset);
        Tensor::cat(vec![latent, k_rope], 3)
    }

    /// Expanded path: per-head keys `[k_nope ‖ k_rope]` and values from the latent, then
    /// multi-head attention with `d_qk = qk_nope + qk_rope`, `d_v = v_head_dim`.
    ///
    /// # Shapes
    /// - q_nope, q_rope: `[batch, n_heads, seq_q, qk_nope | qk_rope]`
    /// - entries: `[batch, 1, seq_k, kv_lora_rank + qk_rope]`
    /// - output: `[batch, n_heads, seq_q, v_head_dim]`
    fn attend_expanded(
        &self,
        q_nope: Tensor<4>,
        q_rope: Tensor<4>,
        entries: Tensor<4>,
        key_padding: Option<Tensor<2, Bool>>,
    ) -> Tensor<4> {
        let (queries, keys, values) = self.expanded_heads(q_nope, q_rope, entries);
        attention(queries, keys, values, &self.options(key_padding))
    }

    /// The per-head queries, keys and values of the expanded path.
    ///
    /// # Shapes
    /// - q_nope, q_rope: `[batch, n_heads, seq_q, qk_nope | qk_rope]`
    /// - entries: `[batch, 1, seq_k, kv_lora_rank + qk_rope]`
    /// - output: queries `[batch, n_heads, seq_q, qk_nope + qk_rope]`, keys
    ///   `[batch, n_heads, seq_k, qk_nope + qk_rope]`, values `[batch, n_heads, seq_k, v]`
    fn expanded_heads(
        &self,
        q_nope: Tensor<4>,
        q_rope: Tensor<4>,
        entries: Tensor<4>,
    ) -> (Tensor<4>, Tensor<4>, Tensor<4>) {
        let [batch, _, seq_k, _] = entries.dims();
        let (heads, nope, v) = (self.n_heads, self.qk_nope_head_dim, self.v_head_dim);
        let latent = entries.clone().narrow(3, 0, self.kv_lora_rank).reshape([
            batch,
            seq_k,
            self.kv_lora_rank,
        ]); // [batch, seq_k, rank]
        let kv = self
            .kv_b_proj
            .forward(latent)
            .reshape([batch, seq_k, heads, nope + v])
            .swap_dims(1, 2); // [batch, heads, seq_k, nope + v]
        let k_nope = kv.clone().narrow(3, 0, nope);
        let values = kv.narrow(3, nope, v);
        let k_rope = entries
            .narrow(3, self.kv_lora_rank, self.qk_rope_head_dim)
            .expand([batch, heads, seq_k, self.qk_rope_head_dim]); // shared by every head
        let keys = Tensor::cat(vec![k_nope, k_rope], 3); // [batch, heads, seq_k, nope + rope]
        let queries = Tensor::cat(vec![q_nope, q_rope], 3); // [batch, heads, seq_q, nope + rope]
        (queries, keys, values)
    }

    /// Absorbed path: MQA over the latent with `d_qk = kv_lora_rank + qk_rope` and
    /// `d_v = kv_lora_rank`, then each head's value projection.
    ///
    /// # Shapes
    /// As [`attend_expanded`](Self::attend_expanded).
    fn attend_absorbed(
        &self,
        q_nope: Tensor<4>,
        q_rope: Tensor<4>,
        entries: Tensor<4>,
        key_padding: Option<Tensor<2, Bool>>,
        weights: &AbsorbedWeights,
    ) -> Tensor<4> {
        // q_nope·(W_uk c) = (W_ukᵀ q_nope)·c: the query moves into the latent space.
        let q_latent = q_nope.matmul(weights.w_uk_t.clone()); // [batch, heads, seq_q, rank]
        let queries = Tensor::cat(vec![q_latent, q_rope], 3); // [batch, heads, seq_q, rank + rope]
        // One key/value head shared by all query heads: keys [c ‖ k_rope], values c.
        let values = entries.clone().narrow(3, 0, self.kv_lora_rank); // [batch, 1, seq_k, rank]
        let attended = attention(queries, entries, values, &self.options(key_padding)); // [batch, heads, seq_q, rank]
        // Σ p·(W_uv c) = W_uv (Σ p·c): the value projection after the weighted sum.
        attended.matmul(weights.w_uv.clone()) // [batch, heads, seq_q, v]
    }

    /// The options of one call of the attention core.
    fn options(&self, key_padding: Option<Tensor<2, Bool>>) -> AttentionOptions {
        let dropout = if self.dropout.training.is_enabled() {
            self.dropout.prob
        } else {
            0.0
        };
        AttentionOptions::new()
            // The scale belongs to the expanded head width on both paths: an explicit
            // value keeps the absorbed path from using 1/sqrt(rank + rope).
            .with_scale(Some(self.scale))
            .with_causal(self.causal)
            .with_key_padding(key_padding)
            .with_dropout(dropout)
            .with_implementation(self.implementation)
    }

    /// `[batch, n_heads, seq, v_head_dim] -> [batch, seq, d_model]`.
    fn merge_heads(&self, x: Tensor<4>) -> Tensor<3> {
        let [batch, n_heads, seq, v] = x.dims();
        let x = x.swap_dims(1, 2).reshape([batch, seq, n_heads * v]); // [batch, seq, n_heads · v]
        self.o_proj.forward(x)
    }
}

/// The latent KV cache of one [`LatentAttention`] layer: per token only the normalized
/// latent and the rotated shared key (`kv_lora_rank + qk_rope_head_dim` values; 576 for
/// DeepSeek-V3 against 40 960 for the same heads as MHA).
///
/// On the absorbed path the cache also keeps the module's absorbed weights, split once
/// on the first step: a cache belongs to one layer of one model, and
/// [`reset`](Self::reset) forgets them with the positions.
#[derive(Clone, Debug, Default)]
pub struct LatentKvCache {
    /// `[batch, 1, cached, kv_lora_rank + qk_rope_head_dim]`: `[c ‖ k_rope]`.
    entries: Option<Tensor<4>>,
    /// `[batch, cached]`, `true` for padded positions; `None` when nothing is padded.
    padding: Option<Tensor<2, Bool>>,
    /// Number of positions seen so far.
    position: usize,
    /// `kv_b_proj` split for the absorbed path.
    absorbed: Option<AbsorbedWeights>,
}

impl LatentKvCache {
    /// An empty cache.
    pub fn new() -> Self {
        Self::default()
    }

    /// The absolute position of the next token: the RoPE offset.
    pub fn position(&self) -> usize {
        self.position
    }

    /// Number of positions stored.
    pub fn len(&self) -> usize {
        self.entries.as_ref().map_or(0, |e| e.dims()[2])
    }

    /// Whether nothing is cached.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Bytes held by the cached latents and rotary keys (not the absorbed weights).
    pub fn bytes(&self) -> usize {
        self.entries
            .as_ref()
            .map_or(0, |e| e.shape().num_elements() * e.dtype().size())
    }

    /// Bytes one token of one sequence takes: `(kv_lora_rank + qk_rope) · dtype size`;
    /// 0 while empty.
    pub fn bytes_per_token(&self) -> usize {
        self.entries
            .as_ref()
            .map_or(0, |e| e.dims()[3] * e.dtype().size())
    }

    /// The cached `[c ‖ k_rope]`, if any.
    ///
    /// # Shapes
    /// - `[batch, 1, cached, kv_lora_rank + qk_rope_head_dim]`
    pub fn entries(&self) -> Option<&Tensor<4>> {
        self.entries.as_ref()
    }

    /// Appends the new positions and returns everything to attend over.
    ///
    /// # Shapes
    /// - entries: `[batch, 1, new, kv_lora_rank + qk_rope]`
    /// - padding: `[batch, new]` (`true` = padded) or `None`
    /// - returns entries `[batch, 1, cached + new, _]` and padding `[batch, cached + new]`
    ///   if any step had one.
    pub fn append(
        &mut self,
        entries: Tensor<4>,
        padding: Option<Tensor<2, Bool>>,
    ) -> (Tensor<4>, Option<Tensor<2, Bool>>) {
        let [batch, _, new, _] = entries.dims();
        let cached = self.len();
        let device = entries.device();
        let entries = match self.entries.take() {
            Some(past) => Tensor::cat(vec![past, entries], 2),
            None => entries,
        };
        // Padding is tracked only once some step has it; earlier steps were unpadded.
        let padding = match (self.padding.take(), padding) {
            (None, None) => None,
            (past, new_padding) => {
                let none = |shape: [usize; 2]| Tensor::<2, Int>::zeros(shape, &device).bool();
                let past = past.unwrap_or_else(|| none([batch, cached]));
                let new_padding = new_padding.unwrap_or_else(|| none([batch, new]));
                Some(Tensor::cat(vec![past, new_padding], 1))
            }
        };
        self.position += new;
        self.entries = Some(entries.clone());
        self.padding = padding.clone();
        (entries, padding)
    }

    /// The absorbed weights kept for the absorbed path, once a step has split them.
    pub fn absorbed_weights(&self) -> Option<&AbsorbedWeights> {
        self.absorbed.as_ref()
    }

    /// Sets (or clears) the absorbed weights, e.g. to share one split between the caches
    /// of several sequences decoded by the same layer.
    pub fn set_absorbed_weights(&mut self, weights: Option<AbsorbedWeights>) {
        self.absorbed = weights;
    }

    /// Empties the cache (and forgets the absorbed weights).
    pub fn reset(&mut self) {
        *self = Self::default();
    }

    /// Keeps only the batch rows in `indices` (beam search reorders beams).
    ///
    /// # Shapes
    /// - indices: `[new_batch]`
    pub fn select_batch(&mut self, indices: Tensor<1, Int>) {
        self.entries = self.entries.take().map(|t| t.select(0, indices.clone()));
        self.padding = self
            .padding
            .take()
            .map(|t| t.int().select(0, indices.clone()).bool());
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::attention::padding_mask_from_lengths;
    use crate::test_utils::{Fixture, assert_close, fixture_dir, test_devices};
    use burn::module::Param;
    use burn::tensor::Distribution;

    /// A burn Linear from an HF `nn.Linear`'s `<prefix>.weight` (`[out, in]`) and bias.
    fn load_linear(fixture: &Fixture, prefix: &str, device: &Device) -> Linear {
        let weight = fixture.tensor::<2>(&format!("{prefix}.weight"), device);
        let [d_output, d_input] = weight.dims();
        let bias_key = format!("{prefix}.bias");
        let mut linear = LinearConfig::new(d_input, d_output)
            .with_bias(fixture.contains(&bias_key))
            .init(device);
        linear.weight = Param::from_tensor(weight.transpose());
        if fixture.contains(&bias_key) {
            linear.bias = Some(Param::from_tensor(fixture.tensor(&bias_key, device)));
        }
        linear
    }

    fn load_norm(fixture: &Fixture, prefix: &str, device: &Device) -> RmsNorm {
        let weight = fixture.tensor::<1>(&format!("{prefix}.weight"), device);
        let mut norm = RmsNormConfig::new(weight.dims()[0]).init(device);
        norm.weight = Param::from_tensor(weight);
        norm
    }

    /// The fixture's HF config and an attention holding its weights.
    fn load(name: &str, device: &Device) -> (Fixture, LatentAttentionConfig, LatentAttention) {
        let fixture = Fixture::load(name);
        let path = fixture_dir().join(format!("{name}.json"));
        let text = std::fs::read_to_string(&path)
            .unwrap_or_else(|e| panic!("{}: {e} (run tools/make_fixtures.py)", path.display()));
        let json: Value = serde_json::from_str(&text).unwrap();
        let config = LatentAttentionConfig::from_hf_config(&json).unwrap();
        let mut attention = config.init(device);
        let linear = |prefix| Some(load_linear(&fixture, prefix, device));
        if config.q_lora_rank.is_some() {
            attention.q_a_proj = linear("q_a_proj");
            attention.q_a_layernorm = Some(load_norm(&fixture, "q_a_layernorm", device));
            attention.q_b_proj = linear("q_b_proj");
        } else {
            attention.q_proj = linear("q_proj");
        }
        attention.kv_a_proj_with_mqa = load_linear(&fixture, "kv_a_proj_with_mqa", device);
        attention.kv_a_layernorm = load_norm(&fixture, "kv_a_layernorm", device);
        attention.kv_b_proj = load_linear(&fixture, "kv_b_proj", device);
        attention.o_proj = load_linear(&fixture, "o_proj", device);
        (fixture, config, attention)
    }

    const FIXTURES: [&str; 2] = ["mla_yarn", "mla_q_proj"];

    #[test]
    fn matches_hugging_face_deepseek_v3_attention_on_both_paths() {
        for name in FIXTURES {
            for device in test_devices() {
                let (fixture, _, attention) = load(name, &device);
                let x = fixture.tensor::<3>("x", &device);
                let expected = fixture.tensor::<3>("y", &device);
                for path in [LatentPath::Expanded, LatentPath::Absorbed] {
                    let y = attention.forward_path(x.clone(), None, path);
                    assert_close(y, expected.clone(), 1e-5, &format!("{name} {path:?}"));
                }
            }
        }
    }

    #[test]
    fn softmax_scale_includes_yarn_mscale_as_hugging_face() {
        for name in FIXTURES {
            let (fixture, config, attention) = load(name, &Device::flex());
            let expected = fixture.scalar("scaling") as f64;
            assert!(
                (attention.scale() - expected).abs() < 1e-7,
                "{name}: scale {} vs HF {expected}",
                attention.scale()
            );
            assert!(
                (attention.rope.attention_scaling() - fixture.scalar("attention_scaling") as f64)
                    .abs()
                    < 1e-6
            );
            assert_eq!(config.rope_config().layout, RopeLayout::Interleaved);
        }
    }

    /// A config with every dimension different, so a mixed-up axis cannot pass.
    fn small_config() -> LatentAttentionConfig {
        LatentAttentionConfig::new(40, 5, 12, 6, 4, 7)
            .with_q_lora_rank(Some(10))
            .with_attention_bias(true)
            .with_initializer(Initializer::Normal {
                mean: 0.0,
                std: 0.3,
            })
    }

    #[test]
    fn cached_decoding_equals_full_forward_on_both_paths() {
        for device in test_devices() {
            device.seed(11);
            let attention = small_config().init(&device);
            let x = Tensor::<3>::random([2, 9, 40], Distribution::Normal(0.0, 1.0), &device);
            let full = attention.forward(x.clone(), None);
            for path in [LatentPath::Expanded, LatentPath::Absorbed] {
                // Prefill 4 positions, decode 3 one by one, then a chunk of 2.
                let mut cache = LatentKvCache::new();
                let mut outputs = vec![attention.forward_cached_path(
                    x.clone().narrow(1, 0, 4),
                    &mut cache,
                    None,
                    path,
                )];
                for position in 4..7 {
                    outputs.push(attention.forward_cached_path(
                        x.clone().narrow(1, position, 1),
                        &mut cache,
                        None,
                        path,
                    ));
                }
                outputs.push(attention.forward_cached_path(
                    x.clone().narrow(1, 7, 2),
                    &mut cache,
                    None,
                    path,
                ));
                assert_eq!(cache.position(), 9);
                assert_close(
                    Tensor::cat(outputs, 1),
                    full.clone(),
                    1e-5,
                    &format!("cached {path:?} vs full"),
                );
            }
        }
    }

    #[test]
    fn absorbed_equals_expanded_with_padding_and_without_causal_mask() {
        for device in test_devices() {
            device.seed(12);
            for causal in [true, false] {
                let attention = small_config().with_causal(causal).init(&device);
                let x = Tensor::<3>::random([2, 6, 40], Distribution::Normal(0.0, 1.0), &device);
                let padding = padding_mask_from_lengths(&[6, 4], 6, &device);
                let expanded =
                    attention.forward_path(x.clone(), Some(padding.clone()), LatentPath::Expanded);
                let absorbed = attention.forward_path(x, Some(padding), LatentPath::Absorbed);
                // Row 1 positions 4, 5 are padding queries: compare everything anyway,
                // both paths mask identically.
                assert_close(absorbed, expanded, 1e-5, &format!("causal={causal}"));
            }
        }
    }

    #[test]
    fn cache_stores_only_latent_and_rotary_key() {
        let device = Device::flex();
        let attention = small_config().init(&device);
        let mut cache = LatentKvCache::new();
        let x = Tensor::<3>::random([3, 5, 40], Distribution::Normal(0.0, 1.0), &device);
        attention.forward_cached(x, &mut cache, None);
        // (rank 12 + rope 4) floats of 4 bytes per token.
        assert_eq!(cache.bytes_per_token(), 16 * 4);
        assert_eq!(cache.bytes(), 3 * 5 * 16 * 4);
        let footprint = small_config().cache_bytes_per_token(DType::F32, 1);
        assert_eq!(footprint.latent, cache.bytes_per_token());
        // MHA: 5 heads × (6 + 4 key + 7 value) floats.
        assert_eq!(footprint.mha, 5 * 17 * 4);
        assert_eq!(footprint.gqa, 17 * 4);
    }

    #[test]
    fn deepseek_v3_cache_is_576_values_per_token() {
        let footprint = LatentAttentionConfig::deepseek_v3().cache_bytes_per_token(DType::BF16, 8);
        assert_eq!(footprint.latent, 576 * 2);
        assert_eq!(footprint.mha, 128 * (192 + 128) * 2);
        assert_eq!(footprint.gqa, 8 * (192 + 128) * 2);
        println!("{footprint}");
        // YaRN ×40 with mscale_all_dim 1: scale = 192^-0.5 · (0.1 ln 40 + 1)².
        let mscale = 0.1 * 40f64.ln() + 1.0;
        let expected = mscale * mscale / 192f64.sqrt();
        assert!((LatentAttentionConfig::deepseek_v3().softmax_scale() - expected).abs() < 1e-12);
        LatentAttentionConfig::deepseek_v3().validate().unwrap();
        LatentAttentionConfig::deepseek_v2_lite()
            .validate()
            .unwrap();
    }

    #[test]
    fn select_batch_and_reset() {
        let device = Device::flex();
        let attention = small_config().init(&device);
        let mut cache = LatentKvCache::new();
        let x = Tensor::<3>::random([3, 2, 40], Distribution::Normal(0.0, 1.0), &device);
        attention.forward_cached(x, &mut cache, None);
        cache.select_batch(Tensor::from_ints([2, 0], &device));
        assert_eq!(cache.entries().unwrap().dims(), [2, 1, 2, 16]);
        cache.reset();
        assert!(cache.is_empty() && cache.position() == 0);
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
        assert!(matches!(
            LatentAttentionConfig::from_hf_config(&serde_json::json!({"hidden_size": 8})),
            Err(ConfigError::Invalid { .. })
        ));
    }

    #[test]
    #[should_panic(expected = "LatentAttentionConfig: `kv_lora_rank` must be greater than 0")]
    fn init_panics_with_the_validation_message() {
        LatentAttentionConfig::new(8, 2, 0, 4, 4, 4).init(&Device::flex());
    }
}
