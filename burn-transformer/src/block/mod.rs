//! Transformer blocks: Pre-LN, Post-LN, parallel and ResiDual, with stochastic depth.

mod layer;
mod stack;
mod stochastic_depth;

pub use layer::{
    BlockCache, BlockKind, BlockState, BlockWeights, Memory, TransformerBlock,
    TransformerBlockConfig,
};
pub use stack::{TransformerStack, TransformerStackConfig};
pub use stochastic_depth::{StochasticDepth, StochasticDepthConfig};
