//! Attention: the one core function, and the modules built on it.

mod core;

pub use self::core::{
    AttentionImpl, AttentionOptions, attention, is_hidden, padding_mask_from_lengths,
    reference_attention, structural_mask,
};
