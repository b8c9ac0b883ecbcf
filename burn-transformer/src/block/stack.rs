//! A stack of transformer blocks with its final norm: the body of every model.

use burn::config::Config;
use burn::module::Module;
use burn::tensor::{Bool, Device, Int, Tensor};

use super::transformer_block::{
    BlockCache, BlockKind, BlockState, BlockWeights, Memory, RoutingLosses, TransformerBlock,
    TransformerBlockConfig,
};
use crate::error::ConfigError;
use crate::norm::Norm;

const MODULE: &str = "TransformerStackConfig";

/// Configuration of a [`TransformerStack`] of identical blocks. Stacks whose blocks
/// differ by layer (sliding windows on some, mixtures of experts on others) are
/// built with [`TransformerStack::new`] from their blocks.
#[derive(Config, Debug)]
pub struct TransformerStackConfig {
    /// The configuration shared by every block.
    pub block: TransformerBlockConfig,
    /// Number of blocks.
    pub n_layers: usize,
    /// A norm after the last block. Default: true for Pre-LN, parallel and ResiDual
    /// blocks (which need one), false for Post-LN (whose blocks end with a norm).
    #[config(default = "None")]
    pub final_norm: Option<bool>,
}

impl TransformerStackConfig {
    /// Whether the stack ends with a norm, after defaults.
    pub fn has_final_norm(&self) -> bool {
        self.final_norm
            .unwrap_or(self.block.kind.has_final_norm_by_default())
    }

    /// Checks the configuration.
    ///
    /// # Errors
    /// The block's errors; [`ConfigError::Zero`] without layers;
    /// [`ConfigError::Invalid`] for a ResiDual stack without a final norm.
    pub fn validate(&self) -> Result<(), ConfigError> {
        self.block.validate()?;
        ConfigError::check_positive(MODULE, "n_layers", self.n_layers)?;
        check_final_norm(self.block.kind, self.has_final_norm())
    }

    /// Builds the stack, or returns why the configuration is invalid.
    ///
    /// # Errors
    /// See [`validate`](Self::validate).
    pub fn try_init(&self, device: &Device) -> Result<TransformerStack, ConfigError> {
        self.validate()?;
        let layers = (0..self.n_layers)
            .map(|_| self.block.try_init(device))
            .collect::<Result<Vec<_>, _>>()?;
        let norm = self
            .has_final_norm()
            .then(|| self.block.norm.try_init(device))
            .transpose()?;
        TransformerStack::new(layers, norm)
    }
}

crate::builders::init_or_panic!(TransformerStackConfig => TransformerStack);

/// ResiDual combines its streams through the final norm.
fn check_final_norm(kind: BlockKind, has_final_norm: bool) -> Result<(), ConfigError> {
    if kind == BlockKind::ResiDual && !has_final_norm {
        return Err(ConfigError::Invalid {
            module: MODULE,
            field: "final_norm",
            reason: "ResiDual combines its streams through the final norm".into(),
        });
    }
    Ok(())
}

/// Blocks and the final norm (HF `model.layers`, `model.norm`).
#[derive(Module, Debug)]
pub struct TransformerStack {
    /// The blocks, first to last.
    pub layers: Vec<TransformerBlock>,
    /// The norm after the last block.
    pub norm: Option<Norm>,
    #[module(skip)]
    kind: BlockKind,
}

/// The decoding state of a [`TransformerStack`]: one cache per block.
#[derive(Clone, Debug)]
pub struct StackCache {
    /// One per block, first to last.
    pub blocks: Vec<BlockCache>,
    /// `[batch]`: how many of the positions seen were padding in each row; `None` while
    /// no step had padding.
    padded: Option<Tensor<1, Int>>,
}

impl StackCache {
    /// `[batch]`: how many of the positions seen were padding in each row (absolute
    /// positions count real tokens only); `None` while no step had padding.
    pub fn padded_positions(&self) -> Option<Tensor<1, Int>> {
        self.padded.clone()
    }

    /// Counts the padding of new positions.
    ///
    /// # Shapes
    /// - key_padding: `[batch, new]`
    fn count_padding(&mut self, key_padding: Tensor<2, Bool>) {
        // [batch]
        let new = key_padding.int().sum_dim(1).squeeze_dim::<1>(1);
        self.padded = Some(match self.padded.take() {
            Some(seen) => seen + new,
            None => new,
        });
    }

    /// The absolute position of the next token (the number of positions seen).
    pub fn position(&self) -> usize {
        self.blocks
            .first()
            .map_or(0, |block| block.self_attn.position())
    }

    /// Bytes held by every block's self-attention cache.
    pub fn bytes(&self) -> usize {
        self.blocks
            .iter()
            .map(|block| block.self_attn.bytes())
            .sum()
    }

    /// Keeps only the batch rows in `indices`, in that order (beam search).
    ///
    /// # Shapes
    /// - indices: `[new_batch]`
    pub fn select_batch(&mut self, indices: Tensor<1, Int>) {
        for block in &mut self.blocks {
            block.self_attn.select_batch(indices.clone());
            block.cross_attn.select_batch(indices.clone());
        }
        self.padded = self
            .padded
            .take()
            .map(|padded| padded.select(0, indices.clone()));
    }
}

impl TransformerStack {
    /// A stack of `layers` (possibly configured differently, e.g. sliding windows on
    /// some layers) and a final norm.
    ///
    /// # Errors
    /// [`ConfigError::Zero`] without layers; [`ConfigError::Invalid`] when the blocks
    /// are of different kinds, or for a ResiDual stack without a final norm.
    pub fn new(layers: Vec<TransformerBlock>, norm: Option<Norm>) -> Result<Self, ConfigError> {
        ConfigError::check_positive(MODULE, "n_layers", layers.len())?;
        let kind = layers[0].kind();
        if let Some(other) = layers.iter().find(|layer| layer.kind() != kind) {
            return Err(ConfigError::Invalid {
                module: MODULE,
                field: "block.kind",
                reason: format!(
                    "every block of a stack has one arrangement, got {kind:?} and {:?}",
                    other.kind()
                ),
            });
        }
        check_final_norm(kind, norm.is_some())?;
        Ok(Self { layers, norm, kind })
    }

    /// The blocks' arrangement.
    pub fn kind(&self) -> BlockKind {
        self.kind
    }

    /// Runs every block over a whole sequence.
    ///
    /// # Shapes
    /// - x: `[batch, seq, d_model]`
    /// - key_padding: `[batch, seq]`, `true` = padded
    /// - output: `[batch, seq, d_model]`
    ///
    /// # Panics
    /// If the blocks read per-layer inputs (see
    /// [`forward_with_losses`](Self::forward_with_losses)).
    pub fn forward(
        &self,
        x: Tensor<3>,
        key_padding: Option<Tensor<2, Bool>>,
        memory: Option<&Memory>,
    ) -> Tensor<3> {
        self.forward_with_losses(x, None, key_padding, memory).0
    }

    /// [`forward`](Self::forward) with each block's own input (for the blocks with a
    /// per-layer branch, [`TransformerBlockConfig::per_layer_input`]), that also
    /// returns the routing losses of the stack's mixture-of-experts layers (to add to
    /// a training loss).
    ///
    /// # Shapes
    /// - layer_inputs: `[batch, seq, n_layers, width]`, block `i` reading `[.., i, ..]`
    /// - otherwise as [`forward`](Self::forward); the losses are `[1]`
    ///
    /// [`TransformerBlockConfig::per_layer_input`]: super::TransformerBlockConfig::per_layer_input
    ///
    /// # Panics
    /// If the blocks read per-layer inputs and none are given, or they are not one per
    /// block.
    pub fn forward_with_losses(
        &self,
        x: Tensor<3>,
        layer_inputs: Option<Tensor<4>>,
        key_padding: Option<Tensor<2, Bool>>,
        memory: Option<&Memory>,
    ) -> (Tensor<3>, RoutingLosses) {
        let mut state = BlockState::new(x, self.kind);
        for (index, layer) in self.layers.iter().enumerate() {
            state.per_layer_input = self.layer_input(layer_inputs.as_ref(), index);
            state = layer.forward(state, key_padding.clone(), memory);
        }
        self.finish(state)
    }

    /// [`forward_with_losses`](Self::forward_with_losses) that also returns every
    /// block's attention probabilities, first block first (see
    /// [`TransformerBlock::forward_with_weights`]), and not the losses.
    ///
    /// # Shapes
    /// - as [`forward_with_losses`](Self::forward_with_losses); one [`BlockWeights`]
    ///   per block
    ///
    /// # Panics
    /// As [`forward_with_losses`](Self::forward_with_losses).
    pub fn forward_with_weights(
        &self,
        x: Tensor<3>,
        layer_inputs: Option<Tensor<4>>,
        key_padding: Option<Tensor<2, Bool>>,
        memory: Option<&Memory>,
    ) -> (Tensor<3>, Vec<BlockWeights>) {
        let mut state = BlockState::new(x, self.kind);
        let mut weights = Vec::with_capacity(self.layers.len());
        for (index, layer) in self.layers.iter().enumerate() {
            state.per_layer_input = self.layer_input(layer_inputs.as_ref(), index);
            let (next, block_weights) =
                layer.forward_with_weights(state, key_padding.clone(), memory);
            state = next;
            weights.push(block_weights);
        }
        (self.finish(state).0, weights)
    }

    /// Block `index`'s own input, `[batch, seq, width]`, from all of them.
    ///
    /// # Shapes
    /// - layer_inputs: `[batch, seq, n_layers, width]`
    fn layer_input(&self, layer_inputs: Option<&Tensor<4>>, index: usize) -> Option<Tensor<3>> {
        let inputs = layer_inputs?;
        let layers = inputs.dims()[2];
        assert_eq!(
            layers,
            self.layers.len(),
            "TransformerStack: {layers} per-layer inputs for {} blocks",
            self.layers.len()
        );
        Some(inputs.clone().narrow(2, index, 1).squeeze_dim::<3>(2))
    }

    /// Runs every block over new positions with per-block caches (see
    /// [`new_cache`](Self::new_cache)); also returns the routing losses.
    ///
    /// # Shapes
    /// - x: `[batch, new, d_model]`
    /// - layer_inputs: `[batch, new, n_layers, width]`, as for
    ///   [`forward_with_losses`](Self::forward_with_losses)
    /// - key_padding: `[batch, new]` for the new positions
    /// - output: `[batch, new, d_model]`
    ///
    /// # Panics
    /// If `cache` does not hold one cache per block; as
    /// [`forward_with_losses`](Self::forward_with_losses).
    pub fn forward_cached(
        &self,
        x: Tensor<3>,
        layer_inputs: Option<Tensor<4>>,
        cache: &mut StackCache,
        key_padding: Option<Tensor<2, Bool>>,
        memory: Option<&Memory>,
    ) -> (Tensor<3>, RoutingLosses) {
        let new = x.dims()[1];
        self.forward_cached_keeping(x, layer_inputs, cache, key_padding, memory, new)
    }

    /// [`forward_cached`](Self::forward_cached) that returns the output of the last
    /// `keep` positions only (a prefill that needs the next token's logits alone):
    /// every block that caches keys and values still runs on all positions, the blocks
    /// after the last of them (those that reuse earlier blocks' keys and values) on the
    /// kept ones only.
    ///
    /// # Shapes
    /// - as [`forward_cached`](Self::forward_cached); output `[batch, keep, d_model]`
    ///
    /// # Panics
    /// As [`forward_cached`](Self::forward_cached); if `keep` is 0 or more than `new`.
    pub fn forward_cached_keeping(
        &self,
        x: Tensor<3>,
        layer_inputs: Option<Tensor<4>>,
        cache: &mut StackCache,
        key_padding: Option<Tensor<2, Bool>>,
        memory: Option<&Memory>,
        keep: usize,
    ) -> (Tensor<3>, RoutingLosses) {
        assert_eq!(
            cache.blocks.len(),
            self.layers.len(),
            "TransformerStack: the cache has {} blocks, the stack {}",
            cache.blocks.len(),
            self.layers.len()
        );
        if let Some(padding) = &key_padding {
            cache.count_padding(padding.clone());
        }
        let new = x.dims()[1];
        // The blocks after the last one that caches run on the kept positions.
        let narrowed_from = self
            .layers
            .iter()
            .rposition(|layer| !layer.reuses_kv())
            .map_or(0, |last| last + 1);
        let mut layer_inputs = layer_inputs;
        let mut state = BlockState::new(x, self.kind);
        for (index, (layer, block_cache)) in self.layers.iter().zip(&mut cache.blocks).enumerate() {
            if index == narrowed_from {
                state = state.keep_last(keep);
                layer_inputs = layer_inputs.map(|inputs| inputs.narrow(1, new - keep, keep));
            }
            state.per_layer_input = self.layer_input(layer_inputs.as_ref(), index);
            state = layer.forward_cached(state, block_cache, key_padding.clone(), memory);
        }
        if narrowed_from == self.layers.len() {
            state = state.keep_last(keep);
        }
        self.finish(state)
    }

    /// Empty caches, one per block (rolling for sliding-window blocks, latent for MLA).
    pub fn new_cache(&self) -> StackCache {
        StackCache {
            blocks: self.layers.iter().map(BlockCache::for_block).collect(),
            padded: None,
        }
    }

    /// The stack's output from the last block's state: the final norm (ResiDual adds
    /// its normed dual stream).
    fn finish(&self, state: BlockState) -> (Tensor<3>, RoutingLosses) {
        let hidden = match (self.kind, &self.norm) {
            (BlockKind::ResiDual, Some(norm)) => {
                let dual = state.dual.expect("ResiDual blocks carry the dual stream");
                state.hidden + norm.forward(dual)
            }
            (_, Some(norm)) => norm.forward(state.hidden),
            (_, None) => state.hidden,
        };
        (hidden, state.losses)
    }
}
