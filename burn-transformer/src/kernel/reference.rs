//! The portable implementation of the fused op, in primitive tensor ops generic over
//! any backend (flex, ndarray, and whatever else implements `Backend`).
//!
//! It computes exactly what the CubeCL kernels compute (output and log-sum-exp in
//! the forward; gradients recomputed from the log-sum-exp in the backward), in f32
//! whatever the input dtype. It materializes the `seq_q × seq_k` scores inside each
//! call, but the autodiff graph keeps only `q, k, v, O, LSE` between forward and
//! backward, as the kernel does.

use burn::backend::tensor::{BoolTensor, FloatTensor};
use burn::backend::{Backend, TensorMetadata, get_or_init_device_settings};
use burn::tensor::{DType, FloatDType, Shape, TensorData};

use super::{FlashOptions, MASKED_ROW_LSE, Problem};

/// Casts to f32 unless the tensor already is.
fn to_f32<B: Backend>(tensor: FloatTensor<B>) -> FloatTensor<B> {
    match tensor.dtype() {
        DType::F32 => tensor,
        _ => B::float_cast(tensor, FloatDType::F32),
    }
}

/// Casts an f32 result back to the input dtype.
fn to_dtype<B: Backend>(tensor: FloatTensor<B>, dtype: DType) -> FloatTensor<B> {
    match dtype {
        DType::F32 => tensor,
        other => B::float_cast(tensor, other.into()),
    }
}

/// The hidden entries (`true` = masked) of the grouped score tensor
/// `[batch, kv_heads, group, seq_q, seq_k]`, or `None` when nothing is masked.
fn hidden_mask<B: Backend>(
    problem: &Problem,
    key_mask: FloatTensor<B>,
    device: &B::Device,
) -> Option<BoolTensor<B>> {
    let Problem {
        batch,
        kv_heads,
        seq_q,
        seq_k,
        ..
    } = *problem;
    let shape = Shape::new([batch, kv_heads, problem.group(), seq_q, seq_k]);
    let bool_dtype = get_or_init_device_settings::<B>(device).bool_dtype;
    let structural = problem.structural_mask().map(|hidden| {
        let mask = B::bool_from_data(TensorData::new(hidden, [1, 1, 1, seq_q, seq_k]), device);
        B::bool_expand(mask, shape.clone())
    });
    let padding = problem.has_key_mask.then(|| {
        let padded = B::float_greater_elem(key_mask, 0.5.into(), bool_dtype);
        let padded = B::bool_reshape(padded, Shape::new([batch, 1, 1, 1, seq_k]));
        B::bool_expand(padded, shape.clone())
    });
    match (structural, padding) {
        (Some(a), Some(b)) => Some(B::bool_or(a, b)),
        (a, b) => a.or(b),
    }
}

/// Scores after scale, softcap and masking (`-inf` where hidden), in f32, grouped as
/// `[batch, kv_heads, group, seq_q, seq_k]`; also the softcapped scores before
/// masking when a softcap is set (its derivative needs them).
fn scores<B: Backend>(
    problem: &Problem,
    q: FloatTensor<B>,
    k: FloatTensor<B>,
    key_mask: FloatTensor<B>,
    options: &FlashOptions,
) -> (FloatTensor<B>, Option<FloatTensor<B>>) {
    let Problem {
        batch,
        kv_heads,
        seq_q,
        seq_k,
        d_qk,
        ..
    } = *problem;
    let group = problem.group();
    let device = q.device();
    // Query heads of one group are contiguous: grouping them makes GQA one batched
    // matmul against the shared key head.
    let q = B::float_reshape(q, Shape::new([batch, kv_heads, group * seq_q, d_qk]));
    let scores = B::float_matmul(q, B::float_swap_dims(k, 2, 3)); // [batch, kv_heads, group*seq_q, seq_k]
    let scores = B::float_mul_scalar(scores, options.scale.into());
    let (scores, capped) = match options.softcap {
        Some(cap) => {
            let capped = B::float_mul_scalar(
                B::float_tanh(B::float_div_scalar(scores, cap.into())),
                cap.into(),
            );
            (capped.clone(), Some(capped))
        }
        None => (scores, None),
    };
    let scores = B::float_reshape(scores, Shape::new([batch, kv_heads, group, seq_q, seq_k]));
    let scores = match hidden_mask::<B>(problem, key_mask, &device) {
        Some(hidden) => B::float_mask_fill(scores, hidden, f32::NEG_INFINITY.into()),
        None => scores,
    };
    (scores, capped)
}

/// Forward: `(output, lse)`; see [`super::FlashAttentionOps::flash_attention_forward`].
pub fn forward<B: Backend>(
    q: FloatTensor<B>,
    k: FloatTensor<B>,
    v: FloatTensor<B>,
    key_mask: FloatTensor<B>,
    options: &FlashOptions,
) -> (FloatTensor<B>, FloatTensor<B>) {
    let problem = Problem::from_shapes(&q.shape(), &k.shape(), &v.shape(), options);
    let Problem {
        batch,
        heads,
        kv_heads,
        seq_q,
        seq_k,
        d_v,
        ..
    } = problem;
    let group = problem.group();
    let dtype = q.dtype();
    let (scores, _) = scores::<B>(&problem, to_f32::<B>(q), to_f32::<B>(k), key_mask, options);

    // The max is clamped to a finite value so fully-masked rows (all -inf) give
    // exp(-inf) = 0 rather than NaN.
    let max = B::float_clamp_min(B::float_max_dim(scores.clone(), 4), f32::MIN.into()); // [.., seq_q, 1]
    let numerator = B::float_exp(B::float_sub(scores, max.clone()));
    let sum = B::float_sum_dim(numerator.clone(), 4); // [.., seq_q, 1]
    let bool_dtype = get_or_init_device_settings::<B>(&sum.device()).bool_dtype;
    let empty = B::float_lower_equal_elem(sum.clone(), 0.0.into(), bool_dtype);
    let lse = B::float_add(
        max,
        B::float_log(B::float_clamp_min(sum.clone(), 1e-30.into())),
    );
    let lse = B::float_mask_fill(lse, empty, MASKED_ROW_LSE.into());
    let probs = B::float_div(numerator, B::float_clamp_min(sum, 1e-30.into()));

    let probs = B::float_reshape(probs, Shape::new([batch, kv_heads, group * seq_q, seq_k]));
    let output = B::float_matmul(probs, to_f32::<B>(v)); // [batch, kv_heads, group*seq_q, d_v]
    let output = B::float_reshape(output, Shape::new([batch, heads, seq_q, d_v]));
    let lse = B::float_reshape(lse, Shape::new([batch, heads, seq_q]));
    (to_dtype::<B>(output, dtype), lse)
}

/// Backward: `(dq, dk, dv)`; see [`super::FlashAttentionOps::flash_attention_backward`].
#[allow(clippy::too_many_arguments)]
pub fn backward<B: Backend>(
    q: FloatTensor<B>,
    k: FloatTensor<B>,
    v: FloatTensor<B>,
    output: FloatTensor<B>,
    lse: FloatTensor<B>,
    grad_output: FloatTensor<B>,
    key_mask: FloatTensor<B>,
    options: &FlashOptions,
) -> (FloatTensor<B>, FloatTensor<B>, FloatTensor<B>) {
    let problem = Problem::from_shapes(&q.shape(), &k.shape(), &v.shape(), options);
    let Problem {
        batch,
        heads,
        kv_heads,
        seq_q,
        seq_k,
        d_qk,
        d_v,
        ..
    } = problem;
    let group = problem.group();
    let dtype = q.dtype();
    let q = to_f32::<B>(q);
    let k = to_f32::<B>(k);
    let v = to_f32::<B>(v);
    let (scores, capped) = scores::<B>(&problem, q.clone(), k.clone(), key_mask, options);

    // P = exp(S - LSE): hidden entries are -inf and give 0; rows that see no key
    // have LSE = MASKED_ROW_LSE and give 0 too.
    let lse = B::float_reshape(
        to_f32::<B>(lse),
        Shape::new([batch, kv_heads, group, seq_q, 1]),
    );
    let probs = B::float_exp(B::float_sub(scores, lse));
    let rows = Shape::new([batch, kv_heads, group * seq_q, seq_k]);
    let probs = B::float_reshape(probs, rows.clone()); // [batch, kv_heads, group*seq_q, seq_k]

    let grad_output = B::float_reshape(
        to_f32::<B>(grad_output),
        Shape::new([batch, kv_heads, group * seq_q, d_v]),
    );
    let output = B::float_reshape(
        to_f32::<B>(output),
        Shape::new([batch, kv_heads, group * seq_q, d_v]),
    );

    // dV = Pᵀ·dO; the matmul over group*seq_q rows sums the group's query heads.
    let dv = B::float_matmul(B::float_swap_dims(probs.clone(), 2, 3), grad_output.clone()); // [batch, kv_heads, seq_k, d_v]

    // dS = P ∘ (dO·Vᵀ − D) with D = rowsum(dO ∘ O).
    let d = B::float_sum_dim(B::float_mul(grad_output.clone(), output), 3); // [batch, kv_heads, group*seq_q, 1]
    let dp = B::float_matmul(grad_output, B::float_swap_dims(v, 2, 3)); // [batch, kv_heads, group*seq_q, seq_k]
    let ds = B::float_mul(probs, B::float_sub(dp, d));
    // Through the softcap s = c·tanh(t/c): ds/dt = 1 − (s/c)².
    let ds = match (capped, options.softcap) {
        (Some(capped), Some(cap)) => {
            let ratio = B::float_div_scalar(capped, cap.into());
            let derivative =
                B::float_add_scalar(B::float_neg(B::float_mul(ratio.clone(), ratio)), 1.0.into());
            B::float_mul(ds, derivative)
        }
        _ => ds,
    };
    let ds = B::float_mul_scalar(ds, options.scale.into());

    let dq = B::float_matmul(ds.clone(), k); // [batch, kv_heads, group*seq_q, d_qk]
    let q = B::float_reshape(q, Shape::new([batch, kv_heads, group * seq_q, d_qk]));
    let dk = B::float_matmul(B::float_swap_dims(ds, 2, 3), q); // [batch, kv_heads, seq_k, d_qk]

    let dq = B::float_reshape(dq, Shape::new([batch, heads, seq_q, d_qk]));
    (
        to_dtype::<B>(dq, dtype),
        to_dtype::<B>(dk, dtype),
        to_dtype::<B>(dv, dtype),
    )
}
