//! How the fused CPU ops join the autodiff graph (one that saves its two inputs, one
//! with a single differentiated input), and how their backwards hand the gradients
//! back.

use burn::backend::Autodiff;
use burn::backend::Backend;
use burn::backend::autodiff::checkpoint::strategy::CheckpointStrategy;
use burn::backend::autodiff::grads::Gradients;
use burn::backend::autodiff::ops::{Backward, Ops, OpsKind};
use burn::backend::tensor::FloatTensor;

/// Runs `forward` on the inner tensors of `lhs` and `rhs` and records `backward`
/// with both inputs as its state (saved, not recomputed: the ops are compute-bound)
/// when either input is tracked.
pub(crate) fn record_binary<B, C, S>(
    backward: S,
    lhs: FloatTensor<Autodiff<B, C>>,
    rhs: FloatTensor<Autodiff<B, C>>,
    forward: impl FnOnce(FloatTensor<B>, FloatTensor<B>) -> FloatTensor<B>,
) -> FloatTensor<Autodiff<B, C>>
where
    B: Backend,
    C: CheckpointStrategy,
    S: Backward<B, 2, State = (FloatTensor<B>, FloatTensor<B>)>,
{
    let nodes = [lhs.node(), rhs.node()];
    let (lhs, rhs) = (lhs.into_primitive(), rhs.into_primitive());
    let output = forward(lhs.clone(), rhs.clone());
    match backward.prepare::<C>(nodes).compute_bound().stateful() {
        OpsKind::Tracked(prep) => prep.finish((lhs, rhs), output),
        OpsKind::UnTracked(prep) => prep.finish(output),
    }
}

/// Runs `forward` on the inner tensor of `input`, which returns the output and the
/// state `backward` needs, and records `backward` with that state when `input` is
/// tracked (the state is dropped otherwise). The op's other inputs are constants.
pub(crate) fn record_unary<B, C, S>(
    backward: S,
    input: FloatTensor<Autodiff<B, C>>,
    forward: impl FnOnce(FloatTensor<B>) -> (FloatTensor<B>, S::State),
) -> FloatTensor<Autodiff<B, C>>
where
    B: Backend,
    C: CheckpointStrategy,
    S: Backward<B, 1>,
{
    let nodes = [input.node()];
    let (output, state) = forward(input.into_primitive());
    match backward.prepare::<C>(nodes).compute_bound().stateful() {
        OpsKind::Tracked(prep) => prep.finish(state, output),
        OpsKind::UnTracked(prep) => prep.finish(output),
    }
}

/// The body of a two-input op's [`Backward::backward`]: `backward` turns the saved state
/// and the output's gradient into the gradients of both inputs, which go to the
/// inputs that are tracked.
pub(crate) fn backward_binary<B: Backend, S>(
    ops: Ops<S, 2>,
    grads: &mut Gradients,
    backward: impl FnOnce(S, FloatTensor<B>) -> (FloatTensor<B>, FloatTensor<B>),
) {
    let grad = grads.consume::<B>(&ops.node);
    let (d_lhs, d_rhs) = backward(ops.state, grad);
    for (node, d_input) in ops.parents.into_iter().zip([d_lhs, d_rhs]) {
        if let Some(node) = node {
            grads.register::<B>(node.id, d_input);
        }
    }
}

/// The body of a one-input op's [`Backward::backward`]: `backward` turns the saved state
/// and the output's gradient into the input's gradient, computed only when the input
/// is tracked.
pub(crate) fn backward_unary<B: Backend, S>(
    ops: Ops<S, 1>,
    grads: &mut Gradients,
    backward: impl FnOnce(S, FloatTensor<B>) -> FloatTensor<B>,
) {
    let grad = grads.consume::<B>(&ops.node);
    let [node] = ops.parents;
    if let Some(node) = node {
        grads.register::<B>(node.id, backward(ops.state, grad));
    }
}
