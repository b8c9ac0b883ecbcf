//! The attention probabilities `softmax(scores·scale + mask)`, fused: one pass over
//! each row forward and one backward.
//!
//! The reference path composes this from a scale, a mask fill, a detached row max, a
//! subtraction, an exponential, a row sum and a division; under autodiff every one of
//! them adds a backward pass over the `seq_q × seq_k` scores. The fused op reads the
//! masking rule of [`crate::attention`] directly (a query sees one contiguous range
//! of keys under causal and window masks, minus padded keys), saves only the
//! probabilities, and computes the gradient in one pass:
//!
//! `∂L/∂s_j = scale · p_j · (∂L/∂p_j − Σ_k ∂L/∂p_k · p_k)`.
//!
//! A row that sees no key gets zeros, as on the reference path.

use burn::backend::Dispatch;
use burn::tensor::{Bool, Tensor};

use super::fused_cpu_supported;

pub use ops::AttentionSoftmaxOps;

/// The non-tensor arguments of [`attention_softmax`]: the scale and the masking rule
/// of [`crate::attention`] (bottom-right aligned causal mask, sliding window).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct SoftmaxMask {
    /// Multiplies the scores before the softmax.
    pub scale: f64,
    /// Causal masking (query row `i` sits at position `i + seq_k - seq_q`).
    pub causal: bool,
    /// Sliding window (see [`crate::attention`]).
    pub window: Option<usize>,
    /// Whether the `key_mask` argument is a real `[batch, seq_k]` mask (`1` = padded)
    /// instead of a `[1, 1]` placeholder.
    pub has_key_mask: bool,
}

impl SoftmaxMask {
    /// The keys `lo..hi` that query row `row` may see under the causal and window
    /// rules (padding aside); empty when it sees none. Equals
    /// [`crate::attention::is_hidden`] (tested below).
    pub fn visible_keys(&self, row: usize, seq_q: usize, seq_k: usize) -> std::ops::Range<usize> {
        let position = row as i64 + seq_k as i64 - seq_q as i64;
        let mut lo = 0i64;
        let mut hi = seq_k as i64;
        if self.causal {
            hi = hi.min(position + 1);
        }
        if let Some(window) = self.window {
            let window = window as i64;
            lo = lo.max(position - window + 1);
            if !self.causal {
                hi = hi.min(position + window);
            }
        }
        let lo = lo.clamp(0, seq_k as i64) as usize;
        let hi = hi.clamp(0, seq_k as i64) as usize;
        lo..hi.max(lo)
    }
}

mod ops {
    use super::SoftmaxMask;
    use burn::backend::tensor::FloatTensor;
    use burn::backend::{Backend, backend_extension};

    /// The fused attention softmax as a backend extension: native loops on flex, a
    /// hand-written backward under autodiff. Only [`super::attention_softmax`] calls
    /// it, and only on flex.
    #[backend_extension(Flex: cfg(feature = "flex"), Autodiff)]
    pub trait AttentionSoftmaxOps: Backend {
        /// Forward.
        ///
        /// # Shapes
        /// - scores: `[batch, heads, seq_q, seq_k]`, f32
        /// - key_mask: `[batch, seq_k]` (`1` = padded) or a `[1, 1]` placeholder, f32
        /// - output: `[batch, heads, seq_q, seq_k]`
        fn attention_softmax(
            scores: FloatTensor<Self>,
            key_mask: FloatTensor<Self>,
            mask: SoftmaxMask,
        ) -> FloatTensor<Self>;

        /// Backward: the gradient of the scores from the saved probabilities.
        ///
        /// # Shapes
        /// - probabilities, grad: `[batch, heads, seq_q, seq_k]`, f32
        /// - output: `[batch, heads, seq_q, seq_k]`
        fn attention_softmax_backward(
            probabilities: FloatTensor<Self>,
            grad: FloatTensor<Self>,
            mask: SoftmaxMask,
        ) -> FloatTensor<Self>;
    }
}

/// `softmax(scores·scale + mask)` over the last axis, fused on flex (f32), or `None`
/// where the fused op does not run (the caller then composes it from tensor ops).
///
/// # Shapes
/// - scores: `[batch, heads, seq_q, seq_k]`
/// - key_padding: `[batch, seq_k]`, `true` for padded keys
/// - output: `[batch, heads, seq_q, seq_k]`
pub fn attention_softmax(
    scores: Tensor<4>,
    key_padding: Option<Tensor<2, Bool>>,
    mask: SoftmaxMask,
) -> Option<Tensor<4>> {
    let device = scores.device();
    // The row max is taken before scaling, which needs a positive scale.
    let positive_scale = mask.scale.is_finite() && mask.scale > 0.0;
    if !positive_scale || !fused_cpu_supported(&device, scores.dtype()) {
        return None;
    }
    let [batch, _, _, seq_k] = scores.dims();
    let has_key_mask = key_padding.is_some();
    let key_mask = match key_padding {
        Some(padding) => {
            assert_eq!(
                padding.dims(),
                [batch, seq_k],
                "attention: key padding must be [batch, seq_k]"
            );
            padding.float()
        }
        None => Tensor::<2>::zeros([1, 1], &device),
    };
    let mask = SoftmaxMask {
        has_key_mask,
        ..mask
    };
    Some(Tensor::from_dispatch(Dispatch::attention_softmax(
        scores.into_dispatch(),
        key_mask.into_dispatch(),
        mask,
    )))
}

#[cfg(feature = "flex")]
mod flex {
    use burn::backend::Flex;
    use burn::backend::flex::FlexTensor;
    use burn::backend::tensor::FloatTensor;

    use super::{AttentionSoftmaxOps, SoftmaxMask};
    use crate::cpu::exp::exp;
    use crate::cpu::{flex_like, flex_values as values, for_rows, lanes, simd_kernel};

    fn dims(tensor: &FlexTensor) -> [usize; 4] {
        let shape = tensor.layout().shape();
        assert_eq!(shape.num_dims(), 4, "attention softmax takes 4-D scores");
        [shape[0], shape[1], shape[2], shape[3]]
    }

    impl AttentionSoftmaxOps for Flex {
        fn attention_softmax(
            scores: FloatTensor<Self>,
            key_mask: FloatTensor<Self>,
            mask: SoftmaxMask,
        ) -> FloatTensor<Self> {
            let scores = scores.to_contiguous();
            let key_mask = key_mask.to_contiguous();
            let [_, heads, seq_q, seq_k] = dims(&scores);
            let padding = values(&key_mask);
            let mut out = vec![0.0f32; scores.layout().num_elements()];
            let scale = mask.scale as f32;
            for_rows(seq_k, [values(&scores)], [&mut out], |first, [s], [p]| {
                for (index, (s, p)) in s.chunks(seq_k).zip(p.chunks_mut(seq_k)).enumerate() {
                    let row = first + index;
                    let keys = mask.visible_keys(row % seq_q, seq_q, seq_k);
                    let pad = mask.has_key_mask.then(|| {
                        &padding[(row / (heads * seq_q)) * seq_k..][..seq_k][keys.clone()]
                    });
                    row_forward(&s[keys.clone()], pad, scale, &mut p[keys]);
                }
            });
            flex_like(&scores, out)
        }

        fn attention_softmax_backward(
            probabilities: FloatTensor<Self>,
            grad: FloatTensor<Self>,
            mask: SoftmaxMask,
        ) -> FloatTensor<Self> {
            let probabilities = probabilities.to_contiguous();
            let grad = grad.to_contiguous();
            let [_, _, seq_q, seq_k] = dims(&probabilities);
            let mut out = vec![0.0f32; probabilities.layout().num_elements()];
            let scale = mask.scale as f32;
            let inputs = [values(&probabilities), values(&grad)];
            for_rows(seq_k, inputs, [&mut out], |first, [p, dp], [ds]| {
                let rows = p
                    .chunks(seq_k)
                    .zip(dp.chunks(seq_k))
                    .zip(ds.chunks_mut(seq_k));
                for (index, ((p, dp), ds)) in rows.enumerate() {
                    // Hidden keys have p = 0, hence a zero gradient: only the visible
                    // range is read and written.
                    let keys = mask.visible_keys((first + index) % seq_q, seq_q, seq_k);
                    row_backward(&p[keys.clone()], &dp[keys.clone()], scale, &mut ds[keys]);
                }
            });
            flex_like(&probabilities, out)
        }
    }

    /// One row forward over its visible keys; `pad` marks padded ones (`1`).
    fn row_forward(scores: &[f32], pad: Option<&[f32]>, scale: f32, out: &mut [f32]) {
        match pad {
            None => row_forward_dense(scores, scale, out),
            Some(pad) => row_forward_padded(scores, pad, scale, out),
        }
    }

    simd_kernel! {
        fn row_forward_dense(scores: &[f32], scale: f32, out: &mut [f32]) {
            // The max of the scaled scores: `scale` is positive.
            let max = lanes::max(scores) * scale;
            if max == f32::NEG_INFINITY {
                // No visible key: the row stays zero.
                return;
            }
            for (o, &s) in out.iter_mut().zip(scores) {
                *o = exp(s * scale - max);
            }
            normalize(out);
        }
    }

    simd_kernel! {
        fn row_forward_padded(scores: &[f32], pad: &[f32], scale: f32, out: &mut [f32]) {
            // Padded keys read as -inf for the max and contribute exp(-inf) = 0.
            for ((o, &s), &padded) in out.iter_mut().zip(scores).zip(pad) {
                *o = if padded != 0.0 { f32::NEG_INFINITY } else { s * scale };
            }
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
        fn row_backward(p: &[f32], dp: &[f32], scale: f32, ds: &mut [f32]) {
            let dot = lanes::dot(p, dp);
            for ((d, &p), &dp) in ds.iter_mut().zip(p).zip(dp) {
                *d = scale * p * (dp - dot);
            }
        }
    }
}

mod autodiff {
    use burn::backend::Autodiff;
    use burn::backend::autodiff::checkpoint::base::Checkpointer;
    use burn::backend::autodiff::checkpoint::strategy::CheckpointStrategy;
    use burn::backend::autodiff::grads::Gradients;
    use burn::backend::autodiff::ops::{Backward, Ops, OpsKind};
    use burn::backend::tensor::FloatTensor;

    use super::{AttentionSoftmaxOps, SoftmaxMask};

    #[derive(Debug)]
    struct AttentionSoftmaxBackward;

    impl<B: AttentionSoftmaxOps> Backward<B, 1> for AttentionSoftmaxBackward {
        /// The probabilities (also kept by the product with V that follows).
        type State = (FloatTensor<B>, SoftmaxMask);

        fn backward(
            self,
            ops: Ops<Self::State, 1>,
            grads: &mut Gradients,
            _checkpointer: &mut Checkpointer,
        ) {
            let grad = grads.consume::<B>(&ops.node);
            let (probabilities, mask) = ops.state;
            let [node_scores] = ops.parents;
            if let Some(node) = node_scores {
                let d_scores = B::attention_softmax_backward(probabilities, grad, mask);
                grads.register::<B>(node.id, d_scores);
            }
        }
    }

    impl<B: AttentionSoftmaxOps, C: CheckpointStrategy> AttentionSoftmaxOps for Autodiff<B, C> {
        fn attention_softmax(
            scores: FloatTensor<Self>,
            key_mask: FloatTensor<Self>,
            mask: SoftmaxMask,
        ) -> FloatTensor<Self> {
            let nodes = [scores.node()];
            // The padding mask is a constant: never differentiated.
            let output =
                B::attention_softmax(scores.into_primitive(), key_mask.into_primitive(), mask);
            match AttentionSoftmaxBackward
                .prepare::<C>(nodes)
                .compute_bound()
                .stateful()
            {
                OpsKind::Tracked(prep) => prep.finish((output.clone(), mask), output),
                OpsKind::UnTracked(prep) => prep.finish(output),
            }
        }

        fn attention_softmax_backward(
            probabilities: FloatTensor<Self>,
            grad: FloatTensor<Self>,
            mask: SoftmaxMask,
        ) -> FloatTensor<Self> {
            // Gradients of gradients are not supported: the result is a constant.
            <FloatTensor<Self>>::new(B::attention_softmax_backward(
                probabilities.into_primitive(),
                grad.into_primitive(),
                mask,
            ))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::attention::{composed_softmax, is_hidden};
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
                let mask = SoftmaxMask {
                    scale: 0.37,
                    causal,
                    window,
                    has_key_mask: padded,
                };
                let run = |fused: bool| {
                    let s = scores.clone().require_grad();
                    let p = if fused {
                        attention_softmax(s.clone(), padding.clone(), mask)
                            .expect("flex takes the fused softmax")
                    } else {
                        composed_softmax(s.clone(), padding.clone(), mask, None)
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
    fn visible_keys_follow_the_attention_masking_rule() {
        for (seq_q, seq_k) in [(1, 1), (5, 5), (3, 9), (9, 3), (1, 7)] {
            for causal in [false, true] {
                for window in [None, Some(1), Some(2), Some(4)] {
                    let mask = SoftmaxMask {
                        scale: 1.0,
                        causal,
                        window,
                        has_key_mask: false,
                    };
                    for row in 0..seq_q {
                        let keys = mask.visible_keys(row, seq_q, seq_k);
                        for key in 0..seq_k {
                            assert_eq!(
                                keys.contains(&key),
                                !is_hidden(row, key, seq_q, seq_k, causal, window),
                                "row {row} key {key} seq {seq_q}x{seq_k} causal {causal} window {window:?}"
                            );
                        }
                    }
                }
            }
        }
    }
}
