//! Normalization layers: RMSNorm, LayerNorm, a run-time choice between them, and a
//! norm with weights of its own per head.

mod choice;
mod layer;
mod per_head;
mod rms;

pub use choice::{Norm, NormConfig};
pub use layer::{LayerNorm, LayerNormConfig};
pub use per_head::{PerHeadNorm, PerHeadNormConfig};
pub use rms::{RmsNorm, RmsNormConfig};
