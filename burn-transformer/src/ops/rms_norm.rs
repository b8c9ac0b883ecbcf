//! RMSNorm `x · r · w` with `r = 1 / sqrt(mean(x²) + eps)` per row (`w` the weight,
//! or `1 + weight` for Gemma's unit offset), fused on flex: one pass forward, one pass
//! backward.
//!
//! Composed from tensor ops this is a square, a mean, an addition, a square root, a
//! reciprocal and two products: seven passes and five temporaries forward, and under
//! autodiff a backward node for each (the mean's broadcast and the two broadcast
//! products among them). A transformer runs two norms per layer, so on a small model's
//! training step they cost about as much as the projections. The fused backward
//! recomputes `r` from the saved input and takes both gradients in one pass over the
//! rows, with `x̂ = x·r` and `ĝ = g·w`:
//!
//! `∂x = r · (ĝ − x̂ · mean(ĝ·x̂))`, `∂weight = Σ_rows g·x̂`.

use burn::backend::Dispatch;
use burn::tensor::Tensor;

use super::simd::runs_fused_on_cpu;

pub(crate) use ops::RmsNormOps;

/// The extension trait lives in its own module so that the attribute's generated code
/// stays apart from the kernels.
mod ops {
    use burn::backend::tensor::FloatTensor;
    use burn::backend::{Backend, backend_extension};

    /// RMSNorm as a backend extension: native loops on flex, a hand-written backward
    /// under autodiff. Other backends are not listed: [`super::fused_rms_norm`] only
    /// calls it on flex.
    #[backend_extension(Flex: cfg(feature = "flex"), Autodiff)]
    pub(crate) trait RmsNormOps: Backend {
        /// Forward; the scale is `1 + weight` with `unit_offset`.
        ///
        /// # Shapes
        /// - x: `[..., d]`, f32
        /// - weight: `[d]`, f32
        /// - output: x's shape
        fn rms_norm(
            x: FloatTensor<Self>,
            weight: FloatTensor<Self>,
            eps: f64,
            unit_offset: bool,
        ) -> FloatTensor<Self>;

        /// Backward: `(∂x, ∂weight)` of `sum(grad · rms_norm(x, weight))`.
        ///
        /// # Shapes
        /// - x, grad: `[..., d]`, f32
        /// - weight: `[d]`, f32
        /// - output: x's shape and weight's shape
        fn rms_norm_backward(
            x: FloatTensor<Self>,
            weight: FloatTensor<Self>,
            grad: FloatTensor<Self>,
            eps: f64,
            unit_offset: bool,
        ) -> (FloatTensor<Self>, FloatTensor<Self>);
    }
}

/// RMSNorm of the last axis of `x` scaled by `weight` (by `1 + weight` with
/// `unit_offset`), fused on flex for f32 tensors;
/// `None` where the fused op does not run (the caller then composes it from tensor
/// ops, in its own precision rules).
///
/// # Shapes
/// - x: `[..., d]`
/// - weight: `[d]`
/// - output: x's shape
pub(crate) fn fused_rms_norm<const D: usize>(
    x: Tensor<D>,
    weight: Tensor<1>,
    eps: f64,
    unit_offset: bool,
) -> Option<Tensor<D>> {
    if !runs_fused_on_cpu(&x.device(), x.dtype()) || weight.dtype() != x.dtype() {
        return None;
    }
    Some(Tensor::from_dispatch(Dispatch::rms_norm(
        x.into_dispatch(),
        weight.into_dispatch(),
        eps,
        unit_offset,
    )))
}

#[cfg(feature = "flex")]
mod flex {
    use burn::backend::Flex;
    use burn::backend::tensor::FloatTensor;
    use burn::tensor::TensorData;

    use super::RmsNormOps;
    use crate::ops::simd::{flex_like, flex_values as values, for_rows, map_rows};

    impl RmsNormOps for Flex {
        fn rms_norm(
            x: FloatTensor<Self>,
            weight: FloatTensor<Self>,
            eps: f64,
            unit_offset: bool,
        ) -> FloatTensor<Self> {
            let x = x.to_contiguous();
            let w = &scale(&weight, unit_offset);
            let len = x.layout().num_elements();
            // SAFETY: the kernel writes every element of its output rows.
            let [out] = unsafe {
                for_rows(w.len(), len, [values(&x)], |_, [x], [out]| {
                    kernels::forward(x, w, eps as f32, out)
                })
            };
            flex_like(&x, out)
        }

        fn rms_norm_backward(
            x: FloatTensor<Self>,
            weight: FloatTensor<Self>,
            grad: FloatTensor<Self>,
            eps: f64,
            unit_offset: bool,
        ) -> (FloatTensor<Self>, FloatTensor<Self>) {
            let (x, grad) = (x.to_contiguous(), grad.to_contiguous());
            let w = &scale(&weight, unit_offset);
            let d = w.len();
            let len = x.layout().num_elements();
            // Each task sums the weight gradient over its own rows; the partial sums
            // are added afterwards, so no two tasks write one value.
            // SAFETY: the kernel writes every element of its rows of `d_x`.
            let ([d_x], partials) = unsafe {
                map_rows(d, len, [values(&x), values(&grad)], |_, [x, g], [d_x]| {
                    let mut d_w = vec![0.0f32; d];
                    kernels::backward(x, w, g, eps as f32, d_x, &mut d_w);
                    d_w
                })
            };
            let mut d_w = vec![0.0f32; d];
            for partial in partials {
                for (total, part) in d_w.iter_mut().zip(partial) {
                    *total += part;
                }
            }
            (
                flex_like(&x, d_x),
                burn::backend::flex::FlexTensor::from_data(TensorData::new(d_w, [d])),
            )
        }
    }

    /// The per-feature scale: the weight, plus one with `unit_offset`.
    fn scale(weight: &burn::backend::flex::FlexTensor, unit_offset: bool) -> Vec<f32> {
        let offset = if unit_offset { 1.0 } else { 0.0 };
        values(&weight.to_contiguous())
            .iter()
            .map(|w| w + offset)
            .collect()
    }

    /// The loops, compiled once per instruction set and picked at run time.
    mod kernels {
        use std::mem::MaybeUninit;

        use crate::ops::simd::{lanes, simd_kernel};

        /// `1 / sqrt(mean(row²) + eps)`.
        #[inline(always)]
        fn inverse_rms(row: &[f32], eps: f32) -> f32 {
            1.0 / (lanes::dot(row, row) / row.len() as f32 + eps).sqrt()
        }

        simd_kernel! {
            /// Normalizes each row of `x` (rows of `scale.len()` values) into `out`.
            pub(super) fn forward(
                x: &[f32],
                scale: &[f32],
                eps: f32,
                out: &mut [MaybeUninit<f32>],
            ) {
                let d = scale.len();
                for (row, out) in x.chunks_exact(d).zip(out.chunks_exact_mut(d)) {
                    let r = inverse_rms(row, eps);
                    for ((o, &x), &w) in out.iter_mut().zip(row).zip(scale) {
                        o.write(x * r * w);
                    }
                }
            }
        }

        simd_kernel! {
            /// The input gradient of each row into `d_x`; the weight gradient of these
            /// rows added to `d_w`.
            pub(super) fn backward(
                x: &[f32],
                scale: &[f32],
                grad: &[f32],
                eps: f32,
                d_x: &mut [MaybeUninit<f32>],
                d_w: &mut [f32],
            ) {
                let d = scale.len();
                let rows = x.chunks_exact(d).zip(grad.chunks_exact(d));
                for ((row, g), d_x) in rows.zip(d_x.chunks_exact_mut(d)) {
                    let r = inverse_rms(row, eps);
                    // mean(ĝ·x̂) = r · Σ g·w·x / d
                    let sum = lanes::dot3(g, scale, row);
                    let projection = r * sum / d as f32;
                    for j in 0..d {
                        let normed = row[j] * r;
                        d_x[j].write(r * (g[j] * scale[j] - normed * projection));
                        d_w[j] += g[j] * normed;
                    }
                }
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

    use super::RmsNormOps;
    use crate::ops::autodiff::{backward_binary, record_binary};

    #[derive(Debug)]
    struct RmsNormBackward {
        eps: f64,
        unit_offset: bool,
    }

    impl<B: RmsNormOps> Backward<B, 2> for RmsNormBackward {
        /// The input and the weight: the backward recomputes each row's `r`.
        type State = (FloatTensor<B>, FloatTensor<B>);

        fn backward(
            self,
            ops: Ops<Self::State, 2>,
            grads: &mut Gradients,
            _checkpointer: &mut Checkpointer,
        ) {
            backward_binary::<B, _>(ops, grads, |(x, weight), grad| {
                B::rms_norm_backward(x, weight, grad, self.eps, self.unit_offset)
            });
        }
    }

    impl<B: RmsNormOps, C: CheckpointStrategy> RmsNormOps for Autodiff<B, C> {
        fn rms_norm(
            x: FloatTensor<Self>,
            weight: FloatTensor<Self>,
            eps: f64,
            unit_offset: bool,
        ) -> FloatTensor<Self> {
            let backward = RmsNormBackward { eps, unit_offset };
            record_binary::<B, C, _>(backward, x, weight, |x, weight| {
                B::rms_norm(x, weight, eps, unit_offset)
            })
        }

        fn rms_norm_backward(
            x: FloatTensor<Self>,
            weight: FloatTensor<Self>,
            grad: FloatTensor<Self>,
            eps: f64,
            unit_offset: bool,
        ) -> (FloatTensor<Self>, FloatTensor<Self>) {
            // Gradients of gradients are not supported: the results are constants.
            let (d_x, d_weight) = B::rms_norm_backward(
                x.into_primitive(),
                weight.into_primitive(),
                grad.into_primitive(),
                eps,
                unit_offset,
            );
            (
                <FloatTensor<Self>>::new(d_x),
                <FloatTensor<Self>>::new(d_weight),
            )
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_utils::{assert_close, test_devices};
    use burn::tensor::{Distribution, Tensor};

    /// The naive composition, in f32.
    fn composed<const D: usize>(
        x: Tensor<D>,
        weight: Tensor<1>,
        eps: f64,
        unit_offset: bool,
    ) -> Tensor<D> {
        let mean_square = x.clone().square().mean_dim(D - 1);
        let scale = if unit_offset { weight + 1.0 } else { weight };
        x * (mean_square + eps).sqrt().recip() * scale.unsqueeze::<D>()
    }

    /// Forward and both gradients against the composition on flex, for rows shorter
    /// and longer than one vector and a row count split into parallel tasks with a
    /// ragged last one; on devices without the fused op, `fused_rms_norm` declines.
    #[test]
    fn matches_the_composed_ops_forward_and_backward() {
        for device in test_devices() {
            let device = device.autodiff();
            let cases = [
                ([2, 3, 5], 5, 1e-6, false),
                ([3, 700, 40], 40, 1e-5, false),
                ([1, 9, 130], 130, 0.0, true),
            ];
            for (shape, d, eps, unit_offset) in cases {
                let draw = |shape: [usize; 3], mean: f64| {
                    Tensor::<3>::random(shape, Distribution::Normal(mean, 1.0), &device)
                };
                let (x, out_weight) = (draw(shape, 0.3), draw(shape, 0.0));
                let weight = Tensor::<1>::random([d], Distribution::Normal(1.0, 0.5), &device);
                let run = |fused: bool| {
                    let (x, w) = (x.clone().require_grad(), weight.clone().require_grad());
                    let y = if fused {
                        fused_rms_norm(x.clone(), w.clone(), eps, unit_offset)?
                    } else {
                        composed(x.clone(), w.clone(), eps, unit_offset)
                    };
                    let grads = (y.clone() * out_weight.clone()).sum().backward();
                    Some((
                        y.inner(),
                        x.grad(&grads).expect("x gradient"),
                        w.grad(&grads).expect("weight gradient"),
                    ))
                };
                let Some((y, d_x, d_w)) = run(true) else {
                    assert!(!runs_fused_on_cpu(&device, x.dtype()), "flex runs it fused");
                    continue;
                };
                let (y_ref, d_x_ref, d_w_ref) = run(false).expect("composed");
                assert_close(y, y_ref, 1e-5, "rms norm");
                assert_close(d_x, d_x_ref, 1e-5, "rms norm d_x");
                // The weight gradient sums every row (2100 in the second case), in task
                // order here and in one pass there: f32 rounding grows with the sum's
                // magnitude, so the bound is relative to it.
                let magnitude = d_w_ref.clone().abs().max().into_scalar::<f32>();
                assert_close(d_w, d_w_ref, 1e-5 * magnitude.max(1.0), "rms norm d_weight");
            }
        }
    }
}
