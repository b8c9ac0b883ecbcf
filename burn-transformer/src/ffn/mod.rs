//! Feed-forward layers: the dense two-layer FFN and the gated SwiGLU / GeGLU.

mod activation;
mod dense;
pub mod moe;
mod swiglu;

pub use activation::Activation;
pub use dense::{DenseFfn, DenseFfnConfig};
pub use moe::{Moe, MoeConfig, MoeLayerPlan, MoeOutput};
pub use swiglu::{SwiGlu, SwiGluConfig};
mod feed_forward;
pub use feed_forward::{FeedForward, FeedForwardConfig, FeedForwardOutput};
