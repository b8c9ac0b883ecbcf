//! Positions: rotary embedding (with its scaling variants), sinusoidal and learned
//! absolute encodings.

mod rope;
mod rope_scaling;

pub use rope::{MAX_TABLE_POSITIONS, Rope, RopeConfig, RopeLayout};
pub use rope_scaling::RopeScaling;
