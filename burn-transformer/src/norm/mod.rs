//! Normalization layers: RMSNorm and LayerNorm.

mod layer;
mod rms;

pub use layer::{LayerNorm, LayerNormConfig};
pub use rms::{RmsNorm, RmsNormConfig};
mod kind;
pub use kind::{Norm, NormConfig};
