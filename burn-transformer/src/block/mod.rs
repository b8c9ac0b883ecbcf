//! Transformer blocks and the stack every model is built from: Pre-LN, Post-LN,
//! parallel and ResiDual arrangements, any self-attention (grouped or latent), any
//! feed-forward (dense, gated or mixture of experts), stochastic depth.

mod per_layer_input;
mod stack;
mod stochastic_depth;
mod transformer_block;

pub use per_layer_input::{PerLayerInput, PerLayerInputConfig};
pub use stack::{StackCache, TransformerStack, TransformerStackConfig};
pub use stochastic_depth::{StochasticDepth, StochasticDepthConfig};
pub use transformer_block::{
    BlockCache, BlockKind, BlockState, BlockWeights, Memory, RoutingLosses, TransformerBlock,
    TransformerBlockConfig,
};
