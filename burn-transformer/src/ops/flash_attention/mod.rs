//! Flash attention: `softmax(q·kᵀ·scale + mask)·v` computed one tile of query rows at
//! a time, forward and backward, as a Burn backend extension; and the reference it is
//! tested against.
//!
//! FlashAttention-2 (Dao, 2023) streams key/value blocks with an online softmax, so
//! the `seq_q × seq_k` score matrix never exists. The forward writes the output `O`
//! and the per-row log-sum-exp `LSE` (f32); the backward recomputes the probabilities
//! from `LSE`, so training saves only `q, k, v, O, LSE`.
//!
//! - [`ScoreOptions`] and [`Problem`] describe a call apart from its data
//!   (`problem.rs`); the masking rule is [`crate::ops::mask`].
//! - `op.rs` is the backend-extension trait and its implementations: the CubeCL
//!   kernels of `cube/` on wgpu and CUDA (through Burn's fusion wrapper), the tiled
//!   CPU flash attention of `cpu_flash.rs` on flex (f32), the portable tensor-op
//!   version elsewhere (ndarray, half types on flex); `autodiff.rs` its backward under
//!   autodiff.
//! - [`flash_attention`] and [`flash_attention_with_lse`] call it; [`check_support`]
//!   says whether a device, dtype and problem can take it (`fused.rs`).
//! - `kernel_variants` (CubeCL runtimes) lists every kernel a device compiles for
//!   the op, as CubeCL kernel definitions, for tools that measure them without the
//!   device (`cube/variants.rs`).
//! - `reference.rs` is the reference attention in tensor ops (the oracle, and the path
//!   of every call the fused op does not take), `cpu_softmax.rs` its softmax fused
//!   into one pass on flex.
//!
//! Choosing between the fused op and the reference path is the attention core's job
//! ([`crate::attention::attention`]), made there once.

mod autodiff;
#[cfg(feature = "flex")]
mod cpu_flash;
pub(crate) mod cpu_softmax;
#[cfg(feature = "cube")]
mod cube;
mod fused;
pub(crate) mod op;
mod problem;
pub(crate) mod reference;

#[cfg(feature = "cube")]
pub use cube::{
    AttentionKernel, KernelFamily, KernelVariant, VARIANT_DTYPES, VARIANT_HEAD_DIMS,
    VARIANT_SEQ_LEN, kernel_variants,
};
pub use fused::{check_support, flash_attention, flash_attention_with_lse};
pub use problem::{
    FlashKernel, MATRIX_LOADS_VAR, Problem, ScoreOptions, Unsupported, matrix_loads_enabled,
};

#[cfg(test)]
pub(crate) mod tests;
