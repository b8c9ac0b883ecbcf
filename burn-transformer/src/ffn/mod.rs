//! Feed-forward layers: the dense two-layer FFN and the gated SwiGLU / GeGLU.

mod activation;
mod dense;
pub mod moe;
mod swiglu;

pub use activation::Activation;
pub use dense::{DenseFfn, DenseFfnConfig};
pub use moe::{FeedForward, FeedForwardConfig, FeedForwardOutput, Moe, MoeConfig, MoeOutput};
pub use swiglu::{SwiGlu, SwiGluConfig};
