//! The rotation of rotary position embedding, fused on flex: one pass forward and one
//! backward, each moving the heads axis in the same pass.
//!
//! Each pair of features `(a, b)` at position `p` becomes `(a·c − b·s, b·c + a·s)`
//! with `c, s` the cosine and sine of the pair's angle at `p` (scaled by the
//! attention factor of some schedules). Composed from tensor ops that is two slices,
//! four products, a sum, a difference and a concatenation per tensor, and under
//! autodiff a backward node for each (the slices' backward fills zeros and writes
//! into them). The backward of a rotation by `(c, s)` is the rotation by `(c, −s)`,
//! so both directions are one kernel.
//!
//! Queries and keys come out of their projections as `[batch, seq, heads, head_dim]`
//! and attention wants `[batch, heads, seq, head_dim]`: the forward reads the first
//! and writes the second, and the backward writes its gradient back in the
//! projection's order, so neither direction copies to change the layout.

use burn::backend::Dispatch;
use burn::config::Config;
use burn::tensor::Tensor;

use super::simd::runs_fused_on_cpu;

pub(crate) use ops::RotaryOps;

/// Which features of a head form the rotated pairs.
#[derive(Config, Debug, Copy, PartialEq, Eq)]
pub enum RopeLayout {
    /// Feature `i` pairs with `i + rotary_dim/2` (LLaMA's `rotate_half`).
    HalfSplit,
    /// Features `2i` and `2i+1` form a pair (GPT-J's `rotate_every_two`, DeepSeek).
    Interleaved,
}

/// The extension trait lives in its own module so that the attribute's generated code
/// stays apart from the kernels.
mod ops {
    use super::RopeLayout;
    use burn::backend::tensor::FloatTensor;
    use burn::backend::{Backend, backend_extension};

    /// The rotation as a backend extension: native loops on flex, a hand-written
    /// backward under autodiff. Other backends are not listed: [`super::fused_rotary`]
    /// only calls it on flex.
    #[backend_extension(Flex: cfg(feature = "flex"), Autodiff)]
    pub(crate) trait RotaryOps: Backend {
        /// Forward: rotates the first `2 · cos.dims()[1]` features of each head
        /// (the rest pass through) and moves the heads before the positions.
        ///
        /// # Shapes
        /// - x: `[batch, seq, heads, head_dim]`, f32, any strides
        /// - cos, sin: `[seq, rotary_dim / 2]`, f32
        /// - output: `[batch, heads, seq, head_dim]`
        fn rotary(
            x: FloatTensor<Self>,
            cos: FloatTensor<Self>,
            sin: FloatTensor<Self>,
            layout: RopeLayout,
        ) -> FloatTensor<Self>;

        /// Backward: the rotation by the opposite angles, back in the input's order.
        ///
        /// # Shapes
        /// - grad: `[batch, heads, seq, head_dim]`, f32, any strides
        /// - cos, sin: `[seq, rotary_dim / 2]`, f32
        /// - output: `[batch, seq, heads, head_dim]`
        fn rotary_backward(
            grad: FloatTensor<Self>,
            cos: FloatTensor<Self>,
            sin: FloatTensor<Self>,
            layout: RopeLayout,
        ) -> FloatTensor<Self>;
    }
}

/// Rotates `x` by the angles whose cosines and sines are `cos` and `sin`, fused on
/// flex for f32 tensors; `None` where the fused op does not run (the caller then
/// composes it from tensor ops).
///
/// # Shapes
/// - x: `[batch, heads, seq, head_dim]`
/// - cos, sin: `[seq, rotary_dim / 2]` with `rotary_dim ≤ head_dim`
/// - output: `[batch, heads, seq, head_dim]`
pub(crate) fn fused_rotary(
    x: Tensor<4>,
    cos: Tensor<2>,
    sin: Tensor<2>,
    layout: RopeLayout,
) -> Option<Tensor<4>> {
    let dtype = x.dtype();
    if !runs_fused_on_cpu(&x.device(), dtype) || cos.dtype() != dtype || sin.dtype() != dtype {
        return None;
    }
    // [batch, seq, heads, head_dim]: a view of the projection's own order.
    let x = x.swap_dims(1, 2);
    Some(Tensor::from_dispatch(Dispatch::rotary(
        x.into_dispatch(),
        cos.into_dispatch(),
        sin.into_dispatch(),
        layout,
    )))
}

#[cfg(feature = "flex")]
mod flex {
    use burn::backend::Flex;
    use burn::backend::flex::FlexTensor;
    use burn::backend::tensor::FloatTensor;
    use burn::tensor::TensorData;

    use super::{RopeLayout, RotaryOps};
    use crate::ops::simd::{flex_values as values, for_rows};

    impl RotaryOps for Flex {
        fn rotary(
            x: FloatTensor<Self>,
            cos: FloatTensor<Self>,
            sin: FloatTensor<Self>,
            layout: RopeLayout,
        ) -> FloatTensor<Self> {
            rotate_swapping(&x, 1, &cos, &sin, layout, 1.0)
        }

        fn rotary_backward(
            grad: FloatTensor<Self>,
            cos: FloatTensor<Self>,
            sin: FloatTensor<Self>,
            layout: RopeLayout,
        ) -> FloatTensor<Self> {
            rotate_swapping(&grad, 2, &cos, &sin, layout, -1.0)
        }
    }

    /// Where the rows of a 4-D input lie, and how they turn.
    #[derive(Clone, Copy)]
    pub(super) struct Geometry {
        /// The input's first element in its storage.
        start: usize,
        /// Strides of the input's first three axes (the last one is 1).
        strides: [usize; 3],
        /// Sizes of the input's axes 1 and 2.
        sizes: [usize; 2],
        /// Which of the input's axes 1 and 2 is the position (indexes cos and sin).
        seq_axis: usize,
        /// Features per row, rotated or not.
        head_dim: usize,
        layout: RopeLayout,
        /// `1` forward, `−1` backward (the rotation by the opposite angle).
        sign: f32,
    }

    /// Rotates the rows of `x` (`[a0, a1, a2, head_dim]`, position along `seq_axis`,
    /// 1 or 2) into a contiguous `[a0, a2, a1, head_dim]`.
    fn rotate_swapping(
        x: &FlexTensor,
        seq_axis: usize,
        cos: &FlexTensor,
        sin: &FlexTensor,
        layout: RopeLayout,
        sign: f32,
    ) -> FlexTensor {
        let x = if x.layout().has_positive_strides() && x.layout().strides()[3] == 1 {
            x.clone()
        } else {
            x.to_contiguous()
        };
        let (cos, sin) = (cos.to_contiguous(), sin.to_contiguous());
        let shape = x.layout().shape();
        let [a0, a1, a2, head_dim] = [shape[0], shape[1], shape[2], shape[3]];
        let strides = x.layout().strides();
        let geometry = Geometry {
            start: x.layout().start_offset(),
            strides: [0, 1, 2].map(|axis| strides[axis] as usize),
            sizes: [a1, a2],
            seq_axis,
            head_dim,
            layout,
            sign,
        };
        let (cos, sin) = (values(&cos), values(&sin));
        let len = a0 * a1 * a2 * head_dim;
        let out = if len == 0 {
            Vec::new()
        } else {
            let seq = [a1, a2][seq_axis - 1];
            assert!(
                cos.len() == sin.len() && cos.len() % seq == 0 && 2 * cos.len() / seq <= head_dim,
                "rotary: the cos/sin tables do not match the positions and the head dim"
            );
            let storage = x.storage::<f32>();
            // SAFETY: the kernel writes every element of its output rows.
            let [out] = unsafe {
                for_rows(head_dim, len, [], |first_row, [], [out]| {
                    kernels::rotate_rows(storage, &geometry, first_row, cos, sin, out)
                })
            };
            out
        };
        FlexTensor::from_data(TensorData::new(out, [a0, a2, a1, head_dim]))
    }

    /// The loop, compiled once per instruction set and picked at run time.
    mod kernels {
        use std::mem::MaybeUninit;

        use super::{Geometry, RopeLayout};
        use crate::ops::simd::simd_kernel;

        /// Pairs rotated per block: one AVX-512 register of f32 (two AVX2 ones).
        const LANES: usize = 16;

        simd_kernel! {
            /// Writes output rows `first_row..` (as many as `out` holds, every
            /// element) from the input rows they come from.
            pub(super) fn rotate_rows(
                x: &[f32],
                geometry: &Geometry,
                first_row: usize,
                cos: &[f32],
                sin: &[f32],
                out: &mut [MaybeUninit<f32>],
            ) {
                let Geometry { start, strides, sizes, seq_axis, head_dim, layout, sign } =
                    *geometry;
                let [a1, a2] = sizes;
                let seq = sizes[seq_axis - 1];
                let half = cos.len() / seq;
                // Output rows run over [a0, a2, a1]: the index of `first_row`, then
                // counted up row by row.
                let (mut i1, mut i2, mut i0) =
                    (first_row % a1, (first_row / a1) % a2, first_row / (a1 * a2));
                for out in out.chunks_exact_mut(head_dim) {
                    let offset = start + i0 * strides[0] + i1 * strides[1] + i2 * strides[2];
                    let input = &x[offset..offset + head_dim];
                    let position = if seq_axis == 1 { i1 } else { i2 };
                    i1 += 1;
                    if i1 == a1 {
                        i1 = 0;
                        i2 += 1;
                        if i2 == a2 {
                            i2 = 0;
                            i0 += 1;
                        }
                    }
                    let c = &cos[position * half..(position + 1) * half];
                    let s = &sin[position * half..(position + 1) * half];
                    let (rotated, passed) = out.split_at_mut(2 * half);
                    match layout {
                        RopeLayout::HalfSplit => {
                            let (a, b) = input[..2 * half].split_at(half);
                            let (new_a, new_b) = rotated.split_at_mut(half);
                            // Blocks of fixed width, computed in local arrays: a loop
                            // over `half` slots of four slices stayed scalar (LLVM would
                            // not vectorize it at these short, unknown trip counts).
                            let blocks = half / LANES * LANES;
                            for j in (0..blocks).step_by(LANES) {
                                let block = |values: &[f32]| -> [f32; LANES] {
                                    values[j..j + LANES].try_into().expect("LANES values")
                                };
                                let (a, b, c, s) = (block(a), block(b), block(c), block(s));
                                let (mut rotated_a, mut rotated_b) = ([0.0; LANES], [0.0; LANES]);
                                for lane in 0..LANES {
                                    rotated_a[lane] = a[lane] * c[lane] - sign * b[lane] * s[lane];
                                    rotated_b[lane] = b[lane] * c[lane] + sign * a[lane] * s[lane];
                                }
                                new_a[j..j + LANES].write_copy_of_slice(&rotated_a);
                                new_b[j..j + LANES].write_copy_of_slice(&rotated_b);
                            }
                            for j in blocks..half {
                                new_a[j].write(a[j] * c[j] - sign * b[j] * s[j]);
                                new_b[j].write(b[j] * c[j] + sign * a[j] * s[j]);
                            }
                        }
                        RopeLayout::Interleaved => {
                            for j in 0..half {
                                let (even, odd) = (input[2 * j], input[2 * j + 1]);
                                rotated[2 * j].write(even * c[j] - sign * odd * s[j]);
                                rotated[2 * j + 1].write(odd * c[j] + sign * even * s[j]);
                            }
                        }
                    }
                    passed.write_copy_of_slice(&input[2 * half..]);
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

    use super::{RopeLayout, RotaryOps};
    use crate::ops::autodiff::{backward_unary, record_unary};

    #[derive(Debug)]
    struct RotaryBackward {
        layout: RopeLayout,
    }

    impl<B: RotaryOps> Backward<B, 1> for RotaryBackward {
        /// The tables: constants, which take no gradient.
        type State = (FloatTensor<B>, FloatTensor<B>);

        fn backward(
            self,
            ops: Ops<Self::State, 1>,
            grads: &mut Gradients,
            _checkpointer: &mut Checkpointer,
        ) {
            backward_unary::<B, _>(ops, grads, |(cos, sin), grad| {
                B::rotary_backward(grad, cos, sin, self.layout)
            });
        }
    }

    impl<B: RotaryOps, C: CheckpointStrategy> RotaryOps for Autodiff<B, C> {
        fn rotary(
            x: FloatTensor<Self>,
            cos: FloatTensor<Self>,
            sin: FloatTensor<Self>,
            layout: RopeLayout,
        ) -> FloatTensor<Self> {
            let (cos, sin) = (cos.into_primitive(), sin.into_primitive());
            record_unary::<B, C, _>(RotaryBackward { layout }, x, |x| {
                (B::rotary(x, cos.clone(), sin.clone(), layout), (cos, sin))
            })
        }

        fn rotary_backward(
            grad: FloatTensor<Self>,
            cos: FloatTensor<Self>,
            sin: FloatTensor<Self>,
            layout: RopeLayout,
        ) -> FloatTensor<Self> {
            // Gradients of gradients are not supported: the result is a constant.
            <FloatTensor<Self>>::new(B::rotary_backward(
                grad.into_primitive(),
                cos.into_primitive(),
                sin.into_primitive(),
                layout,
            ))
        }
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::test_utils::{assert_close, test_devices};
    use burn::tensor::{Distribution, Tensor, TensorData};

    /// The rotation written out pair by pair on the host, in f64.
    pub(crate) fn naive(
        x: &[f32],
        [batch, heads, seq, head_dim]: [usize; 4],
        cos: &[f32],
        sin: &[f32],
        layout: RopeLayout,
    ) -> Vec<f32> {
        let half = cos.len() / seq;
        let mut out = x.to_vec();
        for row in 0..batch * heads * seq {
            let position = row % seq;
            let base = row * head_dim;
            for j in 0..half {
                let (ia, ib) = match layout {
                    RopeLayout::HalfSplit => (j, j + half),
                    RopeLayout::Interleaved => (2 * j, 2 * j + 1),
                };
                let (a, b) = (x[base + ia] as f64, x[base + ib] as f64);
                let (c, s) = (
                    cos[position * half + j] as f64,
                    sin[position * half + j] as f64,
                );
                out[base + ia] = (a * c - b * s) as f32;
                out[base + ib] = (b * c + a * s) as f32;
            }
        }
        out
    }

    /// Forward against the pair-by-pair rotation and backward against the transposed
    /// rotation (the gradient of `Σ w·rot(x)` is `rotᵀ(w)`), for both layouts, a
    /// partial rotation, scaled tables (not a pure rotation) and an input that is a
    /// strided view as the projections give it; sizes split into parallel tasks.
    #[test]
    fn rotates_pairs_and_back() {
        for device in test_devices() {
            let device = device.autodiff();
            // Pairs per head: 4 (fewer than a block of the kernel), 18 (a block and two).
            for (shape, rotary_dim) in
                [([2, 3, 5, 8], 8), ([3, 4, 700, 20], 8), ([2, 2, 5, 40], 36)]
            {
                let [batch, heads, seq, head_dim] = shape;
                let half = rotary_dim / 2;
                let angles: Vec<f32> = (0..seq * half)
                    .map(|i| (i / half) as f32 * 0.37 / (1 + i % half) as f32)
                    .collect();
                let scale = 1.25f32;
                let cos_values: Vec<f32> = angles.iter().map(|a| a.cos() * scale).collect();
                let sin_values: Vec<f32> = angles.iter().map(|a| a.sin() * scale).collect();
                let table = |values: &[f32]| {
                    Tensor::<2>::from_data(TensorData::new(values.to_vec(), [seq, half]), &device)
                };
                let (cos, sin) = (table(&cos_values), table(&sin_values));
                // As a projection gives it: [batch, seq, heads, head_dim] seen as
                // [batch, heads, seq, head_dim].
                let projected = Tensor::<4>::random(
                    [batch, seq, heads, head_dim],
                    Distribution::Normal(0.0, 1.0),
                    &device,
                );
                let weight = Tensor::<4>::random(shape, Distribution::Normal(0.0, 1.0), &device);
                for layout in [RopeLayout::HalfSplit, RopeLayout::Interleaved] {
                    let x = projected.clone().require_grad();
                    let Some(y) =
                        fused_rotary(x.clone().swap_dims(1, 2), cos.clone(), sin.clone(), layout)
                    else {
                        assert!(!runs_fused_on_cpu(&device, x.dtype()), "flex runs it fused");
                        continue;
                    };
                    let grads = (y.clone() * weight.clone()).sum().backward();
                    let d_x = x.grad(&grads).expect("x gradient").swap_dims(1, 2);
                    let values = |t: Tensor<4>| t.into_data().try_to_vec::<f32>().expect("f32");
                    let expected = |values: Vec<f32>| {
                        Tensor::<4>::from_data(TensorData::new(values, shape), &d_x.device())
                    };
                    let x_values = values(x.inner().swap_dims(1, 2));
                    let rotated = naive(&x_values, shape, &cos_values, &sin_values, layout);
                    assert_close(
                        y.inner(),
                        expected(rotated),
                        1e-5,
                        &format!("{layout:?} forward"),
                    );
                    // The transposed rotation: the same one with the sines negated.
                    let negated: Vec<f32> = sin_values.iter().map(|s| -s).collect();
                    let w_values = values(weight.clone());
                    let back = naive(&w_values, shape, &cos_values, &negated, layout);
                    assert_close(
                        d_x.clone(),
                        expected(back),
                        1e-5,
                        &format!("{layout:?} backward"),
                    );
                }
            }
        }
    }
}
