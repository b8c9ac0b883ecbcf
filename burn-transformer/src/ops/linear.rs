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
//! On flex (f32) the products are one `gemm` call each that writes into a new
//! uninitialized buffer: flex's own matmul output is a zeroed buffer copied once more
//! into an aligned one, which at a training step's shapes costs about a tenth of the
//! step. Transposed factors are strided views, never copies.

use burn::backend::Dispatch;
use burn::nn::Linear;
use burn::tensor::Tensor;

use super::simd::runs_fused_on_cpu;

pub(crate) use ops::RowsMatmulOps;

/// The extension trait lives in its own module so that the attribute's generated code
/// stays apart from the kernels.
mod ops {
    use burn::backend::tensor::FloatTensor;
    use burn::backend::{Backend, backend_extension};

    /// A 2-D matrix product as a backend extension: one `gemm` call on flex, its
    /// two products backward under autodiff. Other backends are not listed:
    /// [`super::linear_rows`] and [`super::matmul_rows`] only call it on flex.
    #[backend_extension(Flex: cfg(feature = "flex"), Autodiff)]
    pub(crate) trait RowsMatmulOps: Backend {
        /// `lhs · rhs`; either factor may be a strided view (a transpose).
        ///
        /// # Shapes
        /// - lhs: `[m, k]`, f32
        /// - rhs: `[k, n]`, f32
        /// - output: `[m, n]`, contiguous
        fn rows_matmul(lhs: FloatTensor<Self>, rhs: FloatTensor<Self>) -> FloatTensor<Self>;
    }
}

/// Applies `linear` (weight `[d_in, d_out]`, optional bias `[d_out]`) to `x` as one
/// matrix product over all of its rows.
///
/// # Shapes
/// - x: `[..., d_in]`
/// - output: `[..., d_out]`
pub fn linear_rows<const D: usize>(linear: &Linear, x: Tensor<D>) -> Tensor<D> {
    on_rows(x, |x| {
        if runs_fused(&x, &linear.weight.val()) {
            let y = rows_matmul(x, linear.weight.val());
            match &linear.bias {
                Some(bias) => y + bias.val().unsqueeze_dim(0),
                None => y,
            }
        } else {
            linear.forward(x)
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
    on_rows(x, |x| {
        if runs_fused(&x, &weight) {
            rows_matmul(x, weight)
        } else {
            x.matmul(weight)
        }
    })
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

/// Whether the product of `x` and `weight` runs as flex's own `gemm` call.
fn runs_fused(x: &Tensor<2>, weight: &Tensor<2>) -> bool {
    runs_fused_on_cpu(&x.device(), x.dtype()) && weight.dtype() == x.dtype()
}

fn rows_matmul(x: Tensor<2>, weight: Tensor<2>) -> Tensor<2> {
    Tensor::from_dispatch(Dispatch::rows_matmul(
        x.into_dispatch(),
        weight.into_dispatch(),
    ))
}

#[cfg(feature = "flex")]
mod flex {
    use burn::backend::Flex;
    use burn::backend::flex::FlexTensor;
    use burn::backend::tensor::FloatTensor;
    use burn::tensor::TensorData;

    use super::RowsMatmulOps;

    /// Multiply-adds from which the product is split over the rayon pool (below it
    /// the hand-off costs more than it saves).
    const PARALLEL_WORK: usize = 1 << 21;

    impl RowsMatmulOps for Flex {
        fn rows_matmul(lhs: FloatTensor<Self>, rhs: FloatTensor<Self>) -> FloatTensor<Self> {
            let (m, k) = matrix_dims(&lhs);
            let (k_rhs, n) = matrix_dims(&rhs);
            assert_eq!(k, k_rhs, "rows_matmul: [{m}, {k}] · [{k_rhs}, {n}]");
            let mut out = Vec::<f32>::with_capacity(m * n);
            if k == 0 {
                out.resize(m * n, 0.0);
            } else if m * n > 0 {
                let (lhs_rows, lhs_cols) = matrix_strides(&lhs);
                let (rhs_rows, rhs_cols) = matrix_strides(&rhs);
                let parallelism = if m * n * k >= PARALLEL_WORK {
                    gemm::Parallelism::Rayon(0)
                } else {
                    gemm::Parallelism::None
                };
                // SAFETY: the factors' pointers start at their views' first elements
                // and every offset the strides reach lies in their buffers (flex's
                // layouts); `out` has room for `m·n` values, all of which the call
                // writes (`read_dst = false` never reads them), so setting its length
                // afterwards exposes initialized values only.
                unsafe {
                    gemm::gemm(
                        m,
                        n,
                        k,
                        out.as_mut_ptr(),
                        1,
                        n as isize,
                        false,
                        first_element(&lhs),
                        lhs_cols,
                        lhs_rows,
                        first_element(&rhs),
                        rhs_cols,
                        rhs_rows,
                        0.0,
                        1.0,
                        false,
                        false,
                        false,
                        parallelism,
                    );
                    out.set_len(m * n);
                }
            }
            FlexTensor::from_data(TensorData::new(out, [m, n]))
        }
    }

    fn matrix_dims(tensor: &FlexTensor) -> (usize, usize) {
        let shape = tensor.layout().shape();
        assert_eq!(shape.num_dims(), 2, "rows_matmul takes matrices");
        (shape[0], shape[1])
    }

    /// `(row stride, column stride)` in elements.
    fn matrix_strides(tensor: &FlexTensor) -> (isize, isize) {
        let strides = tensor.layout().strides();
        (strides[0], strides[1])
    }

    fn first_element(tensor: &FlexTensor) -> *const f32 {
        tensor.storage::<f32>()[tensor.layout().start_offset()..].as_ptr()
    }
}

mod autodiff {
    use burn::backend::Autodiff;
    use burn::backend::autodiff::checkpoint::base::Checkpointer;
    use burn::backend::autodiff::checkpoint::strategy::CheckpointStrategy;
    use burn::backend::autodiff::grads::Gradients;
    use burn::backend::autodiff::ops::{Backward, Ops};
    use burn::backend::tensor::FloatTensor;

    use super::RowsMatmulOps;
    use crate::ops::autodiff::record_binary;

    #[derive(Debug)]
    struct RowsMatmulBackward;

    impl<B: RowsMatmulOps> Backward<B, 2> for RowsMatmulBackward {
        /// The factors.
        type State = (FloatTensor<B>, FloatTensor<B>);

        fn backward(
            self,
            ops: Ops<Self::State, 2>,
            grads: &mut Gradients,
            _checkpointer: &mut Checkpointer,
        ) {
            let grad = grads.consume::<B>(&ops.node);
            let (lhs, rhs) = ops.state;
            let [node_lhs, node_rhs] = ops.parents;
            // d(lhs) = grad · rhsᵀ, d(rhs) = lhsᵀ · grad: transposes are views.
            if let Some(node) = node_lhs {
                let d_lhs = B::rows_matmul(grad.clone(), B::float_swap_dims(rhs, 0, 1));
                grads.register::<B>(node.id, d_lhs);
            }
            if let Some(node) = node_rhs {
                let d_rhs = B::rows_matmul(B::float_swap_dims(lhs, 0, 1), grad);
                grads.register::<B>(node.id, d_rhs);
            }
        }
    }

    impl<B: RowsMatmulOps, C: CheckpointStrategy> RowsMatmulOps for Autodiff<B, C> {
        fn rows_matmul(lhs: FloatTensor<Self>, rhs: FloatTensor<Self>) -> FloatTensor<Self> {
            record_binary::<B, C, _>(RowsMatmulBackward, lhs, rhs, B::rows_matmul)
        }
    }
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
