//! `x · W + b` with every leading dim of `x` folded into the rows.
//!
//! Burn's `Linear` multiplies a `[batch, seq, d_in]` input as `batch` products of
//! `seq` rows against the shared weight whenever `seq` already fills its row tiles,
//! and under autodiff the weight's gradient is then `batch` products summed over the
//! broadcast. Folding the rows first makes each of the three products one matrix
//! product (`y = x·W`, `dx = dy·Wᵀ`, `dW = xᵀ·dy`), which is what a training step's
//! projections are: on flex, one large GEMM instead of `batch` small ones and no
//! per-batch weight gradients to sum. The result is the same function.

use burn::nn::Linear;
use burn::tensor::Tensor;

/// Applies `linear` (weight `[d_in, d_out]`, optional bias `[d_out]`) to `x` as one
/// matrix product over all of its rows.
///
/// # Shapes
/// - x: `[..., d_in]`
/// - output: `[..., d_out]`
pub fn linear_rows<const D: usize>(linear: &Linear, x: Tensor<D>) -> Tensor<D> {
    if D <= 2 {
        return linear.forward(x);
    }
    let dims = x.dims();
    let d_in = dims[D - 1];
    let rows = dims[..D - 1].iter().product::<usize>();
    let y = linear.forward(x.reshape([rows, d_in])); // [rows, d_out]
    let mut out_dims = dims;
    out_dims[D - 1] = y.dims()[1];
    y.reshape(out_dims)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_utils::{assert_close, test_devices};
    use burn::nn::LinearConfig;
    use burn::tensor::Distribution;

    /// Output and the gradients of input, weight and bias equal Burn's `Linear` on
    /// the unfolded input, on every test device.
    #[test]
    fn matches_burns_linear_forward_and_backward() {
        for device in test_devices() {
            let device = device.autodiff();
            let linear = LinearConfig::new(24, 40).init(&device);
            let x = Tensor::<3>::random([3, 16, 24], Distribution::Normal(0.0, 1.0), &device);
            let weight = Tensor::<3>::random([3, 16, 40], Distribution::Normal(0.0, 1.0), &device);
            let run = |folded: bool| {
                let x = x.clone().require_grad();
                let y = if folded {
                    linear_rows(&linear, x.clone())
                } else {
                    linear.forward(x.clone())
                };
                let grads = (y.clone() * weight.clone()).sum().backward();
                let bias = linear.bias.as_ref().expect("bias");
                (
                    y.inner(),
                    x.grad(&grads).expect("x gradient"),
                    linear.weight.grad(&grads).expect("weight gradient"),
                    bias.grad(&grads).expect("bias gradient"),
                )
            };
            let (y, dx, dw, db) = run(true);
            let (y_ref, dx_ref, dw_ref, db_ref) = run(false);
            assert_close(y, y_ref, 1e-5, "linear_rows output");
            assert_close(dx, dx_ref, 1e-5, "linear_rows dx");
            assert_close(dw, dw_ref, 1e-4, "linear_rows dW");
            assert_close(db, db_ref, 1e-4, "linear_rows db");
        }
    }
}
