//! Clipping the gradient by its global norm (Pascanu et al. 2013), as PyTorch's
//! `clip_grad_norm_` and nanoGPT do: all gradients are scaled by one factor so that
//! their joint L2 norm is at most `max_norm`. (Burn's optimizer-level
//! `GradientClipping::Norm` clips each parameter's gradient separately, which
//! changes the update's direction.)
//!
//! The factor stays a tensor: clipping adds no device-to-host synchronization.

use burn::module::{Module, ModuleVisitor, Param};
use burn::optim::GradientsParams;
use burn::tensor::Tensor;

/// Scales `grads` so their global L2 norm is at most `max_norm`; returns the norm
/// before clipping.
///
/// # Shapes
/// - output: `[1]`
pub fn clip_grad_norm<M: Module>(
    module: &M,
    grads: &mut GradientsParams,
    max_norm: f64,
) -> Option<Tensor<1>> {
    let norm = grad_norm(module, grads)?;
    // min(1, max_norm / (norm + 1e-6)), PyTorch's coefficient.
    let factor = (norm.clone().add_scalar(1e-6).recip() * max_norm).clamp_max(1.0);
    module.visit(&mut Scale { grads, factor });
    Some(norm)
}

/// The global L2 norm of the gradients of `module`'s parameters; `None` without any.
///
/// # Shapes
/// - output: `[1]`
pub(crate) fn grad_norm<M: Module>(module: &M, grads: &GradientsParams) -> Option<Tensor<1>> {
    let mut squares = SumOfSquares { grads, total: None };
    module.visit(&mut squares);
    Some(squares.total?.sqrt())
}

/// Multiplies every gradient of `module`'s parameters by `factor`.
pub(crate) fn scale_grads<M: Module>(module: &M, grads: &mut GradientsParams, factor: f64) {
    let Some(norm) = grad_norm(module, grads) else {
        return;
    };
    let factor = norm.zeros_like().add_scalar(factor);
    module.visit(&mut Scale { grads, factor });
}

struct SumOfSquares<'a> {
    grads: &'a GradientsParams,
    total: Option<Tensor<1>>,
}

impl ModuleVisitor for SumOfSquares<'_> {
    fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<D>>) {
        if let Some(grad) = self.grads.get::<D>(param.id) {
            let squares = grad.square().sum();
            self.total = Some(match self.total.take() {
                Some(total) => total + squares,
                None => squares,
            });
        }
    }
}

struct Scale<'a> {
    grads: &'a mut GradientsParams,
    factor: Tensor<1>,
}

impl ModuleVisitor for Scale<'_> {
    fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<D>>) {
        if let Some(grad) = self.grads.remove::<D>(param.id) {
            let factor = self
                .factor
                .clone()
                .to_device(&grad.device())
                .unsqueeze::<D>();
            self.grads.register(param.id, grad * factor);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_utils::test_devices;
    use burn::nn::{Linear, LinearConfig};

    #[test]
    fn scales_all_gradients_by_one_factor() {
        for device in test_devices() {
            let autodiff = device.clone().autodiff();
            let linear: Linear = LinearConfig::new(3, 2).init(&autodiff);
            let x = Tensor::<2>::ones([4, 3], &autodiff);
            let loss = linear.forward(x).sum() * 10.0;
            let mut grads = GradientsParams::from_grads(loss.backward(), &linear);
            // The weight's and the bias's gradients, and their global L2 norm.
            let gradients = |grads: &GradientsParams| {
                let weight: Vec<f32> = grads
                    .get::<2>(linear.weight.id)
                    .unwrap()
                    .try_to_vec_as()
                    .unwrap();
                let bias: Vec<f32> = grads
                    .get::<1>(linear.bias.as_ref().unwrap().id)
                    .unwrap()
                    .try_to_vec_as()
                    .unwrap();
                let norm = weight
                    .iter()
                    .chain(&bias)
                    .map(|g| (*g as f64).powi(2))
                    .sum::<f64>()
                    .sqrt();
                (weight, bias, norm)
            };
            let (before_w, before_b, norm_expected) = gradients(&grads);
            let norm: f32 = clip_grad_norm(&linear, &mut grads, 1.0)
                .unwrap()
                .into_scalar();
            assert!((norm as f64 - norm_expected).abs() < 1e-3 * norm_expected);
            let (after_w, after_b, after_norm) = gradients(&grads);
            assert!((after_norm - 1.0).abs() < 1e-4, "clipped norm {after_norm}");
            let factor = after_w[0] as f64 / before_w[0] as f64;
            assert!((after_b[0] as f64 / before_b[0] as f64 - factor).abs() < 1e-5);
            // A norm below the limit is left alone.
            let mut again = grads;
            let _ = clip_grad_norm(&linear, &mut again, 10.0);
            let (kept, _, _) = gradients(&again);
            for (a, b) in kept.iter().zip(&after_w) {
                assert!((a - b).abs() < 1e-6);
            }
        }
    }
}
