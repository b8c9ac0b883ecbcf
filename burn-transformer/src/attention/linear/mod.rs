//! Linear attention: token mixers whose decoding state has a fixed size (a matrix per
//! head) instead of a cache that grows by a position per token.

mod gated_delta_net;
mod recurrent_cache;
mod short_conv;

pub use self::gated_delta_net::{GatedDeltaNet, GatedDeltaNetConfig};
pub use self::recurrent_cache::RecurrentCache;
pub use self::short_conv::ShortConv;
