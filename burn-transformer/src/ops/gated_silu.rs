//! `silu(gate) · up`, the gated activation of SwiGLU, fused: one pass forward, one
//! pass backward.
//!
//! Composed from tensor ops this is `gate · sigmoid(gate) · up`: three forward passes
//! with two temporaries, and under autodiff three backward nodes (seven more passes).
//! The fused backward computes both gradients in one pass from the saved inputs:
//!
//! `∂/∂gate = dh · up · σ(g) · (1 + g · (1 − σ(g)))`, `∂/∂up = dh · g · σ(g)`.

use burn::backend::Dispatch;
use burn::tensor::Tensor;
use burn::tensor::activation::silu;

use super::simd::runs_fused_on_cpu;

pub(crate) use ops::GatedSiluOps;

/// The extension trait lives in its own module so that the attribute's generated code
/// stays apart from the kernels.
mod ops {
    use burn::backend::tensor::FloatTensor;
    use burn::backend::{Backend, backend_extension};

    /// `silu(gate) · up` as a backend extension: native loops on flex, a hand-written
    /// backward under autodiff. Other backends are not listed: [`super::gated_silu`]
    /// only calls it on flex.
    #[backend_extension(Flex: cfg(feature = "flex"), Autodiff)]
    pub(crate) trait GatedSiluOps: Backend {
        /// Forward.
        ///
        /// # Shapes
        /// - gate, up: the same shape, f32
        /// - output: that shape
        fn gated_silu(gate: FloatTensor<Self>, up: FloatTensor<Self>) -> FloatTensor<Self>;

        /// Backward: `(∂/∂gate, ∂/∂up)` of `sum(grad · silu(gate) · up)`.
        ///
        /// # Shapes
        /// - gate, up, grad: the same shape, f32
        /// - output: two tensors of that shape
        fn gated_silu_backward(
            gate: FloatTensor<Self>,
            up: FloatTensor<Self>,
            grad: FloatTensor<Self>,
        ) -> (FloatTensor<Self>, FloatTensor<Self>);
    }
}

/// `silu(gate) · up`: fused on flex in f32, the tensor-op composition elsewhere.
///
/// # Shapes
/// - gate, up: the same shape
/// - output: that shape
///
/// # Panics
/// If the shapes differ.
pub fn gated_silu<const D: usize>(gate: Tensor<D>, up: Tensor<D>) -> Tensor<D> {
    assert_eq!(
        gate.dims(),
        up.dims(),
        "gated_silu: gate and up shapes differ"
    );
    if runs_fused_on_cpu(&gate.device(), gate.dtype()) && up.dtype() == gate.dtype() {
        Tensor::from_dispatch(Dispatch::gated_silu(
            gate.into_dispatch(),
            up.into_dispatch(),
        ))
    } else {
        gated_silu_reference(gate, up)
    }
}

/// The composition of tensor ops the fused op replaces (its reference in tests).
///
/// # Shapes
/// As [`gated_silu`].
pub fn gated_silu_reference<const D: usize>(gate: Tensor<D>, up: Tensor<D>) -> Tensor<D> {
    silu(gate) * up
}

#[cfg(feature = "flex")]
mod flex {
    use burn::backend::Flex;
    use burn::backend::tensor::FloatTensor;

    use super::GatedSiluOps;
    use crate::ops::simd::exp::sigmoid;
    use crate::ops::simd::{flex_like as output_like, flex_values as values, for_chunks};

    impl GatedSiluOps for Flex {
        fn gated_silu(gate: FloatTensor<Self>, up: FloatTensor<Self>) -> FloatTensor<Self> {
            let (gate, up) = (gate.to_contiguous(), up.to_contiguous());
            let len = gate.layout().num_elements();
            // SAFETY: the kernel writes every element of its output chunk.
            let [out] = unsafe {
                for_chunks(len, [values(&gate), values(&up)], |[g, u], [o]| {
                    kernels::forward(g, u, o)
                })
            };
            output_like(&gate, out)
        }

        fn gated_silu_backward(
            gate: FloatTensor<Self>,
            up: FloatTensor<Self>,
            grad: FloatTensor<Self>,
        ) -> (FloatTensor<Self>, FloatTensor<Self>) {
            let (gate, up, grad) = (
                gate.to_contiguous(),
                up.to_contiguous(),
                grad.to_contiguous(),
            );
            let len = gate.layout().num_elements();
            // SAFETY: the kernel writes every element of both output chunks.
            let [d_gate, d_up] = unsafe {
                for_chunks(
                    len,
                    [values(&gate), values(&up), values(&grad)],
                    |[g, u, dh], [dg, du]| kernels::backward(g, u, dh, dg, du),
                )
            };
            (output_like(&gate, d_gate), output_like(&gate, d_up))
        }
    }

    /// The loops, compiled once per instruction set and picked at run time.
    mod kernels {
        use std::mem::MaybeUninit;

        use super::sigmoid;
        use crate::ops::simd::simd_kernel;

        simd_kernel! {
            pub(super) fn forward(gate: &[f32], up: &[f32], out: &mut [MaybeUninit<f32>]) {
                for ((o, &g), &u) in out.iter_mut().zip(gate).zip(up) {
                    o.write(g * sigmoid(g) * u);
                }
            }
        }

        simd_kernel! {
            pub(super) fn backward(
                gate: &[f32],
                up: &[f32],
                grad: &[f32],
                d_gate: &mut [MaybeUninit<f32>],
                d_up: &mut [MaybeUninit<f32>],
            ) {
                let inputs = gate.iter().zip(up).zip(grad);
                for (((&g, &u), &dh), (dg, du)) in inputs.zip(d_gate.iter_mut().zip(d_up)) {
                    let s = sigmoid(g);
                    dg.write(dh * u * s * (1.0 + g * (1.0 - s)));
                    du.write(dh * g * s);
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

    use super::GatedSiluOps;
    use crate::ops::autodiff::{backward_binary, record_binary};

    #[derive(Debug)]
    struct GatedSiluBackward;

    impl<B: GatedSiluOps> Backward<B, 2> for GatedSiluBackward {
        /// The inputs: the backward recomputes `σ(gate)` instead of saving it.
        type State = (FloatTensor<B>, FloatTensor<B>);

        fn backward(
            self,
            ops: Ops<Self::State, 2>,
            grads: &mut Gradients,
            _checkpointer: &mut Checkpointer,
        ) {
            backward_binary::<B, _>(ops, grads, |(gate, up), grad| {
                B::gated_silu_backward(gate, up, grad)
            });
        }
    }

    impl<B: GatedSiluOps, C: CheckpointStrategy> GatedSiluOps for Autodiff<B, C> {
        fn gated_silu(gate: FloatTensor<Self>, up: FloatTensor<Self>) -> FloatTensor<Self> {
            record_binary::<B, C, _>(GatedSiluBackward, gate, up, B::gated_silu)
        }

        fn gated_silu_backward(
            gate: FloatTensor<Self>,
            up: FloatTensor<Self>,
            grad: FloatTensor<Self>,
        ) -> (FloatTensor<Self>, FloatTensor<Self>) {
            // Gradients of gradients are not supported: the results are constants.
            let (d_gate, d_up) = B::gated_silu_backward(
                gate.into_primitive(),
                up.into_primitive(),
                grad.into_primitive(),
            );
            (
                <FloatTensor<Self>>::new(d_gate),
                <FloatTensor<Self>>::new(d_up),
            )
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_utils::{assert_close, test_devices};
    use burn::tensor::{Distribution, Tensor};

    /// Forward and both gradients against the tensor-op composition, on every test
    /// device (flex runs the fused loops; the others check the fallback), at a size
    /// that is split into parallel chunks with a ragged last one.
    #[test]
    fn matches_the_composed_ops_forward_and_backward() {
        for device in test_devices() {
            let device = device.autodiff();
            for shape in [[2, 3, 5], [3, 100, 353]] {
                let draw = |scale: f64| {
                    Tensor::<3>::random(shape, Distribution::Normal(0.0, scale), &device)
                };
                // Wide gates reach the saturated ends of the sigmoid.
                let (gate, up, weight) = (draw(4.0), draw(1.0), draw(1.0));
                let run = |fused: bool| {
                    let (g, u) = (gate.clone().require_grad(), up.clone().require_grad());
                    let h = if fused {
                        gated_silu(g.clone(), u.clone())
                    } else {
                        gated_silu_reference(g.clone(), u.clone())
                    };
                    let grads = (h.clone() * weight.clone()).sum().backward();
                    (
                        h.inner(),
                        g.grad(&grads).expect("gate gradient"),
                        u.grad(&grads).expect("up gradient"),
                    )
                };
                let (h, dg, du) = run(true);
                let (h_ref, dg_ref, du_ref) = run(false);
                assert_close(h, h_ref, 1e-5, "gated silu");
                assert_close(dg, dg_ref, 1e-5, "gated silu d_gate");
                assert_close(du, du_ref, 1e-5, "gated silu d_up");
            }
        }
    }
}
