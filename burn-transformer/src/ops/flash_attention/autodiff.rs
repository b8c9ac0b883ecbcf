//! The `Autodiff<B, C>` implementation of the fused op: the forward saves only
//! `q, k, v`, the sinks, `O`, `LSE` (and the constant key mask), and the backward calls
//! the backend's fused backward, which recomputes the probabilities from the
//! log-sum-exp.
//!
//! The sinks' gradient needs no kernel. A sink `s_h` is one more logit of every row of
//! head `h` with no value, so its probability is `p_i = exp(s_h − LSE_i)` (the sink
//! inside `LSE`) and, as for any logit, `∂L/∂s_h` sums `p_i · (dP_i − D_i)` over the
//! rows, with `dP_i = 0` (no value) and `D_i = rowsum(dO ∘ O)_i`:
//! `dsinks[h] = −Σ_{batch, i} exp(s_h − LSE_i) · D_i`.

use burn::backend::autodiff::checkpoint::base::Checkpointer;
use burn::backend::autodiff::checkpoint::strategy::CheckpointStrategy;
use burn::backend::autodiff::grads::Gradients;
use burn::backend::autodiff::ops::{Backward, Ops, OpsKind};
use burn::backend::tensor::FloatTensor;
use burn::backend::{Autodiff, TensorMetadata};
use burn::tensor::{FloatDType, Shape};

use super::ScoreOptions;
use super::op::FlashAttentionOps;

/// The saved state of one forward: inputs, sinks, output, log-sum-exp, key mask,
/// options.
struct SavedState<B: FlashAttentionOps> {
    q: FloatTensor<B>,
    k: FloatTensor<B>,
    v: FloatTensor<B>,
    sinks: FloatTensor<B>,
    output: FloatTensor<B>,
    lse: FloatTensor<B>,
    key_mask: FloatTensor<B>,
    options: ScoreOptions,
}

impl<B: FlashAttentionOps> Clone for SavedState<B> {
    fn clone(&self) -> Self {
        Self {
            q: self.q.clone(),
            k: self.k.clone(),
            v: self.v.clone(),
            sinks: self.sinks.clone(),
            output: self.output.clone(),
            lse: self.lse.clone(),
            key_mask: self.key_mask.clone(),
            options: self.options,
        }
    }
}

impl<B: FlashAttentionOps> std::fmt::Debug for SavedState<B> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SavedState")
            .field("options", &self.options)
            .finish_non_exhaustive()
    }
}

/// The backward step of the fused op in the autodiff graph; parents are q, k, v and
/// the sinks.
#[derive(Debug)]
struct FlashAttentionBackward;

impl<B: FlashAttentionOps> Backward<B, 4> for FlashAttentionBackward {
    type State = SavedState<B>;

    fn backward(
        self,
        ops: Ops<Self::State, 4>,
        grads: &mut Gradients,
        _checkpointer: &mut Checkpointer,
    ) {
        let grad_output = grads.consume::<B>(&ops.node);
        let state = ops.state;
        let [node_q, node_k, node_v, node_sinks] = ops.parents;
        if let Some(node) = node_sinks {
            let dsinks = sink_gradient::<B>(
                state.sinks,
                state.lse.clone(),
                state.output.clone(),
                grad_output.clone(),
            );
            grads.register::<B>(node.id, dsinks);
        }
        let (dq, dk, dv) = B::flash_attention_backward(
            state.q,
            state.k,
            state.v,
            state.output,
            state.lse,
            grad_output,
            state.key_mask,
            state.options,
        );
        for (node, grad) in [(node_q, dq), (node_k, dk), (node_v, dv)] {
            if let Some(node) = node {
                grads.register::<B>(node.id, grad);
            }
        }
    }
}

/// `dsinks[h] = −Σ_{batch, i} exp(sinks[h] − LSE_{h,i}) · rowsum(dO ∘ O)_{h,i}` (see
/// the module docs), in f32.
///
/// # Shapes
/// - sinks: `[heads]` f32; lse: `[batch, heads, seq_q]` f32
/// - output, grad_output: `[batch, heads, seq_q, d_v]`
/// - returns `[heads]` f32
fn sink_gradient<B: FlashAttentionOps>(
    sinks: FloatTensor<B>,
    lse: FloatTensor<B>,
    output: FloatTensor<B>,
    grad_output: FloatTensor<B>,
) -> FloatTensor<B> {
    let [batch, heads, seq_q] = lse.shape().dims::<3>();
    let f32 = |x: FloatTensor<B>| B::float_cast(x, FloatDType::F32);
    let rows = Shape::new([batch, heads, seq_q]);
    // D = rowsum(dO ∘ O): [batch, heads, seq_q]
    let delta = B::float_reshape(
        B::float_sum_dim(B::float_mul(f32(output), f32(grad_output)), 3),
        rows.clone(),
    );
    // exp(s_h − LSE): [batch, heads, seq_q]
    let sinks = B::float_expand(B::float_reshape(sinks, Shape::new([1, heads, 1])), rows);
    let probabilities = B::float_exp(B::float_sub(sinks, lse));
    let total = B::float_sum_dim(B::float_sum_dim(B::float_mul(probabilities, delta), 2), 0); // [1, heads, 1]
    B::float_neg(B::float_reshape(total, Shape::new([heads])))
}

impl<B: FlashAttentionOps, C: CheckpointStrategy> FlashAttentionOps for Autodiff<B, C> {
    fn flash_attention_forward(
        q: FloatTensor<Self>,
        k: FloatTensor<Self>,
        v: FloatTensor<Self>,
        key_mask: FloatTensor<Self>,
        sinks: FloatTensor<Self>,
        options: ScoreOptions,
    ) -> (FloatTensor<Self>, FloatTensor<Self>) {
        let nodes = [q.node(), k.node(), v.node(), sinks.node()];
        let q = q.into_primitive();
        let k = k.into_primitive();
        let v = v.into_primitive();
        let sinks = sinks.into_primitive();
        // The padding mask is a constant: never differentiated.
        let key_mask = key_mask.into_primitive();
        let (output, lse) = B::flash_attention_forward(
            q.clone(),
            k.clone(),
            v.clone(),
            key_mask.clone(),
            sinks.clone(),
            options,
        );
        let output = match FlashAttentionBackward
            .prepare::<C>(nodes)
            .compute_bound()
            .stateful()
        {
            OpsKind::Tracked(prep) => prep.finish(
                SavedState {
                    q,
                    k,
                    v,
                    sinks,
                    output: output.clone(),
                    lse: lse.clone(),
                    key_mask,
                    options,
                },
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
        options: ScoreOptions,
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
