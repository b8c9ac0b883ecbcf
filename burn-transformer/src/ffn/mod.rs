//! Feed-forward layers: the dense two-layer FFN and the gated SwiGLU / GeGLU.

mod activation;
mod dense;
pub mod moe;
mod swiglu;
mod xielu;

pub use activation::Activation;
pub use dense::{DenseFfn, DenseFfnConfig};
pub use moe::{Moe, MoeConfig, MoeLayerPlan, MoeOutput};
pub use swiglu::{SwiGlu, SwiGluConfig};
pub use xielu::{Xielu, XieluConfig};
mod feed_forward;
pub use feed_forward::{FeedForward, FeedForwardConfig, FeedForwardOutput};

use burn::module::Initializer;
use burn::nn::{Linear, LinearConfig};
use burn::tensor::Device;

/// A projection `d_input → d_output` of a feed-forward layer: Burn's default
/// initializer, or the model's (a normal of `initializer_range` in decoder-only models).
fn projection(
    d_input: usize,
    d_output: usize,
    bias: bool,
    initializer: &Option<Initializer>,
    device: &Device,
) -> Linear {
    let config = LinearConfig::new(d_input, d_output).with_bias(bias);
    match initializer {
        Some(initializer) => config.with_initializer(initializer.clone()),
        None => config,
    }
    .init(device)
}
