//! A stack of transformer blocks with its final norm.

use burn::config::Config;
use burn::module::Module;
use burn::tensor::{Bool, Device, Tensor};

use super::layer::{
    BlockCache, BlockKind, BlockState, BlockWeights, Memory, TransformerBlock,
    TransformerBlockConfig,
};
use crate::error::ConfigError;
use crate::norm::Norm;

/// Configuration of a [`TransformerStack`].
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
            .unwrap_or(self.block.kind != BlockKind::PostNorm)
    }

    /// Checks the configuration.
    pub fn validate(&self) -> Result<(), ConfigError> {
        self.block.validate()?;
        ConfigError::check_positive("TransformerStackConfig", "n_layers", self.n_layers)?;
        if self.block.kind == BlockKind::ResiDual && !self.has_final_norm() {
            return Err(ConfigError::Invalid {
                module: "TransformerStackConfig",
                field: "final_norm",
                reason: "ResiDual combines its streams through the final norm".into(),
            });
        }
        Ok(())
    }

    /// Builds the stack, or returns why the configuration is invalid.
    pub fn try_init(&self, device: &Device) -> Result<TransformerStack, ConfigError> {
        self.validate()?;
        let layers = (0..self.n_layers)
            .map(|_| self.block.try_init(device))
            .collect::<Result<Vec<_>, _>>()?;
        Ok(TransformerStack {
            layers,
            norm: self
                .has_final_norm()
                .then(|| self.block.norm.try_init(device))
                .transpose()?,
            kind: self.block.kind,
        })
    }

    /// Builds the stack.
    ///
    /// # Panics
    /// If the configuration is invalid, with the message of [`validate`](Self::validate).
    pub fn init(&self, device: &Device) -> TransformerStack {
        self.try_init(device)
            .unwrap_or_else(|error| panic!("{error}"))
    }
}

/// `n_layers` blocks and the final norm (HF `model.layers`, `model.norm`).
#[derive(Module, Debug)]
pub struct TransformerStack {
    /// The blocks, first to last.
    pub layers: Vec<TransformerBlock>,
    /// The norm after the last block.
    pub norm: Option<Norm>,
    #[module(skip)]
    kind: BlockKind,
}

impl TransformerStack {
    /// Runs every block over a whole sequence.
    ///
    /// # Shapes
    /// - x: `[batch, seq, d_model]`
    /// - key_padding: `[batch, seq]`, `true` = padded
    /// - output: `[batch, seq, d_model]`
    pub fn forward(
        &self,
        x: Tensor<3>,
        key_padding: Option<Tensor<2, Bool>>,
        memory: Option<&Memory>,
    ) -> Tensor<3> {
        let mut state = BlockState::new(x, self.kind);
        for layer in &self.layers {
            state = layer.forward(state, key_padding.clone(), memory);
        }
        self.finish(state)
    }

    /// [`forward`](Self::forward) that also returns every block's attention
    /// probabilities, first block first (see [`TransformerBlock::forward_with_weights`]).
    ///
    /// # Shapes
    /// - as [`forward`](Self::forward); one [`BlockWeights`] per block
    pub fn forward_with_weights(
        &self,
        x: Tensor<3>,
        key_padding: Option<Tensor<2, Bool>>,
        memory: Option<&Memory>,
    ) -> (Tensor<3>, Vec<BlockWeights>) {
        let mut state = BlockState::new(x, self.kind);
        let mut weights = Vec::with_capacity(self.layers.len());
        for layer in &self.layers {
            let (next, block_weights) =
                layer.forward_with_weights(state, key_padding.clone(), memory);
            state = next;
            weights.push(block_weights);
        }
        (self.finish(state), weights)
    }

    /// Runs every block over new positions with per-block caches (see [`Self::new_cache`]).
    ///
    /// # Shapes
    /// - x: `[batch, new, d_model]`
    /// - key_padding: `[batch, new]` for the new positions
    /// - output: `[batch, new, d_model]`
    ///
    /// # Panics
    /// If `caches` does not hold one cache per block.
    pub fn forward_cached(
        &self,
        x: Tensor<3>,
        caches: &mut [BlockCache],
        key_padding: Option<Tensor<2, Bool>>,
        memory: Option<&Memory>,
    ) -> Tensor<3> {
        assert_eq!(caches.len(), self.layers.len(), "one cache per block");
        let mut state = BlockState::new(x, self.kind);
        for (layer, cache) in self.layers.iter().zip(caches.iter_mut()) {
            state = layer.forward_cached(state, cache, key_padding.clone(), memory);
        }
        self.finish(state)
    }

    /// Empty caches, one per block.
    pub fn new_cache(&self) -> Vec<BlockCache> {
        self.layers.iter().map(BlockCache::for_block).collect()
    }

    fn finish(&self, state: BlockState) -> Tensor<3> {
        match (self.kind, &self.norm) {
            (BlockKind::ResiDual, Some(norm)) => {
                let dual = state.dual.expect("ResiDual blocks carry the dual stream");
                state.hidden + norm.forward(dual)
            }
            (_, Some(norm)) => norm.forward(state.hidden),
            (_, None) => state.hidden,
        }
    }
}
