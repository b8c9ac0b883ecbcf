//! Positions: rotary embedding (with its scaling variants), sinusoidal and learned
//! absolute encodings.

mod learned;
mod rope;
mod rope_scaling;
mod sinusoidal;

pub use learned::{LearnedPosition, LearnedPositionConfig};
pub use rope::{MAX_TABLE_POSITIONS, Rope, RopeConfig, RopeLayout};
pub use rope_scaling::RopeScaling;
pub(crate) use rope_scaling::yarn_get_mscale;
pub use sinusoidal::{SinusoidalLayout, SinusoidalPosition, SinusoidalPositionConfig};
