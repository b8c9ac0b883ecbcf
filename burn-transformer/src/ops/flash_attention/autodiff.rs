//! The `Autodiff<B, C>` implementation of the fused op: the forward saves only
//! `q, k, v, O, LSE` (and the constant key mask), and the backward calls the backend's
//! fused backward, which recomputes the probabilities from the log-sum-exp.

use burn::backend::Autodiff;
use burn::backend::autodiff::checkpoint::base::Checkpointer;
use burn::backend::autodiff::checkpoint::strategy::CheckpointStrategy;
use burn::backend::autodiff::grads::Gradients;
use burn::backend::autodiff::ops::{Backward, Ops, OpsKind};
use burn::backend::tensor::FloatTensor;

use super::ScoreOptions;
use super::op::FlashAttentionOps;

/// The saved state of one forward: inputs, output, log-sum-exp, key mask, options.
type SavedState<B> = (
    FloatTensor<B>,
    FloatTensor<B>,
    FloatTensor<B>,
    FloatTensor<B>,
    FloatTensor<B>,
    FloatTensor<B>,
    ScoreOptions,
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
        options: ScoreOptions,
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
