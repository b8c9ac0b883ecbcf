//! Feed-forward layers: the dense two-layer FFN and the gated SwiGLU / GeGLU.

mod activation;
mod dense;
mod swiglu;

pub use activation::Activation;
pub use dense::{DenseFfn, DenseFfnConfig};
pub use swiglu::{SwiGlu, SwiGluConfig};
