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
pub mod device;
pub mod error;
pub mod ffn;
pub mod kernel;
pub mod norm;
pub mod position;

pub use error::ConfigError;

#[cfg(test)]
pub(crate) mod test_utils;
