//! The reference path's softmax `softmax(scores·scale + mask)` on flex, fused: one
//! pass over each row forward and one backward.
//!
//! Composed from tensor ops, the softmax is a scale, a mask fill, a row max, a
//! subtraction, an exponential, a row sum and a division; under autodiff every one of
//! them adds a backward pass over the `seq_q × seq_k` scores. The fused op reads the
//! [`MaskRule`](crate::ops::mask::MaskRule) directly (a query sees one contiguous range
//! of keys, minus padded keys), saves only the probabilities, and computes the
//! gradient in one pass:
//!
//! `∂L/∂s_j = scale · p_j · (∂L/∂p_j − Σ_k ∂L/∂p_k · p_k)`.
//!
//! A row that sees no key gets zeros, as on the composed path. Soft-capped scores take
//! the composed path.

use burn::backend::Dispatch;
use burn::tensor::{Bool, Tensor};

use super::ScoreOptions;
use crate::ops::simd::runs_fused_on_cpu;

use ops::AttentionSoftmaxOps;

mod ops {
    use super::ScoreOptions;
    use burn::backend::tensor::FloatTensor;
    use burn::backend::{Backend, backend_extension};

    /// The fused attention softmax as a backend extension: native loops on flex, a
    /// hand-written backward under autodiff. Only [`super::fused_softmax`] calls it,
    /// and only on flex.
    #[backend_extension(Flex: cfg(feature = "flex"), Autodiff)]
    pub(crate) trait AttentionSoftmaxOps: Backend {
        /// Forward.
        ///
        /// # Shapes
        /// - scores: `[batch, heads, seq_q, seq_k]`, f32
        /// - key_mask: `[batch, seq_k]` (`1` = padded) or a `[1, 1]` placeholder, f32
        /// - output: `[batch, heads, seq_q, seq_k]`
        fn attention_softmax(
            scores: FloatTensor<Self>,
            key_mask: FloatTensor<Self>,
            options: ScoreOptions,
        ) -> FloatTensor<Self>;

        /// Backward: the gradient of the scores from the saved probabilities.
        ///
        /// # Shapes
        /// - probabilities, grad: `[batch, heads, seq_q, seq_k]`, f32
        /// - output: `[batch, heads, seq_q, seq_k]`
        fn attention_softmax_backward(
            probabilities: FloatTensor<Self>,
            grad: FloatTensor<Self>,
            options: ScoreOptions,
        ) -> FloatTensor<Self>;
    }
}

/// `softmax(scores·scale + mask)` over the last axis, fused on flex (f32 scores, a
/// positive scale, no soft-cap), or `None` where the fused op does not run (the caller
/// then composes it from tensor ops).
///
/// # Shapes
/// - scores: `[batch, heads, seq_q, seq_k]`
/// - key_padding: `[batch, seq_k]`, `true` for padded keys
/// - output: `[batch, heads, seq_q, seq_k]`
pub(crate) fn fused_softmax(
    scores: Tensor<4>,
    key_padding: Option<Tensor<2, Bool>>,
    options: &ScoreOptions,
) -> Option<Tensor<4>> {
    let device = scores.device();
    // The row max is taken before scaling, which needs a positive scale.
    let positive_scale = options.scale.is_finite() && options.scale > 0.0;
    let plain_logits = options.softcap.is_none() && options.alibi.is_none();
    if !plain_logits || !positive_scale || !runs_fused_on_cpu(&device, scores.dtype()) {
        return None;
    }
    let has_key_mask = key_padding.is_some();
    let key_mask = match key_padding {
        Some(padding) => padding.float(),
        None => Tensor::<2>::zeros([1, 1], &device),
    };
    let options = options.with_key_mask(has_key_mask);
    Some(Tensor::from_dispatch(Dispatch::attention_softmax(
        scores.into_dispatch(),
        key_mask.into_dispatch(),
        options,
    )))
}

#[cfg(feature = "flex")]
mod flex {
    use std::mem::MaybeUninit;

    use burn::backend::Flex;
    use burn::backend::flex::FlexTensor;
    use burn::backend::tensor::FloatTensor;

    use super::{AttentionSoftmaxOps, ScoreOptions};
    use crate::ops::simd::exp::exp;
    use crate::ops::simd::{
        assume_written, flex_like, flex_values as values, for_rows, lanes, simd_kernel,
    };

    fn dims(tensor: &FlexTensor) -> [usize; 4] {
        let shape = tensor.layout().shape();
        assert_eq!(shape.num_dims(), 4, "attention softmax takes 4-D scores");
        [shape[0], shape[1], shape[2], shape[3]]
    }

    impl AttentionSoftmaxOps for Flex {
        fn attention_softmax(
            scores: FloatTensor<Self>,
            key_mask: FloatTensor<Self>,
            options: ScoreOptions,
        ) -> FloatTensor<Self> {
            let scores = scores.to_contiguous();
            let key_mask = key_mask.to_contiguous();
            let [_, heads, seq_q, seq_k] = dims(&scores);
            let padding = values(&key_mask);
            let len = scores.layout().num_elements();
            let scale = options.scale as f32;
            // SAFETY: each row's hidden keys are written zeros, its visible ones by
            // `row_forward`, which writes all of them.
            let [out] = unsafe {
                for_rows(seq_k, len, [values(&scores)], |first, [s], [p]| {
                    for (index, (s, p)) in s.chunks(seq_k).zip(p.chunks_mut(seq_k)).enumerate() {
                        let row = first + index;
                        let keys = options.mask.visible_keys(row % seq_q, seq_q, seq_k);
                        let pad = options.has_key_mask.then(|| {
                            &padding[(row / (heads * seq_q)) * seq_k..][..seq_k][keys.clone()]
                        });
                        row_forward(&s[keys.clone()], pad, scale, visible(p, keys));
                    }
                })
            };
            flex_like(&scores, out)
        }

        fn attention_softmax_backward(
            probabilities: FloatTensor<Self>,
            grad: FloatTensor<Self>,
            options: ScoreOptions,
        ) -> FloatTensor<Self> {
            let probabilities = probabilities.to_contiguous();
            let grad = grad.to_contiguous();
            let [_, _, seq_q, seq_k] = dims(&probabilities);
            let len = probabilities.layout().num_elements();
            let scale = options.scale as f32;
            let inputs = [values(&probabilities), values(&grad)];
            // SAFETY: each row's hidden keys are written zeros, its visible ones by
            // `row_backward`, which writes all of them.
            let [out] = unsafe {
                for_rows(seq_k, len, inputs, |first, [p, dp], [ds]| {
                    let rows = p
                        .chunks(seq_k)
                        .zip(dp.chunks(seq_k))
                        .zip(ds.chunks_mut(seq_k));
                    for (index, ((p, dp), ds)) in rows.enumerate() {
                        // Hidden keys have p = 0, hence a zero gradient: only the
                        // visible range is read.
                        let keys = options
                            .mask
                            .visible_keys((first + index) % seq_q, seq_q, seq_k);
                        let ds = visible(ds, keys.clone());
                        row_backward(&p[keys.clone()], &dp[keys], scale, ds);
                    }
                })
            };
            flex_like(&probabilities, out)
        }
    }

    /// Writes zeros into a row's hidden keys (outside `keys`) and returns its visible
    /// ones, for the caller to write.
    fn visible(
        row: &mut [MaybeUninit<f32>],
        keys: std::ops::Range<usize>,
    ) -> &mut [MaybeUninit<f32>] {
        let (before, rest) = row.split_at_mut(keys.start);
        let (visible, after) = rest.split_at_mut(keys.len());
        before.fill(MaybeUninit::new(0.0));
        after.fill(MaybeUninit::new(0.0));
        visible
    }

    /// One row forward over its visible keys (all of which it writes); `pad` marks
    /// padded ones (`1`).
    fn row_forward(scores: &[f32], pad: Option<&[f32]>, scale: f32, out: &mut [MaybeUninit<f32>]) {
        match pad {
            None => row_forward_dense(scores, scale, out),
            Some(pad) => row_forward_padded(scores, pad, scale, out),
        }
    }

    simd_kernel! {
        fn row_forward_dense(scores: &[f32], scale: f32, out: &mut [MaybeUninit<f32>]) {
            // The max of the scaled scores: `scale` is positive.
            let max = lanes::max(scores) * scale;
            if max == f32::NEG_INFINITY {
                // No visible key: the row is zero.
                out.fill(MaybeUninit::new(0.0));
                return;
            }
            for (o, &s) in out.iter_mut().zip(scores) {
                o.write(exp(s * scale - max));
            }
            // SAFETY: the loop wrote every element (`out` and `scores` have one length).
            normalize(unsafe { assume_written(out) });
        }
    }

    simd_kernel! {
        fn row_forward_padded(
            scores: &[f32],
            pad: &[f32],
            scale: f32,
            out: &mut [MaybeUninit<f32>],
        ) {
            // Padded keys read as -inf for the max and contribute exp(-inf) = 0.
            for ((o, &s), &padded) in out.iter_mut().zip(scores).zip(pad) {
                o.write(if padded != 0.0 { f32::NEG_INFINITY } else { s * scale });
            }
            // SAFETY: the loop wrote every element (`out`, `scores` and `pad` have
            // one length).
            let out = unsafe { assume_written(out) };
            let max = lanes::max(out);
            if max == f32::NEG_INFINITY {
                out.fill(0.0);
                return;
            }
            for o in out.iter_mut() {
                *o = if *o == f32::NEG_INFINITY { 0.0 } else { exp(*o - max) };
            }
            normalize(out);
        }
    }

    /// Divides a row of exponentials by their sum (at least 1: the max is among them).
    #[inline(always)]
    fn normalize(row: &mut [f32]) {
        let inverse = 1.0 / lanes::sum(row);
        for value in row.iter_mut() {
            *value *= inverse;
        }
    }

    simd_kernel! {
        fn row_backward(p: &[f32], dp: &[f32], scale: f32, ds: &mut [MaybeUninit<f32>]) {
            let dot = lanes::dot(p, dp);
            for ((d, &p), &dp) in ds.iter_mut().zip(p).zip(dp) {
                d.write(scale * p * (dp - dot));
            }
        }
    }
}

mod autodiff {
    use burn::backend::Autodiff;
    use burn::backend::autodiff::checkpoint::base::Checkpointer;
    use burn::backend::autodiff::checkpoint::strategy::CheckpointStrategy;
    use burn::backend::autodiff::grads::Gradients;
    use burn::backend::autodiff::ops::{Backward, Ops};
    use burn::backend::tensor::FloatTensor;

    use super::{AttentionSoftmaxOps, ScoreOptions};
    use crate::ops::autodiff::{backward_unary, record_unary};

    #[derive(Debug)]
    struct AttentionSoftmaxBackward;

    impl<B: AttentionSoftmaxOps> Backward<B, 1> for AttentionSoftmaxBackward {
        /// The probabilities (also kept by the product with V that follows).
        type State = (FloatTensor<B>, ScoreOptions);

        fn backward(
            self,
            ops: Ops<Self::State, 1>,
            grads: &mut Gradients,
            _checkpointer: &mut Checkpointer,
        ) {
            backward_unary::<B, _>(ops, grads, |(probabilities, options), grad| {
                B::attention_softmax_backward(probabilities, grad, options)
            });
        }
    }

    impl<B: AttentionSoftmaxOps, C: CheckpointStrategy> AttentionSoftmaxOps for Autodiff<B, C> {
        fn attention_softmax(
            scores: FloatTensor<Self>,
            key_mask: FloatTensor<Self>,
            options: ScoreOptions,
        ) -> FloatTensor<Self> {
            // The padding mask is a constant: never differentiated.
            let key_mask = key_mask.into_primitive();
            record_unary::<B, C, _>(AttentionSoftmaxBackward, scores, |scores| {
                let output = B::attention_softmax(scores, key_mask, options);
                (output.clone(), (output, options))
            })
        }

        fn attention_softmax_backward(
            probabilities: FloatTensor<Self>,
            grad: FloatTensor<Self>,
            options: ScoreOptions,
        ) -> FloatTensor<Self> {
            // Gradients of gradients are not supported: the result is a constant.
            <FloatTensor<Self>>::new(B::attention_softmax_backward(
                probabilities.into_primitive(),
                grad.into_primitive(),
                options,
            ))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ops::flash_attention::reference::composed_softmax;
    use crate::ops::mask::MaskRule;
    use crate::test_utils::assert_close;
    use burn::tensor::{Device, Distribution, TensorData};

    /// Forward and score gradient against the composed tensor ops on flex, over the
    /// masking rules, shapes with seq_q ≠ seq_k, rows that see no key (a batch whose
    /// keys are all padded, windows past the keys) and a size split into parallel
    /// row groups.
    #[test]
    fn matches_the_composed_softmax_forward_and_backward() {
        let device = Device::flex().autodiff();
        let shapes = [[2, 3, 5, 5], [2, 2, 3, 9], [2, 1, 9, 4], [3, 4, 64, 200]];
        for [batch, heads, seq_q, seq_k] in shapes {
            for (causal, window, padded) in [
                (false, None, false),
                (true, None, false),
                (true, Some(2), true),
                (false, Some(3), false),
                (false, None, true),
            ] {
                let scores = Tensor::<4>::random(
                    [batch, heads, seq_q, seq_k],
                    Distribution::Normal(0.0, 3.0),
                    &device,
                );
                let weight = scores.random_like(Distribution::Normal(0.0, 1.0));
                // Batch 0 pads every key (its rows see nothing); the others pad
                // every third key.
                let padding = padded.then(|| {
                    let hidden: Vec<bool> = (0..batch * seq_k)
                        .map(|i| i < seq_k || i % 3 == 1)
                        .collect();
                    Tensor::<2, Bool>::from_data(TensorData::new(hidden, [batch, seq_k]), &device)
                });
                let options = ScoreOptions::new(0.37, None, MaskRule::new(causal, window));
                let run = |fused: bool| {
                    let s = scores.clone().require_grad();
                    let p = if fused {
                        fused_softmax(s.clone(), padding.clone(), &options)
                            .expect("flex takes the fused softmax")
                    } else {
                        composed_softmax(s.clone(), padding.clone(), &options)
                    };
                    let grads = (p.clone() * weight.clone()).sum().backward();
                    (p.inner(), s.grad(&grads).expect("score gradient"))
                };
                let ((p, ds), (p_ref, ds_ref)) = (run(true), run(false));
                let what = format!(
                    "{batch}x{heads}x{seq_q}x{seq_k} causal {causal} window {window:?} padded {padded}"
                );
                assert!(
                    !p.clone().is_nan().any().into_scalar::<bool>(),
                    "{what}: NaN"
                );
                assert_close(p, p_ref, 1e-6, &format!("softmax {what}"));
                assert_close(ds, ds_ref, 1e-6, &format!("softmax grad {what}"));
            }
        }
    }

    #[test]
    fn soft_capped_scores_take_the_composed_path() {
        let device = Device::flex();
        let scores = Tensor::<4>::zeros([1, 1, 2, 2], &device);
        let options = ScoreOptions::new(1.0, Some(5.0), MaskRule::default());
        assert!(fused_softmax(scores, None, &options).is_none());
    }
}
