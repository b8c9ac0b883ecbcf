//! Decoder-only causal language models of the LLaMA family: LLaMA 2/3
//! ([Touvron et al. 2023](https://arxiv.org/abs/2307.09288)), Mistral (sliding window,
//! [Jiang et al. 2023](https://arxiv.org/abs/2310.06825)), Qwen2 (q/k/v biases),
//! Mixtral (sparse mixture of experts) and DeepSeek-V2/V3 (multi-head latent attention,
//! dense first layers then mixture of experts with shared experts, multi-token
//! prediction); and GPT-2 ([Radford et al. 2019](https://openai.com/research/better-language-models)),
//! whose positions are a learned table instead of RoPE.
//!
//! ```text
//! tokens ─► embed_tokens (+ embed_positions) (─► embed_norm) ─► model.layers × N ─► model.norm ─► lm_head ─► logits
//!                                              (a TransformerStack of TransformerBlocks)
//! ```
//!
//! The body is a [`TransformerStack`], the same blocks as the encoder-decoder's, so
//! every block option applies: Pre-LN (the default, as LLaMA), Post-LN, parallel or
//! ResiDual blocks, stochastic depth, grouped or latent attention, dense or MoE
//! feed-forwards (whose load-balancing and z-losses the training loss can include).
//! Multi-token-prediction modules ([`super::multi_token`]) may follow the stack.
//! The module tree carries Hugging Face's names (`model.layers.N.self_attn.q_proj`,
//! `model.norm`, `lm_head`; HF's `model.embed_tokens` is our `embed_tokens`), so a
//! checkpoint loads with a rename table: see [`crate::hf`]. Presets of published
//! models live in [`super::presets`]; a Hugging Face `config.json` is read by
//! [`crate::hf::HfConfig`].

use burn::config::Config;
use burn::module::{Initializer, Module, Param};
use burn::nn::{Embedding, EmbeddingConfig, Linear, LinearConfig};
use burn::tensor::{Bool, Device, Int, Tensor};

use crate::attention::{
    AttentionImpl, GatedDeltaNetConfig, KvSharing, LatentAttentionConfig, MultiHeadAttentionConfig,
    QkNormConfig, QueryTemperatureConfig, SelfAttention, SelfAttentionConfig,
};
use crate::block::{
    BlockCache, BlockKind, PerLayerInputConfig, RoutingLosses, StackCache, TransformerBlock,
    TransformerBlockConfig, TransformerStack,
};
use crate::error::ConfigError;
use crate::ffn::{
    Activation, DenseFfnConfig, FeedForwardConfig, MoeConfig, MoeLayerPlan, SwiGluConfig,
};
use crate::norm::{LayerNormConfig, Norm, NormConfig, RmsNormConfig};
use crate::ops::alibi::Alibi;
use crate::ops::linear::{linear_rows, matmul_rows};
use crate::ops::soft_cap::soft_cap;
use crate::position::{LearnedPosition, LearnedPositionConfig, Rope, RopeConfig};

use super::multi_token::MultiTokenPredictor;
use super::per_layer_embedding::{PerLayerEmbedding, PerLayerEmbeddingConfig};

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
    /// Width of one head in the global layers (those without a sliding window), where
    /// it differs from `head_dim` (Gemma-4's `global_head_dim`). `rope` rotates the
    /// global layers, so its `head_dim` must be this one, and `sliding_rope` (of
    /// `head_dim`) the sliding layers. Not available with `latent`. Default: `head_dim`.
    #[config(default = "None")]
    pub global_head_dim: Option<usize>,
    /// Number of key/value heads in the global layers (Gemma-4's
    /// `num_global_key_value_heads`). Not available with `latent`. Default: `n_kv_heads`.
    #[config(default = "None")]
    pub global_kv_heads: Option<usize>,
    /// In the global layers, the values are the key projection's output, taken before
    /// QK-norm and RoPE: those layers have no `v_proj` (Gemma-4's `attention_k_eq_v`).
    /// Default: false.
    #[config(default = false)]
    pub global_values_from_keys: bool,
    /// Every grouped-attention layer normalizes each value head by its root mean
    /// square, with `norm_eps` and without a learned scale (Gemma-4's `v_norm`).
    /// Default: false.
    #[config(default = false)]
    pub value_norm: bool,
    /// Every block multiplies the stream it returns by a factor of its own, loaded from
    /// checkpoints and kept fixed in training (Gemma-4's `layer_scalar`; see
    /// [`TransformerBlockConfig::layer_scalar`]). Default: false.
    #[config(default = false)]
    pub layer_scalar: bool,
    /// Per-layer embeddings of this width (Gemma-4 E2B/E4B's
    /// `hidden_size_per_layer_input`): every decoder layer reads an input of its own
    /// ([`PerLayerEmbedding`]) through a branch after its sublayers
    /// ([`PerLayerInput`](crate::block::PerLayerInput)). Default: none.
    #[config(default = "None")]
    pub per_layer_input_width: Option<usize>,
    /// Number of token ids of the per-layer embedding table (HF
    /// `vocab_size_per_layer_input`); at least `vocab_size`. Default: `vocab_size`.
    #[config(default = "None")]
    pub per_layer_vocab_size: Option<usize>,
    /// The last this many decoder layers project no keys or values: each attends over
    /// those of the last earlier layer of its kind (sliding or global), with queries of
    /// its own (Gemma-4's `num_kv_shared_layers`; [`KvSharing`]). Their decoding
    /// caches stay empty. Not available with `latent`. Default: 0.
    #[config(default = 0)]
    pub kv_shared_layers: usize,
    /// Hidden width of the dense feed-forward (in a mixture of experts, of its shared
    /// experts) in the layers of `kv_shared_layers` (Gemma-4's `use_double_wide_mlp`:
    /// `2 · d_ff`). Default: `d_ff`.
    #[config(default = "None")]
    pub kv_shared_d_ff: Option<usize>,
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
    /// Whether the dense feed-forward is gated (`down(act(gate(x)) · up(x))`, LLaMA's
    /// SwiGLU) or not (`fc2(act(fc1(x)))`, Arcee's squared ReLU). Default: gated.
    #[config(default = true)]
    pub gated_mlp: bool,
    /// Sliding attention window (HF `sliding_window`; Mistral). Default: none.
    #[config(default = "None")]
    pub sliding_window: Option<usize>,
    /// Which layers use `sliding_window` (HF `layer_types`; Qwen2's
    /// `max_window_layers`). Default: all of them.
    #[config(default = "None")]
    pub sliding_layers: Option<Vec<bool>>,
    /// Every norm of the model scales by `1 + weight` (Gemma's RMSNorm; with
    /// `layer_norm`, Nemotron's `LayerNorm1P`); QK-norm sets its own. Default: false.
    #[config(default = false)]
    pub norm_unit_offset: bool,
    /// Scale of `q·kᵀ` in every grouped-attention layer (Gemma:
    /// `query_pre_attn_scalar^-½`). Default: `head_dim^-½`.
    #[config(default = "None")]
    pub attention_scale: Option<f64>,
    /// Attention logit soft-capping `cap · tanh(s / cap)` in every grouped-attention
    /// layer (Gemma-2's `attn_logit_softcapping`). Default: none.
    #[config(default = "None")]
    pub attention_softcap: Option<f64>,
    /// The rotary embedding of the sliding-window layers, where it differs from `rope`
    /// (Gemma-3's local base frequency). Default: `rope` in every layer.
    #[config(default = "None")]
    pub sliding_rope: Option<RopeConfig>,
    /// Which layers attend without any position encoding (NoPE: no rotary embedding;
    /// causality alone tells positions apart), as SmolLM3's every fourth layer (HF
    /// `no_rope_layers`, where 0 marks them). Default: none.
    #[config(default = "None")]
    pub nope_layers: Option<Vec<bool>>,
    /// Learned absolute positions instead of RoPE: a table of this many positions
    /// (GPT-2's `n_positions`, HF `wpe`) whose rows are added to the token embeddings,
    /// counting real tokens only (left padding takes no position, see
    /// [`LearnedPosition::forward_padded`]). No layer rotates, so `rope` is unused and
    /// `sliding_rope`, `nope_layers` and `layer_rope_theta` must stay unset; sequences
    /// are limited to this length (generation slides its context window there). Not
    /// available with `latent` or `mtp_depth`. Default: none (RoPE).
    #[config(default = "None")]
    pub learned_positions: Option<usize>,
    /// With `learned_positions`, rows of the table before position 0, never read (OPT
    /// keeps 2: position `p` reads row `p + 2`). Default: 0.
    #[config(default = 0)]
    pub reserved_position_rows: usize,
    /// ALiBi instead of RoPE (BLOOM, MPT): every layer's heads add a linear penalty on
    /// distance to their logits ([`Alibi`]), so no layer rotates and sequences
    /// have no length limit; `rope` is unused and `sliding_rope`, `nope_layers`,
    /// `layer_rope_theta` and `learned_positions` must stay unset. Not available with
    /// `latent`. The fused op takes ALiBi on every backend. Default: none (RoPE).
    #[config(default = "None")]
    pub alibi: Option<Alibi>,
    /// A norm of the model's kind on the embeddings before the first block (BLOOM's
    /// `word_embeddings_layernorm`), after learned positions are added. Not available
    /// with `mtp_depth`. Default: false.
    #[config(default = false)]
    pub embed_norm: bool,
    /// Factor on the token embeddings before the first block (Gemma: `√d_model`).
    /// Default: none.
    #[config(default = "None")]
    pub embed_scale: Option<f64>,
    /// Soft-capping of the output logits, `cap · tanh(logits / cap)` (Gemma-2's
    /// `final_logit_softcapping`). Default: none.
    #[config(default = "None")]
    pub final_logit_softcap: Option<f64>,
    /// Queries scaled by position in every layer, grouped or latent (Ministral-3's
    /// `llama_4_scaling_beta`, see [`QueryTemperatureConfig`]). Default: none.
    #[config(default = "None")]
    pub query_temperature: Option<QueryTemperatureConfig>,
    /// The layers of `query_temperature` (Llama 4: those without RoPE). Default: every
    /// layer.
    #[config(default = "None")]
    pub query_temperature_layers: Option<Vec<bool>>,
    /// Chunked local attention (Llama 4's `attention_chunk_size`): the layers of
    /// `chunked_layers` cut the positions into chunks of this many from the first and
    /// attend only within their own chunk (see [`crate::ops::mask`]); their caches keep
    /// every key. Not on a layer with a sliding window, nor with `latent`. Default: none.
    #[config(default = "None")]
    pub attention_chunk: Option<usize>,
    /// The layers of `attention_chunk` (Llama 4: those that rotate, HF `layer_types`
    /// `chunked_attention`). Default: every layer.
    #[config(default = "None")]
    pub chunked_layers: Option<Vec<bool>>,
    /// Factor on each sublayer's output before its residual add (Granite's
    /// `residual_multiplier`). Default: none.
    #[config(default = "None")]
    pub residual_scale: Option<f64>,
    /// Factor on the output logits (Cohere's `logit_scale`; Granite divides by its
    /// `logits_scaling`). Default: none.
    #[config(default = "None")]
    pub logit_scale: Option<f64>,
    /// Every norm of the model (blocks and final; not QK-norm) is a LayerNorm without
    /// a shift, `w · (x − mean) / √(var + eps)`, instead of an RMSNorm (Cohere's).
    /// Default: false.
    #[config(default = false)]
    pub layer_norm: bool,
    /// With `layer_norm`, a learned shift too, `w · (x − mean) / √(var + eps) + b`
    /// (PyTorch's `nn.LayerNorm`, StarCoder2's). Default: false.
    #[config(default = false)]
    pub layer_norm_bias: bool,
    /// Whether every norm of the model (blocks, final, embeddings'; not QK-norm) has a
    /// learned scale `w` (false: OLMo's LayerNorm and nanochat's RMSNorm, which have no
    /// parameters). Default: true.
    #[config(default = true)]
    pub norm_scale: bool,
    /// The RoPE base of each layer, in place of `rope.theta` (HF `layer_rope_theta`,
    /// Granite-SWA); layers of `nope_layers` do not rotate whatever it says. Not
    /// available with `latent`. Default: none (every layer at `rope.theta`).
    #[config(default = "None")]
    pub layer_rope_theta: Option<Vec<f64>>,
    /// Clamps every layer's projected queries, keys and values to `[-clip, clip]` (HF
    /// `clip_qkv`, OLMo). Not available with `latent`. Default: none.
    #[config(default = "None")]
    pub qkv_clip: Option<f64>,
    /// A learned attention sink per head in every grouped-attention layer (gpt-oss).
    /// Default: false.
    #[config(default = false)]
    pub attention_sinks: bool,
    /// QK-norm in every grouped-attention layer (Qwen3: per head, with `norm_eps`).
    /// Not available with `latent`. Default: none.
    #[config(default = "None")]
    pub qk_norm: Option<QkNormConfig>,
    /// The layers of `qk_norm` (Llama 4: those that rotate). Default: every layer.
    #[config(default = "None")]
    pub qk_norm_layers: Option<Vec<bool>>,
    /// The LM head shares the token embedding's weight (HF `tie_word_embeddings`).
    /// Default: false.
    #[config(default = false)]
    pub tie_word_embeddings: bool,
    /// A learned bias on the logits, `[vocab_size]` (HF `lm_head.bias`; ERNIE-4.5-MoE's
    /// `use_bias`), kept apart from the head's weight so that it also works with
    /// `tie_word_embeddings`. Default: false.
    #[config(default = false)]
    pub lm_head_bias: bool,
    /// A sigmoid gate on every grouped attention's output, projected by `q_proj`
    /// beside the queries (Qwen3-Next, Qwen3.5;
    /// [`MultiHeadAttentionConfig::output_gate`]). Not available with `latent`.
    /// Default: false.
    #[config(default = false)]
    pub attention_output_gate: bool,
    /// A linear attention in place of the grouped attention on the layers
    /// `linear_attention_layers` names (Qwen3-Next's and Qwen3.5's Gated DeltaNet, three
    /// layers in four); its `d_model` must be the model's. Not available with `latent`.
    /// Default: none.
    #[config(default = "None")]
    pub linear_attention: Option<GatedDeltaNetConfig>,
    /// The layers of `linear_attention`. Default: every layer.
    #[config(default = "None")]
    pub linear_attention_layers: Option<Vec<bool>>,
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
    /// Weight of the MoE router z-loss (ST-MoE) in the training loss (HF
    /// `router_z_loss_coef`; 0.001 is the paper's choice). Default: 0 (off).
    #[config(default = 0.0)]
    pub router_z_loss_coef: f64,
    /// Multi-token-prediction modules after the stack (DeepSeek-V3's
    /// `num_nextn_predict_layers`): module `k` (from 1) predicts the token `k + 1`
    /// ahead; each is a block configured as layer `n_layers + k − 1` would be. Not
    /// available with ResiDual blocks. Default: 0.
    #[config(default = 0)]
    pub mtp_depth: usize,
    /// Weight `λ` of the multi-token-prediction loss `λ/D · Σₖ CEₖ` in training
    /// (DeepSeek-V3: 0.3, then 0.1 for the last part of training). Default: 0.3.
    #[config(default = 0.3)]
    pub mtp_loss_weight: f64,
    /// Arrangement of norms and residuals in every block. Default: Pre-LN (LLaMA).
    #[config(default = "BlockKind::PreNorm")]
    pub block_kind: BlockKind,
    /// Stochastic depth: probability of dropping a block's sublayer for a whole sample
    /// during training. Default: 0.
    #[config(default = 0.0)]
    pub drop_path: f64,
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

    /// Whether layer `layer` is global: it attends without a sliding window.
    pub fn is_global_layer(&self, layer: usize) -> bool {
        self.window_of(layer).is_none()
    }

    /// Width of one head of layer `layer` after defaults ([`Self::global_head_dim`]).
    pub fn head_width_of(&self, layer: usize) -> usize {
        match self.global_head_dim {
            Some(width) if self.is_global_layer(layer) => width,
            _ => self.head_width(),
        }
    }

    /// Number of key/value heads of layer `layer` after defaults
    /// ([`Self::global_kv_heads`]).
    pub fn kv_heads_of(&self, layer: usize) -> usize {
        match self.global_kv_heads {
            Some(heads) if self.is_global_layer(layer) => heads,
            _ => self.kv_heads(),
        }
    }

    /// The sliding window of layer `layer`, if it has one.
    pub fn window_of(&self, layer: usize) -> Option<usize> {
        self.sliding_window
            .filter(|_| listed_or_all(&self.sliding_layers, layer))
    }

    /// The chunk of layer `layer`'s attention, if it has one ([`Self::attention_chunk`]).
    pub fn chunk_of(&self, layer: usize) -> Option<usize> {
        self.attention_chunk
            .filter(|_| listed_or_all(&self.chunked_layers, layer))
    }

    /// Whether layer `layer` is a linear attention one ([`Self::linear_attention`]).
    pub fn is_linear_attention_layer(&self, layer: usize) -> bool {
        self.linear_attention.is_some() && listed_or_all(&self.linear_attention_layers, layer)
    }

    /// Whether layer `layer` attends without a position encoding ([`Self::nope_layers`]).
    pub fn is_nope_layer(&self, layer: usize) -> bool {
        self.nope_layers
            .as_ref()
            .is_some_and(|layers| layers.get(layer).copied().unwrap_or(false))
    }

    /// The first decoder layer that reuses an earlier layer's keys and values
    /// ([`Self::kv_shared_layers`]); `n_layers` when none does.
    pub fn first_kv_shared_layer(&self) -> usize {
        self.n_layers.saturating_sub(self.kv_shared_layers)
    }

    /// The layer whose keys and values decoder layer `layer` reuses: the last layer of
    /// its kind (sliding or global) before [`Self::first_kv_shared_layer`]; `None` for
    /// the layers that project their own, or when no earlier layer is of its kind.
    pub fn kv_source_of(&self, layer: usize) -> Option<usize> {
        let first = self.first_kv_shared_layer();
        if !(first..self.n_layers).contains(&layer) {
            return None;
        }
        (0..first)
            .rev()
            .find(|&source| self.window_of(source) == self.window_of(layer))
    }

    /// How layer `layer` shares keys and values: reusing those of
    /// [`Self::kv_source_of`], publishing its own for later layers (slot: its index),
    /// or not at all.
    pub fn kv_sharing_of(&self, layer: usize) -> Option<KvSharing> {
        if let Some(slot) = self.kv_source_of(layer) {
            return Some(KvSharing::Reuse { slot });
        }
        (self.first_kv_shared_layer()..self.n_layers)
            .any(|reader| self.kv_source_of(reader) == Some(layer))
            .then_some(KvSharing::Publish { slot: layer })
    }

    /// Hidden width of the dense feed-forward of layer `layer` after defaults
    /// ([`Self::kv_shared_d_ff`]).
    pub fn d_ff_of(&self, layer: usize) -> usize {
        match self.kv_shared_d_ff {
            Some(width) if (self.first_kv_shared_layer()..self.n_layers).contains(&layer) => width,
            _ => self.d_ff,
        }
    }

    /// The attention configuration of layer `layer` (without its RoPE, which the model
    /// shares between layers).
    pub fn attention_config(&self, layer: usize) -> MultiHeadAttentionConfig {
        MultiHeadAttentionConfig::new(self.d_model, self.n_heads)
            .with_kv_sharing(self.kv_sharing_of(layer))
            .with_n_kv_heads(Some(self.kv_heads_of(layer)))
            .with_head_dim(Some(self.head_width_of(layer)))
            .with_values_from_keys(self.global_values_from_keys && self.is_global_layer(layer))
            .with_value_norm_eps(self.value_norm.then_some(self.norm_eps))
            .with_qkv_bias(self.qkv_bias)
            .with_o_bias(self.o_bias)
            .with_output_gate(self.attention_output_gate)
            .with_causal(true)
            .with_window(self.window_of(layer))
            .with_chunk(self.chunk_of(layer))
            .with_scale(self.attention_scale)
            .with_softcap(self.attention_softcap)
            .with_query_temperature(
                (self.query_temperature.clone())
                    .filter(|_| listed_or_all(&self.query_temperature_layers, layer)),
            )
            .with_sinks(self.attention_sinks)
            .with_alibi(self.alibi)
            .with_qk_norm(
                (self.qk_norm.clone()).filter(|_| listed_or_all(&self.qk_norm_layers, layer)),
            )
            .with_qkv_clip(self.qkv_clip)
            .with_implementation(self.implementation)
            .with_initializer(self.initializer.clone())
    }

    /// The self-attention of layer `layer`: linear where `linear_attention_layers` says
    /// so, latent when `latent` is set, else grouped (without its RoPE, which the model
    /// shares between layers).
    pub fn self_attention_config(&self, layer: usize) -> SelfAttentionConfig {
        if let Some(linear) = self
            .linear_attention
            .as_ref()
            .filter(|_| self.is_linear_attention_layer(layer))
        {
            return SelfAttentionConfig::GatedDeltaNet(
                linear.clone().with_initializer(self.initializer.clone()),
            );
        }
        match &self.latent {
            Some(latent) => SelfAttentionConfig::Latent(
                latent
                    .clone()
                    .with_query_temperature(
                        (self.query_temperature.clone()).or(latent.query_temperature.clone()),
                    )
                    .with_causal(true)
                    .with_implementation(self.implementation)
                    .with_initializer(self.initializer.clone()),
            ),
            None => SelfAttentionConfig::MultiHead(self.attention_config(layer)),
        }
    }

    /// The feed-forward of layer `layer`: the mixture of experts where `moe_layers`
    /// says so, else the dense feed-forward of width `d_ff` (gated unless `gated_mlp`
    /// is false).
    pub fn feed_forward_config(&self, layer: usize) -> FeedForwardConfig {
        let d_ff = self.d_ff_of(layer);
        match &self.moe {
            Some(moe) if self.moe_layers.is_moe(layer) => {
                FeedForwardConfig::Moe(if d_ff == self.d_ff {
                    moe.clone()
                } else {
                    moe.clone().with_shared_d_ff(Some(d_ff))
                })
            }
            _ if !self.gated_mlp => FeedForwardConfig::Dense(
                DenseFfnConfig::new(self.d_model, d_ff)
                    .with_bias(self.mlp_bias)
                    .with_activation(self.activation)
                    .with_initializer(Some(self.initializer.clone())),
            ),
            _ => FeedForwardConfig::SwiGlu(
                SwiGluConfig::new(self.d_model, d_ff)
                    .with_bias(self.mlp_bias)
                    .with_activation(self.activation)
                    .with_initializer(Some(self.initializer.clone())),
            ),
        }
    }

    /// The norm of every block and of the stack's end (and of Gemma-4's experts'
    /// branches, [`MoeConfig::stream_norms`]).
    pub fn norm_config(&self) -> NormConfig {
        self.norm_of_width(self.d_model)
    }

    /// The model's kind of norm over `width` features.
    fn norm_of_width(&self, width: usize) -> NormConfig {
        if self.layer_norm {
            return NormConfig::Layer(
                LayerNormConfig::new(width)
                    .with_eps(self.norm_eps)
                    .with_scale(self.norm_scale)
                    .with_bias(self.layer_norm_bias)
                    .with_unit_offset(self.norm_unit_offset),
            );
        }
        NormConfig::Rms(
            RmsNormConfig::new(width)
                .with_eps(self.norm_eps)
                .with_unit_offset(self.norm_unit_offset)
                .with_scale(self.norm_scale),
        )
    }

    /// The block of layer `layer`.
    pub fn block_config(&self, layer: usize) -> TransformerBlockConfig {
        TransformerBlockConfig::new(
            self.self_attention_config(layer),
            self.feed_forward_config(layer),
            self.norm_config(),
        )
        .with_kind(self.block_kind)
        .with_drop_path(self.drop_path)
        .with_residual_scale(self.residual_scale)
        .with_layer_scalar(self.layer_scalar)
        .with_per_layer_input(self.per_layer_input_config(layer))
    }

    /// The per-layer branch of decoder layer `layer`, with per-layer embeddings (the
    /// multi-token-prediction modules have none).
    fn per_layer_input_config(&self, layer: usize) -> Option<PerLayerInputConfig> {
        let width = self
            .per_layer_input_width
            .filter(|_| layer < self.n_layers)?;
        Some(
            PerLayerInputConfig::new(self.d_model, width, self.norm_config())
                .with_activation(self.activation)
                .with_initializer(self.initializer.clone()),
        )
    }

    /// The per-layer embeddings' configuration, if the model has them.
    pub fn per_layer_embedding_config(&self) -> Option<PerLayerEmbeddingConfig> {
        let width = self.per_layer_input_width?;
        Some(
            PerLayerEmbeddingConfig::new(
                self.per_layer_vocab_size.unwrap_or(self.vocab_size),
                self.d_model,
                self.n_layers,
                width,
                self.norm_of_width(width),
            )
            .with_initializer(self.initializer.clone()),
        )
    }

    /// Checks the configuration without allocating anything.
    ///
    /// # Errors
    /// A [`ConfigError`] naming the field: zero sizes, heads that do not divide, a RoPE
    /// head size that is not the attention's, a `sliding_layers` list of the wrong
    /// length, a loss weight that is negative, a drop-path probability outside
    /// `[0, 1)`.
    pub fn validate(&self) -> Result<(), ConfigError> {
        ConfigError::check_positive(MODULE, "vocab_size", self.vocab_size)?;
        ConfigError::check_positive(MODULE, "n_layers", self.n_layers)?;
        ConfigError::check_positive(MODULE, "d_ff", self.d_ff)?;
        // Before the layers' attention, which would name the chunk by its own field.
        self.validate_chunks()?;
        if let Some(scale) = self.embed_scale {
            ConfigError::check_finite(MODULE, "embed_scale", scale)?;
        }
        if let Some(scale) = self.logit_scale {
            ConfigError::check_finite(MODULE, "logit_scale", scale)?;
        }
        if let Some(cap) = self.final_logit_softcap {
            ConfigError::check_positive_real(MODULE, "final_logit_softcap", cap)?;
        }
        if let Some(moe) = &self.moe {
            moe.validate()?;
            if moe.router.d_model != self.d_model {
                return Err(self.mismatch("moe.router.d_model", moe.router.d_model));
            }
        }
        ConfigError::check_non_negative(MODULE, "aux_loss_coef", self.aux_loss_coef)?;
        ConfigError::check_non_negative(MODULE, "router_z_loss_coef", self.router_z_loss_coef)?;
        ConfigError::check_probability(MODULE, "drop_path", self.drop_path)?;
        ConfigError::check_non_negative(MODULE, "mtp_loss_weight", self.mtp_loss_weight)?;
        if self.layer_norm_bias && !self.layer_norm {
            return Err(ConfigError::Invalid {
                module: MODULE,
                field: "layer_norm_bias",
                reason: "shifts LayerNorms, but the model's norms are RMSNorms: set \
                         layer_norm too, or leave layer_norm_bias false"
                    .into(),
            });
        }
        if self.mtp_depth > 0 && self.block_kind == BlockKind::ResiDual {
            return Err(ConfigError::Invalid {
                module: MODULE,
                field: "mtp_depth",
                reason: "multi-token prediction reads the stack's normed output, which \
                         ResiDual blocks only form at the end; use another block_kind"
                    .into(),
            });
        }
        if let Some(latent) = &self.latent {
            if self.qk_norm.is_some() {
                return Err(ConfigError::Invalid {
                    module: MODULE,
                    field: "qk_norm",
                    reason: "applies to grouped attention; latent attention normalizes its \
                             own low-rank projections"
                        .into(),
                });
            }
            let grouped_only = [
                (self.global_head_dim.is_some(), "global_head_dim"),
                (self.global_kv_heads.is_some(), "global_kv_heads"),
                (self.global_values_from_keys, "global_values_from_keys"),
                (self.value_norm, "value_norm"),
            ];
            if let Some((_, field)) = grouped_only.iter().find(|(set, _)| *set) {
                return Err(ConfigError::Invalid {
                    module: MODULE,
                    field,
                    reason: "applies to grouped attention; latent attention has its own \
                             head shapes and projections: leave it unset"
                        .into(),
                });
            }
            if self.qkv_clip.is_some() {
                return Err(ConfigError::Invalid {
                    module: MODULE,
                    field: "qkv_clip",
                    reason: "applies to grouped attention; latent attention has no q/k/v \
                             projections to clamp: leave it unset"
                        .into(),
                });
            }
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
        for (field, layers) in [
            ("sliding_layers", &self.sliding_layers),
            ("nope_layers", &self.nope_layers),
            ("chunked_layers", &self.chunked_layers),
            ("qk_norm_layers", &self.qk_norm_layers),
            ("query_temperature_layers", &self.query_temperature_layers),
            ("linear_attention_layers", &self.linear_attention_layers),
        ] {
            if let Some(layers) = layers
                && layers.len() != self.n_layers
            {
                return Err(ConfigError::Invalid {
                    module: MODULE,
                    field,
                    reason: format!("has {} entries for {} layers", layers.len(), self.n_layers),
                });
            }
        }
        if let Some(bases) = &self.layer_rope_theta {
            let problem = if self.latent.is_some() {
                Some(
                    "latent attention rotates with its own RoPE; per-layer bases apply to \
                      grouped attention only"
                        .to_string(),
                )
            } else if bases.len() != self.n_layers {
                Some(format!(
                    "has {} entries for {} layers",
                    bases.len(),
                    self.n_layers
                ))
            } else {
                bases
                    .iter()
                    .find(|base| !(base.is_finite() && **base > 0.0))
                    .map(|base| format!("every base must be positive and finite, got {base}"))
            };
            if let Some(reason) = problem {
                return Err(ConfigError::Invalid {
                    module: MODULE,
                    field: "layer_rope_theta",
                    reason,
                });
            }
        }
        if self.reserved_position_rows > 0 && self.learned_positions.is_none() {
            return Err(ConfigError::Invalid {
                module: MODULE,
                field: "reserved_position_rows",
                reason: "reserves rows of a table of learned positions, which the model does \
                         not have: set learned_positions too, or leave it 0"
                    .into(),
            });
        }
        if let Some(positions) = self.learned_positions {
            ConfigError::check_positive(MODULE, "learned_positions", positions)?;
            self.check_replaces_rope("learned_positions", &[(self.mtp_depth > 0, "mtp_depth")])?;
        }
        if self.alibi.is_some() {
            let learned = self.learned_positions.is_some();
            self.check_replaces_rope("alibi", &[(learned, "learned_positions")])?;
        }
        if self.embed_norm && self.mtp_depth > 0 {
            return Err(ConfigError::Invalid {
                module: MODULE,
                field: "embed_norm",
                reason: "the multi-token-prediction modules read the embeddings without \
                         a norm: leave embed_norm false or mtp_depth 0"
                    .into(),
            });
        }
        if self.latent.is_some() && self.nope_layers.is_some() {
            return Err(ConfigError::Invalid {
                module: MODULE,
                field: "nope_layers",
                reason: "latent attention rotates its own part of every head; NoPE layers \
                         apply to grouped attention only"
                    .into(),
            });
        }
        self.validate_per_layer_inputs()?;
        self.validate_linear_attention()?;
        self.validate_kv_sharing()?;
        ConfigError::check_non_negative(MODULE, "norm_eps", self.norm_eps)
    }

    /// Chunked attention is grouped, on layers without a window; the per-layer lists
    /// of the chunks, QK-norm, query temperature and linear attention come with what
    /// they choose layers for.
    fn validate_chunks(&self) -> Result<(), ConfigError> {
        let invalid = |field, reason: String| {
            Err(ConfigError::Invalid {
                module: MODULE,
                field,
                reason,
            })
        };
        for (field, list, chosen, option) in [
            (
                "chunked_layers",
                self.chunked_layers.is_some(),
                self.attention_chunk.is_some(),
                "attention_chunk",
            ),
            (
                "qk_norm_layers",
                self.qk_norm_layers.is_some(),
                self.qk_norm.is_some(),
                "qk_norm",
            ),
            (
                "query_temperature_layers",
                self.query_temperature_layers.is_some(),
                self.query_temperature.is_some(),
                "query_temperature",
            ),
            (
                "linear_attention_layers",
                self.linear_attention_layers.is_some(),
                self.linear_attention.is_some(),
                "linear_attention",
            ),
        ] {
            if list && !chosen {
                return invalid(
                    field,
                    format!(
                        "chooses layers for {option}, which is unset: set it too, or leave {field} unset"
                    ),
                );
            }
        }
        let Some(chunk) = self.attention_chunk else {
            return Ok(());
        };
        ConfigError::check_positive(MODULE, "attention_chunk", chunk)?;
        if self.latent.is_some() {
            return invalid(
                "attention_chunk",
                "applies to grouped attention; latent attention has no chunks: leave it unset"
                    .into(),
            );
        }
        match (0..self.n_layers)
            .find(|&layer| self.chunk_of(layer).is_some() && self.window_of(layer).is_some())
        {
            Some(layer) => invalid(
                "attention_chunk",
                format!(
                    "applies to layer {layer}, which has a sliding window: a layer takes one                      of the two (set chunked_layers or sliding_layers apart)"
                ),
            ),
            None => Ok(()),
        }
    }

    /// A linear attention is valid, of the model's width, beside grouped attention only
    /// (as is the output gate), and never asked to share keys and values.
    fn validate_linear_attention(&self) -> Result<(), ConfigError> {
        let invalid = |field, reason: &str| {
            Err(ConfigError::Invalid {
                module: MODULE,
                field,
                reason: reason.into(),
            })
        };
        if self.latent.is_some() {
            if self.attention_output_gate {
                return invalid(
                    "attention_output_gate",
                    "applies to grouped attention; latent attention has no gate: leave it \
                     false",
                );
            }
            if self.linear_attention.is_some() {
                return invalid(
                    "linear_attention",
                    "replaces grouped attention on some layers; latent attention takes \
                     every layer: leave one of them unset",
                );
            }
        }
        let Some(linear) = &self.linear_attention else {
            return Ok(());
        };
        linear.validate()?;
        if linear.d_model != self.d_model {
            return Err(self.mismatch("linear_attention.d_model", linear.d_model));
        }
        if self.kv_shared_layers > 0 {
            return invalid(
                "kv_shared_layers",
                "shares grouped attention's keys and values between layers; a model with \
                 linear attention layers shares none: leave it 0",
            );
        }
        Ok(())
    }

    /// Per-layer embeddings have a positive width and a table covering the vocabulary.
    fn validate_per_layer_inputs(&self) -> Result<(), ConfigError> {
        if let Some(config) = self.per_layer_embedding_config() {
            config.validate()?;
            if config.vocab_size < self.vocab_size {
                return Err(ConfigError::Invalid {
                    module: MODULE,
                    field: "per_layer_vocab_size",
                    reason: format!(
                        "must cover every token id: at least vocab_size {}, got {}",
                        self.vocab_size, config.vocab_size
                    ),
                });
            }
        } else if self.per_layer_vocab_size.is_some() {
            return Err(ConfigError::Invalid {
                module: MODULE,
                field: "per_layer_vocab_size",
                reason: "sizes the per-layer embeddings, which the model does not have: set \
                         per_layer_input_width too, or leave it unset"
                    .into(),
            });
        }
        Ok(())
    }

    /// Layers that reuse keys and values each find an earlier layer of their kind to
    /// reuse them from, in grouped attention.
    fn validate_kv_sharing(&self) -> Result<(), ConfigError> {
        let invalid = |field, reason: String| {
            Err(ConfigError::Invalid {
                module: MODULE,
                field,
                reason,
            })
        };
        if let Some(width) = self.kv_shared_d_ff {
            ConfigError::check_positive(MODULE, "kv_shared_d_ff", width)?;
            if self.kv_shared_layers == 0 {
                return invalid(
                    "kv_shared_d_ff",
                    "sizes the feed-forward of the layers that reuse keys and values, which \
                     the model has none of: set kv_shared_layers too, or leave it unset"
                        .into(),
                );
            }
        }
        if self.kv_shared_layers == 0 {
            return Ok(());
        }
        if self.latent.is_some() {
            return invalid(
                "kv_shared_layers",
                "applies to grouped attention; latent attention caches its own latents: \
                 leave it 0"
                    .into(),
            );
        }
        if self.kv_shared_layers >= self.n_layers {
            return invalid(
                "kv_shared_layers",
                format!(
                    "is {} of {} layers: at least the first layer must project the keys and \
                     values the others reuse",
                    self.kv_shared_layers, self.n_layers
                ),
            );
        }
        let first = self.first_kv_shared_layer();
        match (first..self.n_layers).find(|&layer| self.kv_source_of(layer).is_none()) {
            Some(layer) => invalid(
                "kv_shared_layers",
                format!(
                    "makes layer {layer} reuse the keys and values of an earlier {} layer, \
                     but none of the first {first} layers is one",
                    if self.is_global_layer(layer) {
                        "global"
                    } else {
                        "sliding"
                    },
                ),
            ),
            None => Ok(()),
        }
    }

    /// A position scheme that takes the rotary embedding's place in every layer
    /// (`learned_positions`, `alibi`) leaves the rotary options unset, and `others`.
    fn check_replaces_rope(
        &self,
        scheme: &str,
        others: &[(bool, &'static str)],
    ) -> Result<(), ConfigError> {
        let rotary = [
            (self.latent.is_some(), "latent"),
            (self.sliding_rope.is_some(), "sliding_rope"),
            (self.nope_layers.is_some(), "nope_layers"),
            (self.layer_rope_theta.is_some(), "layer_rope_theta"),
        ];
        let conflict = rotary
            .iter()
            .chain(others)
            .find_map(|&(set, field)| set.then_some(field));
        match conflict {
            Some(field) => Err(ConfigError::Invalid {
                module: MODULE,
                field,
                reason: format!(
                    "does not apply with {scheme}, which takes the rotary embedding's place \
                     in every layer: leave one of them unset"
                ),
            }),
            None => Ok(()),
        }
    }

    fn mismatch(&self, field: &'static str, found: usize) -> ConfigError {
        ConfigError::Invalid {
            module: MODULE,
            field,
            reason: format!("must equal d_model {}, got {found}", self.d_model),
        }
    }

    /// The grouped attention and its RoPE agree: `rope` rotates the global layers (and
    /// the sliding ones when there is no `sliding_rope`), `sliding_rope` the sliding
    /// ones.
    fn validate_grouped_attention(&self) -> Result<(), ConfigError> {
        // The layers differ only in being sliding or global.
        let sliding = (0..self.n_layers).find(|&layer| !self.is_global_layer(layer));
        let global = (0..self.n_layers).find(|&layer| self.is_global_layer(layer));
        for layer in [sliding, global].into_iter().flatten() {
            self.attention_config(layer).validate()?;
        }
        let sliding_width = self.head_width();
        let global_width = self.global_head_dim.unwrap_or(sliding_width);
        if self.sliding_rope.is_none() && sliding.is_some() && sliding_width != global_width {
            return Err(ConfigError::Invalid {
                module: MODULE,
                field: "sliding_rope",
                reason: format!(
                    "is needed: the sliding layers' heads ({sliding_width}) differ from the \
                     global layers' ({global_width}), so each kind needs a rotary embedding \
                     of its own head_dim"
                ),
            });
        }
        if self.layer_rope_theta.is_some() && sliding_width != global_width {
            return Err(ConfigError::Invalid {
                module: MODULE,
                field: "layer_rope_theta",
                reason: "applies to models whose layers share one head width: leave it \
                         unset with global_head_dim"
                    .into(),
            });
        }
        let ropes = [
            ("rope.head_dim", Some(&self.rope), global_width),
            (
                "sliding_rope.head_dim",
                self.sliding_rope.as_ref(),
                sliding_width,
            ),
        ];
        for (field, rope, width) in ropes {
            let Some(rope) = rope else { continue };
            rope.validate()?;
            if rope.head_dim != width {
                return Err(ConfigError::Invalid {
                    module: MODULE,
                    field,
                    reason: format!(
                        "must equal the head_dim {width} of the layers it rotates, got {}",
                        rope.head_dim
                    ),
                });
            }
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
        let rotates =
            self.latent.is_none() && self.learned_positions.is_none() && self.alibi.is_none();
        let rope = rotates.then(|| self.rope.try_init(device)).transpose()?;
        // Sliding-window layers may rotate with their own frequencies (Gemma-3).
        let sliding_rope = match (&self.latent, &self.sliding_rope) {
            (None, Some(sliding)) => Some(sliding.try_init(device)?),
            _ => rope.clone(),
        };
        // Layers with a base of their own: one RoPE per distinct base, shared by cloning.
        let mut bases: Vec<(f64, Rope)> = Vec::new();
        let mut layer_ropes = Vec::new();
        for &theta in self.layer_rope_theta.iter().flatten() {
            let rope = match bases.iter().find(|(base, _)| *base == theta) {
                Some((_, rope)) => rope.clone(),
                None => {
                    let rope = self.rope.clone().with_theta(theta).try_init(device)?;
                    bases.push((theta, rope.clone()));
                    rope
                }
            };
            layer_ropes.push(rope);
        }
        let block = |layer: usize| -> Result<TransformerBlock, ConfigError> {
            let mut block = self.block_config(layer).try_init(device)?;
            if let SelfAttention::MultiHead(attention) = &mut block.self_attn {
                attention.rope = match self.window_of(layer) {
                    _ if self.is_nope_layer(layer) => None,
                    _ if layer < layer_ropes.len() => Some(layer_ropes[layer].clone()),
                    Some(_) => sliding_rope.clone(),
                    None => rope.clone(),
                };
            }
            Ok(block)
        };
        let layers = (0..self.n_layers)
            .map(block)
            .collect::<Result<Vec<_>, ConfigError>>()?;
        let mtp = (self.n_layers..self.n_layers + self.mtp_depth)
            .map(|layer| {
                MultiTokenPredictor::try_new(
                    block(layer)?,
                    &self.norm_config(),
                    self.initializer.clone(),
                    device,
                )
            })
            .collect::<Result<Vec<_>, ConfigError>>()?;
        let norm = self
            .block_kind
            .has_final_norm_by_default()
            .then(|| self.norm_config().try_init(device))
            .transpose()?;
        let embed_tokens = EmbeddingConfig::new(self.vocab_size, self.d_model)
            .with_initializer(self.initializer.clone())
            .init(device);
        let embed_positions = self
            .learned_positions
            .map(|positions| {
                LearnedPositionConfig::new(positions, self.d_model)
                    .with_reserved_rows(self.reserved_position_rows)
                    .with_initializer(self.initializer.clone())
                    .try_init(device)
            })
            .transpose()?;
        let embed_norm = self
            .embed_norm
            .then(|| self.norm_config().try_init(device))
            .transpose()?;
        let per_layer_embed = self
            .per_layer_embedding_config()
            .map(|config| config.try_init(device))
            .transpose()?;
        let lm_head = (!self.tie_word_embeddings).then(|| {
            LinearConfig::new(self.d_model, self.vocab_size)
                .with_bias(false)
                .with_initializer(self.initializer.clone())
                .init(device)
        });
        Ok(CausalLm {
            embed_tokens,
            embed_positions,
            embed_norm,
            per_layer_embed,
            model: TransformerStack::new(layers, norm)?,
            lm_head,
            lm_head_bias: self
                .lm_head_bias
                .then(|| Param::from_tensor(Tensor::zeros([self.vocab_size], device))),
            mtp,
            vocab_size: self.vocab_size,
            mtp_loss_weight: self.mtp_loss_weight,
            aux_loss_coef: self.aux_loss_coef,
            router_z_loss_coef: self.router_z_loss_coef,
            embed_scale: self.embed_scale,
            final_logit_softcap: self.final_logit_softcap,
            logit_scale: self.logit_scale,
        })
    }
}

crate::builders::init_or_panic!(CausalLmConfig => CausalLm);

/// A decoder-only causal language model.
#[derive(Module, Debug)]
pub struct CausalLm {
    /// Token embedding, `[vocab_size, d_model]` (HF `model.embed_tokens`).
    pub embed_tokens: Embedding,
    /// Learned absolute positions, `[learned_positions, d_model]` (GPT-2's `wpe`), if
    /// the model has them instead of RoPE.
    pub embed_positions: Option<LearnedPosition>,
    /// The norm of the embeddings before the first block (BLOOM's
    /// `word_embeddings_layernorm`), if any.
    pub embed_norm: Option<Norm>,
    /// The per-layer embeddings (Gemma-4's PLE), if any: every block's own input.
    pub per_layer_embed: Option<PerLayerEmbedding>,
    /// The transformer body: the blocks and the final norm (HF `model`).
    pub model: TransformerStack,
    /// The output projection; `None` when tied to `embed_tokens`.
    pub lm_head: Option<Linear>,
    /// `[vocab_size]`: added to the logits (HF `lm_head.bias`), if any.
    pub lm_head_bias: Option<Param<Tensor<1>>>,
    /// The multi-token-prediction modules, depth 1 first (empty without).
    pub mtp: Vec<MultiTokenPredictor>,
    #[module(skip)]
    vocab_size: usize,
    #[module(skip)]
    mtp_loss_weight: f64,
    #[module(skip)]
    aux_loss_coef: f64,
    #[module(skip)]
    router_z_loss_coef: f64,
    #[module(skip)]
    embed_scale: Option<f64>,
    #[module(skip)]
    final_logit_softcap: Option<f64>,
    logit_scale: Option<f64>,
}

/// Whether a per-layer option whose layers `layers` lists (none: every layer) applies
/// to layer `layer`.
fn listed_or_all(layers: &Option<Vec<bool>>, layer: usize) -> bool {
    layers
        .as_ref()
        .is_none_or(|layers| layers.get(layer).copied().unwrap_or(false))
}

/// What a forward pass returns.
#[derive(Debug, Clone)]
pub struct CausalLmOutput {
    /// `[batch, seq, vocab_size]`
    pub logits: Tensor<3>,
    /// The MoE layers' routing losses, weighted: `aux_loss_coef · Σ load-balancing +
    /// router_z_loss_coef · Σ z-loss`, `[1]`. `None` for dense models, or when both
    /// weights are 0. Add it to the language-modelling loss when training.
    pub routing_loss: Option<Tensor<1>>,
    /// The logits of the multi-token-prediction modules, depth 1 first, from
    /// [`CausalLm::forward_with_mtp`] (empty from the other forwards): depth `k`
    /// gives `[batch, seq − k, vocab_size]`, position `i` predicting token `i + k + 1`.
    pub mtp_logits: Vec<Tensor<3>>,
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

    /// Number of multi-token-prediction modules.
    pub fn mtp_depth(&self) -> usize {
        self.mtp.len()
    }

    /// The longest sequence the model can embed: its number of learned positions;
    /// `None` for rotary models, which have no such limit.
    pub fn max_positions(&self) -> Option<usize> {
        self.embed_positions
            .as_ref()
            .map(LearnedPosition::max_position_embeddings)
    }

    /// The sequence length past which a decoding cache filled at shorter lengths must
    /// be rebuilt from the tokens: LongRoPE's original context, past which every
    /// position rotates with the long factors (see [`Rope::cache_rebuild_length`]);
    /// `None` when cached keys never go stale.
    pub fn cache_rebuild_length(&self) -> Option<usize> {
        self.model
            .layers
            .iter()
            .filter_map(|layer| match &layer.self_attn {
                SelfAttention::MultiHead(attention) => attention.rope.as_ref(),
                _ => None,
            })
            .find_map(Rope::cache_rebuild_length)
    }

    /// Weight `λ` of the multi-token-prediction loss (see
    /// [`CausalLmConfig::mtp_loss_weight`]).
    pub fn mtp_loss_weight(&self) -> f64 {
        self.mtp_loss_weight
    }

    /// The device the parameters live on.
    pub fn device(&self) -> Device {
        self.embed_tokens.weight.device()
    }

    /// An empty decoding cache (rolling for sliding-window layers, latent for MLA).
    pub fn new_cache(&self) -> StackCache {
        self.model.new_cache()
    }

    /// Logits of every position of a whole sequence.
    ///
    /// # Shapes
    /// - tokens: `[batch, seq]`
    /// - key_padding: `[batch, seq]`, `true` for padding (left padding for batched
    ///   prompts of different lengths)
    /// - output: `[batch, seq, vocab_size]`
    ///
    /// # Panics
    /// With learned positions, if `seq` exceeds them ([`max_positions`](Self::max_positions)).
    pub fn forward(
        &self,
        tokens: Tensor<2, Int>,
        key_padding: Option<Tensor<2, Bool>>,
    ) -> Tensor<3> {
        self.forward_full(tokens, key_padding).logits
    }

    /// [`forward`](Self::forward) that also returns the weighted routing losses.
    ///
    /// # Shapes
    /// As [`forward`](Self::forward).
    pub fn forward_full(
        &self,
        tokens: Tensor<2, Int>,
        key_padding: Option<Tensor<2, Bool>>,
    ) -> CausalLmOutput {
        let x = self.input(tokens.clone(), 0, None, key_padding.clone());
        let layer_inputs = self.layer_inputs(tokens, x.clone());
        let (hidden, losses) = self
            .model
            .forward_with_losses(x, layer_inputs, key_padding, None);
        self.output(hidden, losses)
    }

    /// [`forward_full`](Self::forward_full) that also runs the multi-token-prediction
    /// modules (see [`CausalLmOutput::mtp_logits`]); their routing losses join the
    /// stack's. Depths that reach past the sequence are left out.
    ///
    /// # Shapes
    /// - tokens: `[batch, seq]`
    /// - output: logits `[batch, seq, vocab_size]`; depth `k`: `[batch, seq − k, vocab_size]`
    pub fn forward_with_mtp(&self, tokens: Tensor<2, Int>) -> CausalLmOutput {
        let seq = tokens.dims()[1];
        let x = self.embed(tokens.clone());
        let layer_inputs = self.layer_inputs(tokens, x.clone());
        let (hidden, mut losses) =
            self.model
                .forward_with_losses(x.clone(), layer_inputs, None, None);
        let mut mtp_logits = Vec::with_capacity(self.mtp.len());
        let mut previous = hidden.clone();
        for (index, module) in self.mtp.iter().enumerate() {
            let depth = index + 1;
            if depth >= seq {
                break;
            }
            let len = seq - depth;
            // Position i combines h(i) with the embedding of token i + depth.
            let out = module.forward(previous.narrow(1, 0, len), x.clone().narrow(1, depth, len));
            losses = losses.add(out.losses.aux_loss, out.losses.z_loss);
            mtp_logits.push(self.logits(out.head_input));
            previous = out.hidden;
        }
        CausalLmOutput {
            mtp_logits,
            ..self.output(hidden, losses)
        }
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
    ///
    /// # Panics
    /// If `cache` was not made by [`new_cache`](Self::new_cache) of this model; with
    /// learned positions, if the cache and the new tokens exceed them.
    pub fn forward_cached(
        &self,
        tokens: Tensor<2, Int>,
        cache: &mut StackCache,
        key_padding: Option<Tensor<2, Bool>>,
    ) -> Tensor<3> {
        self.forward_cached_with_hidden(tokens, cache, key_padding)
            .0
    }

    /// [`forward_cached`](Self::forward_cached) that also returns the stack's output
    /// states (what the output head and the first multi-token-prediction module read).
    ///
    /// # Shapes
    /// - as [`forward_cached`](Self::forward_cached); the states are
    ///   `[batch, new, d_model]`
    ///
    /// # Panics
    /// As [`forward_cached`](Self::forward_cached).
    pub fn forward_cached_with_hidden(
        &self,
        tokens: Tensor<2, Int>,
        cache: &mut StackCache,
        key_padding: Option<Tensor<2, Bool>>,
    ) -> (Tensor<3>, Tensor<3>) {
        let new = tokens.dims()[1];
        let hidden = self.cached_states(tokens, cache, key_padding, new);
        (self.logits(hidden.clone()), hidden)
    }

    /// [`forward_cached`](Self::forward_cached) that returns the logits of the last
    /// new position only, as a prefill before sampling needs: the output head runs on
    /// that position alone, and so do the layers that reuse earlier layers' keys and
    /// values ([`CausalLmConfig::kv_shared_layers`]). The cache is extended with every
    /// new position.
    ///
    /// # Shapes
    /// - tokens: `[batch, new]`
    /// - key_padding: `[batch, new]`, `true` for padding among the new positions
    /// - output: `[batch, 1, vocab_size]`
    ///
    /// # Panics
    /// As [`forward_cached`](Self::forward_cached); if `tokens` has no position.
    pub fn forward_cached_last(
        &self,
        tokens: Tensor<2, Int>,
        cache: &mut StackCache,
        key_padding: Option<Tensor<2, Bool>>,
    ) -> Tensor<3> {
        self.logits(self.cached_states(tokens, cache, key_padding, 1))
    }

    /// The stack's output states of the last `keep` new positions, through `cache`.
    ///
    /// # Shapes
    /// - tokens: `[batch, new]`, key_padding: `[batch, new]`
    /// - output: `[batch, keep, d_model]`
    pub(crate) fn cached_states(
        &self,
        tokens: Tensor<2, Int>,
        cache: &mut StackCache,
        key_padding: Option<Tensor<2, Bool>>,
        keep: usize,
    ) -> Tensor<3> {
        let x = self.input(
            tokens.clone(),
            cache.position(),
            cache.padded_positions(),
            key_padding.clone(),
        );
        let layer_inputs = self.layer_inputs(tokens, x.clone());
        let (hidden, _) =
            self.model
                .forward_cached_keeping(x, layer_inputs, cache, key_padding, None, keep);
        hidden
    }

    /// Empty decoding caches for the multi-token-prediction modules, depth 1 first.
    pub fn new_mtp_caches(&self) -> Vec<BlockCache> {
        self.mtp
            .iter()
            .map(MultiTokenPredictor::new_cache)
            .collect()
    }

    /// The first multi-token-prediction module over new positions, through its
    /// cache: position `i` combines the stack's output state at `i` with token
    /// `i + 1` and predicts token `i + 2` (the draft of self-speculative decoding).
    /// `None` for a model without multi-token prediction.
    ///
    /// # Shapes
    /// - hidden: `[batch, new, d_model]`, from
    ///   [`forward_cached_with_hidden`](Self::forward_cached_with_hidden)
    /// - next_tokens: `[batch, new]`, the tokens one ahead of those states
    /// - output: `[batch, new, vocab_size]`
    pub fn draft_cached(
        &self,
        hidden: Tensor<3>,
        next_tokens: Tensor<2, Int>,
        cache: &mut BlockCache,
    ) -> Option<Tensor<3>> {
        let module = self.mtp.first()?;
        let out = module.forward_cached(hidden, self.embed(next_tokens), cache);
        Some(self.logits(out.head_input))
    }

    /// The model with every attention switched to `implementation` (the weights are
    /// kept): e.g. force the reference path on a loaded model.
    pub fn with_attention_implementation(mut self, implementation: AttentionImpl) -> Self {
        self.model.layers = self
            .model
            .layers
            .into_iter()
            .map(|block| block.with_attention_implementation(implementation))
            .collect();
        for module in &mut self.mtp {
            module.block = module
                .block
                .clone()
                .with_attention_implementation(implementation);
        }
        self
    }

    /// The stack's input: the token embeddings, with learned positions those of the
    /// positions from `offset` (the cache's length, `padded_before` of them padding
    /// in each row) added, then normed by `embed_norm`.
    ///
    /// # Panics
    /// With learned positions, if the sequence ends past them.
    fn input(
        &self,
        tokens: Tensor<2, Int>,
        offset: usize,
        padded_before: Option<Tensor<1, Int>>,
        key_padding: Option<Tensor<2, Bool>>,
    ) -> Tensor<3> {
        let x = self.embed(tokens);
        let x = match &self.embed_positions {
            Some(positions) => positions.forward_padded(x, offset, padded_before, key_padding),
            None => x,
        };
        match &self.embed_norm {
            Some(norm) => norm.forward(x),
            None => x,
        }
    }

    /// Every block's own input from the per-layer embeddings, if the model has them.
    ///
    /// # Shapes
    /// - tokens: `[batch, seq]`
    /// - x: `[batch, seq, d_model]`, the stack's input
    /// - output: `[batch, seq, n_layers, width]`
    fn layer_inputs(&self, tokens: Tensor<2, Int>, x: Tensor<3>) -> Option<Tensor<4>> {
        self.per_layer_embed
            .as_ref()
            .map(|embedding| embedding.forward(tokens, x))
    }

    /// The token embeddings, scaled by `embed_scale` (the multi-token-prediction
    /// modules' input; learned positions are refused with them).
    fn embed(&self, tokens: Tensor<2, Int>) -> Tensor<3> {
        let x = self.embed_tokens.forward(tokens);
        match self.embed_scale {
            Some(scale) => x * scale,
            None => x,
        }
    }

    /// The logits and weighted routing losses of the stack's output.
    fn output(&self, hidden: Tensor<3>, losses: RoutingLosses) -> CausalLmOutput {
        let weighted = |loss: Option<Tensor<1>>, coef: f64| {
            loss.filter(|_| coef != 0.0).map(|loss| loss * coef)
        };
        let routing_loss = match (
            weighted(losses.aux_loss, self.aux_loss_coef),
            weighted(losses.z_loss, self.router_z_loss_coef),
        ) {
            (Some(aux), Some(z)) => Some(aux + z),
            (aux, z) => aux.or(z),
        };
        CausalLmOutput {
            logits: self.logits(hidden),
            routing_loss,
            mtp_logits: Vec::new(),
        }
    }

    /// The output head with the logit scale and the final soft-cap: `[batch, seq,
    /// d_model] -> [batch, seq, vocab_size]`.
    pub(crate) fn logits(&self, hidden: Tensor<3>) -> Tensor<3> {
        let logits = self.lm_head(hidden);
        let logits = match self.logit_scale {
            Some(scale) => logits * scale,
            None => logits,
        };
        match self.final_logit_softcap {
            Some(cap) => soft_cap(logits, cap),
            None => logits,
        }
    }

    /// `[batch, seq, d_model] -> [batch, seq, vocab_size]`.
    fn lm_head(&self, hidden: Tensor<3>) -> Tensor<3> {
        let logits = match &self.lm_head {
            Some(head) => linear_rows(head, hidden),
            // The embedding is [vocab, d_model]; tied logits are hidden · Eᵀ.
            None => matmul_rows(hidden, self.embed_tokens.weight.val().transpose()),
        };
        match &self.lm_head_bias {
            Some(bias) => logits + bias.val().unsqueeze::<3>(),
            None => logits,
        }
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::attention::LatentAttentionConfig;
    use crate::position::RopeScaling;
    use crate::test_utils::{assert_close, max_abs_diff, model_test_devices, test_devices, tokens};
    use burn::module::Param;

    /// A small LLaMA-style model with a sliding window on its second layer.
    pub(crate) fn small(kind: BlockKind) -> CausalLmConfig {
        CausalLmConfig::new(40, 16, 2, 4, 24, RopeConfig::new(4))
            .with_n_kv_heads(Some(2))
            .with_sliding_window(Some(3))
            .with_sliding_layers(Some(vec![false, true]))
            .with_block_kind(kind)
            .with_initializer(Initializer::Normal {
                mean: 0.0,
                std: 0.3,
            })
    }

    /// `small(Sandwich)` in Gemma-4's layout: its global first layer has heads of 8 (one
    /// key/value head, values from the keys' projection) rotated by a proportional RoPE,
    /// its sliding second layer heads of 4; value norms and a factor per block.
    pub(crate) fn small_gemma4() -> CausalLmConfig {
        let global_rope = RopeConfig::new(8).with_scaling(RopeScaling::Proportional {
            factor: 1.0,
            rotated_fraction: 0.5,
        });
        CausalLmConfig {
            rope: global_rope,
            ..small(BlockKind::Sandwich)
        }
        .with_sliding_rope(Some(RopeConfig::new(4)))
        .with_global_head_dim(Some(8))
        .with_global_kv_heads(Some(1))
        .with_global_values_from_keys(true)
        .with_value_norm(true)
        .with_layer_scalar(true)
    }

    /// `small_gemma4()` in Gemma-4 E2B's layout: four layers (global, sliding, global,
    /// sliding), per-layer inputs of width 4, the last two layers reusing the keys and
    /// values of the first two, with a feed-forward twice as wide.
    pub(crate) fn small_gemma4_e2b() -> CausalLmConfig {
        CausalLmConfig {
            n_layers: 4,
            ..small_gemma4()
        }
        .with_sliding_layers(Some(vec![false, true, false, true]))
        .with_per_layer_input_width(Some(4))
        .with_kv_shared_layers(2)
        .with_kv_shared_d_ff(Some(48))
    }

    /// A small DeepSeek-style model: latent attention, a dense first layer, then a
    /// mixture of experts.
    pub(crate) fn small_latent_moe() -> CausalLmConfig {
        let latent = LatentAttentionConfig::new(16, 4, 8, 4, 4, 4).with_q_lora_rank(Some(8));
        CausalLmConfig::new(40, 16, 2, 4, 24, latent.rope_config())
            .with_latent(Some(latent))
            .with_moe(Some(
                MoeConfig::mixtral(16, 8, 4, 2).with_n_shared_experts(1),
            ))
            .with_moe_layers(MoeLayerPlan::new().with_first_k_dense_replace(1))
    }

    /// A small GPT-2-style model: learned positions (8 of them), biased LayerNorms, an
    /// ungated GELU feed-forward, biases on every projection, a tied head.
    pub(crate) fn small_gpt() -> CausalLmConfig {
        CausalLmConfig::new(40, 16, 2, 4, 32, RopeConfig::new(4))
            .with_gpt2_design(8)
            .with_initializer(Initializer::Normal {
                mean: 0.0,
                std: 0.3,
            })
    }

    fn prompt(device: &Device) -> Tensor<2, Int> {
        tokens(&[&[1, 5, 9, 13, 17, 21], &[2, 4, 6, 8, 10, 12]], device)
    }

    /// Prefill then one token at a time equals the full forward, for every block
    /// arrangement and for latent attention with a mixture of experts.
    /// A layer without position encoding sees its prefix as a set: the last
    /// position's output does not change when the earlier tokens are reordered, as
    /// it does when the layer rotates.
    #[test]
    fn nope_layers_attend_without_positions() {
        let device = Device::flex();
        let config = CausalLmConfig::new(40, 16, 1, 4, 24, RopeConfig::new(4)).with_initializer(
            Initializer::Normal {
                mean: 0.0,
                std: 0.3,
            },
        );
        let last = |model: &CausalLm, row: &[i64]| {
            let seq = row.len();
            model
                .forward(tokens(&[row], &device), None)
                .slice([0..1, seq - 1..seq, 0..40])
        };
        let (order, reordered) = ([3, 9, 27, 5, 11], [27, 5, 3, 9, 11]);
        let nope = config.clone().with_nope_layers(Some(vec![true]));
        assert!(nope.is_nope_layer(0) && !config.is_nope_layer(0));
        let model = nope.init(&device);
        assert_close(
            last(&model, &order),
            last(&model, &reordered),
            1e-5,
            "NoPE layer",
        );
        let model = config.init(&device);
        let rotated = max_abs_diff(last(&model, &order), last(&model, &reordered));
        assert!(rotated > 1e-3, "a rotating layer sees the order: {rotated}");
        let error = config.with_nope_layers(Some(vec![true, false])).validate();
        assert!(
            matches!(
                error,
                Err(ConfigError::Invalid {
                    field: "nope_layers",
                    ..
                })
            ),
            "{error:?}"
        );
    }

    /// The per-layer choices of chunks, QK-norm and query temperature reach the layers
    /// they name; each is refused without the option it chooses layers for, and a
    /// chunk on a windowed layer or with latent attention is refused by name.
    #[test]
    fn chunks_qk_norm_and_query_temperature_apply_to_their_layers() {
        let config = CausalLmConfig::new(40, 16, 2, 4, 24, RopeConfig::new(4))
            .with_attention_chunk(Some(8))
            .with_chunked_layers(Some(vec![true, false]))
            .with_qk_norm(Some(QkNormConfig::new().with_scale(false)))
            .with_qk_norm_layers(Some(vec![false, true]))
            .with_query_temperature(Some(QueryTemperatureConfig::new(0.5, 4)))
            .with_query_temperature_layers(Some(vec![true, false]));
        assert!(config.validate().is_ok());
        let first = config.attention_config(0);
        let second = config.attention_config(1);
        assert_eq!((first.chunk, second.chunk), (Some(8), None));
        assert!(first.qk_norm.is_none() && second.qk_norm.is_some());
        assert!(first.query_temperature.is_some() && second.query_temperature.is_none());
        let refused = |config: CausalLmConfig, field: &str| {
            let error = config.validate();
            assert!(
                matches!(
                    &error,
                    Err(ConfigError::Invalid { field: f, .. } | ConfigError::Zero { field: f, .. })
                        if *f == field
                ),
                "{field}: {error:?}"
            );
        };
        refused(config.clone().with_attention_chunk(None), "chunked_layers");
        refused(config.clone().with_qk_norm(None), "qk_norm_layers");
        refused(
            config.clone().with_query_temperature(None),
            "query_temperature_layers",
        );
        refused(
            config
                .clone()
                .with_query_temperature_layers(Some(vec![true])),
            "query_temperature_layers",
        );
        refused(
            config.clone().with_sliding_window(Some(4)),
            "attention_chunk",
        );
        refused(
            config.clone().with_attention_chunk(Some(0)),
            "attention_chunk",
        );
    }

    /// Global layers of their own head width need a rotary embedding each kind of
    /// layer can use; the built layers take their own shapes.
    #[test]
    fn global_heads_of_their_own_shape_need_a_rope_of_each_width() {
        let config = small_gemma4();
        let model = config.init(&Device::flex());
        let shapes: Vec<(usize, usize, bool)> = model
            .model
            .layers
            .iter()
            .map(|layer| match &layer.self_attn {
                SelfAttention::MultiHead(attention) => (
                    attention.head_dim(),
                    attention.n_kv_heads(),
                    attention.v_proj.is_some(),
                ),
                _ => unreachable!("grouped attention"),
            })
            .collect();
        assert_eq!(shapes, [(8, 1, false), (4, 2, true)]);
        for (config, field) in [
            (config.clone().with_sliding_rope(None), "sliding_rope"),
            (
                CausalLmConfig {
                    rope: RopeConfig::new(4),
                    ..config.clone()
                },
                "rope.head_dim",
            ),
            (
                config.with_layer_rope_theta(Some(vec![1e4, 1e4])),
                "layer_rope_theta",
            ),
        ] {
            let error = config.validate();
            assert!(
                matches!(error, Err(ConfigError::Invalid { field: f, .. }) if f == field),
                "{field}: {error:?}"
            );
        }
    }

    #[test]
    fn a_layer_norm_shift_without_layer_norms_is_an_error() {
        let config = CausalLmConfig::tiny().with_layer_norm_bias(true);
        let error = config.validate().unwrap_err();
        assert!(
            matches!(
                error,
                ConfigError::Invalid {
                    field: "layer_norm_bias",
                    ..
                }
            ),
            "{error:?}"
        );
        assert!(config.with_layer_norm(true).validate().is_ok());
    }

    #[test]
    fn cached_decoding_equals_the_full_forward_for_every_block_option() {
        for device in model_test_devices() {
            device.seed(3);
            let configs = [
                small(BlockKind::PreNorm),
                small(BlockKind::PostNorm),
                small(BlockKind::Parallel),
                small(BlockKind::ResiDual),
                small(BlockKind::OutputNorm),
                small(BlockKind::Sandwich),
                small(BlockKind::PreNorm).with_attention_sinks(true),
                small_gemma4(),
                small_gemma4_e2b(),
                small_latent_moe(),
                small_gpt(),
            ];
            for config in configs {
                let model = config.init(&device);
                let input = prompt(&device);
                let full = model.forward(input.clone(), None);
                let mut cache = model.new_cache();
                let mut steps =
                    vec![model.forward_cached(input.clone().narrow(1, 0, 3), &mut cache, None)];
                for position in 3..6 {
                    steps.push(model.forward_cached(
                        input.clone().narrow(1, position, 1),
                        &mut cache,
                        None,
                    ));
                }
                assert_eq!(cache.position(), 6);
                let what = format!("{:?} latent {}", config.block_kind, config.latent.is_some());
                assert_close(Tensor::cat(steps, 1), full, 1e-4, &what);
            }
        }
    }

    /// A prefill that keeps the last position's logits only (the output head, and the
    /// layers reusing keys and values, on that position alone) gives the whole
    /// prefill's last logits and the same cache, with a left-padded row.
    #[test]
    fn the_last_positions_prefill_equals_the_whole_ones_last() {
        for device in model_test_devices() {
            device.seed(9);
            for config in [small(BlockKind::ResiDual), small_gemma4_e2b()] {
                let model = config.init(&device);
                let batch = tokens(&[&[0, 0, 5, 9, 13, 17], &[2, 4, 6, 8, 10, 12]], &device);
                let padding = Tensor::<2, Bool>::from_data(
                    burn::tensor::TensorData::new(
                        (0..12).map(|i| i < 2).collect::<Vec<_>>(),
                        [2, 6],
                    ),
                    &device,
                );
                let mut whole_cache = model.new_cache();
                let whole =
                    model.forward_cached(batch.clone(), &mut whole_cache, Some(padding.clone()));
                let mut last_cache = model.new_cache();
                let last = model.forward_cached_last(batch, &mut last_cache, Some(padding));
                assert_eq!(last.dims(), [2, 1, 40]);
                let what = format!(
                    "{:?}, {} shared",
                    config.block_kind, config.kv_shared_layers
                );
                assert_close(last, whole.narrow(1, 5, 1), 1e-4, &what);
                let next = tokens(&[&[21], &[23]], &device);
                assert_close(
                    model.forward_cached(next.clone(), &mut last_cache, None),
                    model.forward_cached(next, &mut whole_cache, None),
                    1e-4,
                    &format!("{what}: the step after"),
                );
            }
        }
    }

    /// Learned positions: no layer rotates, the model sees token order only through
    /// the table, and a left-padded row (in one pass, or prefilled then decoded) gives
    /// the logits it gives alone, as its real tokens keep their positions.
    #[test]
    fn learned_positions_count_real_tokens_only() {
        for device in model_test_devices() {
            device.seed(5);
            let model = small_gpt().init(&device);
            assert_eq!(model.max_positions(), Some(8));
            assert!(
                model
                    .model
                    .layers
                    .iter()
                    .all(|layer| match &layer.self_attn {
                        SelfAttention::MultiHead(attention) => attention.rope.is_none(),
                        _ => false,
                    })
            );
            let alone = model.forward(tokens(&[&[5, 9, 13, 17]], &device), None);
            // [pad, pad, 5, 9, 13, 17] beside an unpadded row.
            let batch = tokens(&[&[0, 0, 5, 9, 13, 17], &[2, 4, 6, 8, 10, 12]], &device);
            let padding = Tensor::<2, Bool>::from_data(
                // The first two positions of row 0.
                burn::tensor::TensorData::new((0..12).map(|i| i < 2).collect::<Vec<_>>(), [2, 6]),
                &device,
            );
            let full = model.forward(batch.clone(), Some(padding.clone()));
            let padded_row = full.clone().slice([0..1, 2..6, 0..40]);
            assert_close(padded_row, alone.clone(), 1e-4, "padded row, one pass");
            let unpadded = model.forward(batch.clone().narrow(0, 1, 1), None);
            assert_close(full.slice([1..2, 0..6, 0..40]), unpadded, 1e-4, "other row");

            let mut cache = model.new_cache();
            let prefill = model.forward_cached(
                batch.clone().narrow(1, 0, 4),
                &mut cache,
                Some(padding.narrow(1, 0, 4)),
            );
            let steps: Vec<_> = (4..6)
                .map(|position| {
                    model.forward_cached(batch.clone().narrow(1, position, 1), &mut cache, None)
                })
                .collect();
            let decoded = Tensor::cat([vec![prefill], steps].concat(), 1);
            assert_close(
                decoded.slice([0..1, 2..6, 0..40]),
                alone.clone(),
                1e-4,
                "padded row, decoded",
            );

            // Order reaches the model only through the table.
            let swapped = model.forward(tokens(&[&[9, 5, 13, 17]], &device), None);
            let moved = max_abs_diff(
                swapped.slice([0..1, 3..4, 0..40]),
                alone.slice([0..1, 3..4, 0..40]),
            );
            assert!(moved > 1e-3, "the positions tell the order apart: {moved}");
        }
    }

    #[test]
    fn learned_positions_refuse_rotary_options() {
        let error = small_gpt()
            .with_nope_layers(Some(vec![true, false]))
            .validate()
            .unwrap_err();
        assert!(
            matches!(
                error,
                ConfigError::Invalid {
                    field: "nope_layers",
                    ..
                }
            ),
            "{error:?}"
        );
        assert!(error.to_string().contains("learned_positions"), "{error}");
        let error = small_gpt().with_mtp_depth(1).validate().unwrap_err();
        assert!(error.to_string().contains("mtp_depth"), "{error}");
        let error = small_gpt()
            .with_learned_positions(Some(0))
            .validate()
            .unwrap_err();
        assert!(error.to_string().contains("learned_positions"), "{error}");
    }

    /// ALiBi takes RoPE's place: no layer rotates, and the other position schemes and
    /// rotary options are refused by name; a norm of the embeddings goes without
    /// multi-token prediction.
    #[test]
    fn alibi_replaces_rope_and_refuses_other_position_schemes() {
        let alibi = || {
            CausalLmConfig::new(40, 16, 2, 4, 32, RopeConfig::new(4))
                .with_alibi(Some(Alibi::new()))
                .with_embed_norm(true)
        };
        let model = alibi().init(&Device::flex());
        for layer in &model.model.layers {
            let SelfAttention::MultiHead(attention) = &layer.self_attn else {
                panic!("grouped attention expected");
            };
            assert!(attention.rope.is_none());
        }
        assert!(model.embed_norm.is_some() && model.embed_positions.is_none());
        for (config, field) in [
            (alibi().with_learned_positions(Some(8)), "learned_positions"),
            (
                alibi().with_nope_layers(Some(vec![true, false])),
                "nope_layers",
            ),
            (alibi().with_mtp_depth(1), "embed_norm"),
        ] {
            let error = config.validate().unwrap_err();
            assert!(
                matches!(error, ConfigError::Invalid { field: f, .. } if f == field),
                "{field}: {error:?}"
            );
        }
    }

    /// Every block takes the configured arrangement and stochastic depth, and the
    /// stack ends with a norm exactly when the arrangement needs one.
    #[test]
    fn block_options_reach_every_layer() {
        let device = Device::flex();
        for kind in [
            BlockKind::PreNorm,
            BlockKind::PostNorm,
            BlockKind::Parallel,
            BlockKind::ResiDual,
            BlockKind::OutputNorm,
            BlockKind::Sandwich,
        ] {
            let model = small(kind).with_drop_path(0.25).init(&device);
            assert_eq!(model.model.kind(), kind);
            for block in &model.model.layers {
                assert_eq!(block.kind(), kind);
                assert_eq!(block.drop_path.prob, 0.25);
            }
            assert_eq!(model.model.norm.is_some(), kind != BlockKind::PostNorm);
        }
        let error = small(BlockKind::PreNorm)
            .with_drop_path(1.0)
            .validate()
            .unwrap_err();
        assert!(error.to_string().contains("drop_path"), "{error}");
    }

    /// A model of `config` holding the weights of `model` (same parameters).
    fn with_weights_of(config: CausalLmConfig, model: &CausalLm) -> CausalLm {
        config
            .init(&model.device())
            .load_record(model.clone().into_record())
    }

    /// The gradient of every parameter of a model.
    fn gradients(model: &CausalLm, loss: Tensor<1>) -> Vec<Vec<f32>> {
        use burn::module::ModuleVisitor;
        struct Collect<'a>(&'a burn::tensor::Gradients, Vec<Vec<f32>>);
        impl ModuleVisitor for Collect<'_> {
            fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<D>>) {
                let grad = param.val().grad(self.0);
                self.1
                    .push(grad.map_or_else(Vec::new, |g| g.try_to_vec_as().unwrap()));
            }
        }
        let grads = loss.backward();
        let mut collect = Collect(&grads, Vec::new());
        model.visit(&mut collect);
        collect.1
    }

    /// ResiDual and Pre-LN blocks have the same parameters; with the same weights the
    /// ResiDual model computes something else, and so trains differently.
    #[test]
    fn residual_blocks_change_the_output_and_the_gradients() {
        let device = Device::flex().autodiff();
        device.seed(5);
        let pre = small(BlockKind::PreNorm).init(&device);
        let residual = with_weights_of(small(BlockKind::ResiDual), &pre);
        let loss = |model: &CausalLm| model.forward(prompt(&device), None).powi_scalar(2).mean();
        let (a, b) = (
            gradients(&pre, loss(&pre)),
            gradients(&residual, loss(&residual)),
        );
        assert_eq!(a.len(), b.len());
        let differ = a.iter().zip(&b).filter(|(x, y)| x != y).count();
        assert!(
            differ * 2 > a.len(),
            "{differ} of {} gradients differ",
            a.len()
        );
    }

    /// With stochastic depth a block's sublayer is dropped for whole samples during
    /// training: for a single sample, a dropped attention gets no gradient at all. In
    /// eval mode nothing is dropped.
    #[test]
    fn stochastic_depth_drops_whole_branches_in_training() {
        let device = Device::flex().autodiff();
        device.seed(9);
        let plain = small(BlockKind::PreNorm).init(&device);
        let dropping = with_weights_of(small(BlockKind::PreNorm).with_drop_path(0.5), &plain);
        let input = tokens(&[&[1, 5, 9, 13, 17, 21]], &device);
        // The first layer's q_proj gradient, for seeds 0..12.
        let q_proj_gradient_is_zero = |model: &CausalLm, seed: u64| {
            device.seed(seed);
            let loss = model.forward(input.clone(), None).powi_scalar(2).mean();
            let grads = loss.backward();
            let SelfAttention::MultiHead(attention) = &model.model.layers[0].self_attn else {
                unreachable!("grouped attention")
            };
            let grad = attention.q_proj.weight.val().grad(&grads).unwrap();
            grad.abs().max().into_scalar::<f32>() == 0.0
        };
        let dropped: Vec<bool> = (0..12)
            .map(|s| q_proj_gradient_is_zero(&dropping, s))
            .collect();
        assert!(
            dropped.iter().any(|d| *d) && dropped.iter().any(|d| !*d),
            "drops in 12 seeds at p = 0.5: {dropped:?}"
        );
        assert!((0..4).all(|s| !q_proj_gradient_is_zero(&plain, s)));
        // Eval mode: the same logits as without stochastic depth.
        let eval = dropping.valid();
        let plain_eval = plain.valid();
        let inference = input.clone().inner();
        assert_close(
            eval.forward(inference.clone(), None),
            plain_eval.forward(inference, None),
            1e-6,
            "eval",
        );
    }

    /// The routing loss is `aux_loss_coef · Σ balance + router_z_loss_coef · Σ z`, and
    /// the z-loss reaches the router's gradient with its weight.
    #[test]
    fn router_z_loss_is_weighted_into_the_routing_loss_and_its_gradient() {
        for device in test_devices() {
            let device = device.autodiff();
            device.seed(13);
            let base = small_latent_moe().init(&device);
            let with = |aux: f64, z: f64| {
                let config = small_latent_moe()
                    .with_aux_loss_coef(aux)
                    .with_router_z_loss_coef(z);
                with_weights_of(config, &base)
            };
            let routing = |model: &CausalLm| {
                model
                    .forward_full(prompt(&device), None)
                    .routing_loss
                    .expect("an MoE model with a non-zero weight has a routing loss")
            };
            let balance = routing(&with(1.0, 0.0)).into_scalar::<f32>();
            let z = routing(&with(0.0, 1.0)).into_scalar::<f32>();
            let both = routing(&with(0.01, 0.001)).into_scalar::<f32>();
            assert!((both - (0.01 * balance + 0.001 * z)).abs() <= 1e-6 * both.abs().max(1.0));
            assert!(
                with(0.0, 0.0)
                    .forward_full(prompt(&device), None)
                    .routing_loss
                    .is_none()
            );

            // The router's gradient of the training loss moves by exactly the weighted
            // z-loss's gradient.
            let router_gradient = |model: &CausalLm, loss: Tensor<1>| {
                let grads = loss.backward();
                let crate::ffn::FeedForward::Moe(moe) = &model.model.layers[1].mlp else {
                    unreachable!("the second layer is sparse")
                };
                let grad: Vec<f32> = moe
                    .gate
                    .weight
                    .val()
                    .grad(&grads)
                    .unwrap()
                    .try_to_vec_as()
                    .unwrap();
                grad
            };
            let task_loss = |model: &CausalLm| {
                let output = model.forward_full(prompt(&device), None);
                let lm = output.logits.powi_scalar(2).mean();
                match output.routing_loss {
                    Some(routing) => lm + routing,
                    None => lm,
                }
            };
            let (off, on, z_only) = (with(0.0, 0.0), with(0.0, 0.5), with(0.0, 0.5));
            let without = router_gradient(&off, task_loss(&off));
            let with_z = router_gradient(&on, task_loss(&on));
            let z_part = router_gradient(&z_only, routing(&z_only));
            let largest = z_part.iter().fold(0.0f32, |m, g| m.max(g.abs()));
            assert!(largest > 0.0, "the z-loss has a router gradient");
            for ((a, b), c) in with_z.iter().zip(&without).zip(&z_part) {
                assert!(
                    (a - b - c).abs() <= 1e-4 * largest,
                    "{a} - {b} != {c} on {device:?}"
                );
            }
        }
    }

    /// Tied embeddings use `embed_tokens` as the head: logits are `hidden · Eᵀ`.
    #[test]
    fn tied_head_is_the_embedding() {
        let device = Device::flex();
        device.seed(1);
        let model = small(BlockKind::PreNorm)
            .with_tie_word_embeddings(true)
            .init(&device);
        assert!(model.lm_head.is_none());
        let x = model.embed_tokens.forward(prompt(&device));
        let hidden = model.model.forward(x, None, None);
        let weight = model.embed_tokens.weight.val();
        let expected = hidden.matmul(weight.transpose().unsqueeze_dim(0));
        assert_close(model.forward(prompt(&device), None), expected, 1e-5, "tied");
    }
}
