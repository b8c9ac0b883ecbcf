//! Routed experts: SwiGLU networks, and the dispatch that runs each one only on the
//! tokens routed to it.
//!
//! Dispatch (per layer call):
//! 1. The router's `[tokens, top_k]` expert indices are read on the host (the expert
//!    batch sizes decide tensor shapes, so they must be known there).
//! 2. A [`DispatchPlan`] lists every (token, slot) assignment grouped by expert, in token
//!    order, and drops the assignments beyond an expert's capacity.
//! 3. One `select` gathers the kept tokens in that order; each expert runs on its
//!    contiguous slice; the outputs are weighted and added back to their tokens with one
//!    `select_assign(.., Add)`. A token's `top_k` contributions sum there.
//!
//! Work is `Σ_e tokens_e = tokens · top_k` expert evaluations whatever the number of
//! experts: compute grows with `top_k`, not with `n_experts`.
//!
//! # Checkpoint layouts
//! Each expert is a [`SwiGlu`] (`gate_proj`, `up_proj`, `down_proj`), so the published
//! per-expert keys map by name (DeepSeek: `experts.N.gate_proj.weight`; Mixtral:
//! `experts.N.w1/w3/w2.weight` = gate/up/down). transformers 5 instead holds the experts
//! fused: `experts.gate_up_proj` `[n_experts, 2·d_ff, d_model]` (gate rows, then up rows)
//! and `experts.down_proj` `[n_experts, d_model, d_ff]`; [`experts_from_fused`] splits
//! them.

use burn::module::Param;
use burn::nn::{Linear, LinearConfig};
use burn::tensor::{Device, IndexingUpdateOp, Int, Tensor, TensorData};

use crate::ffn::{Activation, SwiGlu};

/// Which token each expert evaluates, grouped by expert.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DispatchPlan {
    /// The kept assignments as flat slot indices `token · top_k + slot`, grouped by
    /// expert (expert 0's first), in token order within an expert.
    pub slots: Vec<i64>,
    /// The token of each entry of `slots`.
    pub tokens: Vec<i64>,
    /// Number of kept assignments per expert (the expert batch sizes).
    pub kept: Vec<usize>,
    /// Number of assignments per expert before any capacity limit.
    pub routed: Vec<usize>,
}

impl DispatchPlan {
    /// Groups the assignments in `indices` (`[tokens, top_k]` row-major) by expert,
    /// keeping at most `capacity` per expert (the earliest tokens win, as in GShard).
    ///
    /// # Panics
    /// If an index is not an expert (`0..n_experts`): the router produced it.
    pub fn new(indices: &[i64], top_k: usize, n_experts: usize, capacity: Option<usize>) -> Self {
        let mut per_expert: Vec<Vec<i64>> = vec![Vec::new(); n_experts];
        for (slot, &expert) in indices.iter().enumerate() {
            let expert = usize::try_from(expert)
                .ok()
                .filter(|&e| e < n_experts)
                .unwrap_or_else(|| panic!("dispatch: expert index {expert} out of 0..{n_experts}"));
            per_expert[expert].push(slot as i64);
        }
        let routed: Vec<usize> = per_expert.iter().map(Vec::len).collect();
        let mut slots = Vec::with_capacity(indices.len());
        let mut kept = Vec::with_capacity(n_experts);
        for assignments in per_expert {
            let keep = capacity.map_or(assignments.len(), |c| c.min(assignments.len()));
            slots.extend_from_slice(&assignments[..keep]);
            kept.push(keep);
        }
        let tokens = slots.iter().map(|&slot| slot / top_k as i64).collect();
        Self {
            slots,
            tokens,
            kept,
            routed,
        }
    }

    /// Assignments dropped by the capacity limit.
    pub fn dropped(&self) -> usize {
        self.routed.iter().sum::<usize>() - self.kept.iter().sum::<usize>()
    }
}

/// Runs each expert on its tokens and sums the weighted outputs per token.
///
/// A dropped assignment contributes nothing (the token passes through the residual
/// connection around the layer for that expert).
///
/// # Shapes
/// - x: `[tokens, d_model]`
/// - weights: `[tokens, top_k]`, the routing weights (cast to `x`'s dtype)
/// - output: `[tokens, d_model]`
///
/// # Panics
/// If `plan.kept` does not have one entry per expert.
pub fn dispatch(
    experts: &[SwiGlu],
    x: Tensor<2>,
    weights: Tensor<2>,
    plan: &DispatchPlan,
) -> Tensor<2> {
    assert_eq!(
        plan.kept.len(),
        experts.len(),
        "dispatch: one batch size per expert"
    );
    let [tokens, d_model] = x.dims();
    let [_, top_k] = weights.dims();
    let device = x.device();
    let output = Tensor::<2>::zeros([tokens, d_model], &device).cast(x.dtype());
    if plan.slots.is_empty() {
        return output;
    }
    let n = plan.slots.len();
    let index = |values: &[i64]| {
        Tensor::<1, Int>::from_data(TensorData::new(values.to_vec(), [n]), &device)
    };
    let token_index = index(&plan.tokens);
    let gathered = x.clone().select(0, token_index.clone()); // [kept, d_model], grouped by expert
    let mut outputs = Vec::new();
    let mut start = 0;
    for (expert, &count) in experts.iter().zip(&plan.kept) {
        if count > 0 {
            outputs.push(expert.forward(gathered.clone().narrow(0, start, count)));
            start += count;
        }
    }
    let outputs = Tensor::cat(outputs, 0); // [kept, d_model]
    let slot_weights = weights
        .reshape([tokens * top_k])
        .select(0, index(&plan.slots))
        .cast(x.dtype())
        .reshape([n, 1]); // [kept, 1]
    output.select_assign(
        0,
        token_index,
        outputs * slot_weights,
        IndexingUpdateOp::Add,
    )
}

/// The experts of a transformers 5 fused layout.
///
/// # Shapes
/// - gate_up_proj: `[n_experts, 2 · d_ff, d_model]`, per expert the gate rows then the up
///   rows (`nn.functional.linear(x, gate_up_proj[e]).chunk(2)`)
/// - down_proj: `[n_experts, d_model, d_ff]`
///
/// # Panics
/// If the shapes disagree.
pub fn experts_from_fused(
    gate_up_proj: Tensor<3>,
    down_proj: Tensor<3>,
    activation: Activation,
) -> Vec<SwiGlu> {
    let [n_experts, two_d_ff, d_model] = gate_up_proj.dims();
    let d_ff = two_d_ff / 2;
    assert_eq!(
        down_proj.dims(),
        [n_experts, d_model, d_ff],
        "experts_from_fused: gate_up_proj is {:?}, down_proj must be [n_experts, d_model, d_ff]",
        gate_up_proj.dims()
    );
    let device = gate_up_proj.device();
    (0..n_experts)
        .map(|e| {
            // [2·d_ff, d_model] in torch's [out, in]; burn's Linear stores [in, out].
            let gate_up = gate_up_proj
                .clone()
                .narrow(0, e, 1)
                .reshape([two_d_ff, d_model]);
            let down = down_proj.clone().narrow(0, e, 1).reshape([d_model, d_ff]);
            SwiGlu {
                gate_proj: linear_from_torch(gate_up.clone().narrow(0, 0, d_ff), &device),
                up_proj: linear_from_torch(gate_up.narrow(0, d_ff, d_ff), &device),
                down_proj: linear_from_torch(down, &device),
                activation,
            }
        })
        .collect()
}

/// A bias-free Linear from a torch `[out, in]` weight.
fn linear_from_torch(weight: Tensor<2>, device: &Device) -> Linear {
    let [d_out, d_in] = weight.dims();
    let mut linear = LinearConfig::new(d_in, d_out).with_bias(false).init(device);
    linear.weight = Param::from_tensor(weight.transpose());
    linear
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plan_groups_by_expert_in_token_order_and_drops_over_capacity() {
        // 4 tokens, top-2, 3 experts.
        let indices = [0, 2, 2, 0, 0, 1, 2, 0];
        let plan = DispatchPlan::new(&indices, 2, 3, None);
        assert_eq!(plan.routed, vec![4, 1, 3]);
        assert_eq!(plan.slots, vec![0, 3, 4, 7, 5, 1, 2, 6]);
        assert_eq!(plan.tokens, vec![0, 1, 2, 3, 2, 0, 1, 3]);
        assert_eq!(plan.dropped(), 0);

        let plan = DispatchPlan::new(&indices, 2, 3, Some(2));
        assert_eq!(plan.kept, vec![2, 1, 2]);
        assert_eq!(plan.slots, vec![0, 3, 5, 1, 2]);
        assert_eq!(plan.dropped(), 3);
    }
}
