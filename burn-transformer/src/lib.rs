#![warn(missing_docs)]
//! # burn-transformer
//!
//! Transformer building blocks for [Burn](https://burn.dev) 0.22 — attention
//! (MHA/GQA/MQA, cross, MLA), positions (RoPE and its scaling variants),
//! norms, feed-forward and MoE layers, blocks and models — plus a fused, tiled
//! flash-attention kernel written in CubeCL, forward and backward, so that one
//! model definition trains on wgpu, CUDA, flex or ndarray.
//!
//! The backend is picked at run time by the [`Device`](burn::tensor::Device):
//! see [`device::parse_device`].

pub mod attention;
pub mod block;
mod builders;
pub mod device;
pub mod error;
pub mod ffn;
pub mod generate;
pub mod hf;
pub mod io;
pub mod lora;
pub mod model;
mod module_path;
pub mod norm;
pub mod ops;
#[cfg(feature = "plot")]
pub mod plot;
pub mod position;
#[cfg(feature = "train")]
pub mod train;

pub use error::ConfigError;

#[cfg(test)]
pub(crate) mod test_utils;

/// Every page of `docs/` and the README, compiled as doctests so that every Rust block
/// in the documentation builds and runs (`cargo test --doc`; blocks marked `text` or
/// `sh` are not Rust). Not part of the API.
#[cfg(doctest)]
mod book {
    #[doc = include_str!("../../README.md")]
    mod readme {}
    #[doc = include_str!("../../docs/README.md")]
    mod contents {}
    #[doc = include_str!("../../docs/architecture.md")]
    mod architecture {}
    #[doc = include_str!("../../docs/attention.md")]
    mod attention {}
    #[doc = include_str!("../../docs/positions.md")]
    mod positions {}
    #[doc = include_str!("../../docs/norms-and-blocks.md")]
    mod norms_and_blocks {}
    #[doc = include_str!("../../docs/feed-forward.md")]
    mod feed_forward {}
    #[doc = include_str!("../../docs/flash-attention.md")]
    mod flash_attention {}
    #[doc = include_str!("../../docs/latent-attention.md")]
    mod latent_attention {}
    #[doc = include_str!("../../docs/mixture-of-experts.md")]
    mod mixture_of_experts {}
    #[doc = include_str!("../../docs/decoding.md")]
    mod decoding {}
    #[doc = include_str!("../../docs/models.md")]
    mod models {}
    #[doc = include_str!("../../docs/training.md")]
    mod training {}
    #[doc = include_str!("../../docs/fine-tuning.md")]
    mod fine_tuning {}
    #[doc = include_str!("../../docs/benchmarks.md")]
    mod benchmarks {}
}
