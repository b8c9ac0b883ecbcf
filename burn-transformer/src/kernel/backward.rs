//! The backward pass: the `Autodiff<B, C>` implementation of the op (it saves only
//! `q, k, v, O, LSE` and calls the backend's fused backward) and the launch of the
//! CubeCL backward kernels.
//!
//! The CubeCL backward runs three kernels:
//! 1. a pre-pass writing `(LSE, D)` per query row, `D = rowsum(dO ∘ O)`;
//! 2. a key/value-block kernel accumulating `dK, dV` (one unit per key, looping over
//!    every query row block of every query head of its group: no atomics);
//! 3. a query-block kernel accumulating `dQ` over key blocks.
//!
//! Both 2 and 3 recompute `P = exp(S − LSE)` from the scores; no `seq_q × seq_k`
//! buffer exists. The results do not depend on scheduling (each output element is
//! summed by one unit in a fixed order), so they are deterministic.

use burn::backend::Autodiff;
use burn::backend::autodiff::checkpoint::base::Checkpointer;
use burn::backend::autodiff::checkpoint::strategy::CheckpointStrategy;
use burn::backend::autodiff::grads::Gradients;
use burn::backend::autodiff::ops::{Backward, Ops, OpsKind};
use burn::backend::tensor::FloatTensor;

use super::{FlashAttentionOps, FlashOptions};

/// The saved state of one forward: inputs, output, log-sum-exp, key mask, options.
type SavedState<B> = (
    FloatTensor<B>,
    FloatTensor<B>,
    FloatTensor<B>,
    FloatTensor<B>,
    FloatTensor<B>,
    FloatTensor<B>,
    FlashOptions,
);

/// The backward step of the fused op in the autodiff graph; parents are q, k, v.
#[derive(Debug)]
struct FlashAttentionBackward;

impl<B: FlashAttentionOps> Backward<B, 3> for FlashAttentionBackward {
    type State = SavedState<B>;

    fn backward(
        self,
        ops: Ops<Self::State, 3>,
        grads: &mut Gradients,
        _checkpointer: &mut Checkpointer,
    ) {
        let grad_output = grads.consume::<B>(&ops.node);
        let (q, k, v, output, lse, key_mask, options) = ops.state;
        let (dq, dk, dv) =
            B::flash_attention_backward(q, k, v, output, lse, grad_output, key_mask, options);
        let [node_q, node_k, node_v] = ops.parents;
        for (node, grad) in [(node_q, dq), (node_k, dk), (node_v, dv)] {
            if let Some(node) = node {
                grads.register::<B>(node.id, grad);
            }
        }
    }
}

impl<B: FlashAttentionOps, C: CheckpointStrategy> FlashAttentionOps for Autodiff<B, C> {
    fn flash_attention_forward(
        q: FloatTensor<Self>,
        k: FloatTensor<Self>,
        v: FloatTensor<Self>,
        key_mask: FloatTensor<Self>,
        options: FlashOptions,
    ) -> (FloatTensor<Self>, FloatTensor<Self>) {
        let nodes = [q.node(), k.node(), v.node()];
        let q = q.into_primitive();
        let k = k.into_primitive();
        let v = v.into_primitive();
        // The padding mask is a constant: never differentiated.
        let key_mask = key_mask.into_primitive();
        let (output, lse) =
            B::flash_attention_forward(q.clone(), k.clone(), v.clone(), key_mask.clone(), options);
        let output = match FlashAttentionBackward
            .prepare::<C>(nodes)
            .compute_bound()
            .stateful()
        {
            OpsKind::Tracked(prep) => prep.finish(
                (q, k, v, output.clone(), lse.clone(), key_mask, options),
                output,
            ),
            OpsKind::UnTracked(prep) => prep.finish(output),
        };
        // The log-sum-exp is a by-product: it is not differentiated.
        (output, <FloatTensor<Self>>::new(lse))
    }

    fn flash_attention_backward(
        q: FloatTensor<Self>,
        k: FloatTensor<Self>,
        v: FloatTensor<Self>,
        output: FloatTensor<Self>,
        lse: FloatTensor<Self>,
        grad_output: FloatTensor<Self>,
        key_mask: FloatTensor<Self>,
        options: FlashOptions,
    ) -> (FloatTensor<Self>, FloatTensor<Self>, FloatTensor<Self>) {
        // Gradients of gradients are not supported: the results are constants.
        let (dq, dk, dv) = B::flash_attention_backward(
            q.into_primitive(),
            k.into_primitive(),
            v.into_primitive(),
            output.into_primitive(),
            lse.into_primitive(),
            grad_output.into_primitive(),
            key_mask.into_primitive(),
            options,
        );
        (
            <FloatTensor<Self>>::new(dq),
            <FloatTensor<Self>>::new(dk),
            <FloatTensor<Self>>::new(dv),
        )
    }
}

#[cfg(feature = "cube")]
pub(super) use cube::backward;

#[cfg(feature = "cube")]
mod cube {
    use burn::backend::TensorMetadata;
    use burn::backend::cubecl::dtype_to_storage_type;
    use burn::tensor::{DType, Shape};
    use burn_cubecl::kernel::into_contiguous;
    use burn_cubecl::ops::numeric::empty_device_contiguous_dtype;
    use burn_cubecl::tensor::CubeTensor;
    use cubecl::calculate_cube_count_elemwise;
    use cubecl::prelude::*;

    use super::super::forward::{config, plan_or_panic, sizes};
    use super::super::kernel;
    use super::super::{FlashOptions, Problem};

    /// Runs the backward kernels: `(dq, dk, dv)`.
    ///
    /// # Shapes
    /// See [`super::super::FlashAttentionOps::flash_attention_backward`].
    #[allow(clippy::too_many_arguments)]
    pub fn backward(
        q: CubeTensor,
        k: CubeTensor,
        v: CubeTensor,
        output: CubeTensor,
        lse: CubeTensor,
        grad_output: CubeTensor,
        key_mask: CubeTensor,
        options: &FlashOptions,
    ) -> (CubeTensor, CubeTensor, CubeTensor) {
        let q = into_contiguous(q);
        let k = into_contiguous(k);
        let v = into_contiguous(v);
        let output = into_contiguous(output);
        let lse = into_contiguous(lse);
        let grad_output = into_contiguous(grad_output);
        let key_mask = into_contiguous(key_mask);
        let problem = Problem::from_shapes(&q.shape(), &k.shape(), &v.shape(), options);
        let tiling = plan_or_panic(&problem, &q);
        let client = q.client.clone();
        let device = q.device.clone();
        let dtype = q.dtype;
        let storage = dtype_to_storage_type(dtype);
        // Dense buffers, as the kernels index them (see `forward::forward`).
        let empty = |shape: Shape, dtype: DType| {
            empty_device_contiguous_dtype(client.clone(), device.clone(), shape, dtype)
        };

        // 1. (LSE, D) per query row.
        let rows = problem.batch * problem.heads * problem.seq_q;
        let stats = empty(
            Shape::new([problem.batch, problem.heads, problem.seq_q, 2]),
            DType::F32,
        );
        let cube_dim = CubeDim::new_1d(256);
        let cube_count = calculate_cube_count_elemwise(&client, rows, cube_dim);
        // SAFETY: the kernel checks `row < rows` and the tensors hold `rows` rows.
        unsafe {
            kernel::flash_backward_stats::launch_unchecked(
                &client,
                cube_count,
                cube_dim,
                tiling.vector_size,
                output.into_tensor_arg(),
                grad_output.clone().into_tensor_arg(),
                lse.into_tensor_arg(),
                stats.clone().into_tensor_arg(),
                rows as u32,
                problem.d_v / tiling.vector_size,
                storage,
            );
        }

        // 2. dK, dV: one unit per key.
        let grad_k = empty(k.shape(), dtype);
        let grad_v = empty(v.shape(), dtype);
        let tile = tiling.backward_kv;
        let kv_config = config(&problem, tiling.vector_size, &tile);
        let cube_count = CubeCount::Static(
            problem.seq_k.div_ceil(tile.cube_rows()) as u32,
            (problem.batch * problem.kv_heads) as u32,
            1,
        );
        // SAFETY: indices are bounded by the problem sizes of these contiguous tensors.
        unsafe {
            kernel::flash_backward_kv::launch_unchecked(
                &client,
                cube_count,
                CubeDim::new_1d(tile.units as u32),
                tiling.vector_size,
                q.clone().into_tensor_arg(),
                k.clone().into_tensor_arg(),
                v.clone().into_tensor_arg(),
                grad_output.clone().into_tensor_arg(),
                stats.clone().into_tensor_arg(),
                key_mask.clone().into_tensor_arg(),
                grad_k.clone().into_tensor_arg(),
                grad_v.clone().into_tensor_arg(),
                sizes(&problem, options),
                kv_config,
                storage,
            );
        }

        // 3. dQ: one unit per query row.
        let grad_q = empty(q.shape(), dtype);
        let tile = tiling.backward_q;
        let q_config = config(&problem, tiling.vector_size, &tile);
        let cube_count = CubeCount::Static(
            problem.seq_q.div_ceil(tile.cube_rows()) as u32,
            (problem.batch * problem.heads) as u32,
            1,
        );
        // SAFETY: indices are bounded by the problem sizes of these contiguous tensors.
        unsafe {
            kernel::flash_backward_q::launch_unchecked(
                &client,
                cube_count,
                CubeDim::new_1d(tile.units as u32),
                tiling.vector_size,
                q.into_tensor_arg(),
                k.into_tensor_arg(),
                v.into_tensor_arg(),
                grad_output.into_tensor_arg(),
                stats.into_tensor_arg(),
                key_mask.into_tensor_arg(),
                grad_q.clone().into_tensor_arg(),
                sizes(&problem, options),
                q_config,
                storage,
            );
        }
        (grad_q, grad_k, grad_v)
    }
}
