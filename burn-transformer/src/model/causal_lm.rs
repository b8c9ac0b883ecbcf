//! Decoder-only causal language models of the LLaMA family: LLaMA 2/3
//! ([Touvron et al. 2023](https://arxiv.org/abs/2307.09288)), Mistral (sliding window,
//! [Jiang et al. 2023](https://arxiv.org/abs/2310.06825)), Qwen2 (q/k/v biases),
//! Mixtral (sparse mixture of experts) and DeepSeek-V2/V3 (multi-head latent attention,
//! dense first layers then mixture of experts with shared experts).
//!
//! ```text
//! tokens ─► model.embed_tokens ─► model.layers × N ─► model.norm ─► lm_head ─► logits
//! ```
//!
//! The module tree carries Hugging Face's names (`model.embed_tokens`,
//! `model.layers.N.self_attn.q_proj`, `model.norm`, `lm_head`), so a checkpoint loads
//! with a rename table of (almost) nothing: see [`crate::hf`]. Presets of published
//! models live in [`super::presets`]; a Hugging Face `config.json` is read by
//! [`crate::hf::HfConfig`].

use burn::config::Config;
use burn::module::{Initializer, Module};
use burn::nn::{Embedding, EmbeddingConfig, Linear, LinearConfig};
use burn::tensor::{Bool, Device, Int, Tensor};

use super::decoder_layer::{DecoderLayer, LayerCache, Mlp, SelfAttention};
use crate::attention::{AttentionImpl, LatentAttentionConfig, MultiHeadAttentionConfig};
use crate::error::ConfigError;
use crate::ffn::{Activation, MoeConfig, MoeLayerPlan, SwiGluConfig};
use crate::norm::{RmsNorm, RmsNormConfig};
use crate::position::RopeConfig;

const MODULE: &str = "CausalLmConfig";

/// Configuration of a [`CausalLm`].
///
/// Build one from a preset ([`CausalLmConfig::llama_3_2_1b`], …), from a Hugging Face
/// `config.json` ([`crate::hf::HfConfig`]) or field by field.
#[derive(Config, Debug)]
pub struct CausalLmConfig {
    /// Number of token ids (HF `vocab_size`).
    pub vocab_size: usize,
    /// Width of the residual stream (HF `hidden_size`).
    pub d_model: usize,
    /// Number of decoder layers (HF `num_hidden_layers`).
    pub n_layers: usize,
    /// Number of query heads (HF `num_attention_heads`).
    pub n_heads: usize,
    /// Hidden width of the feed-forward networks (HF `intermediate_size`).
    pub d_ff: usize,
    /// Rotary embedding of queries and keys; its `head_dim` must be the attention's.
    pub rope: RopeConfig,
    /// Number of key/value heads (HF `num_key_value_heads`). Default: `n_heads` (MHA).
    #[config(default = "None")]
    pub n_kv_heads: Option<usize>,
    /// Width of one head (HF `head_dim`). Default: `d_model / n_heads`.
    #[config(default = "None")]
    pub head_dim: Option<usize>,
    /// Epsilon of every RMSNorm (HF `rms_norm_eps`). Default: 1e-6.
    #[config(default = 1e-6)]
    pub norm_eps: f64,
    /// Bias on the q, k and v projections (HF `attention_bias`; Qwen2 has them).
    /// Default: false.
    #[config(default = false)]
    pub qkv_bias: bool,
    /// Bias on the attention output projection (LLaMA's `attention_bias` covers it,
    /// Qwen2's q/k/v biases do not). Default: false.
    #[config(default = false)]
    pub o_bias: bool,
    /// Bias on the feed-forward projections (HF `mlp_bias`). Default: false.
    #[config(default = false)]
    pub mlp_bias: bool,
    /// Activation of the feed-forward gate (HF `hidden_act`). Default: SiLU.
    #[config(default = "Activation::Silu")]
    pub activation: Activation,
    /// Sliding attention window (HF `sliding_window`; Mistral). Default: none.
    #[config(default = "None")]
    pub sliding_window: Option<usize>,
    /// Which layers use `sliding_window` (HF `layer_types`; Qwen2's
    /// `max_window_layers`). Default: all of them.
    #[config(default = "None")]
    pub sliding_layers: Option<Vec<bool>>,
    /// The LM head shares the token embedding's weight (HF `tie_word_embeddings`).
    /// Default: false.
    #[config(default = false)]
    pub tie_word_embeddings: bool,
    /// Multi-head latent attention in every layer instead of grouped attention
    /// (DeepSeek-V2/V3). Its `d_model` and `n_heads` must be the model's; `rope`,
    /// `head_dim` and `n_kv_heads` above are then unused. Default: none.
    #[config(default = "None")]
    pub latent: Option<LatentAttentionConfig>,
    /// Mixture-of-experts feed-forward for the layers `moe_layers` selects (Mixtral,
    /// DeepSeek); the other layers keep the dense SwiGLU of width `d_ff`. Default: none.
    #[config(default = "None")]
    pub moe: Option<MoeConfig>,
    /// Which layers are sparse when `moe` is set (HF `first_k_dense_replace`,
    /// `moe_layer_freq`). Default: every layer.
    #[config(default = "MoeLayerPlan::all_sparse()")]
    pub moe_layers: MoeLayerPlan,
    /// Weight of the MoE load-balancing loss in the training loss (HF
    /// `router_aux_loss_coef`). Default: 0.001.
    #[config(default = 0.001)]
    pub aux_loss_coef: f64,
    /// Which attention implementation the layers use. Default: automatic.
    #[config(default = "AttentionImpl::Auto")]
    pub implementation: AttentionImpl,
    /// Initializer of the projection and embedding weights. Default: normal, std 0.02
    /// (HF `initializer_range`).
    #[config(default = "Initializer::Normal { mean: 0.0, std: 0.02 }")]
    pub initializer: Initializer,
}

impl CausalLmConfig {
    /// Number of key/value heads after defaults.
    pub fn kv_heads(&self) -> usize {
        self.n_kv_heads.unwrap_or(self.n_heads)
    }

    /// Width of one head after defaults.
    pub fn head_width(&self) -> usize {
        self.head_dim
            .unwrap_or(self.d_model.checked_div(self.n_heads).unwrap_or(0))
    }

    /// The sliding window of layer `layer`, if it has one.
    pub fn window_of(&self, layer: usize) -> Option<usize> {
        let window = self.sliding_window?;
        match &self.sliding_layers {
            Some(layers) => layers
                .get(layer)
                .copied()
                .unwrap_or(false)
                .then_some(window),
            None => Some(window),
        }
    }

    /// The attention configuration of layer `layer` (without its RoPE, which the model
    /// shares between layers).
    pub fn attention_config(&self, layer: usize) -> MultiHeadAttentionConfig {
        MultiHeadAttentionConfig::new(self.d_model, self.n_heads)
            .with_n_kv_heads(Some(self.kv_heads()))
            .with_head_dim(Some(self.head_width()))
            .with_qkv_bias(self.qkv_bias)
            .with_o_bias(self.o_bias)
            .with_causal(true)
            .with_window(self.window_of(layer))
            .with_implementation(self.implementation)
            .with_initializer(self.initializer.clone())
    }

    /// Checks the configuration without allocating anything.
    ///
    /// # Errors
    /// A [`ConfigError`] naming the field: zero sizes, heads that do not divide, a RoPE
    /// head size that is not the attention's, a `sliding_layers` list of the wrong
    /// length.
    pub fn validate(&self) -> Result<(), ConfigError> {
        ConfigError::check_positive(MODULE, "vocab_size", self.vocab_size)?;
        ConfigError::check_positive(MODULE, "n_layers", self.n_layers)?;
        ConfigError::check_positive(MODULE, "d_ff", self.d_ff)?;
        if let Some(moe) = &self.moe {
            moe.validate()?;
            if moe.router.d_model != self.d_model {
                return Err(self.mismatch("moe.router.d_model", moe.router.d_model));
            }
        }
        if !(self.aux_loss_coef.is_finite() && self.aux_loss_coef >= 0.0) {
            return Err(ConfigError::Invalid {
                module: MODULE,
                field: "aux_loss_coef",
                reason: format!(
                    "must be finite and non-negative, got {}",
                    self.aux_loss_coef
                ),
            });
        }
        if let Some(latent) = &self.latent {
            latent.validate()?;
            if latent.d_model != self.d_model {
                return Err(self.mismatch("latent.d_model", latent.d_model));
            }
            if latent.n_heads != self.n_heads {
                return Err(ConfigError::Invalid {
                    module: MODULE,
                    field: "latent.n_heads",
                    reason: format!(
                        "must equal n_heads {}, got {}",
                        self.n_heads, latent.n_heads
                    ),
                });
            }
        } else {
            self.validate_grouped_attention()?;
        }
        if let Some(layers) = &self.sliding_layers
            && layers.len() != self.n_layers
        {
            return Err(ConfigError::Invalid {
                module: MODULE,
                field: "sliding_layers",
                reason: format!("has {} entries for {} layers", layers.len(), self.n_layers),
            });
        }
        if !(self.norm_eps.is_finite() && self.norm_eps >= 0.0) {
            return Err(ConfigError::Invalid {
                module: MODULE,
                field: "norm_eps",
                reason: format!("must be finite and non-negative, got {}", self.norm_eps),
            });
        }
        Ok(())
    }

    fn mismatch(&self, field: &'static str, found: usize) -> ConfigError {
        ConfigError::Invalid {
            module: MODULE,
            field,
            reason: format!("must equal d_model {}, got {found}", self.d_model),
        }
    }

    /// The grouped attention and its RoPE agree.
    fn validate_grouped_attention(&self) -> Result<(), ConfigError> {
        self.attention_config(0).validate()?;
        self.rope.validate()?;
        if self.rope.head_dim != self.head_width() {
            return Err(ConfigError::Invalid {
                module: MODULE,
                field: "rope.head_dim",
                reason: format!(
                    "must equal the attention head_dim {}, got {}",
                    self.head_width(),
                    self.rope.head_dim
                ),
            });
        }
        Ok(())
    }

    /// Builds the model (parameters are initialized lazily: loading a checkpoint right
    /// after never materializes the random ones).
    ///
    /// # Errors
    /// See [`CausalLmConfig::validate`].
    pub fn try_init(&self, device: &Device) -> Result<CausalLm, ConfigError> {
        self.validate()?;
        // One RoPE for all grouped-attention layers: its cos/sin tables are shared by
        // cloning. MLA layers carry their own (decoupled, rope part only).
        let rope = match self.latent {
            None => Some(self.rope.try_init(device)?),
            Some(_) => None,
        };
        let norm = RmsNormConfig::new(self.d_model).with_eps(self.norm_eps);
        let layers = (0..self.n_layers)
            .map(|layer| {
                let self_attn = match &self.latent {
                    Some(latent) => SelfAttention::Latent(
                        latent
                            .clone()
                            .with_causal(true)
                            .with_implementation(self.implementation)
                            .with_initializer(self.initializer.clone())
                            .try_init(device)?,
                    ),
                    None => {
                        let mut attention = self.attention_config(layer).try_init(device)?;
                        attention.rope = rope.clone();
                        SelfAttention::Grouped(attention)
                    }
                };
                let mlp = match &self.moe {
                    Some(moe) if self.moe_layers.is_moe(layer) => Mlp::Moe(moe.try_init(device)?),
                    _ => {
                        let mlp = SwiGluConfig::new(self.d_model, self.d_ff)
                            .with_bias(self.mlp_bias)
                            .with_activation(self.activation)
                            .try_init(device)?;
                        Mlp::Dense(reinit_swiglu(mlp, &self.initializer, device))
                    }
                };
                Ok(DecoderLayer {
                    self_attn,
                    mlp,
                    input_layernorm: norm.try_init(device)?,
                    post_attention_layernorm: norm.try_init(device)?,
                    aux_loss_coef: self.aux_loss_coef,
                })
            })
            .collect::<Result<Vec<_>, ConfigError>>()?;
        let embed_tokens = EmbeddingConfig::new(self.vocab_size, self.d_model)
            .with_initializer(self.initializer.clone())
            .init(device);
        let lm_head = (!self.tie_word_embeddings).then(|| {
            LinearConfig::new(self.d_model, self.vocab_size)
                .with_bias(false)
                .with_initializer(self.initializer.clone())
                .init(device)
        });
        Ok(CausalLm {
            model: DecoderStack {
                embed_tokens,
                layers,
                norm: norm.try_init(device)?,
            },
            lm_head,
            vocab_size: self.vocab_size,
        })
    }

    /// Builds the model.
    ///
    /// # Panics
    /// If the configuration is invalid, with the message of [`CausalLmConfig::validate`].
    pub fn init(&self, device: &Device) -> CausalLm {
        self.try_init(device)
            .unwrap_or_else(|error| panic!("{error}"))
    }
}

/// SwiGLU initializes with Burn's default; LLaMA-family models use a normal of
/// `initializer_range`, which matters when training from scratch.
fn reinit_swiglu(
    mut ffn: crate::ffn::SwiGlu,
    initializer: &Initializer,
    device: &Device,
) -> crate::ffn::SwiGlu {
    let linear = |linear: &Linear| {
        let [d_input, d_output] = linear.weight.dims();
        LinearConfig::new(d_input, d_output)
            .with_bias(linear.bias.is_some())
            .with_initializer(initializer.clone())
            .init(device)
    };
    ffn.gate_proj = linear(&ffn.gate_proj);
    ffn.up_proj = linear(&ffn.up_proj);
    ffn.down_proj = linear(&ffn.down_proj);
    ffn
}

/// The transformer body (HF's `LlamaModel`, the `model.` prefix of checkpoint keys).
#[derive(Module, Debug)]
pub struct DecoderStack {
    /// Token embedding, `[vocab_size, d_model]`.
    pub embed_tokens: Embedding,
    /// The decoder layers.
    pub layers: Vec<DecoderLayer>,
    /// Final norm.
    pub norm: RmsNorm,
}

/// A decoder-only causal language model.
#[derive(Module, Debug)]
pub struct CausalLm {
    /// The transformer body.
    pub model: DecoderStack,
    /// The output projection; `None` when tied to `model.embed_tokens`.
    pub lm_head: Option<Linear>,
    #[module(skip)]
    vocab_size: usize,
}

/// What a forward pass returns.
#[derive(Debug, Clone)]
pub struct CausalLmOutput {
    /// `[batch, seq, vocab_size]`
    pub logits: Tensor<3>,
    /// The sum of the MoE layers' weighted load-balancing losses, `[1]`; `None` for
    /// dense models. Add it to the language-modelling loss when training.
    pub aux_loss: Option<Tensor<1>>,
}

/// The decoding state of a [`CausalLm`]: one cache per layer.
#[derive(Clone, Debug)]
pub struct DecoderCache {
    /// One per layer, in order.
    pub layers: Vec<LayerCache>,
}

impl DecoderCache {
    /// The absolute position of the next token (the number of positions seen).
    pub fn position(&self) -> usize {
        self.layers.first().map_or(0, LayerCache::position)
    }

    /// Bytes held by all layers' caches.
    pub fn bytes(&self) -> usize {
        self.layers.iter().map(LayerCache::bytes).sum()
    }

    /// Keeps only the batch rows in `indices`, in that order (beam search).
    ///
    /// # Shapes
    /// - indices: `[new_batch]`
    pub fn select_batch(&mut self, indices: Tensor<1, Int>) {
        for layer in &mut self.layers {
            layer.select_batch(indices.clone());
        }
    }
}

impl CausalLm {
    /// Number of token ids.
    pub fn vocab_size(&self) -> usize {
        self.vocab_size
    }

    /// Number of layers.
    pub fn n_layers(&self) -> usize {
        self.model.layers.len()
    }

    /// An empty decoding cache (rolling for sliding-window layers).
    pub fn new_cache(&self) -> DecoderCache {
        DecoderCache {
            layers: self
                .model
                .layers
                .iter()
                .map(DecoderLayer::new_cache)
                .collect(),
        }
    }

    /// Logits of every position of a whole sequence.
    ///
    /// # Shapes
    /// - tokens: `[batch, seq]`
    /// - key_padding: `[batch, seq]`, `true` for padding (left padding for batched
    ///   prompts of different lengths)
    /// - output: `[batch, seq, vocab_size]`
    pub fn forward(
        &self,
        tokens: Tensor<2, Int>,
        key_padding: Option<Tensor<2, Bool>>,
    ) -> Tensor<3> {
        self.forward_full(tokens, key_padding).logits
    }

    /// [`forward`](Self::forward) that also returns the MoE auxiliary loss.
    ///
    /// # Shapes
    /// As [`forward`](Self::forward).
    pub fn forward_full(
        &self,
        tokens: Tensor<2, Int>,
        key_padding: Option<Tensor<2, Bool>>,
    ) -> CausalLmOutput {
        self.run(tokens, key_padding, None)
    }

    /// Logits of the new positions `tokens`, attending to everything in `cache`,
    /// which is then extended with them. Prefill with the whole prompt, then call it
    /// with one token per step: the result equals [`forward`](Self::forward) on the
    /// whole sequence.
    ///
    /// # Shapes
    /// - tokens: `[batch, new]`
    /// - key_padding: `[batch, new]`, `true` for padding among the new positions
    /// - output: `[batch, new, vocab_size]`
    pub fn forward_cached(
        &self,
        tokens: Tensor<2, Int>,
        cache: &mut DecoderCache,
        key_padding: Option<Tensor<2, Bool>>,
    ) -> Tensor<3> {
        self.run(tokens, key_padding, Some(cache)).logits
    }

    /// The final hidden states (after `model.norm`), before the LM head.
    ///
    /// # Shapes
    /// - tokens: `[batch, seq]`
    /// - output: `[batch, seq, d_model]`
    pub fn hidden_states(
        &self,
        tokens: Tensor<2, Int>,
        key_padding: Option<Tensor<2, Bool>>,
    ) -> Tensor<3> {
        self.body(tokens, key_padding, None).0
    }

    fn run(
        &self,
        tokens: Tensor<2, Int>,
        key_padding: Option<Tensor<2, Bool>>,
        cache: Option<&mut DecoderCache>,
    ) -> CausalLmOutput {
        let (hidden, aux_loss) = self.body(tokens, key_padding, cache);
        CausalLmOutput {
            logits: self.lm_head(hidden),
            aux_loss,
        }
    }

    fn body(
        &self,
        tokens: Tensor<2, Int>,
        key_padding: Option<Tensor<2, Bool>>,
        mut cache: Option<&mut DecoderCache>,
    ) -> (Tensor<3>, Option<Tensor<1>>) {
        if let Some(cache) = &cache {
            assert_eq!(
                cache.layers.len(),
                self.model.layers.len(),
                "CausalLm: the cache has {} layers, the model {}",
                cache.layers.len(),
                self.model.layers.len()
            );
        }
        let mut x = self.model.embed_tokens.forward(tokens);
        let mut aux_loss: Option<Tensor<1>> = None;
        for (index, layer) in self.model.layers.iter().enumerate() {
            let layer_cache = cache.as_deref_mut().map(|cache| &mut cache.layers[index]);
            let (output, aux) = layer.forward(x, key_padding.clone(), layer_cache);
            x = output;
            aux_loss = match (aux_loss, aux.aux_loss) {
                (Some(total), Some(loss)) => Some(total + loss),
                (total, loss) => total.or(loss),
            };
        }
        (self.model.norm.forward(x), aux_loss)
    }

    /// `[batch, seq, d_model] -> [batch, seq, vocab_size]`.
    fn lm_head(&self, hidden: Tensor<3>) -> Tensor<3> {
        match &self.lm_head {
            Some(head) => head.forward(hidden),
            None => {
                let [batch, seq, d_model] = hidden.dims();
                // The embedding is [vocab, d_model]; tied logits are hidden · Eᵀ.
                let weight = self.model.embed_tokens.weight.val();
                hidden
                    .reshape([batch * seq, d_model]) // [batch * seq, d_model]
                    .matmul(weight.transpose())
                    .reshape([batch, seq, self.vocab_size]) // [batch, seq, vocab_size]
            }
        }
    }
}
