//! Leaf ops: tensors in, tensors out. Nothing here knows this crate's modules, layers
//! or their options; the attention modules, blocks and models are built on these.
//!
//! - [`mask`]: the masking rule of attention, stated once.
//! - [`alibi`]: ALiBi's linear bias on attention logits by distance.
//! - [`delta_rule`]: the gated delta rule of linear attention, chunk by chunk.
//! - [`flash_attention`]: the fused attention op (CubeCL kernels, a portable version,
//!   the autodiff backward) and the reference attention it is tested against.
//! - [`gated_silu`]: SwiGLU's `silu(gate) · up`, fused into one pass on flex.
//! - [`linear`]: Burn's `Linear` applied as one matrix product over all rows.
//! - [`matmul`]: batched matrix products, written straight into their output on flex.
//! - [`rms_norm`]: RMSNorm, fused into one pass forward and one backward on flex.
//! - [`rotary`]: rotary position embedding's rotation, fused likewise.
//! - [`soft_cap`]: `cap · tanh(x / cap)`, for attention and output logits.
//! - `simd`: the loops the fused CPU ops are written with; `autodiff`: how those that
//!   save their two inputs join the autodiff graph.

pub mod alibi;
pub(crate) mod autodiff;
pub mod delta_rule;
pub mod flash_attention;
pub mod gated_silu;
pub mod linear;
pub mod mask;
pub mod matmul;
pub mod rms_norm;
pub mod rotary;
pub(crate) mod simd;
pub mod soft_cap;
