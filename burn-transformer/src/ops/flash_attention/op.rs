//! The fused op as a Burn backend extension, and its implementations:
//! - `CubeBackend` (wgpu, cuda: one type covers every CubeCL runtime) launches the
//!   CubeCL kernels of `cube/`;
//! - `Fusion<CubeBackend>` registers the op as a custom fusion operation that runs the
//!   kernels when the fusion stream executes (generated from the metadata functions
//!   below);
//! - `Flex` runs the tiled CPU flash attention of `cpu_flash.rs` on f32 (the
//!   `[seq_q, seq_k]` scores never exist, forward or backward), the portable version
//!   on half types;
//! - `NdArray` runs the portable version: the reference forward and the flash backward
//!   in tensor ops (`reference.rs`), with the op's memory behaviour under autodiff
//!   (only `O` and `LSE` are saved);
//! - `Autodiff<B, C>` wraps any of them (`autodiff.rs`).

use super::ScoreOptions;
use burn::backend::tensor::FloatTensor;

pub(crate) use extension::FlashAttentionOps;

/// The extension trait lives in its own module only so that the deprecation of
/// Burn's ndarray backend (which the generated dispatch names) can be allowed there.
mod extension {
    #![allow(deprecated)] // ndarray is deprecated upstream; we keep supporting it.

    use super::ScoreOptions;
    #[cfg(feature = "cube")]
    use super::{backward_meta, forward_meta};
    use burn::backend::tensor::FloatTensor;
    use burn::backend::{Backend, backend_extension};

    /// The fused flash-attention op as a backend extension.
    #[backend_extension(
        Cube: cfg(feature = "cube"),
        Flex: cfg(feature = "flex"),
        NdArray: cfg(feature = "ndarray"),
        Autodiff,
        Fusion: cfg(feature = "cube"),
    )]
    pub(crate) trait FlashAttentionOps: Backend {
        /// Forward: returns the output and the per-row log-sum-exp (f32, the sink
        /// included).
        ///
        /// # Shapes
        /// - q: `[batch, heads, seq_q, d_qk]`
        /// - k: `[batch, kv_heads, seq_k, d_qk]`
        /// - v: `[batch, kv_heads, seq_k, d_v]`
        /// - key_mask: `[batch, seq_k]` (`1` = padded) or a `[1, 1]` placeholder, q's dtype
        /// - sinks: `[heads]` sink logits or a `[1]` placeholder, f32
        /// - output: `[batch, heads, seq_q, d_v]`, q's dtype
        /// - lse: `[batch, heads, seq_q]`, f32
        #[fusion(meta = forward_meta)]
        fn flash_attention_forward(
            q: FloatTensor<Self>,
            k: FloatTensor<Self>,
            v: FloatTensor<Self>,
            key_mask: FloatTensor<Self>,
            sinks: FloatTensor<Self>,
            options: ScoreOptions,
        ) -> (FloatTensor<Self>, FloatTensor<Self>);

        /// Backward: the gradients of q, k and v from the saved output and log-sum-exp.
        /// Sinks need nothing here: with the sink inside the log-sum-exp, the
        /// recomputed probabilities and `D = rowsum(dO ∘ O)` are already those of the
        /// call with sinks (the sinks' own gradient is taken in `autodiff.rs`).
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
            options: ScoreOptions,
        ) -> (FloatTensor<Self>, FloatTensor<Self>, FloatTensor<Self>);
    }
}

#[cfg(feature = "cube")]
use burn::backend::fusion::custom::TensorSpec;

/// Output metadata of the forward, for the lazy fusion backend.
#[cfg(feature = "cube")]
fn forward_meta(
    q: &TensorSpec,
    _k: &TensorSpec,
    v: &TensorSpec,
    _key_mask: &TensorSpec,
    _sinks: &TensorSpec,
    _options: &ScoreOptions,
) -> (TensorSpec, TensorSpec) {
    use burn::tensor::{DType, Shape};
    let [batch, heads, seq_q, _] = q.shape.dims::<4>();
    let d_v = v.shape[3];
    (
        TensorSpec::new(Shape::new([batch, heads, seq_q, d_v]), q.dtype),
        TensorSpec::new(Shape::new([batch, heads, seq_q]), DType::F32),
    )
}

/// Output metadata of the backward, for the lazy fusion backend: the gradients are
/// shaped like their inputs.
#[cfg(feature = "cube")]
#[allow(clippy::too_many_arguments)]
fn backward_meta(
    q: &TensorSpec,
    k: &TensorSpec,
    v: &TensorSpec,
    _output: &TensorSpec,
    _lse: &TensorSpec,
    _grad_output: &TensorSpec,
    _key_mask: &TensorSpec,
    _options: &ScoreOptions,
) -> (TensorSpec, TensorSpec, TensorSpec) {
    (q.clone(), k.clone(), v.clone())
}

/// Forward kernel launches (tests check that the CubeCL kernel really ran).
#[cfg(all(test, feature = "cube"))]
pub(crate) static FORWARD_LAUNCHES: std::sync::atomic::AtomicUsize =
    std::sync::atomic::AtomicUsize::new(0);

/// Launches of the staged kernels, forward and backward (tests check that the family
/// they ask for really ran).
#[cfg(all(test, feature = "cube"))]
pub(crate) static STAGED_LAUNCHES: std::sync::atomic::AtomicUsize =
    std::sync::atomic::AtomicUsize::new(0);

/// Launches of the fragment forward.
#[cfg(all(test, feature = "cube"))]
pub(crate) static FRAGMENT_LAUNCHES: std::sync::atomic::AtomicUsize =
    std::sync::atomic::AtomicUsize::new(0);

/// Launches of the fragment forward with its key copies overlapped with its
/// computation.
#[cfg(all(test, feature = "cube"))]
pub(crate) static OVERLAPPED_LAUNCHES: std::sync::atomic::AtomicUsize =
    std::sync::atomic::AtomicUsize::new(0);

/// Launches of the fragment dQ kernel with its key copies overlapped with its
/// computation.
#[cfg(all(test, feature = "cube"))]
pub(crate) static OVERLAPPED_DQ_LAUNCHES: std::sync::atomic::AtomicUsize =
    std::sync::atomic::AtomicUsize::new(0);

/// Launches of the fragment dK/dV kernel with its copies of query rows overlapped
/// with its computation.
#[cfg(all(test, feature = "cube"))]
pub(crate) static OVERLAPPED_DKDV_LAUNCHES: std::sync::atomic::AtomicUsize =
    std::sync::atomic::AtomicUsize::new(0);

/// Launches of the fragment backward (its dQ and dK/dV kernels).
#[cfg(all(test, feature = "cube"))]
pub(crate) static FRAGMENT_BACKWARD_LAUNCHES: std::sync::atomic::AtomicUsize =
    std::sync::atomic::AtomicUsize::new(0);

/// Launches of the one-pass fragment backward (dK/dV kernels that add dQ).
#[cfg(all(test, feature = "cube"))]
pub(crate) static ATOMIC_DQ_LAUNCHES: std::sync::atomic::AtomicUsize =
    std::sync::atomic::AtomicUsize::new(0);

/// Register-tile launches (forward, dQ, dK/dV) whose rows are split over lanes.
#[cfg(all(test, feature = "cube"))]
pub(crate) static SPLIT_ROW_LAUNCHES: std::sync::atomic::AtomicUsize =
    std::sync::atomic::AtomicUsize::new(0);

/// Forward launches that split the keys (flash-decoding).
#[cfg(all(test, feature = "cube"))]
pub(crate) static SPLIT_LAUNCHES: std::sync::atomic::AtomicUsize =
    std::sync::atomic::AtomicUsize::new(0);

/// Implements the op for `$backend` with a forward and a backward function of the
/// trait's arguments (the options by reference).
macro_rules! implement_flash_attention {
    ($backend:ty, $forward:path, $backward:path) => {
        #[allow(deprecated)] // ndarray is deprecated upstream; we keep supporting it.
        impl FlashAttentionOps for $backend {
            fn flash_attention_forward(
                q: FloatTensor<Self>,
                k: FloatTensor<Self>,
                v: FloatTensor<Self>,
                key_mask: FloatTensor<Self>,
                sinks: FloatTensor<Self>,
                options: ScoreOptions,
            ) -> (FloatTensor<Self>, FloatTensor<Self>) {
                $forward(q, k, v, key_mask, sinks, &options)
            }

            fn flash_attention_backward(
                q: FloatTensor<Self>,
                k: FloatTensor<Self>,
                v: FloatTensor<Self>,
                output: FloatTensor<Self>,
                lse: FloatTensor<Self>,
                grad_output: FloatTensor<Self>,
                key_mask: FloatTensor<Self>,
                options: ScoreOptions,
            ) -> (FloatTensor<Self>, FloatTensor<Self>, FloatTensor<Self>) {
                $backward(q, k, v, output, lse, grad_output, key_mask, &options)
            }
        }
    };
}

#[cfg(feature = "cube")]
implement_flash_attention!(
    burn_cubecl::CubeBackend,
    super::cube::dispatch::forward,
    super::cube::dispatch::backward
);

#[cfg(feature = "flex")]
implement_flash_attention!(burn::backend::Flex, flex::forward, flex::backward);

/// The op on flex: the tiled CPU flash attention on the tensors' own memory for f32,
/// the portable version for half types.
#[cfg(feature = "flex")]
mod flex {
    use burn::backend::flex::FlexTensor;
    use burn::backend::{Flex, TensorMetadata};
    use burn::tensor::{DType, Device, TensorData};

    use super::super::cpu_flash::{self, CpuAttention};
    use super::super::{Problem, ScoreOptions};
    use super::portable;
    use crate::device::on_compute_pool;
    use crate::ops::mask::MASKED_ROW_LSE;
    use crate::ops::simd::flex_values;

    /// The kernel's description of a call.
    fn attention(problem: &Problem, options: &ScoreOptions) -> CpuAttention {
        CpuAttention {
            batch: problem.batch,
            heads: problem.heads,
            kv_heads: problem.kv_heads,
            seq_q: problem.seq_q,
            seq_k: problem.seq_k,
            d_qk: problem.d_qk,
            d_v: problem.d_v,
            scale: options.scale as f32,
            softcap: options.softcap.map(|cap| cap as f32),
            alibi: options.alibi,
            mask: problem.mask,
            masked_row_lse: MASKED_ROW_LSE,
        }
    }

    /// The key padding of the op's `key_mask` (`1` = padded), `None` for the placeholder.
    fn key_padding(key_mask: FlexTensor, options: &ScoreOptions) -> Option<Vec<bool>> {
        options.has_key_mask.then(|| {
            let mask = key_mask.to_contiguous();
            flex_values(&mask).iter().map(|&x| x > 0.5).collect()
        })
    }

    /// A dense f32 tensor of `values`.
    fn tensor(values: Vec<f32>, shape: Vec<usize>) -> FlexTensor {
        FlexTensor::from_data(TensorData::new(values, shape))
    }

    /// The forward: `(output, lse)`.
    pub(super) fn forward(
        q: FlexTensor,
        k: FlexTensor,
        v: FlexTensor,
        key_mask: FlexTensor,
        sinks: FlexTensor,
        options: &ScoreOptions,
    ) -> (FlexTensor, FlexTensor) {
        if q.dtype() != DType::F32 {
            return portable::forward::<Flex>(q, k, v, key_mask, sinks, options);
        }
        let (q, k, v) = (q.to_contiguous(), k.to_contiguous(), v.to_contiguous());
        let problem = Problem::from_shapes(&q.shape(), &k.shape(), &v.shape(), options);
        let padding = key_padding(key_mask, options);
        let sinks = options
            .has_sinks
            .then(|| flex_values(&sinks.to_contiguous()).to_vec());
        let (output, lse) = on_compute_pool(&Device::flex(), || {
            cpu_flash::forward(
                &attention(&problem, options),
                flex_values(&q),
                flex_values(&k),
                flex_values(&v),
                padding.as_deref(),
                sinks.as_deref(),
            )
        });
        let rows = vec![problem.batch, problem.heads, problem.seq_q];
        let output_shape = [rows.as_slice(), &[problem.d_v]].concat();
        (tensor(output, output_shape), tensor(lse, rows))
    }

    /// The backward: `(dq, dk, dv)`.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn backward(
        q: FlexTensor,
        k: FlexTensor,
        v: FlexTensor,
        output: FlexTensor,
        lse: FlexTensor,
        grad_output: FlexTensor,
        key_mask: FlexTensor,
        options: &ScoreOptions,
    ) -> (FlexTensor, FlexTensor, FlexTensor) {
        if q.dtype() != DType::F32 {
            return portable::backward::<Flex>(
                q,
                k,
                v,
                output,
                lse,
                grad_output,
                key_mask,
                options,
            );
        }
        let (q, k, v) = (q.to_contiguous(), k.to_contiguous(), v.to_contiguous());
        let (output, grad_output) = (output.to_contiguous(), grad_output.to_contiguous());
        let problem = Problem::from_shapes(&q.shape(), &k.shape(), &v.shape(), options);
        let attention = attention(&problem, options);
        let padding = key_padding(key_mask, options);
        // The backward reads the output only through D = rowsum(dO ∘ O): taking D first
        // releases the output (when the caller held the last reference) before the
        // gradients are allocated, one output-sized buffer less at the peak.
        let delta = on_compute_pool(&Device::flex(), || {
            cpu_flash::backward_deltas(&attention, flex_values(&output), flex_values(&grad_output))
        });
        drop(output);
        let lse = lse.to_contiguous();
        let (dq, dk, dv) = on_compute_pool(&Device::flex(), || {
            cpu_flash::backward(
                &attention,
                flex_values(&q),
                flex_values(&k),
                flex_values(&v),
                &delta,
                flex_values(&lse),
                flex_values(&grad_output),
                padding.as_deref(),
            )
        });
        let shape = |t: &FlexTensor| t.shape().as_slice().to_vec();
        (
            tensor(dq, shape(&q)),
            tensor(dk, shape(&k)),
            tensor(dv, shape(&v)),
        )
    }
}

#[cfg(feature = "ndarray")]
implement_flash_attention!(
    burn::backend::NdArray,
    portable::forward::<burn::backend::NdArray>,
    portable::backward::<burn::backend::NdArray>
);

/// The op on a backend without a kernel: the reference forward with its log-sum-exp
/// and the flash backward from it, in tensor ops on the backend's primitives (wrapped
/// as tensors of its device; no autodiff below this level).
#[cfg(any(feature = "flex", feature = "ndarray"))]
mod portable {
    use burn::backend::tensor::FloatTensor;
    use burn::backend::{Backend, DispatchKindConversion, DispatchTensor};
    use burn::tensor::{BackendPrimitive, Bool, Float, Tensor};

    use super::super::{ScoreOptions, reference};

    /// Wraps a backend primitive as a tensor, and back.
    pub(super) trait Wrap: Backend {
        fn tensor<const D: usize>(primitive: FloatTensor<Self>) -> Tensor<D>;
        fn primitive<const D: usize>(tensor: Tensor<D>) -> FloatTensor<Self>;
    }

    impl<B: Backend> Wrap for B
    where
        Float: BackendPrimitive<B, Primitive = FloatTensor<B>>,
        DispatchTensor: DispatchKindConversion<B>,
    {
        fn tensor<const D: usize>(primitive: FloatTensor<B>) -> Tensor<D> {
            Tensor::from_primitive::<B>(primitive)
        }

        fn primitive<const D: usize>(tensor: Tensor<D>) -> FloatTensor<B> {
            tensor
                .try_into_primitive::<B>()
                .expect("the portable op computes on its own backend")
        }
    }

    /// The key padding of the op's `key_mask` argument (`1` = padded), or `None` for
    /// the placeholder.
    fn key_padding<B: Wrap>(
        key_mask: FloatTensor<B>,
        options: &ScoreOptions,
    ) -> Option<Tensor<2, Bool>> {
        options
            .has_key_mask
            .then(|| B::tensor::<2>(key_mask).greater_elem(0.5))
    }

    /// The forward: `(output, lse)`.
    #[cfg_attr(not(feature = "ndarray"), allow(dead_code))]
    pub(super) fn forward<B: Wrap>(
        q: FloatTensor<B>,
        k: FloatTensor<B>,
        v: FloatTensor<B>,
        key_mask: FloatTensor<B>,
        sinks: FloatTensor<B>,
        options: &ScoreOptions,
    ) -> (FloatTensor<B>, FloatTensor<B>) {
        let padding = key_padding::<B>(key_mask, options);
        let sinks = options.has_sinks.then(|| B::tensor::<1>(sinks));
        let (output, lse) = reference::forward_with_lse(
            B::tensor(q),
            B::tensor(k),
            B::tensor(v),
            padding,
            sinks,
            options,
        );
        (B::primitive(output), B::primitive(lse))
    }

    /// The backward: `(dq, dk, dv)`.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn backward<B: Wrap>(
        q: FloatTensor<B>,
        k: FloatTensor<B>,
        v: FloatTensor<B>,
        output: FloatTensor<B>,
        lse: FloatTensor<B>,
        grad_output: FloatTensor<B>,
        key_mask: FloatTensor<B>,
        options: &ScoreOptions,
    ) -> (FloatTensor<B>, FloatTensor<B>, FloatTensor<B>) {
        let padding = key_padding::<B>(key_mask, options);
        let (dq, dk, dv) = reference::backward_from_lse(
            B::tensor(q),
            B::tensor(k),
            B::tensor(v),
            B::tensor(output),
            B::tensor(lse),
            B::tensor(grad_output),
            padding,
            options,
        );
        (B::primitive(dq), B::primitive(dk), B::primitive(dv))
    }
}
