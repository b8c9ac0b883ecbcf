//! `x · W + b` (and a tied head's `x · Eᵀ`) with every leading dim of `x` folded into
//! the rows.
//!
//! Burn's `Linear` multiplies a `[batch, seq, d_in]` input as `batch` products of
//! `seq` rows against the shared weight whenever `seq` already fills its row tiles,
//! and under autodiff the weight's gradient is then `batch` products summed over the
//! broadcast. Folding the rows first makes each of the three products one matrix
//! product (`y = x·W`, `dx = dy·Wᵀ`, `dW = xᵀ·dy`), which is what a training step's
//! projections are. The result is the same function.
//!
//! The products are [`super::matmul`]'s: on flex one `gemm` call each, written
//! straight into its output (flex's own matmul output is a zeroed buffer copied once
//! more, which at a training step's shapes cost about a tenth of the step), with
//! transposed factors read as strided views.

use burn::nn::Linear;
use burn::tensor::Tensor;

use super::matmul::matmul;

/// Applies `linear` (weight `[d_in, d_out]`, optional bias `[d_out]`) to `x` as one
/// matrix product over all of its rows.
///
/// # Shapes
/// - x: `[..., d_in]`
/// - output: `[..., d_out]`
pub fn linear_rows<const D: usize>(linear: &Linear, x: Tensor<D>) -> Tensor<D> {
    on_rows(x, |x| {
        let y = matmul(x, linear.weight.val());
        match &linear.bias {
            Some(bias) => y + bias.val().unsqueeze_dim(0),
            None => y,
        }
    })
}

/// `x · weight` as one matrix product over all rows of `x`; `weight` may be a
/// transposed view (a tied output head's `Eᵀ`).
///
/// # Shapes
/// - x: `[..., d_in]`
/// - weight: `[d_in, d_out]`
/// - output: `[..., d_out]`
pub fn matmul_rows<const D: usize>(x: Tensor<D>, weight: Tensor<2>) -> Tensor<D> {
    on_rows(x, |x| matmul(x, weight))
}

/// Runs `product` on `x` with its leading dims folded into the rows, and unfolds
/// the result.
fn on_rows<const D: usize>(
    x: Tensor<D>,
    product: impl FnOnce(Tensor<2>) -> Tensor<2>,
) -> Tensor<D> {
    let dims = x.dims();
    let rows = dims[..D - 1].iter().product::<usize>();
    let y = product(x.reshape([rows, dims[D - 1]])); // [rows, d_out]
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
    /// the unfolded input, on every test device (flex runs its own products): a
    /// small layer with a bias, and one large enough that flex splits its products
    /// over threads.
    #[test]
    fn matches_burns_linear_forward_and_backward() {
        for device in test_devices() {
            let device = device.autodiff();
            for (input, d_in, d_out, bias) in [([3, 16], 24, 40, true), ([4, 64], 96, 160, false)] {
                let linear = LinearConfig::new(d_in, d_out).with_bias(bias).init(&device);
                let draw = |dims: [usize; 3]| {
                    Tensor::<3>::random(dims, Distribution::Normal(0.0, 1.0), &device)
                };
                let x = draw([input[0], input[1], d_in]);
                let weight = draw([input[0], input[1], d_out]);
                let run = |folded: bool| {
                    let x = x.clone().require_grad();
                    let y = if folded {
                        linear_rows(&linear, x.clone())
                    } else {
                        linear.forward(x.clone())
                    };
                    let grads = (y.clone() * weight.clone()).sum().backward();
                    (
                        y.inner(),
                        x.grad(&grads).expect("x gradient"),
                        linear.weight.grad(&grads).expect("weight gradient"),
                        linear
                            .bias
                            .as_ref()
                            .map(|b| b.grad(&grads).expect("bias gradient")),
                    )
                };
                let (y, dx, dw, db) = run(true);
                let (y_ref, dx_ref, dw_ref, db_ref) = run(false);
                assert_close(y, y_ref, 1e-4, "linear_rows output");
                assert_close(dx, dx_ref, 1e-4, "linear_rows dx");
                assert_close(dw, dw_ref, 1e-4, "linear_rows dW");
                if let (Some(db), Some(db_ref)) = (db, db_ref) {
                    assert_close(db, db_ref, 1e-4, "linear_rows db");
                }
            }
        }
    }
}
