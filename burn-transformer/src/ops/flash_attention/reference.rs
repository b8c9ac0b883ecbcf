//! The reference attention, `softmax(q·kᵀ·scale + mask)·v` in tensor ops, stated
//! once. It is
//! - the path of every call the fused op does not take, differentiated by Burn's
//!   autodiff (it materializes the `[batch, heads, seq_q, seq_k]` scores);
//! - the oracle the fused paths are tested against;
//! - through [`forward_with_lse`] and [`backward_from_lse`], the portable version of
//!   the fused op on backends without a kernel (flex, ndarray): the same forward, and
//!   the flash backward recomputed from the log-sum-exp.
//!
//! Query heads of one group share their key/value head: grouping them turns GQA into a
//! batched matmul against the shared head, without repeating K/V.

use burn::tensor::{Bool, DType, Distribution, Tensor, TensorData};

use super::ScoreOptions;
use super::cpu_softmax::fused_softmax;
use crate::ops::mask::{MASKED_ROW_LSE, lowest_finite};
use crate::ops::matmul::matmul;

/// `[batch, heads, seq, x] -> [batch, kv_heads, group·seq, x]`: the query heads of a
/// group are contiguous, so this is a view of the same memory.
fn grouped(x: Tensor<4>, kv_heads: usize) -> Tensor<4> {
    let [batch, heads, seq, width] = x.dims();
    x.reshape([batch, kv_heads, heads / kv_heads * seq, width])
}

/// `[batch, kv_heads, group·seq, x] -> [batch, heads, seq, x]`.
fn ungrouped(x: Tensor<4>, heads: usize) -> Tensor<4> {
    let [batch, kv_heads, rows, width] = x.dims();
    x.reshape([batch, heads, rows * kv_heads / heads, width])
}

/// `q·kᵀ` per query head.
///
/// # Shapes
/// - q: `[batch, heads, seq_q, d_qk]`, k: `[batch, kv_heads, seq_k, d_qk]`
/// - output: `[batch, heads, seq_q, seq_k]`
fn scores(q: Tensor<4>, k: Tensor<4>) -> Tensor<4> {
    let heads = q.dims()[1];
    let kv_heads = k.dims()[1];
    let scores = matmul(grouped(q, kv_heads), k.swap_dims(2, 3)); // [batch, kv_heads, group*seq_q, seq_k]
    ungrouped(scores, heads)
}

/// The logits before masking: `softcap(scores·scale)`.
fn logits(scores: Tensor<4>, options: &ScoreOptions) -> Tensor<4> {
    let scaled = scores * options.scale;
    match options.softcap {
        Some(cap) => crate::ops::soft_cap::soft_cap(scaled, cap),
        None => scaled,
    }
}

/// `logits` plus ALiBi's bias where the options ask for it: added after the soft-cap,
/// so the cap's derivative is the unbiased logits'.
fn biased(logits: Tensor<4>, options: &ScoreOptions) -> Tensor<4> {
    match options.alibi {
        Some(alibi) => {
            let [_, heads, seq_q, seq_k] = logits.dims();
            let (dtype, device) = (logits.dtype(), logits.device());
            logits + alibi.bias(heads, seq_q, seq_k, &device).cast(dtype)
        }
        None => logits,
    }
}

/// The hidden entries (`true`) of the logits, by position and key padding; `None`
/// when nothing is hidden.
fn hidden(
    shape: [usize; 4],
    key_padding: Option<Tensor<2, Bool>>,
    options: &ScoreOptions,
    device: &burn::tensor::Device,
) -> Option<Tensor<4, Bool>> {
    let [batch, _, seq_q, seq_k] = shape;
    let positional = options.mask.hidden_flags(seq_q, seq_k).map(|flags| {
        Tensor::<2, Bool>::from_data(TensorData::new(flags, [seq_q, seq_k]), device)
            .reshape([1, 1, seq_q, seq_k])
            .expand(shape)
    });
    let padded = key_padding.map(|padding| padding.reshape([batch, 1, 1, seq_k]).expand(shape));
    match (positional, padded) {
        (Some(a), Some(b)) => Some(a.bool_or(b)),
        (a, b) => a.or(b),
    }
}

/// Logits with `-inf` at hidden entries.
fn masked_logits(
    logits: Tensor<4>,
    key_padding: Option<Tensor<2, Bool>>,
    options: &ScoreOptions,
) -> Tensor<4> {
    match hidden(logits.dims(), key_padding, options, &logits.device()) {
        Some(hidden) => logits.mask_fill(hidden, f64::NEG_INFINITY),
        None => logits,
    }
}

/// The softmax of masked logits in pieces: the row maximum, `exp(logits − max)` and its
/// row sum (`[.., 1]`). Every softmax and log-sum-exp of this file is made of them.
///
/// The shift does not change the softmax, so it is detached (its gradient would be
/// zero anyway); clamped to a finite floor so that a fully hidden row (all `-inf`)
/// gives `exp(-inf) = 0`, not `NaN`.
fn shifted_exponentials(masked: Tensor<4>) -> (Tensor<4>, Tensor<4>, Tensor<4>) {
    let max = masked
        .clone()
        .max_dim(3)
        .detach()
        .clamp_min(lowest_finite(masked.dtype()));
    let exponentials = (masked - max.clone()).exp();
    let sum = exponentials.clone().sum_dim(3);
    (max, exponentials, sum)
}

/// A row that sees a key sums to at least 1 (its max contributes `exp(0)`), so this
/// floor touches only fully hidden rows, whose sum is 0. f16's smallest positive
/// normal: representable in every float type.
const SUM_FLOOR: f64 = 6.1e-5;

/// `softmax(softcap(scores·scale) + mask)` over the last axis from tensor ops; a fully
/// hidden row is all zeros. The reference of the fused CPU softmax.
///
/// # Shapes
/// - scores: `[batch, heads, seq_q, seq_k]` (`q·kᵀ`, before the scale)
/// - key_padding: `[batch, seq_k]`, `true` for padded keys
/// - output: `[batch, heads, seq_q, seq_k]`
pub(crate) fn composed_softmax(
    scores: Tensor<4>,
    key_padding: Option<Tensor<2, Bool>>,
    options: &ScoreOptions,
) -> Tensor<4> {
    let masked = masked_logits(
        biased(logits(scores, options), options),
        key_padding,
        options,
    );
    let (_, exponentials, sum) = shifted_exponentials(masked);
    exponentials / sum.clamp_min(SUM_FLOOR)
}

/// The attention probabilities `softmax(q·kᵀ·scale + mask)`: row `i` of head `h` says
/// how much query `i` reads from each key; hidden keys get 0 and a fully hidden row is
/// all zeros. One pass forward and backward on flex (the fused CPU softmax), tensor ops
/// elsewhere (and with sinks or ALiBi).
///
/// # Shapes
/// - q: `[batch, heads, seq_q, d_qk]`, k: `[batch, kv_heads, seq_k, d_qk]`
/// - key_padding: `[batch, seq_k]`, `true` for padded keys
/// - output: `[batch, heads, seq_q, seq_k]`
pub(crate) fn probabilities(
    q: Tensor<4>,
    k: Tensor<4>,
    key_padding: Option<Tensor<2, Bool>>,
    options: &ScoreOptions,
    sinks: Option<&Tensor<1>>,
) -> Tensor<4> {
    let scores = scores(q, k);
    if let Some(sinks) = sinks {
        return softmax_with_sinks(scores, key_padding, options, sinks.clone());
    }
    match fused_softmax(scores.clone(), key_padding.clone(), options) {
        Some(probabilities) => probabilities,
        None => composed_softmax(scores, key_padding, options),
    }
}

/// [`composed_softmax`] with a learned sink per head (gpt-oss): one more logit in
/// every row, `sinks[h]`, that joins the normalization and takes no value, so a row's
/// probabilities over the keys sum to less than 1 (and a fully hidden row gives the
/// sink everything). Differentiated by autodiff, the sinks' gradient included.
///
/// # Shapes
/// - scores: `[batch, heads, seq_q, seq_k]`, sinks: `[heads]`
/// - output: `[batch, heads, seq_q, seq_k]`
fn softmax_with_sinks(
    scores: Tensor<4>,
    key_padding: Option<Tensor<2, Bool>>,
    options: &ScoreOptions,
    sinks: Tensor<1>,
) -> Tensor<4> {
    let seq_k = scores.dims()[3];
    let logits = biased(logits(scores, options), options);
    let masked = masked_logits(logits, key_padding, options);
    let (_, exponentials, sum) = shifted_exponentials(with_sink_column(masked, sinks));
    (exponentials / sum).narrow(3, 0, seq_k)
}

/// Masked logits with the sink of each head appended as one more column: the
/// softmax over it is the softmax with sinks (drop the last column afterwards).
///
/// # Shapes
/// - masked: `[batch, heads, seq_q, seq_k]`, sinks: `[heads]`
/// - output: `[batch, heads, seq_q, seq_k + 1]`
fn with_sink_column(masked: Tensor<4>, sinks: Tensor<1>) -> Tensor<4> {
    let [batch, heads, seq_q, _] = masked.dims();
    let sinks = sinks
        .cast(masked.dtype())
        .reshape([1, heads, 1, 1])
        .expand([batch, heads, seq_q, 1]);
    Tensor::cat(vec![masked, sinks], 3)
}

/// `probabilities · v` per query head, through its key/value head.
///
/// # Shapes
/// - probabilities: `[batch, heads, seq_q, seq_k]`, v: `[batch, kv_heads, seq_k, d_v]`
/// - output: `[batch, heads, seq_q, d_v]`
fn weighted_values(probabilities: Tensor<4>, v: Tensor<4>) -> Tensor<4> {
    let heads = probabilities.dims()[1];
    let kv_heads = v.dims()[1];
    ungrouped(matmul(grouped(probabilities, kv_heads), v), heads)
}

/// The reference attention and the probabilities it weighted the values with (after
/// dropout, which `dropout > 0` applies only on autodiff devices: the caller decides
/// whether it is training), with the attention sinks `sinks` (`[heads]`) when given.
///
/// # Shapes
/// - q: `[batch, heads, seq_q, d_qk]`
/// - k: `[batch, kv_heads, seq_k, d_qk]`, v: `[batch, kv_heads, seq_k, d_v]`
/// - key_padding: `[batch, seq_k]`, `true` for padded keys
/// - output: `[batch, heads, seq_q, d_v]` and `[batch, heads, seq_q, seq_k]`
pub(crate) fn attention(
    q: Tensor<4>,
    k: Tensor<4>,
    v: Tensor<4>,
    key_padding: Option<Tensor<2, Bool>>,
    options: &ScoreOptions,
    sinks: Option<&Tensor<1>>,
    dropout: f64,
) -> (Tensor<4>, Tensor<4>) {
    let probabilities = probabilities(q, k, key_padding, options, sinks);
    let probabilities = if dropout > 0.0 && probabilities.device().is_autodiff() {
        let keep = 1.0 - dropout;
        let kept = probabilities.random_like(Distribution::Bernoulli(keep));
        probabilities * kept / keep
    } else {
        probabilities
    };
    (weighted_values(probabilities.clone(), v), probabilities)
}

/// The fused op's forward in tensor ops, in f32 whatever the input type: the output
/// and the per-row log-sum-exp, the sink included when `sinks` (`[heads]`) are given
/// ([`MASKED_ROW_LSE`] for rows that see no key and have no sink).
///
/// # Shapes
/// - as [`attention`]; the log-sum-exp is `[batch, heads, seq_q]`, f32
pub(crate) fn forward_with_lse(
    q: Tensor<4>,
    k: Tensor<4>,
    v: Tensor<4>,
    key_padding: Option<Tensor<2, Bool>>,
    sinks: Option<Tensor<1>>,
    options: &ScoreOptions,
) -> (Tensor<4>, Tensor<3>) {
    let dtype = q.dtype();
    let [batch, heads, seq_q, _] = q.dims();
    let seq_k = k.dims()[2];
    let logits = logits(scores(q.cast(DType::F32), k.cast(DType::F32)), options);
    let masked = masked_logits(biased(logits, options), key_padding, options);
    let masked = match sinks {
        Some(sinks) => with_sink_column(masked, sinks.cast(DType::F32)),
        None => masked,
    };
    let (max, exponentials, sum) = shifted_exponentials(masked);
    let probabilities = (exponentials / sum.clone().clamp_min(SUM_FLOOR)).narrow(3, 0, seq_k);
    let output = weighted_values(probabilities, v.cast(DType::F32));
    let sees_nothing = sum.clone().lower_equal_elem(0.0);
    let lse = (max + sum.clamp_min(SUM_FLOOR).log()).mask_fill(sees_nothing, MASKED_ROW_LSE);
    (output.cast(dtype), lse.reshape([batch, heads, seq_q]))
}

/// The flash backward in tensor ops, in f32: the probabilities recomputed from the
/// log-sum-exp, then `dV = Pᵀ·dO`, `dS = P ∘ (dO·Vᵀ − D)` with `D = rowsum(dO ∘ O)`
/// (times the soft-cap's derivative `1 − (s/c)²` and the scale), `dQ = dS·K`,
/// `dK = dSᵀ·Q`. Query heads of a group sum into their shared key/value head.
/// With attention sinks, `lse` includes them and nothing else changes.
///
/// # Shapes
/// - q, k, v, key_padding: as [`attention`]
/// - output, grad_output: `[batch, heads, seq_q, d_v]`; lse: `[batch, heads, seq_q]`
/// - returns `(dq, dk, dv)` shaped like `(q, k, v)`, in their dtype
#[allow(clippy::too_many_arguments)]
pub(crate) fn backward_from_lse(
    q: Tensor<4>,
    k: Tensor<4>,
    v: Tensor<4>,
    output: Tensor<4>,
    lse: Tensor<3>,
    grad_output: Tensor<4>,
    key_padding: Option<Tensor<2, Bool>>,
    options: &ScoreOptions,
) -> (Tensor<4>, Tensor<4>, Tensor<4>) {
    let dtype = q.dtype();
    let [batch, heads, seq_q, _] = q.dims();
    let kv_heads = k.dims()[1];
    let (q, k, v) = (q.cast(DType::F32), k.cast(DType::F32), v.cast(DType::F32));
    let (output, grad_output) = (output.cast(DType::F32), grad_output.cast(DType::F32));
    let logits = logits(scores(q.clone(), k.clone()), options);
    // P = exp(S − LSE): hidden entries are -inf and give 0; rows that see no key have
    // LSE = MASKED_ROW_LSE and give 0 too.
    let lse = lse.cast(DType::F32).reshape([batch, heads, seq_q, 1]);
    let biased_logits = biased(logits.clone(), options);
    let probabilities = (masked_logits(biased_logits, key_padding, options) - lse).exp();

    let grouped_grad = grouped(grad_output.clone(), kv_heads); // [batch, kv_heads, group*seq_q, d_v]
    let dv = matmul(
        grouped(probabilities.clone(), kv_heads).swap_dims(2, 3),
        grouped_grad,
    ); // [batch, kv_heads, seq_k, d_v]
    let d = (grad_output.clone() * output).sum_dim(3); // [batch, heads, seq_q, 1]
    let dp = ungrouped(
        matmul(grouped(grad_output, kv_heads), v.swap_dims(2, 3)),
        heads,
    ); // [batch, heads, seq_q, seq_k]
    let ds = probabilities * (dp - d);
    // Through the soft-cap s = c·tanh(t/c): ds/dt = 1 − (s/c)².
    let ds = match options.softcap {
        Some(cap) => {
            let ratio = logits / cap;
            ds * (ratio.clone() * ratio).neg().add_scalar(1.0)
        }
        None => ds,
    };
    let ds = grouped(ds * options.scale, kv_heads); // [batch, kv_heads, group*seq_q, seq_k]
    let dq = ungrouped(matmul(ds.clone(), k), heads); // [batch, heads, seq_q, d_qk]
    let dk = matmul(ds.swap_dims(2, 3), grouped(q, kv_heads)); // [batch, kv_heads, seq_k, d_qk]
    (dq.cast(dtype), dk.cast(dtype), dv.cast(dtype))
}
