//! Calling the fused op: what it supports, and its public entry points.

use burn::backend::{Dispatch, DispatchDevice};
use burn::tensor::{Bool, DType, Device, Tensor};

use super::op::FlashAttentionOps;
use super::{Problem, ScoreOptions, Unsupported};

/// Checks that the device and dtype can run the fused op for `problem`.
///
/// # Errors
/// The first reason the op cannot take the call.
pub fn check_support(device: &Device, dtype: DType, problem: &Problem) -> Result<(), Unsupported> {
    if !matches!(dtype, DType::F32 | DType::F16 | DType::BF16) {
        return Err(Unsupported::DType(dtype));
    }
    if problem.is_empty() {
        return Err(Unsupported::Empty(*problem));
    }
    let inner = device.clone().inner();
    match inner.as_dispatch() {
        #[cfg(feature = "cube")]
        DispatchDevice::Cube(cube) => super::cube::tiling::check_cube(cube, dtype, problem),
        #[cfg(feature = "flex")]
        DispatchDevice::Flex(_) => Ok(()),
        #[cfg(feature = "ndarray")]
        DispatchDevice::NdArray(_) => Ok(()),
        #[allow(unreachable_patterns)]
        _ => Err(Unsupported::Backend(crate::device::backend_name(device))),
    }
}

/// The fused attention, returning the output and the per-row log-sum-exp: the CubeCL
/// kernels on wgpu and CUDA, the portable tensor-op version on flex and ndarray.
///
/// Differentiable on autodiff devices (the sinks too): the backward is the fused
/// backward, and only `q, k, v`, the sinks, the output and the log-sum-exp are kept
/// for it.
///
/// # Shapes
/// - q: `[batch, heads, seq_q, d_qk]`
/// - k: `[batch, kv_heads, seq_k, d_qk]`
/// - v: `[batch, kv_heads, seq_k, d_v]`
/// - key_padding: `[batch, seq_k]`, `true` for padded keys
/// - sinks: `[heads]`, a learned sink logit per query head (gpt-oss): it joins every
///   row's softmax normalization and takes no value
/// - output: `[batch, heads, seq_q, d_v]`
/// - lse: `[batch, heads, seq_q]` (f32; the sink included;
///   [`MASKED_ROW_LSE`](crate::ops::mask::MASKED_ROW_LSE) for rows that see no key and
///   have no sink)
///
/// # Errors
/// [`Unsupported`] when the device, dtype or shapes are not supported by the op.
///
/// # Panics
/// On inconsistent shapes (see [`Problem::of_call`]).
pub fn flash_attention_with_lse(
    q: Tensor<4>,
    k: Tensor<4>,
    v: Tensor<4>,
    key_padding: Option<Tensor<2, Bool>>,
    sinks: Option<Tensor<1>>,
    options: &ScoreOptions,
) -> Result<(Tensor<4>, Tensor<3>), Unsupported> {
    let problem = Problem::of_call(&q, &k, &v, key_padding.as_ref(), options);
    if let Some(sinks) = &sinks {
        assert_eq!(
            sinks.dims(),
            [problem.heads],
            "attention: sinks must be [heads]"
        );
    }
    let dtype = q.dtype();
    check_support(&q.device(), dtype, &problem)?;
    if k.dtype() != dtype || v.dtype() != dtype {
        return Err(Unsupported::Feature("q, k and v have different dtypes"));
    }
    let options = options
        .with_key_mask(key_padding.is_some())
        .with_sinks(sinks.is_some());
    let device = q.device();
    let key_mask = match key_padding {
        Some(padding) => padding.float().cast(dtype),
        // The op takes tensors only: a [1, 1] placeholder stands for "no mask".
        None => Tensor::<2>::zeros([1, 1], &device).cast(dtype),
    };
    // Sinks are read in f32 whatever the parameters' type (the cast is differentiated).
    let sinks = match sinks {
        Some(sinks) => sinks.cast(DType::F32),
        None => Tensor::<1>::zeros([1], &device).cast(DType::F32),
    };
    let (output, lse) = Dispatch::flash_attention_forward(
        q.into_dispatch(),
        k.into_dispatch(),
        v.into_dispatch(),
        key_mask.into_dispatch(),
        sinks.into_dispatch(),
        options,
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
    key_padding: Option<Tensor<2, Bool>>,
    sinks: Option<Tensor<1>>,
    options: &ScoreOptions,
) -> Result<Tensor<4>, Unsupported> {
    flash_attention_with_lse(q, k, v, key_padding, sinks, options).map(|(output, _)| output)
}
