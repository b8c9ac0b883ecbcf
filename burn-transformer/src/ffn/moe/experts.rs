//! Routed experts: SwiGLU networks stored stacked, and the dispatch that runs each one
//! only on the tokens routed to it.
//!
//! Dispatch (per layer call):
//! 1. The router's `[tokens, top_k]` expert indices are read on the host (expert batch
//!    sizes decide tensor shapes, so they must be known there).
//! 2. A [`DispatchPlan`] lists every (token, slot) assignment grouped by expert, in token
//!    order, and drops the assignments beyond an expert's capacity.
//! 3. One `select` gathers the tokens in that order; the experts run on them (see
//!    below); the weighted outputs are added back to their tokens with one
//!    `select_assign(.., Add)`, where a token's `top_k` contributions sum.
//!
//! Burn has no grouped (ragged) matmul, so the experts run in one of two ways
//! ([`ExpertDispatch`]):
//! - **per expert** (default): one matmul per projection per active expert on its
//!   contiguous slice; no padding, launches grow with the active experts;
//! - **batched**: every expert's tokens padded to the largest expert batch, one matmul
//!   per projection over `[n_experts, rows, d_model]` against the stacked weights; a
//!   fixed number of kernel launches, plus the padding rows.
//!
//! Either way the expert rows are `tokens · top_k` (+ padding), never
//! `tokens · n_experts`: compute follows `top_k`, not the number of experts. (What still
//! grows with the experts is the weight memory read by the active ones.)
//!
//! # Checkpoint layouts
//! [`Experts`] keeps transformers 5's fused layout and names: `gate_up_proj`
//! `[n_experts, 2·d_ff, d_model]` (per expert the gate rows, then the up rows) and
//! `down_proj` `[n_experts, d_model, d_ff]`, so those keys load as they are. Published
//! checkpoints hold one module per expert instead (DeepSeek: `experts.N.gate_proj`,
//! `up_proj`, `down_proj`; Mixtral: `experts.N.w1`, `w3`, `w2` = gate, up, down, each an
//! `nn.Linear` weight `[out, in]`); they stack as
//! `gate_up_proj[N] = cat(gate_proj.weight, up_proj.weight)` and
//! `down_proj[N] = down_proj.weight`, which [`Experts::from_per_expert`] does.

use burn::config::Config;
use burn::module::{Initializer, Module, Param};
use burn::nn::LinearConfig;
use burn::tensor::{Device, IndexingUpdateOp, Int, Tensor, TensorData};

use crate::error::ConfigError;
use crate::ffn::{Activation, SwiGlu};

const MODULE: &str = "ExpertsConfig";

/// Configuration of [`Experts`].
#[derive(Config, Debug)]
pub struct ExpertsConfig {
    /// Input and output width.
    pub d_model: usize,
    /// Hidden width of each expert (HF `moe_intermediate_size`).
    pub d_ff: usize,
    /// Number of experts.
    pub n_experts: usize,
    /// The gate's activation. Default: SiLU (SwiGLU).
    #[config(default = "Activation::Silu")]
    pub activation: Activation,
    /// How the gate and up halves combine. Default: `activation(gate) · up`.
    #[config(default = "ExpertGlu::Gated")]
    pub glu: ExpertGlu,
    /// Biases on both projections (gpt-oss). Default: false.
    #[config(default = false)]
    pub bias: bool,
    /// Initializer of both weights. Default: Burn's Linear default (Kaiming uniform,
    /// gain 1/√3, over each projection's fan-in).
    #[config(
        default = "Initializer::KaimingUniform { gain: 1.0 / 3.0f64.sqrt(), fan_out_only: false }"
    )]
    pub initializer: Initializer,
}

impl ExpertsConfig {
    /// Checks the configuration.
    ///
    /// # Errors
    /// [`ConfigError::Zero`] for a zero size.
    pub fn validate(&self) -> Result<(), ConfigError> {
        ConfigError::check_positive(MODULE, "d_model", self.d_model)?;
        ConfigError::check_positive(MODULE, "d_ff", self.d_ff)?;
        ConfigError::check_positive(MODULE, "n_experts", self.n_experts)
    }

    /// Validates the configuration and initializes the experts.
    ///
    /// # Errors
    /// See [`validate`](Self::validate).
    pub fn try_init(&self, device: &Device) -> Result<Experts, ConfigError> {
        self.validate()?;
        let (e, d, f) = (self.n_experts, self.d_model, self.d_ff);
        let zeros = |shape: [usize; 2]| Param::from_tensor(Tensor::zeros(shape, device));
        Ok(Experts {
            gate_up_proj: self
                .initializer
                .init_with([e, 2 * f, d], Some(d), Some(2 * f), device),
            down_proj: self
                .initializer
                .init_with([e, d, f], Some(f), Some(d), device),
            gate_up_proj_bias: self.bias.then(|| zeros([e, 2 * f])),
            down_proj_bias: self.bias.then(|| zeros([e, d])),
            activation: self.activation,
            glu: self.glu,
        })
    }
}

crate::builders::init_or_panic!(ExpertsConfig => Experts);

/// `n_experts` SwiGLU experts without biases, stacked (transformers 5's
/// `MixtralExperts` / `DeepseekV3Experts` layout and names).
#[derive(Module, Debug)]
pub struct Experts {
    /// `[n_experts, 2·d_ff, d_model]`: per expert, `gate_proj.weight` then
    /// `up_proj.weight` (torch `[out, in]`).
    pub gate_up_proj: Param<Tensor<3>>,
    /// `[n_experts, d_model, d_ff]`: per expert, `down_proj.weight` (torch `[out, in]`).
    pub down_proj: Param<Tensor<3>>,
    /// `[n_experts, 2·d_ff]`: per expert, the gate's bias then the up's (gpt-oss).
    pub gate_up_proj_bias: Option<Param<Tensor<2>>>,
    /// `[n_experts, d_model]`: per expert, the down projection's bias (gpt-oss).
    pub down_proj_bias: Option<Param<Tensor<2>>>,
    /// The gate's activation.
    #[module(skip)]
    pub activation: Activation,
    /// How the gate and up halves combine.
    #[module(skip)]
    pub glu: ExpertGlu,
}

/// How an expert combines the gate and up halves of its first projection.
#[derive(Config, Debug, Copy, PartialEq)]
pub enum ExpertGlu {
    /// `activation(gate) · up` (SwiGLU, GeGLU).
    Gated,
    /// gpt-oss's clamped SwiGLU: with `g = min(gate, limit)` and
    /// `u = clamp(up, -limit, limit)`, `(u + 1) · g · σ(alpha · g)` (the activation is
    /// not used).
    Clamped {
        /// Slope inside the sigmoid (gpt-oss: 1.702).
        alpha: f64,
        /// Bound of both halves (gpt-oss: 7).
        limit: f64,
    },
}

impl ExpertGlu {
    /// Combines `hidden`'s halves along its last axis: `[.., 2·d_ff] -> [.., d_ff]`.
    fn combine<const D: usize>(self, hidden: Tensor<D>, activation: Activation) -> Tensor<D> {
        let d_ff = hidden.dims()[D - 1] / 2;
        let gate = hidden.clone().narrow(D - 1, 0, d_ff);
        let up = hidden.narrow(D - 1, d_ff, d_ff);
        match self {
            Self::Gated => activation.forward(gate) * up,
            Self::Clamped { alpha, limit } => {
                let gate = gate.clamp_max(limit);
                let up = up.clamp(-limit, limit);
                let glu = gate.clone() * burn::tensor::activation::sigmoid(gate * alpha);
                (up + 1.0) * glu
            }
        }
    }
}

impl Experts {
    /// Number of experts.
    pub fn n_experts(&self) -> usize {
        self.gate_up_proj.dims()[0]
    }

    /// Hidden width of one expert.
    pub fn d_ff(&self) -> usize {
        self.down_proj.dims()[2]
    }

    /// The stacked experts of a transformers 5 checkpoint.
    ///
    /// # Shapes
    /// - gate_up_proj: `[n_experts, 2·d_ff, d_model]`
    /// - down_proj: `[n_experts, d_model, d_ff]`
    ///
    /// # Panics
    /// If the shapes disagree.
    pub fn from_fused(
        gate_up_proj: Tensor<3>,
        down_proj: Tensor<3>,
        activation: Activation,
    ) -> Self {
        let [n_experts, two_d_ff, d_model] = gate_up_proj.dims();
        assert_eq!(
            down_proj.dims(),
            [n_experts, d_model, two_d_ff / 2],
            "Experts: gate_up_proj is {:?}, so down_proj must be [n_experts, d_model, d_ff]",
            gate_up_proj.dims()
        );
        Self {
            gate_up_proj: Param::from_tensor(gate_up_proj),
            down_proj: Param::from_tensor(down_proj),
            gate_up_proj_bias: None,
            down_proj_bias: None,
            activation,
            glu: ExpertGlu::Gated,
        }
    }

    /// gpt-oss's experts from transformers' layout: `gate_up_proj` `[n_experts,
    /// d_model, 2·d_ff]` (`x @ w`, gate and up interleaved by column), its bias
    /// `[n_experts, 2·d_ff]` (interleaved too), `down_proj` `[n_experts, d_ff,
    /// d_model]` and its bias `[n_experts, d_model]`; with the clamped gating `glu`.
    ///
    /// # Panics
    /// If the shapes disagree.
    pub fn from_gpt_oss(
        gate_up_proj: Tensor<3>,
        gate_up_proj_bias: Tensor<2>,
        down_proj: Tensor<3>,
        down_proj_bias: Tensor<2>,
        glu: ExpertGlu,
    ) -> Self {
        let [n_experts, d_model, two_d_ff] = gate_up_proj.dims();
        let d_ff = two_d_ff / 2;
        // Column 2i is gate unit i and column 2i+1 up unit i: split the pairs, put the
        // gates' rows first, in torch's [out, in].
        let gate_up = gate_up_proj
            .reshape([n_experts, d_model, d_ff, 2])
            .permute([0, 3, 2, 1]) // [n_experts, 2, d_ff, d_model]
            .reshape([n_experts, two_d_ff, d_model]);
        let gate_up_bias = gate_up_proj_bias
            .reshape([n_experts, d_ff, 2])
            .swap_dims(1, 2)
            .reshape([n_experts, two_d_ff]);
        let down = down_proj.swap_dims(1, 2); // [n_experts, d_model, d_ff]
        Self {
            gate_up_proj_bias: Some(Param::from_tensor(gate_up_bias)),
            down_proj_bias: Some(Param::from_tensor(down_proj_bias)),
            glu,
            ..Self::from_fused(gate_up, down, Activation::Silu)
        }
    }

    /// Stacks per-expert SwiGLUs (the layout of published checkpoints, see the module
    /// docs). Biases are not supported.
    ///
    /// # Panics
    /// If `experts` is empty, the experts differ in shape or activation, or one has a
    /// bias.
    pub fn from_per_expert(experts: &[SwiGlu]) -> Self {
        let first = experts.first().expect("Experts: at least one expert");
        let mut gate_up = Vec::with_capacity(experts.len());
        let mut down = Vec::with_capacity(experts.len());
        for expert in experts {
            assert!(
                expert.gate_proj.bias.is_none()
                    && expert.up_proj.bias.is_none()
                    && expert.down_proj.bias.is_none(),
                "Experts: stacked experts have no biases"
            );
            assert_eq!(
                expert.activation, first.activation,
                "Experts: one activation for all experts"
            );
            // Burn's Linear stores [in, out]; the stacked layout is torch's [out, in].
            let gate = expert.gate_proj.weight.val().transpose(); // [d_ff, d_model]
            let up = expert.up_proj.weight.val().transpose(); // [d_ff, d_model]
            gate_up.push(Tensor::cat(vec![gate, up], 0).unsqueeze_dim::<3>(0));
            down.push(
                expert
                    .down_proj
                    .weight
                    .val()
                    .transpose()
                    .unsqueeze_dim::<3>(0),
            );
        }
        Self::from_fused(
            Tensor::cat(gate_up, 0),
            Tensor::cat(down, 0),
            first.activation,
        )
    }

    /// Expert `index` as a standalone SwiGLU (for references and inspection).
    ///
    /// # Panics
    /// If `index >= n_experts`, or the experts have biases or gpt-oss's clamped
    /// gating, which a [`SwiGlu`] cannot express (use
    /// [`forward_expert`](Self::forward_expert)).
    pub fn expert(&self, index: usize) -> SwiGlu {
        assert!(
            self.gate_up_proj_bias.is_none() && self.glu == ExpertGlu::Gated,
            "Experts: biased or clamped experts are not plain SwiGLUs"
        );
        let [n_experts, two_d_ff, d_model] = self.gate_up_proj.dims();
        assert!(
            index < n_experts,
            "Experts: no expert {index} of {n_experts}"
        );
        let d_ff = two_d_ff / 2;
        let gate_up = self
            .gate_up_proj
            .val()
            .narrow(0, index, 1)
            .reshape([two_d_ff, d_model]); // [2·d_ff, d_model]
        let down = self
            .down_proj
            .val()
            .narrow(0, index, 1)
            .reshape([d_model, d_ff]); // [d_model, d_ff]
        let device = gate_up.device();
        let linear = |weight: Tensor<2>| {
            let [d_out, d_in] = weight.dims();
            let mut linear = LinearConfig::new(d_in, d_out)
                .with_bias(false)
                .init(&device);
            linear.weight = Param::from_tensor(weight.transpose());
            linear
        };
        SwiGlu {
            gate_proj: linear(gate_up.clone().narrow(0, 0, d_ff)),
            up_proj: linear(gate_up.narrow(0, d_ff, d_ff)),
            down_proj: linear(down),
            activation: self.activation,
        }
    }

    /// Expert `index` applied to `x`, straight from the stacked weights.
    ///
    /// # Shapes
    /// - x: `[tokens, d_model]`
    /// - output: `[tokens, d_model]`
    pub fn forward_expert(&self, index: usize, x: Tensor<2>) -> Tensor<2> {
        let [_, two_d_ff, d_model] = self.gate_up_proj.dims();
        let d_ff = two_d_ff / 2;
        let dtype = x.dtype();
        let gate_up = self
            .gate_up_proj
            .val()
            .narrow(0, index, 1)
            .reshape([two_d_ff, d_model])
            .cast(dtype); // [2·d_ff, d_model]
        let down = self
            .down_proj
            .val()
            .narrow(0, index, 1)
            .reshape([d_model, d_ff])
            .cast(dtype); // [d_model, d_ff]
        let row = |bias: &Option<Param<Tensor<2>>>| {
            bias.as_ref()
                .map(|bias| bias.val().narrow(0, index, 1).cast(dtype)) // [1, width]
        };
        let hidden = x.matmul(gate_up.transpose()); // [tokens, 2·d_ff]
        let hidden = match row(&self.gate_up_proj_bias) {
            Some(bias) => hidden + bias,
            None => hidden,
        };
        let output = self
            .glu
            .combine(hidden, self.activation)
            .matmul(down.transpose()); // [tokens, d_model]
        match row(&self.down_proj_bias) {
            Some(bias) => output + bias,
            None => output,
        }
    }

    /// Runs each expert on its tokens and sums the weighted outputs per token, with the
    /// given strategy; with `weighted_inputs` each expert reads its token times the
    /// weight instead, and its output is summed unweighted (Llama 4).
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
    pub(crate) fn dispatch(
        &self,
        x: Tensor<2>,
        weights: Tensor<2>,
        plan: &DispatchPlan,
        strategy: ExpertDispatch,
        weighted_inputs: bool,
    ) -> Tensor<2> {
        let n_experts = self.n_experts();
        assert_eq!(
            plan.kept.len(),
            n_experts,
            "dispatch: one batch size per expert"
        );
        let [tokens, d_model] = x.dims();
        let [_, top_k] = weights.dims();
        let device = x.device();
        let dtype = x.dtype();
        let output = Tensor::<2>::zeros([tokens, d_model], &device).cast(dtype);
        if plan.slots.is_empty() {
            return output;
        }
        let int = |values: Vec<i64>| {
            let n = values.len();
            Tensor::<1, Int>::from_data(TensorData::new(values, [n]), &device)
        };
        // A zero weight after the `tokens · top_k` real ones, for padding rows.
        let weights = Tensor::cat(
            vec![
                weights.reshape([tokens * top_k]),
                Tensor::zeros([1], &device),
            ],
            0,
        ); // [tokens·top_k + 1]
        // Every kept assignment's token (and padding rows, batched), grouped by expert.
        let (token_order, slot_order) = match strategy {
            ExpertDispatch::PerExpert => (int(plan.tokens.clone()), plan.slots.clone()),
            ExpertDispatch::Batched => {
                let layout = plan.padded_layout();
                (int(layout.tokens), layout.slots)
            }
        };
        let rows = slot_order.len();
        let row_weights = weights
            .select(0, int(slot_order))
            .cast(dtype)
            .reshape([rows, 1]); // [rows, 1]
        let gathered = x.select(0, token_order.clone()); // [rows, d_model]
        // Without biases an expert maps 0 to 0, so a padding row (weight 0) still adds
        // nothing when its input is weighted instead of its output.
        let (gathered, row_weights) = match weighted_inputs {
            true => (gathered * row_weights, None),
            false => (gathered, Some(row_weights)),
        };
        let outputs = match strategy {
            ExpertDispatch::PerExpert => {
                let mut outputs = Vec::new();
                let mut start = 0;
                for (expert, &count) in plan.kept.iter().enumerate() {
                    if count > 0 {
                        let batch = gathered.clone().narrow(0, start, count);
                        outputs.push(self.forward_expert(expert, batch));
                        start += count;
                    }
                }
                Tensor::cat(outputs, 0)
            }
            ExpertDispatch::Batched => {
                let gathered = gathered.reshape([n_experts, rows / n_experts, d_model]); // [n_experts, rows, d_model]
                let gate_up = self.gate_up_proj.val().cast(dtype); // [n_experts, 2·d_ff, d_model]
                let down = self.down_proj.val().cast(dtype); // [n_experts, d_model, d_ff]
                // [n_experts, 1, width]: each expert's bias over its rows.
                let per_expert = |bias: &Option<Param<Tensor<2>>>| {
                    bias.as_ref()
                        .map(|bias| bias.val().cast(dtype).unsqueeze_dim::<3>(1))
                };
                let hidden = gathered.matmul(gate_up.swap_dims(1, 2)); // [n_experts, rows, 2·d_ff]
                let hidden = match per_expert(&self.gate_up_proj_bias) {
                    Some(bias) => hidden + bias,
                    None => hidden,
                };
                let hidden = self.glu.combine(hidden, self.activation); // [n_experts, rows, d_ff]
                let outputs = hidden.matmul(down.swap_dims(1, 2)); // [n_experts, rows, d_model]
                let outputs = match per_expert(&self.down_proj_bias) {
                    Some(bias) => outputs + bias,
                    None => outputs,
                };
                outputs.reshape([rows, d_model])
            }
        };
        let outputs = match row_weights {
            Some(row_weights) => outputs * row_weights,
            None => outputs,
        };
        output.select_assign(0, token_order, outputs, IndexingUpdateOp::Add)
    }
}

/// How the experts of one call are evaluated. Burn has no grouped (ragged) matmul, so
/// each choice trades something; both give the same values.
#[derive(Config, Debug, Copy, PartialEq, Eq)]
pub enum ExpertDispatch {
    /// One matmul per projection per active expert, on views of the stacked weights: no
    /// padding, kernel launches grow with the number of active experts. The default:
    /// faster than [`Batched`](Self::Batched) in every case measured on flex and wgpu
    /// (docs/benchmarks.md).
    PerExpert,
    /// One matmul per projection over every expert, each expert's tokens padded to the
    /// largest batch (inactive experts compute padding only): a fixed number of kernel
    /// launches, for devices where launch overhead dominates (many experts with few
    /// tokens each on a GPU). Costs the padding rows
    /// ([`MoeOutput::padded_rows`](super::MoeOutput::padded_rows)).
    Batched,
}

/// Which tokens each expert evaluates, grouped by expert.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct DispatchPlan {
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

    /// Rows computed only as padding by [`ExpertDispatch::Batched`]:
    /// `n_experts · largest batch − kept`.
    pub fn padded_rows(&self) -> usize {
        let rows = self.kept.iter().copied().max().unwrap_or(0);
        self.kept.len() * rows - self.kept.iter().sum::<usize>()
    }

    /// The rows of the batched expert matmul: every expert's assignments, padded to the
    /// largest batch.
    pub fn padded_layout(&self) -> PaddedLayout {
        let rows = self.kept.iter().copied().max().unwrap_or(0);
        let mut tokens = Vec::with_capacity(self.kept.len() * rows);
        let mut slots = Vec::with_capacity(self.kept.len() * rows);
        // The zero weight sits right after the `tokens · top_k` real slots.
        let zero_slot = self.routed.iter().sum::<usize>() as i64;
        let mut offset = 0;
        for &count in &self.kept {
            tokens.extend_from_slice(&self.tokens[offset..offset + count]);
            slots.extend_from_slice(&self.slots[offset..offset + count]);
            tokens.extend(std::iter::repeat_n(0, rows - count));
            slots.extend(std::iter::repeat_n(zero_slot, rows - count));
            offset += count;
        }
        PaddedLayout {
            rows,
            tokens,
            slots,
        }
    }
}

/// A [`DispatchPlan`] laid out for the batched expert matmul.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct PaddedLayout {
    /// Rows per expert: the largest expert batch.
    pub rows: usize,
    /// `[n_experts · rows]`: the token of each row; padding rows read token 0.
    pub tokens: Vec<i64>,
    /// `[n_experts · rows]`: the flat slot of each row; padding rows point one past the
    /// last slot (`tokens · top_k`), where the dispatch appends a zero weight.
    pub slots: Vec<i64>,
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ffn::SwiGluConfig;
    use crate::test_utils::{assert_close, test_devices};
    use burn::tensor::Distribution;

    #[test]
    fn plan_groups_by_expert_in_token_order_and_drops_over_capacity() {
        // 4 tokens, top-2, 3 experts.
        let indices = [0, 2, 2, 0, 0, 1, 2, 0];
        let plan = DispatchPlan::new(&indices, 2, 3, None);
        assert_eq!(plan.routed, vec![4, 1, 3]);
        assert_eq!(plan.slots, vec![0, 3, 4, 7, 5, 1, 2, 6]);
        assert_eq!(plan.tokens, vec![0, 1, 2, 3, 2, 0, 1, 3]);
        assert_eq!(plan.dropped(), 0);
        assert_eq!(plan.padded_rows(), 3 * 4 - 8);

        let layout = plan.padded_layout();
        assert_eq!(layout.rows, 4);
        assert_eq!(layout.tokens, vec![0, 1, 2, 3, 2, 0, 0, 0, 0, 1, 3, 0]);
        assert_eq!(layout.slots, vec![0, 3, 4, 7, 5, 8, 8, 8, 1, 2, 6, 8]);

        let plan = DispatchPlan::new(&indices, 2, 3, Some(2));
        assert_eq!(plan.kept, vec![2, 1, 2]);
        assert_eq!(plan.slots, vec![0, 3, 5, 1, 2]);
        assert_eq!(plan.dropped(), 3);
    }

    #[test]
    fn decoding_pads_inactive_experts() {
        // One token, top-2 of 8 experts: batched, 6 experts would be padding only.
        let plan = DispatchPlan::new(&[3, 6], 2, 8, None);
        assert_eq!(plan.padded_rows(), 6);
        assert_eq!(plan.padded_layout().slots, vec![2, 2, 2, 0, 2, 2, 1, 2]);
    }

    #[test]
    fn both_strategies_agree() {
        for device in test_devices() {
            device.seed(42);
            let experts = ExpertsConfig::new(6, 5, 4).init(&device);
            let x = Tensor::<2>::random([5, 6], Distribution::Normal(0.0, 1.0), &device);
            let weights = Tensor::<2>::random([5, 2], Distribution::Uniform(0.0, 1.0), &device);
            // Expert 2 gets nothing; expert 0 gets three tokens.
            let plan = DispatchPlan::new(&[0, 1, 0, 3, 1, 3, 0, 1, 3, 1], 2, 4, None);
            // The weights on the outputs, or on the inputs (Llama 4): padding rows add
            // nothing either way.
            for weighted_inputs in [false, true] {
                let run = |strategy| {
                    let (x, weights) = (x.clone(), weights.clone());
                    experts.dispatch(x, weights, &plan, strategy, weighted_inputs)
                };
                let batched = run(ExpertDispatch::Batched);
                let per_expert = run(ExpertDispatch::PerExpert);
                let what = format!("batched vs per expert, weighted inputs {weighted_inputs}");
                assert_close(batched, per_expert.clone(), 1e-5, &what);
                // Token 4 goes to experts 3 and 1, in that order.
                let token = x.clone().narrow(0, 4, 1);
                let weight = |slot: usize| weights.clone().narrow(0, 4, 1).narrow(1, slot, 1);
                let expected = if weighted_inputs {
                    experts.forward_expert(3, token.clone() * weight(0))
                        + experts.forward_expert(1, token * weight(1))
                } else {
                    experts.forward_expert(3, token.clone()) * weight(0)
                        + experts.forward_expert(1, token) * weight(1)
                };
                assert_close(per_expert.narrow(0, 4, 1), expected, 1e-5, &what);
            }
        }
    }

    #[test]
    fn stacking_per_expert_swiglus_round_trips() {
        for device in test_devices() {
            device.seed(41);
            let singles: Vec<SwiGlu> = (0..3)
                .map(|_| SwiGluConfig::new(6, 5).init(&device))
                .collect();
            let experts = Experts::from_per_expert(&singles);
            assert_eq!(experts.gate_up_proj.dims(), [3, 10, 6]);
            let x = Tensor::<2>::random([4, 6], Distribution::Normal(0.0, 1.0), &device);
            for (index, single) in singles.iter().enumerate() {
                assert_close(
                    experts.expert(index).forward(x.clone()),
                    single.forward(x.clone()),
                    1e-6,
                    "expert round trip",
                );
            }
        }
    }
}
