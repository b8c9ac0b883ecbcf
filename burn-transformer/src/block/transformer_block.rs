//! One transformer block: a self-attention and a feed-forward sublayer (with a
//! cross-attention between them in encoder-decoder decoders), their norms and residual
//! connections, arranged Pre-LN, Post-LN, parallel or ResiDual. Every model of the
//! crate is a stack of these.
//!
//! - Pre-LN (GPT-2, LLaMA): `x + f(norm(x))` — stable deep training; needs a final norm.
//! - Post-LN (Vaswani et al., 2017): `norm(x + f(x))`.
//! - Parallel (GPT-J, PaLM): `x + attn(norm(x)) + ffn(norm(x))`, one norm read by both;
//!   or each sublayer after its own norm (GPT-NeoX, Pythia):
//!   `x + attn(norm₁(x)) + ffn(norm₂(x))`.
//! - ResiDual (Xie et al., 2023): a Post-LN stream `a ← norm(a + f(a))` and a Pre-LN-like
//!   dual stream `d ← d + f(a)`, combined at the end of the stack as `a + norm(d)`
//!   (see [`TransformerStack`](super::TransformerStack)). Both streams start from the input.
//!
//! The self-attention is grouped multi-head or latent ([`SelfAttention`]); the
//! feed-forward is dense, gated or a mixture of experts ([`FeedForward`]), whose
//! routing losses the block adds to the [`BlockState`] that flows through the stack.
//! Stochastic depth and residual dropout apply to every sublayer's output.
//!
//! Field names follow Hugging Face's LLaMA layers (`self_attn`, `mlp`,
//! `input_layernorm`, `post_attention_layernorm`), so decoder checkpoints load by name.

use burn::config::Config;
use burn::module::{Module, Param};
use burn::nn::{Dropout, DropoutConfig};
use burn::tensor::{Bool, Device, Tensor};

use super::per_layer_input::{PerLayerInput, PerLayerInputConfig};
use super::stochastic_depth::{StochasticDepth, StochasticDepthConfig};
use crate::attention::{
    AttentionImpl, CrossKvCache, KvSharing, MultiHeadAttention, MultiHeadAttentionConfig,
    SelfAttention, SelfAttentionCache, SelfAttentionConfig, SharedKv,
};
use crate::error::ConfigError;
use crate::ffn::{FeedForward, FeedForwardConfig};
use crate::norm::{Norm, NormConfig};

/// Where norms and residual connections sit in a block.
#[derive(Config, Debug, Copy, PartialEq, Eq)]
pub enum BlockKind {
    /// `x + f(norm(x))` for each sublayer.
    PreNorm,
    /// `norm(x + f(x))` for each sublayer.
    PostNorm,
    /// `x + attn(norm(x)) + ffn(norm(x))`: both sublayers read one normed input.
    Parallel,
    /// `x + attn(norm₁(x)) + ffn(norm₂(x))`: parallel sublayers, each after its own
    /// norm (GPT-NeoX's `input_layernorm` and `post_attention_layernorm`).
    ParallelSeparateNorms,
    /// Post-LN stream plus an un-normalized dual stream (ResiDual).
    ResiDual,
    /// `x + norm(f(x))` for each sublayer: the norm on the sublayer's output, before
    /// the residual add (OLMo-2's `post_attention_layernorm` and
    /// `post_feedforward_layernorm`; no norm on the input).
    OutputNorm,
    /// `x + post_norm(f(pre_norm(x)))` for each sublayer: norms on both sides (Gemma-2
    /// and Gemma-3's `input_layernorm`, `post_attention_layernorm`,
    /// `pre_feedforward_layernorm` and `post_feedforward_layernorm`).
    Sandwich,
}

impl BlockKind {
    /// Whether a stack of these blocks ends with a norm unless told otherwise: Pre-LN,
    /// parallel and ResiDual stacks need one; Post-LN blocks already end with a norm.
    pub fn has_final_norm_by_default(self) -> bool {
        self != Self::PostNorm
    }
}

/// Configuration of a [`TransformerBlock`].
#[derive(Config, Debug)]
pub struct TransformerBlockConfig {
    /// The self-attention sublayer (set `causal` for decoders).
    pub self_attention: SelfAttentionConfig,
    /// The feed-forward sublayer.
    pub feed_forward: FeedForwardConfig,
    /// The norm used at every norm position of the block.
    pub norm: NormConfig,
    /// Cross-attention over an encoder's output (decoder of an encoder-decoder).
    /// Default: none.
    #[config(default = "None")]
    pub cross_attention: Option<MultiHeadAttentionConfig>,
    /// Arrangement of norms and residuals. Default: Pre-LN.
    #[config(default = "BlockKind::PreNorm")]
    pub kind: BlockKind,
    /// Dropout on each sublayer's output before the residual add. Default: 0.
    #[config(default = 0.0)]
    pub residual_dropout: f64,
    /// Stochastic depth: probability of dropping a sublayer for a whole sample during
    /// training. Default: 0.
    #[config(default = 0.0)]
    pub drop_path: f64,
    /// Factor on each sublayer's output before its residual add (Granite's
    /// `residual_multiplier`). Default: none.
    #[config(default = "None")]
    pub residual_scale: Option<f64>,
    /// A factor on the main stream the block returns, `[1]`, loaded from checkpoints
    /// and kept fixed in training (Gemma-4's `layer_scalar`, a buffer in transformers).
    /// Initialized to 1. Default: false.
    #[config(default = false)]
    pub layer_scalar: bool,
    /// A branch that adds an input of the block's own to the stream after the
    /// sublayers, before `layer_scalar` (Gemma-4's per-layer embeddings; the stack
    /// hands each block its input, [`BlockState::per_layer_input`]). Default: none.
    #[config(default = "None")]
    pub per_layer_input: Option<PerLayerInputConfig>,
}

impl TransformerBlockConfig {
    /// Checks the configuration without allocating anything.
    ///
    /// # Errors
    /// The sublayers' errors; [`ConfigError::Invalid`] when a sublayer's width is not
    /// the self-attention's or a parallel block has cross-attention;
    /// [`ConfigError::Probability`] for a dropout or drop-path outside `[0, 1)`.
    pub fn validate(&self) -> Result<(), ConfigError> {
        const MODULE: &str = "TransformerBlockConfig";
        self.self_attention.validate()?;
        self.feed_forward.validate()?;
        self.norm.validate()?;
        let d_model = self.self_attention.d_model();
        let cross_width = self.cross_attention.as_ref().map(|cross| cross.d_model);
        if let Some(branch) = &self.per_layer_input {
            branch.validate()?;
        }
        let branch_width = self.per_layer_input.as_ref().map(|branch| branch.d_model);
        for (field, width) in [
            ("feed_forward.d_model", Some(self.feed_forward.d_model())),
            ("norm.d_model", Some(self.norm.d_model())),
            ("cross_attention.d_model", cross_width),
            ("per_layer_input.d_model", branch_width),
        ] {
            if let Some(width) = width
                && width != d_model
            {
                return Err(ConfigError::Invalid {
                    module: MODULE,
                    field,
                    reason: format!("must equal self_attention.d_model {d_model}, got {width}"),
                });
            }
        }
        if let Some(cross) = &self.cross_attention {
            cross.validate()?;
            if !matches!(
                self.kind,
                BlockKind::PreNorm | BlockKind::PostNorm | BlockKind::ResiDual
            ) {
                return Err(ConfigError::Invalid {
                    module: MODULE,
                    field: "kind",
                    reason: format!("a {:?} block has no place for cross-attention", self.kind),
                });
            }
        }
        ConfigError::check_probability(MODULE, "residual_dropout", self.residual_dropout)?;
        ConfigError::check_probability(MODULE, "drop_path", self.drop_path)?;
        if let Some(scale) = self.residual_scale {
            ConfigError::check_finite(MODULE, "residual_scale", scale)?;
        }
        Ok(())
    }

    /// Builds the block, or returns why the configuration is invalid.
    ///
    /// # Errors
    /// See [`validate`](Self::validate).
    pub fn try_init(&self, device: &Device) -> Result<TransformerBlock, ConfigError> {
        self.validate()?;
        let kind = self.kind;
        let norm_if = |present: bool| present.then(|| self.norm.try_init(device)).transpose();
        Ok(TransformerBlock {
            self_attn: self.self_attention.try_init(device)?,
            input_layernorm: norm_if(kind != BlockKind::OutputNorm)?,
            cross_attn: self
                .cross_attention
                .as_ref()
                .map(|config| config.try_init(device))
                .transpose()?,
            cross_attn_layernorm: self
                .cross_attention
                .as_ref()
                .map(|_| self.norm.try_init(device))
                .transpose()?,
            mlp: self.feed_forward.try_init(device)?,
            post_attention_layernorm: norm_if(kind != BlockKind::Parallel)?,
            pre_feedforward_layernorm: norm_if(kind == BlockKind::Sandwich)?,
            post_feedforward_layernorm: norm_if(matches!(
                kind,
                BlockKind::OutputNorm | BlockKind::Sandwich
            ))?,
            dropout: DropoutConfig::new(self.residual_dropout).init(),
            drop_path: StochasticDepthConfig::new()
                .with_prob(self.drop_path)
                .try_init()?,
            layer_scalar: self
                .layer_scalar
                .then(|| Param::from_tensor(Tensor::ones([1], device)).set_require_grad(false)),
            per_layer_input: self
                .per_layer_input
                .as_ref()
                .map(|branch| branch.try_init(device))
                .transpose()?,
            kind: self.kind,
            residual_scale: self.residual_scale,
        })
    }
}

crate::builders::init_or_panic!(TransformerBlockConfig => TransformerBlock);

/// A transformer block.
#[derive(Module, Debug)]
pub struct TransformerBlock {
    /// Self-attention.
    pub self_attn: SelfAttention,
    /// The norm of the self-attention sublayer's input (the shared norm of a parallel
    /// block, the first norm of a post-norm or ResiDual one); none in an
    /// [`BlockKind::OutputNorm`] block.
    pub input_layernorm: Option<Norm>,
    /// Cross-attention over encoder states, in encoder-decoder decoders.
    pub cross_attn: Option<MultiHeadAttention>,
    /// The norm of the cross-attention sublayer.
    pub cross_attn_layernorm: Option<Norm>,
    /// The feed-forward sublayer.
    pub mlp: FeedForward,
    /// The second norm, named as Hugging Face names it in each family: the
    /// feed-forward's input norm of a Pre-LN block (LLaMA) or of a parallel block of
    /// two norms (GPT-NeoX), the norm after the feed-forward's residual add of a
    /// post-norm or ResiDual block, the norm of the attention's output in an
    /// [`BlockKind::OutputNorm`] or [`BlockKind::Sandwich`] block (OLMo-2, Gemma); none
    /// in a parallel block of one norm.
    pub post_attention_layernorm: Option<Norm>,
    /// The feed-forward's input norm of a [`BlockKind::Sandwich`] block.
    pub pre_feedforward_layernorm: Option<Norm>,
    /// The norm of the feed-forward's output in an [`BlockKind::OutputNorm`] or
    /// [`BlockKind::Sandwich`] block.
    pub post_feedforward_layernorm: Option<Norm>,
    /// Residual dropout.
    pub dropout: Dropout,
    /// Stochastic depth on every sublayer.
    pub drop_path: StochasticDepth,
    /// The fixed factor on the main stream the block returns, `[1]` (HF
    /// `layer_scalar`), if any.
    pub layer_scalar: Option<Param<Tensor<1>>>,
    /// The branch that adds the block's own input to the stream, if any.
    pub per_layer_input: Option<PerLayerInput>,
    #[module(skip)]
    kind: BlockKind,
    #[module(skip)]
    residual_scale: Option<f64>,
}

/// The routing losses of the mixture-of-experts feed-forwards a state has passed,
/// summed over blocks and not yet weighted (a model weights them; see
/// [`CausalLmConfig::aux_loss_coef`](crate::model::CausalLmConfig::aux_loss_coef)).
#[derive(Clone, Debug, Default)]
pub struct RoutingLosses {
    /// The sum of the load-balancing losses ([`MoeOutput::aux_loss`]), `[1]`; `None`
    /// before any MoE layer.
    ///
    /// [`MoeOutput::aux_loss`]: crate::ffn::MoeOutput::aux_loss
    pub aux_loss: Option<Tensor<1>>,
    /// The sum of the router z-losses ([`MoeOutput::z_loss`]), `[1]`; `None` before any
    /// MoE layer.
    ///
    /// [`MoeOutput::z_loss`]: crate::ffn::MoeOutput::z_loss
    pub z_loss: Option<Tensor<1>>,
}

impl RoutingLosses {
    /// Adds one layer's losses (either may be absent).
    pub(crate) fn add(self, aux_loss: Option<Tensor<1>>, z_loss: Option<Tensor<1>>) -> Self {
        let sum = |total: Option<Tensor<1>>, loss: Option<Tensor<1>>| match (total, loss) {
            (Some(total), Some(loss)) => Some(total + loss),
            (total, loss) => total.or(loss),
        };
        Self {
            aux_loss: sum(self.aux_loss, aux_loss),
            z_loss: sum(self.z_loss, z_loss),
        }
    }
}

/// What flows through a stack of blocks: the residual streams, the routing losses
/// collected on the way and the keys and values layers share.
#[derive(Clone, Debug)]
pub struct BlockState {
    /// The main stream, `[batch, seq, d_model]`.
    pub hidden: Tensor<3>,
    /// ResiDual's dual stream, `[batch, seq, d_model]`; `None` for other kinds.
    pub dual: Option<Tensor<3>>,
    /// The routing losses of the MoE layers passed so far.
    pub losses: RoutingLosses,
    /// The keys and values published by the layers passed so far, for the later
    /// layers that reuse them ([`KvSharing`](crate::attention::KvSharing)).
    pub shared_kv: SharedKv,
    /// The next block's own input, `[batch, seq, width]`, for its per-layer branch
    /// ([`TransformerBlockConfig::per_layer_input`]); set by the stack before each
    /// block, taken by the block.
    pub per_layer_input: Option<Tensor<3>>,
}

impl BlockState {
    /// The state entering the first block of a stack of `kind` blocks.
    pub fn new(hidden: Tensor<3>, kind: BlockKind) -> Self {
        let dual = (kind == BlockKind::ResiDual).then(|| hidden.clone());
        Self {
            hidden,
            dual,
            losses: RoutingLosses::default(),
            shared_kv: SharedKv::default(),
            per_layer_input: None,
        }
    }
}

impl BlockState {
    /// The state of the last `keep` positions only, for blocks whose earlier positions'
    /// outputs are not needed (the published keys and values stay whole; the queries of
    /// the later blocks move on).
    ///
    /// # Panics
    /// If `keep` is 0 or more than the positions.
    pub fn keep_last(mut self, keep: usize) -> Self {
        let seq = self.hidden.dims()[1];
        assert!(
            (1..=seq).contains(&keep),
            "BlockState: keep 1 to {seq} positions, got {keep}"
        );
        let last = |t: Tensor<3>| t.narrow(1, seq - keep, keep);
        self.shared_kv.skip_queries(seq - keep);
        Self {
            hidden: last(self.hidden),
            dual: self.dual.map(last),
            per_layer_input: self.per_layer_input.map(last),
            ..self
        }
    }
}

/// The attention probabilities of one block, from
/// [`TransformerBlock::forward_with_weights`]: row = query, column = key.
#[derive(Clone, Debug)]
pub struct BlockWeights {
    /// Self-attention, `[batch, n_heads, seq, seq]`.
    pub self_attn: Tensor<4>,
    /// Cross-attention over the memory, `[batch, n_heads, seq, seq_memory]`; `None` in
    /// a block without cross-attention.
    pub cross_attn: Option<Tensor<4>>,
}

/// Encoder output that cross-attention reads.
#[derive(Clone, Debug)]
pub struct Memory {
    /// `[batch, seq_memory, d_memory]`
    pub states: Tensor<3>,
    /// `[batch, seq_memory]`, `true` = padded.
    pub padding: Option<Tensor<2, Bool>>,
}

/// The caches of one block for incremental decoding.
#[derive(Clone, Debug)]
pub struct BlockCache {
    /// Self-attention keys and values (or latents).
    pub self_attn: SelfAttentionCache,
    /// Cross-attention keys and values (computed once from the memory).
    pub cross_attn: CrossKvCache,
}

impl BlockCache {
    /// Empty caches for `block` (a rolling cache when it has a sliding window).
    pub fn for_block(block: &TransformerBlock) -> Self {
        Self {
            self_attn: block.self_attn.new_cache(),
            cross_attn: CrossKvCache::new(),
        }
    }
}

/// How a run of the block calls its self- and cross-attention.
// One value per call of the block, on the stack: boxing would buy nothing.
#[allow(clippy::large_enum_variant)]
enum AttentionCalls<'a> {
    /// Over whole sequences, with this key padding.
    Full(Option<Tensor<2, Bool>>),
    /// Over whole sequences, keeping the probabilities.
    WithWeights {
        key_padding: Option<Tensor<2, Bool>>,
        self_attn: Option<Tensor<4>>,
        cross_attn: Option<Tensor<4>>,
    },
    /// Over new positions, through the caches.
    Cached {
        cache: &'a mut BlockCache,
        key_padding: Option<Tensor<2, Bool>>,
    },
}

impl AttentionCalls<'_> {
    fn self_attention(
        &mut self,
        attention: &SelfAttention,
        shared: &mut SharedKv,
        x: Tensor<3>,
    ) -> Tensor<3> {
        match self {
            Self::Full(key_padding) => attention.forward_sharing(x, key_padding.clone(), shared),
            Self::WithWeights {
                key_padding,
                self_attn,
                ..
            } => {
                let (output, weights) =
                    attention.forward_with_weights_sharing(x, key_padding.clone(), shared);
                *self_attn = Some(weights);
                output
            }
            Self::Cached { cache, key_padding } => attention.forward_cached_sharing(
                x,
                &mut cache.self_attn,
                key_padding.clone(),
                shared,
            ),
        }
    }

    fn cross_attention(
        &mut self,
        attention: &MultiHeadAttention,
        x: Tensor<3>,
        memory: &Memory,
    ) -> Tensor<3> {
        let (states, padding) = (memory.states.clone(), memory.padding.clone());
        match self {
            Self::Full(_) => attention.forward_cross(x, states, padding),
            Self::WithWeights { cross_attn, .. } => {
                let (output, weights) = attention.forward_cross_with_weights(x, states, padding);
                *cross_attn = Some(weights);
                output
            }
            Self::Cached { cache, .. } => {
                attention.forward_cross_cached(x, states, padding, &mut cache.cross_attn)
            }
        }
    }
}

impl TransformerBlock {
    /// The block's arrangement.
    pub fn kind(&self) -> BlockKind {
        self.kind
    }

    /// Whether the block's self-attention reuses an earlier block's keys and values
    /// (and so caches nothing of its own).
    pub fn reuses_kv(&self) -> bool {
        matches!(
            &self.self_attn,
            SelfAttention::MultiHead(attention)
                if matches!(attention.kv_sharing(), Some(KvSharing::Reuse { .. }))
        )
    }

    /// Runs the block over a whole sequence.
    ///
    /// # Shapes
    /// - state: streams `[batch, seq, d_model]`
    /// - key_padding: `[batch, seq]`, `true` = padded
    /// - memory: encoder states for cross-attention, if the block has it
    /// - output: streams `[batch, seq, d_model]`
    ///
    /// # Panics
    /// If the block has cross-attention and no memory is given.
    pub fn forward(
        &self,
        state: BlockState,
        key_padding: Option<Tensor<2, Bool>>,
        memory: Option<&Memory>,
    ) -> BlockState {
        self.run(state, &mut AttentionCalls::Full(key_padding), memory)
    }

    /// [`forward`](Self::forward) that also returns the block's attention
    /// probabilities (computed on the reference path, for inspection and plots).
    ///
    /// # Shapes
    /// - as [`forward`](Self::forward); the weights are `[batch, n_heads, seq, seq]` for
    ///   self-attention and `[batch, n_heads, seq, seq_memory]` for cross-attention
    ///
    /// # Panics
    /// If the block has cross-attention and no memory is given.
    pub fn forward_with_weights(
        &self,
        state: BlockState,
        key_padding: Option<Tensor<2, Bool>>,
        memory: Option<&Memory>,
    ) -> (BlockState, BlockWeights) {
        let mut calls = AttentionCalls::WithWeights {
            key_padding,
            self_attn: None,
            cross_attn: None,
        };
        let state = self.run(state, &mut calls, memory);
        let AttentionCalls::WithWeights {
            self_attn,
            cross_attn,
            ..
        } = calls
        else {
            unreachable!("the calls keep their kind")
        };
        let weights = BlockWeights {
            self_attn: self_attn.expect("every block kind runs its self-attention"),
            cross_attn,
        };
        (state, weights)
    }

    /// Runs the block over new positions, reading and extending `cache`.
    ///
    /// # Shapes
    /// - state: streams `[batch, new, d_model]`
    /// - key_padding: `[batch, new]` for the new positions
    /// - output: streams `[batch, new, d_model]`
    ///
    /// # Panics
    /// If `cache` was not made for this block ([`BlockCache::for_block`]), or the block
    /// has cross-attention and no memory is given.
    pub fn forward_cached(
        &self,
        state: BlockState,
        cache: &mut BlockCache,
        key_padding: Option<Tensor<2, Bool>>,
        memory: Option<&Memory>,
    ) -> BlockState {
        self.run(
            state,
            &mut AttentionCalls::Cached { cache, key_padding },
            memory,
        )
    }

    /// The block's data flow, with the attention calls of `calls`.
    fn run(
        &self,
        state: BlockState,
        calls: &mut AttentionCalls,
        memory: Option<&Memory>,
    ) -> BlockState {
        let cross = self.cross_attn.as_ref().map(|attention| {
            let memory = memory
                .expect("TransformerBlock: a block with cross-attention needs the encoder memory");
            let norm = self
                .cross_attn_layernorm
                .as_ref()
                .expect("cross-attention has a norm");
            (attention, norm, memory)
        });
        let second_norm = self.post_attention_layernorm.as_ref();
        let input_norm = || {
            self.input_layernorm
                .as_ref()
                .expect("every block kind but OutputNorm has an input norm")
        };
        let BlockState {
            hidden: x,
            dual,
            losses,
            mut shared_kv,
            per_layer_input,
        } = state;
        let shared = &mut shared_kv;
        let (hidden, dual, losses) = match self.kind {
            BlockKind::PreNorm => {
                let x = x.clone()
                    + self.branch(calls.self_attention(
                        &self.self_attn,
                        shared,
                        input_norm().forward(x),
                    ));
                let x = match cross {
                    Some((attention, norm, memory)) => {
                        x.clone()
                            + self.branch(calls.cross_attention(attention, norm.forward(x), memory))
                    }
                    None => x,
                };
                let norm = second_norm.expect("a pre-norm block has a feed-forward norm");
                let (fed, losses) =
                    self.feed_forward(norm.forward(x.clone()), x.clone(), losses, None);
                (x + fed, None, losses)
            }
            BlockKind::PostNorm => {
                let x = input_norm().forward(
                    x.clone() + self.branch(calls.self_attention(&self.self_attn, shared, x)),
                );
                let x = match cross {
                    Some((attention, norm, memory)) => norm.forward(
                        x.clone() + self.branch(calls.cross_attention(attention, x, memory)),
                    ),
                    None => x,
                };
                let norm = second_norm.expect("a post-norm block has a feed-forward norm");
                let (fed, losses) = self.feed_forward(x.clone(), x.clone(), losses, None);
                (norm.forward(x + fed), None, losses)
            }
            BlockKind::Parallel => {
                let normed = input_norm().forward(x.clone());
                let attended =
                    self.branch(calls.self_attention(&self.self_attn, shared, normed.clone()));
                let (fed, losses) = self.feed_forward(normed, x.clone(), losses, None);
                (x + attended + fed, None, losses)
            }
            BlockKind::ParallelSeparateNorms => {
                let normed = input_norm().forward(x.clone());
                let attended = self.branch(calls.self_attention(&self.self_attn, shared, normed));
                let norm = second_norm.expect("a parallel block of two norms has a second");
                let (fed, losses) =
                    self.feed_forward(norm.forward(x.clone()), x.clone(), losses, None);
                (x + attended + fed, None, losses)
            }
            BlockKind::ResiDual => {
                let (a, d) = (
                    x,
                    dual.expect(
                        "a ResiDual block needs the dual stream: start from BlockState::new",
                    ),
                );
                let out = self.branch(calls.self_attention(&self.self_attn, shared, a.clone()));
                let (a, d) = (input_norm().forward(a + out.clone()), d + out);
                let (a, d) = match cross {
                    Some((attention, norm, memory)) => {
                        let out = self.branch(calls.cross_attention(attention, a.clone(), memory));
                        (norm.forward(a + out.clone()), d + out)
                    }
                    None => (a, d),
                };
                let norm = second_norm.expect("a ResiDual block has a feed-forward norm");
                let (out, losses) = self.feed_forward(a.clone(), a.clone(), losses, None);
                (norm.forward(a + out.clone()), Some(d + out), losses)
            }
            BlockKind::OutputNorm | BlockKind::Sandwich => {
                let sandwich = self.kind == BlockKind::Sandwich;
                let attention_input = if sandwich {
                    input_norm().forward(x.clone())
                } else {
                    x.clone()
                };
                let attention_norm = second_norm.expect("the attention's output norm");
                let x = x + self.branch(attention_norm.forward(calls.self_attention(
                    &self.self_attn,
                    shared,
                    attention_input,
                )));
                let ffn_input = match &self.pre_feedforward_layernorm {
                    Some(norm) => norm.forward(x.clone()),
                    None => x.clone(),
                };
                let (fed, losses) = self.feed_forward(
                    ffn_input,
                    x.clone(),
                    losses,
                    self.post_feedforward_layernorm.as_ref(),
                );
                (x + fed, None, losses)
            }
        };
        let hidden = match (&self.per_layer_input, per_layer_input) {
            (Some(branch), Some(input)) => branch.forward(hidden, input),
            (Some(_), None) => panic!(
                "TransformerBlock: a block with a per-layer input branch needs its input \
                 (BlockState::per_layer_input, which the stack sets)"
            ),
            (None, _) => hidden,
        };
        let hidden = match &self.layer_scalar {
            Some(scalar) => hidden * scalar.val().unsqueeze::<3>(),
            None => hidden,
        };
        BlockState {
            hidden,
            dual,
            losses,
            shared_kv,
            per_layer_input: None,
        }
    }

    /// The feed-forward sublayer's branch output for its input `x` (normed by
    /// `output_norm` first, when given), and the losses with its routing losses added;
    /// `stream` is the residual stream the sublayer adds to, which Gemma-4's mixture of
    /// experts routes.
    fn feed_forward(
        &self,
        x: Tensor<3>,
        stream: Tensor<3>,
        losses: RoutingLosses,
        output_norm: Option<&Norm>,
    ) -> (Tensor<3>, RoutingLosses) {
        let output = self.mlp.forward_with_losses_beside(x, stream);
        let losses = losses.add(output.aux_loss, output.z_loss);
        let fed = match output_norm {
            Some(norm) => norm.forward(output.output),
            None => output.output,
        };
        (self.branch(fed), losses)
    }

    /// The block with every attention sublayer switched to `implementation` (the
    /// weights are kept): e.g. force the reference path on a loaded model.
    pub fn with_attention_implementation(mut self, implementation: AttentionImpl) -> Self {
        self.self_attn = self.self_attn.with_implementation(implementation);
        self.cross_attn = self
            .cross_attn
            .map(|attention| attention.with_implementation(implementation));
        self
    }

    /// The residual scale, residual dropout and stochastic depth on a sublayer's output.
    fn branch(&self, output: Tensor<3>) -> Tensor<3> {
        let output = match self.residual_scale {
            Some(scale) => output * scale,
            None => output,
        };
        self.drop_path.forward(self.dropout.forward(output))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::block::{TransformerStack, TransformerStackConfig};
    use crate::ffn::SwiGluConfig;
    use crate::position::RopeConfig;
    use crate::test_utils::{Fixture, assert_close, test_devices};
    use burn::module::Param;
    use burn::tensor::Distribution;

    const D_MODEL: usize = 16;

    fn attention(window: Option<usize>) -> MultiHeadAttentionConfig {
        MultiHeadAttentionConfig::new(D_MODEL, 4)
            .with_n_kv_heads(Some(2))
            .with_causal(true)
            .with_window(window)
    }

    fn config(kind: BlockKind) -> TransformerBlockConfig {
        TransformerBlockConfig::new(
            SelfAttentionConfig::MultiHead(attention(None)),
            FeedForwardConfig::SwiGlu(SwiGluConfig::new(D_MODEL, 24)),
            NormConfig::rms(D_MODEL),
        )
        .with_kind(kind)
    }

    fn input(device: &Device) -> Tensor<3> {
        Tensor::random([2, 5, D_MODEL], Distribution::Normal(0.0, 1.0), device)
    }

    /// Encoder states of width 8 for a batch of two, the second padded after 3.
    fn memory(device: &Device) -> Memory {
        Memory {
            states: Tensor::random([2, 6, 8], Distribution::Normal(0.0, 1.0), device),
            padding: Some(crate::attention::padding_mask_from_lengths(
                &[6, 3],
                6,
                device,
            )),
        }
    }

    /// Each arrangement equals its formula written out with the block's own sublayers.
    #[test]
    fn every_kind_matches_its_formula() {
        for device in test_devices() {
            device.seed(21);
            let x = input(&device);
            for kind in [
                BlockKind::PreNorm,
                BlockKind::PostNorm,
                BlockKind::Parallel,
                BlockKind::ParallelSeparateNorms,
                BlockKind::ResiDual,
                BlockKind::OutputNorm,
                BlockKind::Sandwich,
            ] {
                let mut block = config(kind).init(&device);
                // Distinct norm weights, so that a norm used in another's place shows.
                for norm in [
                    &mut block.input_layernorm,
                    &mut block.post_attention_layernorm,
                    &mut block.pre_feedforward_layernorm,
                    &mut block.post_feedforward_layernorm,
                ]
                .into_iter()
                .flatten()
                {
                    let Norm::Rms(norm) = norm else {
                        unreachable!("configured with RMSNorm")
                    };
                    norm.weight = Some(Param::from_tensor(Tensor::random(
                        [D_MODEL],
                        Distribution::Uniform(0.5, 1.5),
                        &device,
                    )));
                }
                let attn = |h: Tensor<3>| block.self_attn.forward(h, None);
                let mlp = |h: Tensor<3>| block.mlp.forward(h);
                let norm = |norm: &Option<Norm>, h: Tensor<3>| norm.as_ref().unwrap().forward(h);
                let n1 = |h: Tensor<3>| norm(&block.input_layernorm, h);
                let n2 = |h: Tensor<3>| norm(&block.post_attention_layernorm, h);
                let n3 = |h: Tensor<3>| norm(&block.pre_feedforward_layernorm, h);
                let n4 = |h: Tensor<3>| norm(&block.post_feedforward_layernorm, h);
                let output = block.forward(BlockState::new(x.clone(), kind), None, None);
                let (expected, expected_dual) = match kind {
                    BlockKind::PreNorm => {
                        let h = x.clone() + attn(n1(x.clone()));
                        (h.clone() + mlp(n2(h)), None)
                    }
                    BlockKind::PostNorm => {
                        let h = n1(x.clone() + attn(x.clone()));
                        (n2(h.clone() + mlp(h)), None)
                    }
                    BlockKind::Parallel => {
                        let h = n1(x.clone());
                        (x.clone() + attn(h.clone()) + mlp(h), None)
                    }
                    BlockKind::ParallelSeparateNorms => {
                        (x.clone() + attn(n1(x.clone())) + mlp(n2(x.clone())), None)
                    }
                    BlockKind::ResiDual => {
                        let out = attn(x.clone());
                        let (a, d) = (n1(x.clone() + out.clone()), x.clone() + out);
                        let out = mlp(a.clone());
                        (n2(a + out.clone()), Some(d + out))
                    }
                    BlockKind::OutputNorm => {
                        assert!(block.input_layernorm.is_none());
                        let h = x.clone() + n2(attn(x.clone()));
                        (h.clone() + n4(mlp(h)), None)
                    }
                    BlockKind::Sandwich => {
                        let h = x.clone() + n2(attn(n1(x.clone())));
                        (h.clone() + n4(mlp(n3(h))), None)
                    }
                };
                assert_close(output.hidden, expected, 1e-5, &format!("{kind:?}"));
                if let Some(dual) = expected_dual {
                    assert_close(output.dual.unwrap(), dual, 1e-5, "ResiDual dual stream");
                }
            }
        }
    }

    /// A Pre-LN block against Hugging Face's `LlamaDecoderLayer` (RMSNorm, GQA with
    /// RoPE, SwiGLU), every weight perturbed (tools/make_fixtures.py).
    #[test]
    fn pre_ln_block_matches_llama_decoder_layer() {
        let fixture = Fixture::load("block_pre_ln");
        for device in test_devices() {
            let config = TransformerBlockConfig::new(
                SelfAttentionConfig::MultiHead(
                    MultiHeadAttentionConfig::new(24, 6)
                        .with_n_kv_heads(Some(2))
                        .with_head_dim(Some(8))
                        .with_causal(true)
                        .with_rope(Some(RopeConfig::new(8).with_max_position_embeddings(64))),
                ),
                FeedForwardConfig::SwiGlu(SwiGluConfig::new(24, 40)),
                NormConfig::rms(24),
            );
            let mut block = config.init(&device);
            let SelfAttention::MultiHead(attention) = &mut block.self_attn else {
                unreachable!("configured as multi-head attention")
            };
            attention.q_proj = fixture.linear("self_attn.q_proj", &device);
            attention.k_proj = Some(fixture.linear("self_attn.k_proj", &device));
            attention.v_proj = Some(fixture.linear("self_attn.v_proj", &device));
            attention.o_proj = fixture.linear("self_attn.o_proj", &device);
            let FeedForward::SwiGlu(mlp) = &mut block.mlp else {
                unreachable!("configured as SwiGLU")
            };
            mlp.gate_proj = fixture.linear("mlp.gate_proj", &device);
            mlp.up_proj = fixture.linear("mlp.up_proj", &device);
            mlp.down_proj = fixture.linear("mlp.down_proj", &device);
            let norm_weight =
                |key: &str| Some(Param::from_tensor(fixture.tensor::<1>(key, &device)));
            let (Some(Norm::Rms(input)), Some(Norm::Rms(post))) = (
                &mut block.input_layernorm,
                &mut block.post_attention_layernorm,
            ) else {
                unreachable!("configured with RMSNorm")
            };
            input.weight = norm_weight("input_layernorm.weight");
            post.weight = norm_weight("post_attention_layernorm.weight");

            let x = fixture.tensor("x", &device);
            let output = block.forward(BlockState::new(x, BlockKind::PreNorm), None, None);
            assert_close(
                output.hidden,
                fixture.tensor("y", &device),
                1e-5,
                "block_pre_ln",
            );
        }
    }

    #[test]
    fn residual_stack_combines_streams_through_the_final_norm() {
        let device = Device::flex();
        device.seed(4);
        let stack = TransformerStackConfig::new(config(BlockKind::ResiDual), 2).init(&device);
        let x = input(&device);
        let mut state = BlockState::new(x.clone(), BlockKind::ResiDual);
        for layer in &stack.layers {
            state = layer.forward(state, None, None);
        }
        let expected = state.hidden + stack.norm.as_ref().unwrap().forward(state.dual.unwrap());
        assert_close(
            stack.forward(x, None, None),
            expected,
            1e-6,
            "ResiDual stack",
        );
    }

    #[test]
    fn cached_stack_equals_full_forward_for_every_kind() {
        for device in test_devices() {
            device.seed(8);
            for kind in [
                BlockKind::PreNorm,
                BlockKind::PostNorm,
                BlockKind::Parallel,
                BlockKind::ParallelSeparateNorms,
                BlockKind::ResiDual,
                BlockKind::OutputNorm,
                BlockKind::Sandwich,
            ] {
                let mut block = config(kind);
                block.self_attention = SelfAttentionConfig::MultiHead(attention(Some(3)));
                let stack: TransformerStack = TransformerStackConfig::new(block, 2).init(&device);
                let x = input(&device);
                let full = stack.forward(x.clone(), None, None);
                let mut caches = stack.new_cache();
                let mut steps = vec![
                    stack
                        .forward_cached(x.clone().narrow(1, 0, 2), None, &mut caches, None, None)
                        .0,
                ];
                for position in 2..5 {
                    let (step, _) = stack.forward_cached(
                        x.clone().narrow(1, position, 1),
                        None,
                        &mut caches,
                        None,
                        None,
                    );
                    steps.push(step);
                }
                assert_close(
                    Tensor::cat(steps, 1),
                    full,
                    1e-5,
                    &format!("cached {kind:?}"),
                );
            }
        }
    }

    #[test]
    fn encoder_decoder_block_uses_memory_and_its_cache() {
        for device in test_devices() {
            device.seed(13);
            let block = config(BlockKind::PostNorm)
                .with_cross_attention(Some(
                    MultiHeadAttentionConfig::new(D_MODEL, 4).with_d_kv_input(Some(8)),
                ))
                .init(&device);
            let memory = memory(&device);
            let x = input(&device);
            let full = block.forward(
                BlockState::new(x.clone(), BlockKind::PostNorm),
                None,
                Some(&memory),
            );
            let mut cache = BlockCache::for_block(&block);
            let steps: Vec<Tensor<3>> = (0..5)
                .map(|position| {
                    let state =
                        BlockState::new(x.clone().narrow(1, position, 1), BlockKind::PostNorm);
                    block
                        .forward_cached(state, &mut cache, None, Some(&memory))
                        .hidden
                })
                .collect();
            assert!(cache.cross_attn.is_filled());
            assert_close(
                Tensor::cat(steps, 1),
                full.hidden,
                1e-5,
                "cross-attention block cached",
            );
        }
    }

    /// A stack's weights are its blocks' own: the output is `forward`'s, the first
    /// block's self-attention weights are those of its attention on its normed input,
    /// and cross-attention weights leave padded memory positions at 0.
    #[test]
    fn stack_returns_every_blocks_weights() {
        for device in test_devices() {
            device.seed(17);
            let stack = TransformerStackConfig::new(
                config(BlockKind::PreNorm).with_cross_attention(Some(
                    MultiHeadAttentionConfig::new(D_MODEL, 2).with_d_kv_input(Some(8)),
                )),
                2,
            )
            .init(&device);
            let memory = memory(&device);
            let x = input(&device);
            let (output, weights) =
                stack.forward_with_weights(x.clone(), None, None, Some(&memory));
            assert_close(
                output,
                stack.forward(x.clone(), None, Some(&memory)),
                1e-5,
                "stack output with weights vs forward",
            );
            assert_eq!(weights.len(), 2);
            let first = &stack.layers[0];
            let (_, expected) = first
                .self_attn
                .forward_with_weights(first.input_layernorm.as_ref().unwrap().forward(x), None);
            assert_close(weights[0].self_attn.clone(), expected, 1e-6, "first block");
            for block in &weights {
                assert_eq!(block.self_attn.dims(), [2, 4, 5, 5]);
                let cross = block.cross_attn.clone().expect("cross-attention weights");
                assert_eq!(cross.dims(), [2, 2, 5, 6]);
                let padded = cross.narrow(0, 1, 1).narrow(3, 3, 3);
                assert_eq!(padded.abs().sum().into_scalar::<f32>(), 0.0);
            }
        }
    }

    /// The same decoder block trained for 5 AdamW steps through the fused kernel and
    /// through the reference path gives the same losses.
    #[cfg(all(feature = "wgpu", feature = "train"))]
    #[test]
    fn decoder_layer_trains_identically_through_the_kernel() {
        decoder_layer_trains_identically_through_the_kernel_on(crate::test_utils::wgpu_device());
    }

    /// The same on CUDA (needs an NVIDIA GPU; CI only compiles it).
    #[cfg(all(feature = "cuda", feature = "train"))]
    #[test]
    fn decoder_layer_trains_identically_through_the_kernel_on_cuda() {
        decoder_layer_trains_identically_through_the_kernel_on(crate::test_utils::cuda_device());
    }

    /// A gpt-oss-style layer (Pre-LN, learned attention sinks) and a Gemma-style one
    /// (sandwich norms, QK-norm, soft-capped scores), both with a window shorter than
    /// the sequence, train with the same losses through the fused kernel as through the
    /// reference path (the sinks train through the kernel too).
    #[cfg(all(feature = "cube", feature = "train"))]
    fn decoder_layer_trains_identically_through_the_kernel_on(device: burn::tensor::Device) {
        use crate::attention::QkNormConfig;
        use burn::optim::{AdamWConfig, GradientsParams};

        let device = device.autodiff();
        device.seed(17);
        for kind in [BlockKind::PreNorm, BlockKind::Sandwich] {
            let gemma_style = kind == BlockKind::Sandwich;
            let config = |implementation| {
                let mut config = config(kind);
                let attention = attention(Some(12))
                    .with_head_dim(Some(32))
                    .with_rope(Some(RopeConfig::new(32)))
                    .with_implementation(implementation);
                let attention = if gemma_style {
                    attention
                        .with_softcap(Some(5.0))
                        .with_qk_norm(Some(QkNormConfig::new().with_unit_offset(true)))
                } else {
                    attention.with_sinks(true)
                };
                config.self_attention = SelfAttentionConfig::MultiHead(attention);
                config
            };
            let initial = config(AttentionImpl::Fused).init(&device);
            // [batch, seq, d_model] with a sequence that is not a multiple of any tile.
            let x = Tensor::<3>::random([2, 37, D_MODEL], Distribution::Normal(0.0, 1.0), &device);
            let target =
                Tensor::<3>::random([2, 37, D_MODEL], Distribution::Normal(0.0, 1.0), &device);

            let train = |implementation| {
                // Same initial weights; only the attention path differs.
                let mut block = initial
                    .clone()
                    .with_attention_implementation(implementation);
                let mut optimizer = AdamWConfig::new().init();
                let mut losses = Vec::new();
                for _ in 0..5 {
                    let output = block.forward(BlockState::new(x.clone(), kind), None, None);
                    let loss = (output.hidden - target.clone()).powi_scalar(2).mean();
                    losses.push(loss.clone().into_scalar::<f32>());
                    let grads = GradientsParams::from_grads(loss.backward(), &block);
                    block = optimizer.step(1e-2, block, grads);
                }
                losses
            };
            let launches = || {
                crate::ops::flash_attention::op::FORWARD_LAUNCHES
                    .load(std::sync::atomic::Ordering::SeqCst)
            };
            let before = launches();
            let fused = train(AttentionImpl::Fused);
            assert!(
                launches() >= before + 5,
                "{kind:?}: the fused run must launch the CubeCL kernel"
            );
            let reference = train(AttentionImpl::Reference);
            assert!(fused[4] < fused[0], "{kind:?}: the layer learns: {fused:?}");
            for (step, (a, b)) in fused.iter().zip(&reference).enumerate() {
                let relative = (a - b).abs() / b.abs();
                assert!(
                    relative <= 1e-4,
                    "{kind:?} step {step}: fused loss {a} vs reference {b} (relative {relative:e})"
                );
            }
        }
    }

    #[test]
    fn mismatched_widths_are_rejected() {
        let mut bad = config(BlockKind::PreNorm);
        bad.norm = NormConfig::rms(D_MODEL + 1);
        let error = bad.validate().unwrap_err();
        assert!(error.to_string().contains("norm.d_model"), "{error}");
        for kind in [
            BlockKind::Parallel,
            BlockKind::ParallelSeparateNorms,
            BlockKind::OutputNorm,
            BlockKind::Sandwich,
        ] {
            let error = config(kind)
                .with_cross_attention(Some(MultiHeadAttentionConfig::new(D_MODEL, 4)))
                .validate()
                .unwrap_err();
            assert!(
                error
                    .to_string()
                    .contains(&format!("a {kind:?} block has no place")),
                "{error}"
            );
        }
    }
}
