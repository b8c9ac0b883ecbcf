//! Multi-head attention with grouped key/value heads: MHA, GQA and MQA in one module.
//!
//! `n_kv_heads == n_heads` is classic multi-head attention (Vaswani et al., 2017),
//! `1 < n_kv_heads < n_heads` grouped-query attention (Ainslie et al., 2023) and
//! `n_kv_heads == 1` multi-query attention (Shazeer, 2019). The same module serves
//! self-attention (optionally with RoPE, causal and sliding-window masks and a KV
//! cache) and cross-attention over an encoder's output.

use burn::config::Config;
use burn::module::{Initializer, Module, Param};
use burn::nn::{Dropout, DropoutConfig, Linear, LinearConfig};
use burn::tensor::activation::sigmoid;
use burn::tensor::{Bool, Device, Tensor};

use super::cache::{CrossKvCache, KvCache};
use super::core::{AttentionImpl, AttentionOptions, attention, attention_with_weights};
use super::qk_norm::{QkNorm, QkNormConfig, QkNormPlacement};
use super::query_temperature::QueryTemperatureConfig;
use super::shared_kv::{AttendedKv, KvSharing, SharedKv};
use crate::error::ConfigError;
use crate::norm::{RmsNorm, RmsNormConfig};
use crate::ops::alibi::Alibi;
use crate::ops::linear::linear_rows;
use crate::position::{Rope, RopeConfig};

/// Configuration of [`MultiHeadAttention`].
#[derive(Config, Debug)]
pub struct MultiHeadAttentionConfig {
    /// Width of the input (and output) hidden states.
    pub d_model: usize,
    /// Number of query heads.
    pub n_heads: usize,
    /// Number of key/value heads. Default: `n_heads` (MHA); 1 gives MQA.
    #[config(default = "None")]
    pub n_kv_heads: Option<usize>,
    /// Width of one head, independent of `d_model`. Default: `d_model / n_heads`.
    #[config(default = "None")]
    pub head_dim: Option<usize>,
    /// Width of the states keys and values are computed from, for cross-attention
    /// over an encoder of another width. Default: `d_model`.
    #[config(default = "None")]
    pub d_kv_input: Option<usize>,
    /// Bias on the q, k and v projections (Qwen2 has them). Default: false.
    #[config(default = false)]
    pub qkv_bias: bool,
    /// Bias on the output projection. Default: false.
    #[config(default = false)]
    pub o_bias: bool,
    /// Gates each head's output by a sigmoid before `o_proj` (gated attention,
    /// Qiu et al., 2025; Qwen3-Next, Qwen3.5): `q_proj` projects the gate beside the
    /// queries, its output twice as wide, each head's query then its gate. Default:
    /// false.
    #[config(default = false)]
    pub output_gate: bool,
    /// Dropout on the attention probabilities during training. Default: 0.
    #[config(default = 0.0)]
    pub dropout: f64,
    /// Causal masking for self-attention. Default: false.
    #[config(default = false)]
    pub causal: bool,
    /// Sliding window size (Mistral). Default: none. Must be > 0.
    #[config(default = "None")]
    pub window: Option<usize>,
    /// Chunked local attention (Llama 4): positions are cut into chunks of this many
    /// from the first key, and a query sees only keys of its own chunk (see
    /// [`crate::ops::mask`]); the layer's cache then keeps every key. Default: none.
    /// Must be > 0.
    #[config(default = "None")]
    pub chunk: Option<usize>,
    /// Attention logit softcap. Default: none.
    #[config(default = "None")]
    pub softcap: Option<f64>,
    /// Scale of `q·kᵀ`. Default: `1/sqrt(head_dim)`.
    #[config(default = "None")]
    pub scale: Option<f64>,
    /// Rotary position embedding applied to q and k. Its `head_dim` must equal the
    /// attention's. Default: none.
    #[config(default = "None")]
    pub rope: Option<RopeConfig>,
    /// RMSNorm of the projected queries and keys before RoPE (Qwen3, OLMo-2, Gemma-3).
    /// Default: none.
    #[config(default = "None")]
    pub qk_norm: Option<QkNormConfig>,
    /// Clamps the projected queries, keys and values to `[-clip, clip]` (HF `clip_qkv`:
    /// OLMo, OLMoE), after a QK-norm across heads and before one per head or RoPE.
    /// Default: none.
    #[config(default = "None")]
    pub qkv_clip: Option<f64>,
    /// Queries scaled by position after RoPE (Ministral-3). Default: none.
    #[config(default = "None")]
    pub query_temperature: Option<QueryTemperatureConfig>,
    /// A learned sink logit per query head (gpt-oss `sinks`): it joins every row's
    /// softmax and takes no value (see [`AttentionOptions::sinks`]). Default: false.
    #[config(default = false)]
    pub sinks: bool,
    /// ALiBi's linear bias by distance on every head's logits (BLOOM, MPT), usually in
    /// place of `rope`. Default: none.
    #[config(default = "None")]
    pub alibi: Option<Alibi>,
    /// The values are the key projection's output, taken before QK-norm and RoPE: the
    /// module has no `v_proj` (Gemma-4's `attention_k_eq_v`). Default: false.
    #[config(default = false)]
    pub values_from_keys: bool,
    /// Normalizes each value head by its root mean square, without a learned scale,
    /// with this epsilon (Gemma-4's `v_norm`). Default: none.
    #[config(default = "None")]
    pub value_norm_eps: Option<f64>,
    /// Keys and values shared with other layers of the stack: published for later
    /// layers, or reused from an earlier one (no key/value projections then; see
    /// [`KvSharing`]). Default: none (the layer's own, for itself alone).
    #[config(default = "None")]
    pub kv_sharing: Option<KvSharing>,
    /// Which attention implementation to use. Default: automatic.
    #[config(default = "AttentionImpl::Auto")]
    pub implementation: AttentionImpl,
    /// Initializer of the projection weights. Default: normal, std 0.02 (GPT-2/LLaMA).
    #[config(default = "Initializer::Normal { mean: 0.0, std: 0.02 }")]
    pub initializer: Initializer,
}

/// Multi-head attention with `n_kv_heads` shared key/value heads.
///
/// Field names match Hugging Face checkpoints (`q_proj`, `k_proj`, `v_proj`, `o_proj`).
#[derive(Module, Debug)]
pub struct MultiHeadAttention {
    /// `[d_model] -> [n_heads * head_dim]` (`[n_heads * 2 * head_dim]` with an output
    /// gate: per head, the query then the gate)
    pub q_proj: Linear,
    /// `[d_kv_input] -> [n_kv_heads * head_dim]`; `None` in a layer that reuses an
    /// earlier layer's keys and values ([`KvSharing::Reuse`]).
    pub k_proj: Option<Linear>,
    /// `[d_kv_input] -> [n_kv_heads * head_dim]`; `None` when the values are the keys'
    /// projection ([`MultiHeadAttentionConfig::values_from_keys`]) or reused.
    pub v_proj: Option<Linear>,
    /// `[n_heads * head_dim] -> [d_model]`
    pub o_proj: Linear,
    /// Rotary embedding of q and k, if any.
    pub rope: Option<Rope>,
    /// QK-norm of the queries (HF `q_norm`), if any.
    pub q_norm: Option<QkNorm>,
    /// QK-norm of the keys (HF `k_norm`), if any.
    pub k_norm: Option<QkNorm>,
    /// The norm of each value head, without parameters (HF `v_norm`), if any.
    pub v_norm: Option<RmsNorm>,
    /// The attention sinks, `[n_heads]` (HF `sinks`), if any.
    pub sinks: Option<Param<Tensor<1>>>,
    /// Dropout on attention probabilities (inactive in eval / without autodiff).
    pub dropout: Dropout,
    #[module(skip)]
    n_heads: usize,
    /// ALiBi's slopes, if any (constants, not parameters).
    #[module(skip)]
    alibi: Option<Alibi>,
    #[module(skip)]
    n_kv_heads: usize,
    #[module(skip)]
    head_dim: usize,
    #[module(skip)]
    causal: bool,
    #[module(skip)]
    window: Option<usize>,
    #[module(skip)]
    chunk: Option<usize>,
    #[module(skip)]
    softcap: Option<f64>,
    #[module(skip)]
    scale: Option<f64>,
    #[module(skip)]
    implementation: AttentionImpl,
    #[module(skip)]
    qk_norm: Option<QkNormPlacement>,
    #[module(skip)]
    query_temperature: Option<QueryTemperatureConfig>,
    #[module(skip)]
    qkv_clip: Option<f64>,
    #[module(skip)]
    kv_sharing: Option<KvSharing>,
    #[module(skip)]
    output_gate: bool,
}

impl MultiHeadAttentionConfig {
    /// Number of key/value heads after defaults.
    pub fn kv_heads(&self) -> usize {
        self.n_kv_heads.unwrap_or(self.n_heads)
    }

    /// Head width after defaults.
    pub fn head_width(&self) -> usize {
        self.head_dim
            .unwrap_or_else(|| self.d_model.checked_div(self.n_heads).unwrap_or(0))
    }

    /// Whether the layer reuses an earlier layer's keys and values
    /// ([`KvSharing::Reuse`]).
    pub fn reuses_kv(&self) -> bool {
        matches!(self.kv_sharing, Some(KvSharing::Reuse { .. }))
    }

    /// Checks the configuration without allocating anything.
    pub fn validate(&self) -> Result<(), ConfigError> {
        const MODULE: &str = "MultiHeadAttentionConfig";
        ConfigError::check_positive(MODULE, "d_model", self.d_model)?;
        ConfigError::check_positive(MODULE, "n_heads", self.n_heads)?;
        ConfigError::check_divisible(
            MODULE,
            "n_heads",
            self.n_heads,
            "n_kv_heads",
            self.kv_heads(),
        )?;
        if self.head_dim.is_none() {
            ConfigError::check_divisible(MODULE, "d_model", self.d_model, "n_heads", self.n_heads)?;
        }
        ConfigError::check_positive(MODULE, "head_dim", self.head_width())?;
        if let Some(d) = self.d_kv_input {
            ConfigError::check_positive(MODULE, "d_kv_input", d)?;
        }
        if let Some(window) = self.window {
            ConfigError::check_positive(MODULE, "window", window)?;
        }
        if let Some(chunk) = self.chunk {
            ConfigError::check_positive(MODULE, "chunk", chunk)?;
            if self.window.is_some() {
                // A chunk counts positions from the first key, which a rolling cache drops.
                return Err(ConfigError::Invalid {
                    module: MODULE,
                    field: "chunk",
                    reason: "is set with a window: a windowed layer's cache drops its oldest                              keys, where chunks are counted from; set one of the two"
                        .into(),
                });
            }
        }
        ConfigError::check_probability(MODULE, "dropout", self.dropout)?;
        if let Some(clip) = self.qkv_clip {
            ConfigError::check_positive_real(MODULE, "qkv_clip", clip)?;
        }
        if let Some(cap) = self.softcap {
            ConfigError::check_positive_real(MODULE, "softcap", cap)?;
        }
        if let Some(scale) = self.scale {
            ConfigError::check_finite(MODULE, "scale", scale)?;
        }
        if let Some(qk_norm) = &self.qk_norm {
            qk_norm.validate()?;
        }
        if let Some(temperature) = &self.query_temperature {
            temperature.validate()?;
        }
        if let Some(alibi) = &self.alibi {
            ConfigError::check_positive_real(MODULE, "alibi.max_bias", alibi.max_bias)?;
            ConfigError::check_positive_real(MODULE, "alibi.slope_scale", alibi.slope_scale)?;
        }
        if self.reuses_kv() && self.d_kv_input.is_some() {
            return Err(ConfigError::Invalid {
                module: MODULE,
                field: "kv_sharing",
                reason: "a layer that reuses another's keys and values projects none, so \
                         d_kv_input does not apply"
                    .into(),
            });
        }
        if let Some(rope) = &self.rope {
            rope.validate()?;
            if rope.head_dim != self.head_width() {
                return Err(ConfigError::Invalid {
                    module: MODULE,
                    field: "rope.head_dim",
                    reason: format!(
                        "must equal the attention head_dim {}, got {}",
                        self.head_width(),
                        rope.head_dim
                    ),
                });
            }
        }
        Ok(())
    }

    /// Builds the module, or returns why the configuration is invalid.
    pub fn try_init(&self, device: &Device) -> Result<MultiHeadAttention, ConfigError> {
        self.validate()?;
        let head_dim = self.head_width();
        let n_kv_heads = self.kv_heads();
        let d_kv_input = self.d_kv_input.unwrap_or(self.d_model);
        let linear = |d_in: usize, d_out: usize, bias: bool| {
            LinearConfig::new(d_in, d_out)
                .with_bias(bias)
                .with_initializer(self.initializer.clone())
                .init(device)
        };
        let (q_norm, k_norm) = match &self.qk_norm {
            Some(qk_norm) => {
                let (q, k) = qk_norm.try_init(self.n_heads, n_kv_heads, head_dim, device)?;
                (Some(q), Some(k))
            }
            None => (None, None),
        };
        // A layer that reuses keys and values has none of their parameters.
        let projects_kv = !self.reuses_kv();
        let kv_linear = || linear(d_kv_input, n_kv_heads * head_dim, self.qkv_bias);
        Ok(MultiHeadAttention {
            q_proj: linear(
                self.d_model,
                self.n_heads * head_dim * if self.output_gate { 2 } else { 1 },
                self.qkv_bias,
            ),
            k_proj: projects_kv.then(kv_linear),
            v_proj: (projects_kv && !self.values_from_keys).then(kv_linear),
            o_proj: linear(self.n_heads * head_dim, self.d_model, self.o_bias),
            rope: self
                .rope
                .as_ref()
                .map(|rope| rope.try_init(device))
                .transpose()?,
            q_norm,
            k_norm: k_norm.filter(|_| projects_kv),
            v_norm: self
                .value_norm_eps
                .filter(|_| projects_kv)
                .map(|eps| {
                    RmsNormConfig::new(head_dim)
                        .with_eps(eps)
                        .with_scale(false)
                        .try_init(device)
                })
                .transpose()?,
            sinks: self
                .sinks
                .then(|| self.initializer.init([self.n_heads], device)),
            dropout: DropoutConfig::new(self.dropout).init(),
            n_heads: self.n_heads,
            alibi: self.alibi,
            n_kv_heads,
            head_dim,
            causal: self.causal,
            window: self.window,
            chunk: self.chunk,
            softcap: self.softcap,
            scale: self.scale,
            implementation: self.implementation,
            qk_norm: self.qk_norm.as_ref().map(|qk_norm| qk_norm.placement),
            query_temperature: self.query_temperature.clone(),
            qkv_clip: self.qkv_clip,
            kv_sharing: self.kv_sharing,
            output_gate: self.output_gate,
        })
    }
}

crate::builders::init_or_panic!(MultiHeadAttentionConfig => MultiHeadAttention);

impl MultiHeadAttention {
    /// Number of query heads.
    pub fn n_heads(&self) -> usize {
        self.n_heads
    }

    /// Number of key/value heads.
    pub fn n_kv_heads(&self) -> usize {
        self.n_kv_heads
    }

    /// Width of one head.
    pub fn head_dim(&self) -> usize {
        self.head_dim
    }

    /// The module with another attention implementation, weights kept.
    pub fn with_implementation(mut self, implementation: AttentionImpl) -> Self {
        self.implementation = implementation;
        self
    }

    /// The sliding window, if any.
    pub fn window(&self) -> Option<usize> {
        self.window
    }

    /// How the layer shares keys and values with others, if it does.
    pub fn kv_sharing(&self) -> Option<KvSharing> {
        self.kv_sharing
    }

    /// Self-attention over `x`.
    ///
    /// # Shapes
    /// - x: `[batch, seq, d_model]`
    /// - key_padding: `[batch, seq]`, `true` for padded positions
    /// - output: `[batch, seq, d_model]`
    ///
    /// # Panics
    /// If the layer reuses another's keys and values: run it with
    /// [`forward_sharing`](Self::forward_sharing), after that layer.
    pub fn forward(&self, x: Tensor<3>, key_padding: Option<Tensor<2, Bool>>) -> Tensor<3> {
        self.forward_sharing(x, key_padding, &mut SharedKv::default())
    }

    /// [`forward`](Self::forward) that publishes its keys and values in `shared`, or
    /// reuses those published there, as [`KvSharing`] says.
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
        self.attend_self(x, key_padding, None, shared, false).0
    }

    /// Self-attention over the new positions `x`, attending also to everything in
    /// `cache`, which is then extended with them. Equals [`forward`](Self::forward)
    /// on the whole sequence, one chunk at a time.
    ///
    /// # Shapes
    /// - x: `[batch, new, d_model]`
    /// - key_padding: `[batch, new]` for the new positions, `true` = padded
    /// - output: `[batch, new, d_model]`
    ///
    /// # Panics
    /// As [`forward`](Self::forward).
    pub fn forward_cached(
        &self,
        x: Tensor<3>,
        cache: &mut KvCache,
        key_padding: Option<Tensor<2, Bool>>,
    ) -> Tensor<3> {
        self.forward_cached_sharing(x, cache, key_padding, &mut SharedKv::default())
    }

    /// [`forward_cached`](Self::forward_cached) that publishes the keys and values it
    /// attends over (the whole cache's) in `shared`, or reuses those published there
    /// (leaving its own `cache` empty), as [`KvSharing`] says.
    ///
    /// # Shapes
    /// As [`forward_cached`](Self::forward_cached).
    ///
    /// # Panics
    /// As [`forward_sharing`](Self::forward_sharing).
    pub fn forward_cached_sharing(
        &self,
        x: Tensor<3>,
        cache: &mut KvCache,
        key_padding: Option<Tensor<2, Bool>>,
        shared: &mut SharedKv,
    ) -> Tensor<3> {
        self.attend_self(x, key_padding, Some(cache), shared, false)
            .0
    }

    /// Cross-attention: queries from `x`, keys and values from `memory` (an encoder's
    /// output). No RoPE and no causal mask are applied to memory positions.
    ///
    /// # Shapes
    /// - x: `[batch, seq, d_model]`
    /// - memory: `[batch, seq_memory, d_kv_input]`
    /// - memory_padding: `[batch, seq_memory]`, `true` = padded
    /// - output: `[batch, seq, d_model]`
    pub fn forward_cross(
        &self,
        x: Tensor<3>,
        memory: Tensor<3>,
        memory_padding: Option<Tensor<2, Bool>>,
    ) -> Tensor<3> {
        let (q, gate) = self.project_queries_unrotated(x);
        let (k, v) = self.project_keys_values(memory, None);
        let output = attention(q, k, v, &self.options(false, memory_padding));
        self.merge_heads(output, gate)
    }

    /// Cross-attention that projects `memory` once into `cache` and reuses it in
    /// later decoding steps (`memory` is read only when the cache is empty).
    ///
    /// # Shapes
    /// As [`forward_cross`](Self::forward_cross).
    pub fn forward_cross_cached(
        &self,
        x: Tensor<3>,
        memory: Tensor<3>,
        memory_padding: Option<Tensor<2, Bool>>,
        cache: &mut CrossKvCache,
    ) -> Tensor<3> {
        let (q, gate) = self.project_queries_unrotated(x);
        let (k, v) = match &cache.entries {
            Some(entries) => entries.clone(),
            None => {
                let entries = self.project_keys_values(memory, None);
                cache.entries = Some(entries.clone());
                entries
            }
        };
        let output = attention(q, k, v, &self.options(false, memory_padding));
        self.merge_heads(output, gate)
    }

    /// [`forward`](Self::forward) that also returns the attention probabilities, for
    /// inspection and plots. Both come from the reference path (the fused kernel never
    /// forms the probabilities), without attention dropout.
    ///
    /// # Shapes
    /// - x: `[batch, seq, d_model]`
    /// - key_padding: `[batch, seq]`, `true` for padded positions
    /// - output: `[batch, seq, d_model]` and the weights `[batch, n_heads, seq, seq]`
    ///   (row = query, column = key; hidden keys get 0)
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

    /// [`forward_with_weights`](Self::forward_with_weights) that shares keys and
    /// values through `shared` as [`forward_sharing`](Self::forward_sharing) does.
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
        let (output, weights) = self.attend_self(x, key_padding, None, shared, true);
        (output, weights.expect("the weights were asked for"))
    }

    /// The one self-attention data flow: keys and values of its own (appended to
    /// `cache` when decoding) or reused from `shared`, published there when the layer
    /// shares them; the probabilities too when `keep_weights` (reference path, no
    /// dropout).
    ///
    /// # Shapes
    /// - x: `[batch, new, d_model]`
    /// - key_padding: `[batch, new]`, `true` = padded
    /// - output: `[batch, new, d_model]`, and the weights `[batch, n_heads, new, keys]`
    fn attend_self(
        &self,
        x: Tensor<3>,
        key_padding: Option<Tensor<2, Bool>>,
        cache: Option<&mut KvCache>,
        shared: &mut SharedKv,
        keep_weights: bool,
    ) -> (Tensor<3>, Option<Tensor<4>>) {
        let attended = match self.kv_sharing {
            Some(KvSharing::Reuse { slot }) => shared
                .get(slot)
                .unwrap_or_else(|| {
                    panic!(
                        "MultiHeadAttention: this layer reuses the keys and values of slot \
                         {slot}, which no earlier layer of the pass published"
                    )
                })
                .clone(),
            _ => {
                let query_offset = cache.as_ref().map_or(0, |cache| cache.position());
                let (keys, values) = self.project_keys_values(x.clone(), Some(query_offset));
                let (keys, values, padding) = match cache {
                    Some(cache) => cache.append(keys, values, key_padding),
                    None => (keys, values, key_padding),
                };
                AttendedKv {
                    keys,
                    values,
                    padding,
                    query_offset,
                }
            }
        };
        if let Some(KvSharing::Publish { slot }) = self.kv_sharing {
            shared.publish(slot, attended.clone());
        }
        let AttendedKv {
            keys,
            values,
            padding,
            query_offset,
        } = attended;
        let (q, gate) = self.project_queries(x, query_offset);
        let options = self.options(self.causal, padding);
        if keep_weights {
            let (output, weights) =
                self.attend_with_weights(q, gate, keys, values, &options.with_dropout(0.0));
            (output, Some(weights))
        } else {
            (
                self.merge_heads(attention(q, keys, values, &options), gate),
                None,
            )
        }
    }

    /// [`forward_cross`](Self::forward_cross) that also returns the attention
    /// probabilities over the memory positions (see
    /// [`forward_with_weights`](Self::forward_with_weights)).
    ///
    /// # Shapes
    /// - x: `[batch, seq, d_model]`
    /// - memory: `[batch, seq_memory, d_kv_input]`
    /// - memory_padding: `[batch, seq_memory]`, `true` = padded
    /// - output: `[batch, seq, d_model]` and the weights `[batch, n_heads, seq, seq_memory]`
    pub fn forward_cross_with_weights(
        &self,
        x: Tensor<3>,
        memory: Tensor<3>,
        memory_padding: Option<Tensor<2, Bool>>,
    ) -> (Tensor<3>, Tensor<4>) {
        let (q, gate) = self.project_queries_unrotated(x);
        let (k, v) = self.project_keys_values(memory, None);
        let options = self.options(false, memory_padding).with_dropout(0.0);
        self.attend_with_weights(q, gate, k, v, &options)
    }

    /// The output and the probabilities of one reference-path call.
    fn attend_with_weights(
        &self,
        q: Tensor<4>,
        gate: Option<Tensor<3>>,
        k: Tensor<4>,
        v: Tensor<4>,
        options: &AttentionOptions,
    ) -> (Tensor<3>, Tensor<4>) {
        let (output, weights) = attention_with_weights(q, k, v, options);
        (self.merge_heads(output, gate), weights)
    }

    /// The options of one call of the attention core.
    fn options(&self, causal: bool, key_padding: Option<Tensor<2, Bool>>) -> AttentionOptions {
        // Burn's dropout convention: active only while the layer is in training mode
        // and the computation is differentiated.
        let dropout = if self.dropout.training.is_enabled() {
            self.dropout.prob
        } else {
            0.0
        };
        AttentionOptions::new()
            .with_scale(self.scale)
            .with_causal(causal)
            .with_window(self.window)
            .with_chunk(self.chunk)
            .with_key_padding(key_padding)
            .with_softcap(self.softcap)
            .with_dropout(dropout)
            .with_sinks(self.sinks.as_ref().map(|sinks| sinks.val()))
            .with_alibi(self.alibi)
            .with_implementation(self.implementation)
    }

    /// `[batch, seq, d_model] -> [batch, n_heads, seq, head_dim]`, rotated from `offset`
    /// (and scaled by the query temperature); and the output gate `[batch, seq, n_heads
    /// * head_dim]`, if the module has one.
    fn project_queries(&self, x: Tensor<3>, offset: usize) -> (Tensor<4>, Option<Tensor<3>>) {
        let (q, gate) = self.queries_and_gate(x);
        let q = self.split_normed(q, self.n_heads, self.q_norm.as_ref());
        let q = match &self.rope {
            Some(rope) => rope.forward(q, offset),
            None => q,
        };
        let q = self.normed_after_rope(q, self.q_norm.as_ref());
        let q = match &self.query_temperature {
            Some(temperature) => temperature.scale(q, offset),
            None => q,
        };
        (q, gate)
    }

    /// Queries without RoPE (cross-attention), QK-normed; and the output gate.
    fn project_queries_unrotated(&self, x: Tensor<3>) -> (Tensor<4>, Option<Tensor<3>>) {
        let (q, gate) = self.queries_and_gate(x);
        let q = self.split_normed(q, self.n_heads, self.q_norm.as_ref());
        (self.normed_after_rope(q, self.q_norm.as_ref()), gate)
    }

    /// `q_proj`'s output: the queries `[batch, seq, n_heads * head_dim]`, and the
    /// output gate of the same shape when the module has one (stored per head after
    /// the head's query).
    fn queries_and_gate(&self, x: Tensor<3>) -> (Tensor<3>, Option<Tensor<3>>) {
        let projected = linear_rows(&self.q_proj, x);
        if !self.output_gate {
            return (projected, None);
        }
        let [batch, seq, _] = projected.dims();
        let (heads, width) = (self.n_heads, self.head_dim);
        let per_head = projected.reshape([batch, seq, heads, 2 * width]);
        let part = |start| {
            per_head
                .clone()
                .narrow(3, start, width)
                .reshape([batch, seq, heads * width])
        };
        (part(0), Some(part(width)))
    }

    /// `x` through QK-norm `norm` when its placement is after RoPE; `x` otherwise.
    ///
    /// # Shapes
    /// - x: `[batch, heads, seq, head_dim]`
    fn normed_after_rope(&self, x: Tensor<4>, norm: Option<&QkNorm>) -> Tensor<4> {
        match (norm, self.qk_norm) {
            (Some(norm), Some(QkNormPlacement::PerHeadAfterRope)) => norm.forward(x),
            _ => x,
        }
    }

    /// `[batch, seq, heads * head_dim] -> [batch, heads, seq, head_dim]`, with QK-norm
    /// `norm` applied here when its placement is before RoPE.
    fn split_normed(&self, x: Tensor<3>, heads: usize, norm: Option<&QkNorm>) -> Tensor<4> {
        match (norm, self.qk_norm) {
            (Some(norm), Some(QkNormPlacement::AcrossHeads)) => {
                split_heads(self.clipped(norm.forward(x)), heads, self.head_dim)
            }
            (Some(norm), Some(QkNormPlacement::PerHead)) => {
                norm.forward(split_heads(self.clipped(x), heads, self.head_dim))
            }
            _ => split_heads(self.clipped(x), heads, self.head_dim),
        }
    }

    /// `x` clamped to `[-qkv_clip, qkv_clip]`, if the module clips.
    ///
    /// # Shapes
    /// - x: `[batch, seq, heads * head_dim]`
    fn clipped(&self, x: Tensor<3>) -> Tensor<3> {
        match self.qkv_clip {
            Some(clip) => x.clamp(-clip, clip),
            None => x,
        }
    }

    /// Keys and values `[batch, n_kv_heads, seq, head_dim]`; keys rotated from
    /// `rope_offset` when it is given and the module has RoPE.
    fn project_keys_values(
        &self,
        x: Tensor<3>,
        rope_offset: Option<usize>,
    ) -> (Tensor<4>, Tensor<4>) {
        let k_proj = self.k_proj.as_ref().expect(
            "MultiHeadAttention: a layer that reuses another's keys and values projects none",
        );
        let projected_keys = linear_rows(k_proj, x.clone());
        let projected_values = match &self.v_proj {
            Some(v_proj) => linear_rows(v_proj, x),
            None => projected_keys.clone(),
        };
        let k = self.split_normed(projected_keys, self.n_kv_heads, self.k_norm.as_ref());
        let v = split_heads(
            self.clipped(projected_values),
            self.n_kv_heads,
            self.head_dim,
        );
        let v = match &self.v_norm {
            Some(norm) => norm.forward(v),
            None => v,
        };
        let k = match (&self.rope, rope_offset) {
            (Some(rope), Some(offset)) => rope.forward(k, offset),
            _ => k,
        };
        (self.normed_after_rope(k, self.k_norm.as_ref()), v)
    }

    /// `[batch, n_heads, seq, head_dim] -> [batch, seq, d_model]`, gated by the sigmoid
    /// of `gate` (`[batch, seq, n_heads * head_dim]`) before `o_proj` when given.
    fn merge_heads(&self, x: Tensor<4>, gate: Option<Tensor<3>>) -> Tensor<3> {
        let [batch, n_heads, seq, head_dim] = x.dims();
        let x = x.swap_dims(1, 2).reshape([batch, seq, n_heads * head_dim]); // [batch, seq, n_heads * head_dim]
        let x = match gate {
            Some(gate) => x * sigmoid(gate),
            None => x,
        };
        linear_rows(&self.o_proj, x)
    }
}

/// `[batch, seq, heads * head_dim] -> [batch, heads, seq, head_dim]`.
fn split_heads(x: Tensor<3>, heads: usize, head_dim: usize) -> Tensor<4> {
    let [batch, seq, _] = x.dims();
    x.reshape([batch, seq, heads, head_dim]).swap_dims(1, 2) // [batch, heads, seq, head_dim]
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::attention::padding_mask_from_lengths;
    use crate::test_utils::{Fixture, assert_close, test_devices};
    use burn::tensor::Distribution;

    fn config() -> MultiHeadAttentionConfig {
        MultiHeadAttentionConfig::new(32, 4)
            .with_n_kv_heads(Some(2))
            .with_head_dim(Some(12))
            .with_qkv_bias(true)
            .with_causal(true)
    }

    /// GQA attention against PyTorch's `scaled_dot_product_attention` with the masks
    /// of Hugging Face's `masking_utils` (tools/make_fixtures.py).
    #[test]
    fn matches_pytorch_for_every_mask_type() {
        for (name, causal, window) in [
            ("attention_gqa_full", false, None),
            ("attention_gqa_causal", true, None),
            ("attention_gqa_sliding_window", true, Some(3)),
            ("attention_gqa_padding", false, None),
            ("attention_gqa_causal_window_padding", true, Some(4)),
        ] {
            let fixture = Fixture::load(name);
            for device in test_devices() {
                let mut attention = MultiHeadAttentionConfig::new(24, 6)
                    .with_n_kv_heads(Some(2))
                    .with_head_dim(Some(8))
                    .with_qkv_bias(fixture.contains("q_proj.bias"))
                    .with_causal(causal)
                    .with_window(window)
                    .init(&device);
                attention.q_proj = fixture.linear("q_proj", &device);
                attention.k_proj = Some(fixture.linear("k_proj", &device));
                attention.v_proj = Some(fixture.linear("v_proj", &device));
                attention.o_proj = fixture.linear("o_proj", &device);
                let padding = fixture.contains("lengths").then(|| {
                    let lengths: Vec<usize> = fixture
                        .data("lengths")
                        .iter::<i64>()
                        .map(|length| length as usize)
                        .collect();
                    padding_mask_from_lengths(&lengths, 7, &device)
                });
                let output = attention.forward(fixture.tensor("x", &device), padding);
                assert_close(output, fixture.tensor("y", &device), 1e-5, name);
            }
        }
    }

    /// `x / sqrt(mean(x²) + eps) · weight` over the last axis, written out.
    fn naive_rms<const D: usize>(x: Tensor<D>, weight: Tensor<1>, eps: f64) -> Tensor<D> {
        let mean_square = x.clone().powf_scalar(2.0).mean_dim(D - 1);
        x / (mean_square + eps).sqrt() * weight.unsqueeze::<D>()
    }

    #[test]
    fn qk_norm_normalizes_queries_and_keys_where_each_placement_says() {
        use crate::attention::reference_attention;
        use crate::norm::Norm;
        use burn::module::Param;
        for placement in [
            QkNormPlacement::PerHead,
            QkNormPlacement::AcrossHeads,
            QkNormPlacement::PerHeadAfterRope,
        ] {
            for device in test_devices() {
                device.seed(11);
                let eps = 1e-5;
                let mut attention = config()
                    .with_rope(Some(RopeConfig::new(12)))
                    .with_qk_norm(Some(
                        QkNormConfig::new().with_placement(placement).with_eps(eps),
                    ))
                    .init(&device);
                let random_weight = |width: usize| {
                    Tensor::<1>::random([width], Distribution::Uniform(0.5, 1.5), &device)
                };
                let (q_width, k_width) = match placement {
                    QkNormPlacement::PerHead | QkNormPlacement::PerHeadAfterRope => (12, 12),
                    QkNormPlacement::AcrossHeads => (4 * 12, 2 * 12),
                };
                let (q_weight, k_weight) = (random_weight(q_width), random_weight(k_width));
                for (norm, weight) in [
                    (&mut attention.q_norm, &q_weight),
                    (&mut attention.k_norm, &k_weight),
                ] {
                    let Some(QkNorm::Shared(Norm::Rms(norm))) = norm.as_mut() else {
                        panic!("{placement:?}: an RMSNorm shared by the heads");
                    };
                    let dims = norm.weight.as_ref().map(|w| w.dims());
                    assert_eq!(dims, Some(weight.dims()), "{placement:?} width");
                    norm.weight = Some(Param::from_tensor(weight.clone()));
                }
                let x = Tensor::<3>::random([2, 5, 32], Distribution::Normal(0.0, 1.0), &device);

                // The same layer written out: project, split into heads, rotate, with
                // the norm where the placement says; attend, merge.
                let rope = attention.rope.as_ref().unwrap();
                let rotated_normed = |projected: Tensor<3>, heads: usize, weight: &Tensor<1>| {
                    let [batch, seq, _] = projected.dims();
                    match placement {
                        QkNormPlacement::AcrossHeads => rope.forward(
                            split_heads(naive_rms(projected, weight.clone(), eps), heads, 12),
                            0,
                        ),
                        QkNormPlacement::PerHead => {
                            let heads_last = projected.reshape([batch, seq, heads, 12]);
                            let normed = naive_rms(heads_last, weight.clone(), eps);
                            rope.forward(normed.swap_dims(1, 2), 0)
                        }
                        QkNormPlacement::PerHeadAfterRope => {
                            let rotated = rope.forward(split_heads(projected, heads, 12), 0);
                            naive_rms(rotated, weight.clone(), eps)
                        }
                    }
                };
                let q = rotated_normed(attention.q_proj.forward(x.clone()), 4, &q_weight);
                let k = rotated_normed(
                    attention.k_proj.as_ref().unwrap().forward(x.clone()),
                    2,
                    &k_weight,
                );
                let v = split_heads(attention.v_proj.as_ref().unwrap().forward(x.clone()), 2, 12);
                let options = AttentionOptions::new().with_causal(true);
                let expected = attention.merge_heads(reference_attention(q, k, v, &options), None);
                let name = format!("{placement:?}");
                assert_close(
                    attention.forward(x.clone(), None),
                    expected.clone(),
                    1e-5,
                    &name,
                );

                // Cached decoding normalizes each new chunk the same way.
                let mut cache = KvCache::new();
                let first = attention.forward_cached(x.clone().narrow(1, 0, 3), &mut cache, None);
                let rest = attention.forward_cached(x.narrow(1, 3, 2), &mut cache, None);
                assert_close(Tensor::cat(vec![first, rest], 1), expected, 1e-5, &name);
            }
        }
    }

    /// Gemma-4's global layers: no `v_proj`, the values are the key projection's output
    /// before the keys' QK-norm and RoPE, each value head normalized without a scale.
    #[test]
    fn values_from_the_keys_projection_are_normed_before_the_keys_are() {
        use crate::attention::reference_attention;
        use crate::norm::Norm;
        use burn::module::Param;
        for device in test_devices() {
            device.seed(17);
            let eps = 1e-5;
            let mut attention = config()
                .with_rope(Some(RopeConfig::new(12)))
                .with_qk_norm(Some(
                    QkNormConfig::new()
                        .with_placement(QkNormPlacement::PerHead)
                        .with_eps(eps),
                ))
                .with_values_from_keys(true)
                .with_value_norm_eps(Some(eps))
                .init(&device);
            assert!(attention.v_proj.is_none(), "no value projection");
            // A key norm weight far from 1, so that values normed as keys would differ.
            let k_weight = Tensor::<1>::random([12], Distribution::Uniform(0.5, 1.5), &device);
            let Some(QkNorm::Shared(Norm::Rms(k_norm))) = attention.k_norm.as_mut() else {
                panic!("an RMSNorm shared by the heads");
            };
            k_norm.weight = Some(Param::from_tensor(k_weight.clone()));
            let x = Tensor::<3>::random([2, 5, 32], Distribution::Normal(0.0, 1.0), &device);

            // Written out: one projection gives the keys (normed, rotated) and the values
            // (normed without a weight).
            let rope = attention.rope.as_ref().unwrap();
            let ones = Tensor::<1>::ones([12], &device);
            let heads_first = |projected: Tensor<3>, heads: usize, weight: &Tensor<1>| {
                let [batch, seq, _] = projected.dims();
                naive_rms(
                    projected.reshape([batch, seq, heads, 12]),
                    weight.clone(),
                    eps,
                )
                .swap_dims(1, 2)
            };
            let projected = attention.k_proj.as_ref().unwrap().forward(x.clone());
            let q = rope.forward(
                heads_first(attention.q_proj.forward(x.clone()), 4, &ones),
                0,
            );
            let k = rope.forward(heads_first(projected.clone(), 2, &k_weight), 0);
            let v = heads_first(projected, 2, &ones);
            let options = AttentionOptions::new().with_causal(true);
            let expected = attention.merge_heads(reference_attention(q, k, v, &options), None);
            assert_close(
                attention.forward(x.clone(), None),
                expected.clone(),
                1e-5,
                "full",
            );

            let mut cache = KvCache::new();
            let first = attention.forward_cached(x.clone().narrow(1, 0, 3), &mut cache, None);
            let rest = attention.forward_cached(x.narrow(1, 3, 2), &mut cache, None);
            assert_close(Tensor::cat(vec![first, rest], 1), expected, 1e-5, "cached");
        }
    }

    #[test]
    fn cached_decoding_equals_full_forward_with_gqa_and_sliding_window() {
        for device in test_devices() {
            device.seed(3);
            // RoPE rotates cached keys at their own positions: the offset must follow.
            let attention = config()
                .with_window(Some(4))
                .with_rope(Some(RopeConfig::new(12)))
                .init(&device);
            let x = Tensor::<3>::random([2, 11, 32], Distribution::Normal(0.0, 1.0), &device);
            let full = attention.forward(x.clone(), None);

            // Prefill 5 positions, then decode one by one, then a chunk of 2.
            let mut cache = KvCache::with_window(Some(4));
            let mut outputs =
                vec![attention.forward_cached(x.clone().narrow(1, 0, 5), &mut cache, None)];
            for position in 5..9 {
                outputs.push(attention.forward_cached(
                    x.clone().narrow(1, position, 1),
                    &mut cache,
                    None,
                ));
            }
            outputs.push(attention.forward_cached(x.clone().narrow(1, 9, 2), &mut cache, None));
            assert_eq!(cache.position(), 11);
            assert!(
                cache.len() <= 3,
                "a window-4 cache keeps 3 past positions, has {}",
                cache.len()
            );
            assert_close(Tensor::cat(outputs, 1), full, 1e-5, "cached vs full");
        }
    }

    /// Chunked attention sees only its own chunk, whole and while decoding across
    /// chunk boundaries (the cache keeps every key); a chunk with a window is refused.
    #[test]
    fn chunked_attention_decodes_as_it_attends_whole() {
        for device in test_devices() {
            device.seed(5);
            let chunked = config()
                .with_chunk(Some(4))
                .with_rope(Some(RopeConfig::new(12)))
                .init(&device);
            let x = Tensor::<3>::random([2, 11, 32], Distribution::Normal(0.0, 1.0), &device);
            let full = chunked.forward(x.clone(), None);
            // Position 9 sees positions 8 and 9 alone: the same layer over those two
            // (its first key at position 0) gives that row.
            let alone = chunked.forward(x.clone().narrow(1, 8, 2), None);
            assert_close(
                full.clone().narrow(1, 9, 1),
                alone.narrow(1, 1, 1),
                1e-5,
                "a chunk attends alone",
            );

            // Prefill 3 positions, decode across the boundaries at 4 and 8.
            let mut cache = KvCache::with_window(chunked.window());
            let mut outputs =
                vec![chunked.forward_cached(x.clone().narrow(1, 0, 3), &mut cache, None)];
            for position in 3..7 {
                outputs.push(chunked.forward_cached(
                    x.clone().narrow(1, position, 1),
                    &mut cache,
                    None,
                ));
            }
            outputs.push(chunked.forward_cached(x.clone().narrow(1, 7, 4), &mut cache, None));
            assert_eq!(cache.len(), 11);
            assert_close(Tensor::cat(outputs, 1), full, 1e-5, "cached vs full");
        }
        let error = config().with_chunk(Some(4)).with_window(Some(4)).validate();
        assert!(
            matches!(error, Err(ConfigError::Invalid { field: "chunk", .. })),
            "{error:?}"
        );
    }

    /// A layer that reuses keys and values attends with its own queries over those the
    /// publishing layer projected from its own input, whole and while decoding (the
    /// reusing layer's cache stays empty).
    #[test]
    fn a_reusing_layer_attends_over_the_published_keys_and_values() {
        for device in test_devices() {
            device.seed(8);
            let sharing = |kv_sharing| {
                config()
                    .with_window(Some(4))
                    .with_rope(Some(RopeConfig::new(12)))
                    .with_kv_sharing(Some(kv_sharing))
                    .init(&device)
            };
            let publisher = sharing(KvSharing::Publish { slot: 0 });
            let reader = sharing(KvSharing::Reuse { slot: 0 });
            assert!(reader.k_proj.is_none() && reader.v_proj.is_none());
            let x = Tensor::<3>::random([2, 7, 32], Distribution::Normal(0.0, 1.0), &device);
            let y = Tensor::<3>::random([2, 7, 32], Distribution::Normal(0.0, 1.0), &device);

            let mut shared = SharedKv::default();
            publisher.forward_sharing(x.clone(), None, &mut shared);
            let full = reader.forward_sharing(y.clone(), None, &mut shared);
            let (k, v) = publisher.project_keys_values(x.clone(), Some(0));
            let (q, gate) = reader.project_queries(y.clone(), 0);
            let expected =
                reader.merge_heads(attention(q, k, v, &reader.options(true, None)), gate);
            assert_close(full.clone(), expected, 1e-5, "reused keys and values");

            // Prefill 4 positions, then one by one: each step publishes anew.
            let (mut published, mut unused) = (KvCache::with_window(Some(4)), KvCache::new());
            let mut outputs = Vec::new();
            for (start, len) in [(0, 4), (4, 1), (5, 1), (6, 1)] {
                let mut shared = SharedKv::default();
                let step = |t: &Tensor<3>| t.clone().narrow(1, start, len);
                publisher.forward_cached_sharing(step(&x), &mut published, None, &mut shared);
                outputs.push(reader.forward_cached_sharing(
                    step(&y),
                    &mut unused,
                    None,
                    &mut shared,
                ));
            }
            assert!(unused.is_empty());
            assert_close(Tensor::cat(outputs, 1), full, 1e-5, "cached vs full");
        }
    }

    #[test]
    fn gqa_cache_stores_only_kv_heads() {
        let device = Device::flex();
        let attention = config().init(&device);
        let mut cache = KvCache::new();
        let x = Tensor::<3>::random([1, 6, 32], Distribution::Normal(0.0, 1.0), &device);
        attention.forward_cached(x, &mut cache, None);
        // 2 kv heads × 6 positions × 12 dims × (k + v) × 4 bytes.
        assert_eq!(cache.bytes(), 2 * 6 * 12 * 2 * 4);
    }

    #[test]
    fn padding_leaves_unpadded_outputs_unchanged() {
        for device in test_devices() {
            device.seed(5);
            let attention = config().with_causal(false).init(&device);
            let short = Tensor::<3>::random([1, 5, 32], Distribution::Normal(0.0, 1.0), &device);
            let alone = attention.forward(short.clone(), None);
            // Pad to 8 positions with garbage; mask the padding.
            let garbage = Tensor::<3>::random([1, 3, 32], Distribution::Normal(0.0, 9.0), &device);
            let padded = Tensor::cat(vec![short, garbage], 1);
            let mask = padding_mask_from_lengths(&[5], 8, &device);
            let batched = attention.forward(padded, Some(mask)).narrow(1, 0, 5);
            assert_close(batched, alone, 1e-5, "padded vs alone");
        }
    }

    #[test]
    fn cross_attention_cache_reuses_memory() {
        for device in test_devices() {
            device.seed(9);
            let attention = MultiHeadAttentionConfig::new(16, 4)
                .with_d_kv_input(Some(24))
                .init(&device);
            let x = Tensor::<3>::random([2, 3, 16], Distribution::Normal(0.0, 1.0), &device);
            let memory = Tensor::<3>::random([2, 7, 24], Distribution::Normal(0.0, 1.0), &device);
            let padding = padding_mask_from_lengths(&[7, 4], 7, &device);
            let full = attention.forward_cross(x.clone(), memory.clone(), Some(padding.clone()));
            let mut cache = CrossKvCache::new();
            let mut steps = Vec::new();
            for position in 0..3 {
                steps.push(attention.forward_cross_cached(
                    x.clone().narrow(1, position, 1),
                    memory.clone(),
                    Some(padding.clone()),
                    &mut cache,
                ));
            }
            assert!(cache.is_filled());
            assert_close(Tensor::cat(steps, 1), full, 1e-5, "cross cached vs full");
        }
    }

    /// The weights are the probabilities the output is made of: `forward_with_weights`
    /// returns `forward`'s output (pinned against PyTorch above), each visible row sums
    /// to 1, and future and padded keys get exactly 0.
    #[test]
    fn weights_are_the_probabilities_behind_the_output() {
        for device in test_devices() {
            device.seed(11);
            let attention = config().with_rope(Some(RopeConfig::new(12))).init(&device);
            let x = Tensor::<3>::random([2, 5, 32], Distribution::Normal(0.0, 1.0), &device);
            let padding = padding_mask_from_lengths(&[5, 3], 5, &device);
            let (output, weights) =
                attention.forward_with_weights(x.clone(), Some(padding.clone()));
            assert_close(
                output,
                attention.forward(x, Some(padding)),
                1e-5,
                "output with weights vs forward",
            );
            assert_eq!(weights.dims(), [2, 4, 5, 5]);
            let values = weights.to_data().try_to_vec::<f32>().unwrap();
            for (row, chunk) in values.chunks(5).enumerate() {
                let (batch, query) = (row / 20, row % 5);
                let length = [5, 3][batch];
                for (key, weight) in chunk.iter().enumerate() {
                    if key > query || key >= length {
                        assert_eq!(*weight, 0.0, "hidden key {key} of query {query}");
                    }
                }
                let total: f32 = chunk.iter().sum();
                assert!((total - 1.0).abs() < 1e-5, "row {row} sums to {total}");
            }
        }
    }

    #[test]
    fn cross_attention_weights_cover_the_unpadded_memory() {
        for device in test_devices() {
            device.seed(13);
            let attention = MultiHeadAttentionConfig::new(16, 4)
                .with_n_kv_heads(Some(2))
                .with_d_kv_input(Some(24))
                .init(&device);
            let x = Tensor::<3>::random([2, 3, 16], Distribution::Normal(0.0, 1.0), &device);
            let memory = Tensor::<3>::random([2, 7, 24], Distribution::Normal(0.0, 1.0), &device);
            let padding = padding_mask_from_lengths(&[7, 4], 7, &device);
            let (output, weights) = attention.forward_cross_with_weights(
                x.clone(),
                memory.clone(),
                Some(padding.clone()),
            );
            assert_close(
                output,
                attention.forward_cross(x, memory, Some(padding)),
                1e-5,
                "cross output with weights vs forward_cross",
            );
            assert_eq!(weights.dims(), [2, 4, 3, 7]);
            // Padded memory positions 4..7 of the second sequence get no weight.
            let padded = weights.narrow(0, 1, 1).narrow(3, 4, 3);
            assert_eq!(padded.abs().sum().into_scalar::<f32>(), 0.0);
        }
    }

    #[test]
    fn invalid_configs_return_typed_errors() {
        let device = Device::flex();
        let error = MultiHeadAttentionConfig::new(32, 6)
            .with_n_kv_heads(Some(4))
            .try_init(&device)
            .unwrap_err();
        assert!(matches!(error, ConfigError::NotDivisible { .. }), "{error}");
        let error = config().with_window(Some(0)).validate().unwrap_err();
        assert_eq!(
            error,
            ConfigError::Zero {
                module: "MultiHeadAttentionConfig",
                field: "window"
            }
        );
        let error = config().with_dropout(-0.1).validate().unwrap_err();
        assert!(matches!(error, ConfigError::Probability { .. }), "{error}");
        let error = config().with_qkv_clip(Some(0.0)).validate().unwrap_err();
        assert!(error.to_string().contains("qkv_clip"), "{error}");
    }

    #[test]
    #[should_panic(expected = "`n_heads` (6) must be divisible by `n_kv_heads` (4)")]
    fn init_panics_with_the_validation_message() {
        MultiHeadAttentionConfig::new(32, 6)
            .with_n_kv_heads(Some(4))
            .init(&Device::flex());
    }
}
