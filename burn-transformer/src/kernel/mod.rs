//! The fused flash-attention op: forward and backward, as a Burn backend extension.
//!
//! FlashAttention-2 (Dao, 2023) computes `softmax(q·kᵀ·scale + mask)·v` one tile of
//! query rows at a time, streaming key/value blocks through shared memory with an
//! online softmax, so the `seq_q × seq_k` score matrix never exists. The forward
//! writes the output `O` and the per-row log-sum-exp `LSE` (f32); the backward
//! recomputes the probabilities from `LSE`, so training saves only `q, k, v, O, LSE`.
//!
//! # Backends
//! The op is the backend-extension trait [`FlashAttentionOps`]:
//! - `CubeBackend` (wgpu, cuda: one type covers every CubeCL runtime) launches the
//!   CubeCL kernels of `kernel.rs` (launch code in `forward.rs` / `backward.rs`);
//! - `Fusion<CubeBackend>` registers the op as a custom fusion operation that runs the
//!   kernels when the fusion stream executes;
//! - `Flex` and `NdArray` run `reference.rs`, the same math written with primitive
//!   tensor ops (it materializes scores, but still saves only `O` and `LSE`);
//! - `Autodiff<B, C>` wraps any of them: its backward calls the fused backward.
//!
//! # Choosing the path
//! The attention core ([`crate::attention::attention`]) calls [`try_flash_attention`]
//! on CubeCL devices (and everywhere with [`AttentionImpl::Fused`]). Any call the
//! kernel cannot take returns an [`Unsupported`] reason and the core falls back to the
//! reference path with a log message. [`AttentionImpl::Reference`], or the environment
//! variable `BURN_TRANSFORMER_ATTENTION=reference`, forces the reference path.
//!
//! [`AttentionImpl::Fused`]: crate::attention::AttentionImpl::Fused
//! [`AttentionImpl::Reference`]: crate::attention::AttentionImpl::Reference

mod backward;
#[cfg(feature = "cube")]
mod forward;
#[cfg(feature = "cube")]
mod kernel;
mod reference;

use burn::backend::tensor::FloatTensor;
use burn::backend::{Dispatch, DispatchDevice};
use burn::tensor::{DType, Device, Shape, Tensor};
use thiserror::Error;

use crate::attention::AttentionOptions;

#[cfg(feature = "cube")]
pub use forward::{KernelTile, Tiling, is_cpu_device, plan_tiling};

/// Log-sum-exp written for a query row that sees no key at all.
///
/// Large and finite: `exp(s - LSE)` is exactly 0 for every finite score, so the
/// backward gives zero gradients for such rows instead of NaN.
pub const MASKED_ROW_LSE: f32 = 1.0e30;

/// The shape of one attention call, apart from its data.
///
/// Query head `h` reads key/value head `h / (heads / kv_heads)`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Problem {
    /// Batch size.
    pub batch: usize,
    /// Number of query heads.
    pub heads: usize,
    /// Number of key/value heads; divides `heads`.
    pub kv_heads: usize,
    /// Query sequence length.
    pub seq_q: usize,
    /// Key/value sequence length.
    pub seq_k: usize,
    /// Query/key head dimension.
    pub d_qk: usize,
    /// Value head dimension.
    pub d_v: usize,
    /// Causal masking (bottom-right aligned).
    pub causal: bool,
    /// Sliding window size.
    pub window: Option<usize>,
    /// Whether a `[batch, seq_k]` key padding mask is given.
    pub has_key_mask: bool,
}

impl Problem {
    /// Reads the problem from the tensor shapes and options of one call.
    ///
    /// # Shapes
    /// - q: `[batch, heads, seq_q, d_qk]`
    /// - k: `[batch, kv_heads, seq_k, d_qk]`
    /// - v: `[batch, kv_heads, seq_k, d_v]`
    pub fn from_shapes(q: &Shape, k: &Shape, v: &Shape, options: &FlashOptions) -> Self {
        Self {
            batch: q[0],
            heads: q[1],
            kv_heads: k[1],
            seq_q: q[2],
            seq_k: k[2],
            d_qk: q[3],
            d_v: v[3],
            causal: options.causal,
            window: options.window,
            has_key_mask: options.has_key_mask,
        }
    }

    /// Query heads per key/value head.
    pub fn group(&self) -> usize {
        self.heads / self.kv_heads
    }

    /// Whether key `key` is hidden from query row `row` by the causal/window structure.
    ///
    /// The same rule as [`crate::attention::is_hidden`] (tested equal): queries are
    /// aligned bottom-right, at absolute position `row + seq_k - seq_q`.
    pub fn is_hidden(&self, row: usize, key: usize) -> bool {
        let position = row as i64 + self.seq_k as i64 - self.seq_q as i64;
        let key = key as i64;
        if self.causal && key > position {
            return true;
        }
        match self.window {
            Some(window) => {
                let window = window as i64;
                position - key >= window || (!self.causal && key - position >= window)
            }
            None => false,
        }
    }

    /// Row-major `[seq_q, seq_k]` hidden flags, or `None` without causal or window.
    pub fn structural_mask(&self) -> Option<Vec<bool>> {
        if !self.causal && self.window.is_none() {
            return None;
        }
        let mut hidden = Vec::with_capacity(self.seq_q * self.seq_k);
        for row in 0..self.seq_q {
            for key in 0..self.seq_k {
                hidden.push(self.is_hidden(row, key));
            }
        }
        Some(hidden)
    }
}

/// The non-tensor arguments of the fused op.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct FlashOptions {
    /// Multiplies `q·kᵀ` before the softmax.
    pub scale: f64,
    /// Causal masking (bottom-right aligned).
    pub causal: bool,
    /// Sliding window (see [`crate::attention`] for its meaning with and without causal).
    pub window: Option<usize>,
    /// Logit soft-capping `c·tanh(s/c)`, applied after the scale and before masking.
    pub softcap: Option<f64>,
    /// Whether the `key_mask` argument is a real `[batch, seq_k]` padding mask
    /// (`1` = padded). Without one the op receives a `[1, 1]` placeholder.
    pub has_key_mask: bool,
}

/// Why the fused op does not take a call. The attention core then uses the
/// reference path (and logs this reason); it never returns wrong numbers.
#[derive(Clone, Debug, PartialEq, Eq, Error)]
pub enum Unsupported {
    /// Not one of the float types the kernel reads (f32, f16, bf16).
    #[error("dtype {0:?} is not f32, f16 or bf16")]
    DType(DType),
    /// The device cannot compute in this float type (bf16 on most wgpu adapters).
    #[error("the device has no arithmetic in {0:?}")]
    DeviceDType(DType),
    /// An empty dimension: nothing to launch.
    #[error("empty problem (a dimension is 0): {0:?}")]
    Empty(Problem),
    /// Head dimensions beyond what the kernels take.
    #[error("head dims d_qk={d_qk} + d_v={d_v} exceed {max}")]
    HeadDim {
        /// Query/key head dimension.
        d_qk: usize,
        /// Value head dimension.
        d_v: usize,
        /// Largest `d_qk + d_v` supported.
        max: usize,
    },
    /// More cubes than the device can launch in one dimension.
    #[error("grid of {cubes} cubes exceeds the device limit {limit}")]
    Grid {
        /// Cubes needed.
        cubes: usize,
        /// Device limit.
        limit: usize,
    },
    /// The device's backend has no implementation of the op.
    #[error("no fused attention for backend {0}")]
    Backend(&'static str),
    /// A feature of the call the kernel does not implement.
    #[error("{0}")]
    Feature(&'static str),
}

pub use ops::FlashAttentionOps;

/// The extension trait lives in its own module only so that the deprecation of
/// Burn's ndarray backend (which the generated dispatch names) can be allowed there.
mod ops {
    #![allow(deprecated)] // ndarray is deprecated upstream; we keep supporting it.

    use super::FlashOptions;
    #[cfg(feature = "cube")]
    use super::{backward_meta, forward_meta};
    use burn::backend::tensor::FloatTensor;
    use burn::backend::{Backend, backend_extension};

    /// The fused flash-attention op as a backend extension.
    ///
    /// Implemented for `CubeBackend` (CubeCL kernels), `Fusion<CubeBackend>`, `Flex` and
    /// `NdArray` (the portable implementation of `reference.rs`), and `Autodiff<B, C>`
    /// over any of them.
    #[backend_extension(
        Cube: cfg(feature = "cube"),
        Flex: cfg(feature = "flex"),
        NdArray: cfg(feature = "ndarray"),
        Autodiff,
        Fusion: cfg(feature = "cube"),
    )]
    pub trait FlashAttentionOps: Backend {
        /// Forward: returns the output and the per-row log-sum-exp (f32).
        ///
        /// # Shapes
        /// - q: `[batch, heads, seq_q, d_qk]`
        /// - k: `[batch, kv_heads, seq_k, d_qk]`
        /// - v: `[batch, kv_heads, seq_k, d_v]`
        /// - key_mask: `[batch, seq_k]` (`1` = padded) or a `[1, 1]` placeholder, q's dtype
        /// - output: `[batch, heads, seq_q, d_v]`, q's dtype
        /// - lse: `[batch, heads, seq_q]`, f32
        #[fusion(meta = forward_meta)]
        fn flash_attention_forward(
            q: FloatTensor<Self>,
            k: FloatTensor<Self>,
            v: FloatTensor<Self>,
            key_mask: FloatTensor<Self>,
            options: FlashOptions,
        ) -> (FloatTensor<Self>, FloatTensor<Self>);

        /// Backward: the gradients of q, k and v from the saved output and log-sum-exp.
        ///
        /// # Shapes
        /// As the forward; `output` and `grad_output` are `[batch, heads, seq_q, d_v]`,
        /// `lse` is `[batch, heads, seq_q]` f32. Returns `(dq, dk, dv)` shaped like
        /// `(q, k, v)`.
        #[allow(clippy::too_many_arguments)]
        #[fusion(meta = backward_meta)]
        fn flash_attention_backward(
            q: FloatTensor<Self>,
            k: FloatTensor<Self>,
            v: FloatTensor<Self>,
            output: FloatTensor<Self>,
            lse: FloatTensor<Self>,
            grad_output: FloatTensor<Self>,
            key_mask: FloatTensor<Self>,
            options: FlashOptions,
        ) -> (FloatTensor<Self>, FloatTensor<Self>, FloatTensor<Self>);
    }
}

/// Output metadata of the forward, for the lazy fusion backend.
#[cfg(feature = "cube")]
fn forward_meta(
    q: &burn::backend::fusion::custom::TensorSpec,
    k: &burn::backend::fusion::custom::TensorSpec,
    v: &burn::backend::fusion::custom::TensorSpec,
    _key_mask: &burn::backend::fusion::custom::TensorSpec,
    _options: &FlashOptions,
) -> (
    burn::backend::fusion::custom::TensorSpec,
    burn::backend::fusion::custom::TensorSpec,
) {
    use burn::backend::fusion::custom::TensorSpec;
    let [batch, heads, seq_q, _] = q.shape.dims::<4>();
    let _ = k;
    let d_v = v.shape[3];
    (
        TensorSpec::new(Shape::new([batch, heads, seq_q, d_v]), q.dtype),
        TensorSpec::new(Shape::new([batch, heads, seq_q]), DType::F32),
    )
}

/// Output metadata of the backward, for the lazy fusion backend.
#[cfg(feature = "cube")]
#[allow(clippy::too_many_arguments)]
fn backward_meta(
    q: &burn::backend::fusion::custom::TensorSpec,
    k: &burn::backend::fusion::custom::TensorSpec,
    v: &burn::backend::fusion::custom::TensorSpec,
    _output: &burn::backend::fusion::custom::TensorSpec,
    _lse: &burn::backend::fusion::custom::TensorSpec,
    _grad_output: &burn::backend::fusion::custom::TensorSpec,
    _key_mask: &burn::backend::fusion::custom::TensorSpec,
    _options: &FlashOptions,
) -> (
    burn::backend::fusion::custom::TensorSpec,
    burn::backend::fusion::custom::TensorSpec,
    burn::backend::fusion::custom::TensorSpec,
) {
    (q.clone(), k.clone(), v.clone())
}

#[cfg(feature = "cube")]
impl FlashAttentionOps for burn_cubecl::CubeBackend {
    fn flash_attention_forward(
        q: FloatTensor<Self>,
        k: FloatTensor<Self>,
        v: FloatTensor<Self>,
        key_mask: FloatTensor<Self>,
        options: FlashOptions,
    ) -> (FloatTensor<Self>, FloatTensor<Self>) {
        #[cfg(test)]
        FORWARD_LAUNCHES.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        forward::forward(q, k, v, key_mask, &options)
    }

    fn flash_attention_backward(
        q: FloatTensor<Self>,
        k: FloatTensor<Self>,
        v: FloatTensor<Self>,
        output: FloatTensor<Self>,
        lse: FloatTensor<Self>,
        grad_output: FloatTensor<Self>,
        key_mask: FloatTensor<Self>,
        options: FlashOptions,
    ) -> (FloatTensor<Self>, FloatTensor<Self>, FloatTensor<Self>) {
        backward::backward(q, k, v, output, lse, grad_output, key_mask, &options)
    }
}

#[cfg(feature = "flex")]
impl FlashAttentionOps for burn::backend::Flex {
    fn flash_attention_forward(
        q: FloatTensor<Self>,
        k: FloatTensor<Self>,
        v: FloatTensor<Self>,
        key_mask: FloatTensor<Self>,
        options: FlashOptions,
    ) -> (FloatTensor<Self>, FloatTensor<Self>) {
        reference::forward::<Self>(q, k, v, key_mask, &options)
    }

    fn flash_attention_backward(
        q: FloatTensor<Self>,
        k: FloatTensor<Self>,
        v: FloatTensor<Self>,
        output: FloatTensor<Self>,
        lse: FloatTensor<Self>,
        grad_output: FloatTensor<Self>,
        key_mask: FloatTensor<Self>,
        options: FlashOptions,
    ) -> (FloatTensor<Self>, FloatTensor<Self>, FloatTensor<Self>) {
        reference::backward::<Self>(q, k, v, output, lse, grad_output, key_mask, &options)
    }
}

#[cfg(feature = "ndarray")]
#[allow(deprecated)] // ndarray is deprecated upstream; we keep supporting it.
impl FlashAttentionOps for burn::backend::NdArray {
    fn flash_attention_forward(
        q: FloatTensor<Self>,
        k: FloatTensor<Self>,
        v: FloatTensor<Self>,
        key_mask: FloatTensor<Self>,
        options: FlashOptions,
    ) -> (FloatTensor<Self>, FloatTensor<Self>) {
        reference::forward::<Self>(q, k, v, key_mask, &options)
    }

    fn flash_attention_backward(
        q: FloatTensor<Self>,
        k: FloatTensor<Self>,
        v: FloatTensor<Self>,
        output: FloatTensor<Self>,
        lse: FloatTensor<Self>,
        grad_output: FloatTensor<Self>,
        key_mask: FloatTensor<Self>,
        options: FlashOptions,
    ) -> (FloatTensor<Self>, FloatTensor<Self>, FloatTensor<Self>) {
        reference::backward::<Self>(q, k, v, output, lse, grad_output, key_mask, &options)
    }
}

/// Forward kernel launches (tests check that the CubeCL kernel really ran).
#[cfg(all(test, feature = "cube"))]
pub(crate) static FORWARD_LAUNCHES: std::sync::atomic::AtomicUsize =
    std::sync::atomic::AtomicUsize::new(0);

/// Checks that the device and dtype can run the fused op for `problem`.
///
/// # Errors
/// The first reason the op cannot take the call.
pub fn check_support(device: &Device, dtype: DType, problem: &Problem) -> Result<(), Unsupported> {
    if !matches!(dtype, DType::F32 | DType::F16 | DType::BF16) {
        return Err(Unsupported::DType(dtype));
    }
    let dims = [
        problem.batch,
        problem.heads,
        problem.kv_heads,
        problem.seq_q,
        problem.seq_k,
        problem.d_qk,
        problem.d_v,
    ];
    if dims.contains(&0) {
        return Err(Unsupported::Empty(*problem));
    }
    let inner = device.clone().inner();
    match inner.as_dispatch() {
        #[cfg(feature = "cube")]
        DispatchDevice::Cube(cube) => forward::check_cube(cube, dtype, problem),
        #[cfg(feature = "flex")]
        DispatchDevice::Flex(_) => Ok(()),
        #[cfg(feature = "ndarray")]
        DispatchDevice::NdArray(_) => Ok(()),
        #[allow(unreachable_patterns)]
        _ => Err(Unsupported::Backend(crate::device::backend_name(device))),
    }
}

/// The fused attention, returning the output and the per-row log-sum-exp.
///
/// Differentiable on autodiff devices (the backward is the fused backward).
/// Dropout is not supported here (the attention core handles it).
///
/// # Shapes
/// - q: `[batch, heads, seq_q, d_qk]`
/// - k: `[batch, kv_heads, seq_k, d_qk]`
/// - v: `[batch, kv_heads, seq_k, d_v]`
/// - output: `[batch, heads, seq_q, d_v]`
/// - lse: `[batch, heads, seq_q]` (f32; [`MASKED_ROW_LSE`] for rows that see no key)
///
/// # Errors
/// [`Unsupported`] when the device, dtype or shapes are not supported by the op.
///
/// # Panics
/// On inconsistent shapes (as [`crate::attention::attention`]).
pub fn flash_attention_with_lse(
    q: Tensor<4>,
    k: Tensor<4>,
    v: Tensor<4>,
    options: &AttentionOptions,
) -> Result<(Tensor<4>, Tensor<3>), Unsupported> {
    let [batch, heads, _, d_qk] = q.dims();
    let [k_batch, kv_heads, seq_k, k_dim] = k.dims();
    let [v_batch, v_heads, v_seq, _] = v.dims();
    assert!(
        k_batch == batch && v_batch == batch && k_dim == d_qk,
        "flash attention: q {:?}, k {:?} disagree",
        q.dims(),
        k.dims()
    );
    assert!(
        v_heads == kv_heads && v_seq == seq_k && kv_heads > 0 && heads % kv_heads == 0,
        "flash attention: k {:?}, v {:?} disagree or {heads} heads cannot share {kv_heads}",
        k.dims(),
        v.dims()
    );
    let flash = FlashOptions {
        scale: options.scale_for(d_qk),
        causal: options.causal,
        window: options.window,
        softcap: options.softcap,
        has_key_mask: options.key_padding.is_some(),
    };
    let problem = Problem::from_shapes(&q.shape(), &k.shape(), &v.shape(), &flash);
    if let Some(window) = options.window {
        assert!(window > 0, "attention: a sliding window must be at least 1");
    }
    let dtype = q.dtype();
    check_support(&q.device(), dtype, &problem)?;
    if k.dtype() != dtype || v.dtype() != dtype {
        return Err(Unsupported::Feature("q, k and v have different dtypes"));
    }

    let device = q.device();
    let key_mask = match &options.key_padding {
        Some(padding) => {
            assert_eq!(
                padding.dims(),
                [batch, seq_k],
                "attention: key padding must be [batch, seq_k]"
            );
            padding.clone().float().cast(dtype)
        }
        // The op takes tensors only; a [1, 1] placeholder stands for "no mask".
        None => Tensor::<2>::zeros([1, 1], &device).cast(dtype),
    };
    let (output, lse) = Dispatch::flash_attention_forward(
        q.into_dispatch(),
        k.into_dispatch(),
        v.into_dispatch(),
        key_mask.into_dispatch(),
        flash,
    );
    Ok((Tensor::from_dispatch(output), Tensor::from_dispatch(lse)))
}

/// The fused attention output; see [`flash_attention_with_lse`].
///
/// # Errors
/// [`Unsupported`] when the device, dtype or shapes are not supported by the op.
pub fn flash_attention(
    q: Tensor<4>,
    k: Tensor<4>,
    v: Tensor<4>,
    options: &AttentionOptions,
) -> Result<Tensor<4>, Unsupported> {
    flash_attention_with_lse(q, k, v, options).map(|(output, _)| output)
}

/// Runs the fused op for the attention core, or says why it cannot take this call.
pub(crate) fn try_flash_attention(
    q: Tensor<4>,
    k: Tensor<4>,
    v: Tensor<4>,
    options: &AttentionOptions,
) -> Result<Tensor<4>, Unsupported> {
    if options.dropout > 0.0 && q.device().is_autodiff() {
        return Err(Unsupported::Feature("dropout on attention probabilities"));
    }
    flash_attention(q, k, v, options)
}

#[cfg(test)]
mod tests;
