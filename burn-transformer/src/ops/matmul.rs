//! `lhs · rhs` over the last two axes, batched over the leading ones, with flex's
//! products written straight into their output.
//!
//! On flex (f32) each matrix of the batch is one `gemm` call that writes into a new
//! uninitialized buffer; flex's own matmul zeroes its output and copies it once more
//! into an aligned one, which at a small model's training-step shapes costs a few
//! percent of the step (the projections and the attention's score and value
//! products). Factors may be strided views (a transpose, swapped axes): they are read
//! in place, never copied. Under autodiff the two gradients are the same op
//! (`d lhs = grad · rhsᵀ`, `d rhs = lhsᵀ · grad`, transposes as views). Other
//! backends run Burn's `matmul`.

use burn::backend::Dispatch;
use burn::tensor::Tensor;

use super::simd::runs_fused_on_cpu;

pub(crate) use ops::MatmulOps;

/// The extension trait lives in its own module so that the attribute's generated code
/// stays apart from the kernels.
mod ops {
    use burn::backend::tensor::FloatTensor;
    use burn::backend::{Backend, backend_extension};

    /// A batched matrix product as a backend extension: one `gemm` call per matrix on
    /// flex, its two products backward under autodiff. Other backends are not listed:
    /// [`super::matmul`] only calls it on flex.
    #[backend_extension(Flex: cfg(feature = "flex"), Autodiff)]
    pub(crate) trait MatmulOps: Backend {
        /// `lhs · rhs` for each index of the leading axes; either factor may be a
        /// strided view.
        ///
        /// # Shapes
        /// - lhs: `[..batch, m, k]`, f32
        /// - rhs: `[..batch, k, n]`, f32, the same leading axes as `lhs`
        /// - output: `[..batch, m, n]`, contiguous
        fn batched_matmul(lhs: FloatTensor<Self>, rhs: FloatTensor<Self>) -> FloatTensor<Self>;
    }
}

/// `lhs · rhs` over the last two axes for each index of the leading ones (which the
/// two factors share: no broadcasting).
///
/// # Shapes
/// - lhs: `[..batch, m, k]`
/// - rhs: `[..batch, k, n]`
/// - output: `[..batch, m, n]`
///
/// # Panics
/// If the leading axes or the inner dimensions differ.
pub fn matmul<const D: usize>(lhs: Tensor<D>, rhs: Tensor<D>) -> Tensor<D> {
    let (lhs_dims, rhs_dims) = (lhs.dims(), rhs.dims());
    assert!(
        D >= 2 && lhs_dims[..D - 2] == rhs_dims[..D - 2] && lhs_dims[D - 1] == rhs_dims[D - 2],
        "matmul: {lhs_dims:?} · {rhs_dims:?} (the leading axes must match, and lhs's \
         last axis rhs's second to last)"
    );
    if runs_fused_on_cpu(&lhs.device(), lhs.dtype()) && rhs.dtype() == lhs.dtype() {
        Tensor::from_dispatch(Dispatch::batched_matmul(
            lhs.into_dispatch(),
            rhs.into_dispatch(),
        ))
    } else {
        lhs.matmul(rhs)
    }
}

#[cfg(feature = "flex")]
mod flex {
    use std::mem::MaybeUninit;

    use burn::backend::Flex;
    use burn::backend::flex::FlexTensor;
    use burn::backend::tensor::FloatTensor;
    use burn::tensor::TensorData;
    use rayon::prelude::*;

    use super::MatmulOps;

    /// Multiply-adds from which a product is split over the rayon pool (below it the
    /// hand-off costs more than it saves): one large product splits inside `gemm`,
    /// a batch of small ones across its matrices.
    const PARALLEL_WORK: usize = 1 << 21;

    impl MatmulOps for Flex {
        fn batched_matmul(lhs: FloatTensor<Self>, rhs: FloatTensor<Self>) -> FloatTensor<Self> {
            let a = Factor::of(&lhs);
            let b = Factor::of(&rhs);
            assert!(
                a.batch_dims == b.batch_dims && a.cols == b.rows,
                "batched_matmul: {:?} · {:?}",
                lhs.layout().shape(),
                rhs.layout().shape()
            );
            let (m, k, n) = (a.rows, a.cols, b.cols);
            let batch = a.batch_dims.iter().product::<usize>();
            let size = m * n;
            let mut out = Vec::<f32>::with_capacity(batch * size);
            if k == 0 {
                out.resize(batch * size, 0.0);
            } else if size > 0 {
                let matrices = out.spare_capacity_mut();
                let work = size * k;
                if batch > 1 && work < PARALLEL_WORK && batch * work >= PARALLEL_WORK {
                    matrices
                        .par_chunks_mut(size)
                        .enumerate()
                        .for_each(|(index, c)| product(&a, &b, index, c, gemm::Parallelism::None));
                } else {
                    let parallelism = if work >= PARALLEL_WORK {
                        gemm::Parallelism::Rayon(0)
                    } else {
                        gemm::Parallelism::None
                    };
                    for (index, c) in matrices.chunks_mut(size).enumerate() {
                        product(&a, &b, index, c, parallelism);
                    }
                }
                // SAFETY: every matrix of the batch was written whole by `product`.
                unsafe { out.set_len(batch * size) };
            }
            let mut dims = a.batch_dims;
            dims.extend([m, n]);
            FlexTensor::from_data(TensorData::new(out, dims))
        }
    }

    /// One factor as `gemm` reads it: a batch of `rows × cols` matrices at strides.
    struct Factor<'a> {
        values: &'a [f32],
        batch_dims: Vec<usize>,
        /// Offset of each matrix's first element in `values`, in batch order.
        starts: Vec<isize>,
        rows: usize,
        cols: usize,
        row_stride: isize,
        col_stride: isize,
    }

    impl<'a> Factor<'a> {
        fn of(tensor: &'a FlexTensor) -> Self {
            let layout = tensor.layout();
            let (shape, strides) = (layout.shape(), layout.strides());
            let rank = shape.num_dims();
            assert!(rank >= 2, "batched_matmul takes matrices");
            let batch_dims: Vec<usize> = (0..rank - 2).map(|axis| shape[axis]).collect();
            // The batch in row-major order: the last leading axis varies fastest.
            let mut starts = vec![layout.start_offset() as isize];
            for (axis, &dim) in batch_dims.iter().enumerate() {
                starts = starts
                    .iter()
                    .flat_map(|&start| (0..dim).map(move |i| start + i as isize * strides[axis]))
                    .collect();
            }
            Self {
                values: tensor.storage::<f32>(),
                batch_dims,
                starts,
                rows: shape[rank - 2],
                cols: shape[rank - 1],
                row_stride: strides[rank - 2],
                col_stride: strides[rank - 1],
            }
        }

        fn matrix(&self, index: usize) -> *const f32 {
            // SAFETY: the offset addresses the matrix's first element inside
            // `values` (flex's layouts keep every element a view reaches in its
            // buffer).
            unsafe { self.values.as_ptr().offset(self.starts[index]) }
        }
    }

    /// Writes matrix `index` of `a · b` into `c` (`m × n`, row-major), all of it.
    fn product(
        a: &Factor,
        b: &Factor,
        index: usize,
        c: &mut [MaybeUninit<f32>],
        parallelism: gemm::Parallelism,
    ) {
        let (m, k, n) = (a.rows, a.cols, b.cols);
        assert_eq!(c.len(), m * n, "batched_matmul: output matrix");
        // SAFETY: the factors' pointers start at their matrices' first elements and
        // every offset their strides reach for `m × k` and `k × n` lies in their
        // buffers (flex's layouts); `c` has room for `m·n` values, all of which the
        // call writes (`read_dst = false` never reads them).
        unsafe {
            gemm::gemm(
                m,
                n,
                k,
                c.as_mut_ptr().cast::<f32>(),
                1,
                n as isize,
                false,
                a.matrix(index),
                a.col_stride,
                a.row_stride,
                b.matrix(index),
                b.col_stride,
                b.row_stride,
                0.0,
                1.0,
                false,
                false,
                false,
                parallelism,
            );
        }
    }
}

mod autodiff {
    use burn::backend::autodiff::checkpoint::base::Checkpointer;
    use burn::backend::autodiff::checkpoint::strategy::CheckpointStrategy;
    use burn::backend::autodiff::grads::Gradients;
    use burn::backend::autodiff::ops::{Backward, Ops};
    use burn::backend::tensor::FloatTensor;
    use burn::backend::{Autodiff, TensorMetadata};

    use super::MatmulOps;
    use crate::ops::autodiff::record_binary;

    #[derive(Debug)]
    struct MatmulBackward;

    /// The factor with its two matrix axes swapped: a view.
    fn transposed<B: MatmulOps>(tensor: FloatTensor<B>) -> FloatTensor<B> {
        let rank = tensor.shape().num_dims();
        B::float_swap_dims(tensor, rank - 2, rank - 1)
    }

    impl<B: MatmulOps> Backward<B, 2> for MatmulBackward {
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
            if let Some(node) = node_lhs {
                let d_lhs = B::batched_matmul(grad.clone(), transposed::<B>(rhs));
                grads.register::<B>(node.id, d_lhs);
            }
            if let Some(node) = node_rhs {
                let d_rhs = B::batched_matmul(transposed::<B>(lhs), grad);
                grads.register::<B>(node.id, d_rhs);
            }
        }
    }

    impl<B: MatmulOps, C: CheckpointStrategy> MatmulOps for Autodiff<B, C> {
        fn batched_matmul(lhs: FloatTensor<Self>, rhs: FloatTensor<Self>) -> FloatTensor<Self> {
            record_binary::<B, C, _>(MatmulBackward, lhs, rhs, B::batched_matmul)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_utils::{assert_close, test_devices};
    use burn::tensor::Distribution;

    /// Output and both gradients equal Burn's `matmul` on every test device (flex runs
    /// its own products): matrices, a batch with a transposed view as the right
    /// factor (the attention's `q · kᵀ`), and a batch large enough to split over
    /// its matrices.
    #[test]
    fn matches_burns_matmul_forward_and_backward() {
        for device in test_devices() {
            let device = device.autodiff();
            let draw = |dims: [usize; 4]| {
                Tensor::<4>::random(dims, Distribution::Normal(0.0, 1.0), &device)
            };
            // (lhs dims, rhs dims as stored, whether rhs is used transposed)
            for (lhs_dims, rhs_dims, transpose) in [
                ([1, 1, 7, 12], [1, 1, 12, 5], false),
                ([2, 3, 17, 8], [2, 3, 9, 8], true),
                ([4, 16, 64, 32], [4, 16, 32, 64], false),
            ] {
                let lhs = draw(lhs_dims);
                let rhs = draw(rhs_dims);
                let n = if transpose { rhs_dims[2] } else { rhs_dims[3] };
                let weight = draw([lhs_dims[0], lhs_dims[1], lhs_dims[2], n]);
                let run = |ours: bool| {
                    let (lhs, rhs) = (lhs.clone().require_grad(), rhs.clone().require_grad());
                    let right = if transpose {
                        rhs.clone().swap_dims(2, 3)
                    } else {
                        rhs.clone()
                    };
                    let y = if ours {
                        matmul(lhs.clone(), right)
                    } else {
                        lhs.clone().matmul(right)
                    };
                    let grads = (y.clone() * weight.clone()).sum().backward();
                    (
                        y.inner(),
                        lhs.grad(&grads).expect("lhs gradient"),
                        rhs.grad(&grads).expect("rhs gradient"),
                    )
                };
                let (y, d_lhs, d_rhs) = run(true);
                let (y_ref, d_lhs_ref, d_rhs_ref) = run(false);
                assert_close(y, y_ref, 1e-4, "matmul output");
                assert_close(d_lhs, d_lhs_ref, 1e-4, "matmul d lhs");
                assert_close(d_rhs, d_rhs_ref, 1e-4, "matmul d rhs");
            }
        }
    }
}
