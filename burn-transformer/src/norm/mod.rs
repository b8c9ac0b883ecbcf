//! Normalization layers: RMSNorm, LayerNorm, and a run-time choice between them.

mod choice;
mod layer;
mod rms;

pub use choice::{Norm, NormConfig};
pub use layer::{LayerNorm, LayerNormConfig};
pub use rms::{RmsNorm, RmsNormConfig};
