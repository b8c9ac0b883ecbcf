//! The backward's pre-pass, shared by every kernel family: per query row, the
//! log-sum-exp and `D = rowsum(dO ∘ O)`, which both gradient kernels read.

use cubecl::prelude::*;

/// f32 values per query row of the backward pre-pass's `stats`: `(LSE, D)`.
pub(super) const ROW_STATS: usize = 2;

/// Backward pre-pass: per query row, `stats = (LSE, D)` with `D = rowsum(dO ∘ O)`
/// in f32. Packing both in one `[rows, ROW_STATS]` tensor keeps the backward kernels within
/// 8 storage buffers (the WebGPU default limit).
#[cube(launch_unchecked)]
pub fn flash_backward_stats<F: Float, N: Size>(
    out: &Tensor<Vector<F, N>>,
    grad_out: &Tensor<Vector<F, N>>,
    lse: &Tensor<f32>,
    stats: &mut Tensor<f32>,
    rows: u32,
    #[comptime] v_vectors: usize,
    #[define(F)] _dtype: ElemType,
) {
    let row = ABSOLUTE_POS;
    if row < rows as usize {
        let mut total = 0.0f32;
        #[unroll]
        for c in 0..v_vectors {
            let o = Vector::<f32, N>::cast_from(out[row * v_vectors + c]);
            let d = Vector::<f32, N>::cast_from(grad_out[row * v_vectors + c]);
            total += o.dot(d);
        }
        stats[row * ROW_STATS] = lse[row];
        stats[row * ROW_STATS + 1] = total;
    }
}
