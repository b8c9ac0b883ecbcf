//! The sparse mixture-of-experts feed-forward layer (Shazeer et al., 2017; Switch
//! Transformer, Fedus et al., 2021): a router picks `top_k` of `n_experts` SwiGLU
//! experts per token, and the token's output is the weighted sum of theirs, plus the
//! always-on shared experts (DeepSeekMoE).
//!
//! Equal to Hugging Face's `MixtralSparseMoeBlock` (softmax router, no shared expert),
//! `DeepseekV3MoE` (sigmoid, group-limited router with a balancing bias, shared
//! experts) and `Qwen2MoeSparseMoeBlock` (a shared expert behind a sigmoid gate); see
//! the presets [`MoeConfig::mixtral`] and [`MoeConfig::deepseek_v3`].
//!
//! # Hugging Face keys
//! Relative to the layer (`model.layers.N.mlp.` for DeepSeek and for Mixtral in
//! transformers 5; `model.layers.N.block_sparse_moe.` in Mixtral's published files):
//!
//! | checkpoint key | field |
//! |---|---|
//! | `gate.weight` `[n_experts, d_model]` | `gate.weight` (same layout, no transpose) |
//! | `gate.e_score_correction_bias` | `gate.e_score_correction_bias` |
//! | `experts.gate_up_proj` `[n_experts, 2·d_ff, d_model]`, `experts.down_proj` `[n_experts, d_model, d_ff]` (transformers 5) | `experts.gate_up_proj`, `experts.down_proj` (same layout) |
//! | `experts.N.gate_proj.weight`, `experts.N.up_proj.weight` (DeepSeek; Mixtral `w1`, `w3`), each `[d_ff, d_model]` | `experts.gate_up_proj[N, ..d_ff]`, `[N, d_ff..]` (stack, no transpose; [`Experts::from_per_expert`]) |
//! | `experts.N.down_proj.weight` (Mixtral `w2`) `[d_model, d_ff]` | `experts.down_proj[N]` |
//! | `shared_experts.gate_proj/up_proj/down_proj.weight` (Qwen2-MoE `shared_expert.…`) | `shared_experts` (one SwiGLU of width `n_shared_experts · d_ff`, or `shared_d_ff`) |
//! | `shared_expert_gate.weight` `[1, d_model]` (Qwen2-MoE) | `shared_expert_gate.weight` `[d_model, 1]` (transposed, as every Linear) |
//!
//! Gemma-4 runs its dense feed-forward beside the experts ([`MoeConfig::stream_norms`]):
//! the dense one is our shared experts, and the layer routes the block's residual
//! stream rather than the block's normed input.

use burn::config::Config;
use burn::module::Module;
use burn::nn::{Linear, LinearConfig};
use burn::tensor::activation::sigmoid;
use burn::tensor::{Device, Int, Tensor};

use super::experts::{DispatchPlan, ExpertDispatch, ExpertGlu, Experts, ExpertsConfig};
use super::router::{Router, RouterConfig, load_balancing_loss, router_z_loss};
use crate::error::ConfigError;
use crate::ffn::{Activation, SwiGlu, SwiGluConfig};
use crate::norm::{Norm, NormConfig};

const MODULE: &str = "MoeConfig";

/// Configuration of a [`Moe`] layer.
#[derive(Config, Debug)]
pub struct MoeConfig {
    /// The router: width, number of experts, top-k and the routing rule.
    pub router: RouterConfig,
    /// Hidden width of each routed expert (HF `moe_intermediate_size`; Mixtral's
    /// `intermediate_size`).
    pub d_ff: usize,
    /// Shared experts applied to every token, fused into one SwiGLU of width
    /// `n_shared_experts · d_ff` (HF `n_shared_experts`). Default: 0.
    #[config(default = 0)]
    pub n_shared_experts: usize,
    /// Width of the shared experts' fused SwiGLU when it is not `n_shared_experts ·
    /// d_ff` (Qwen2-MoE's `shared_expert_intermediate_size`). Default: none.
    #[config(default = "None")]
    pub shared_d_ff: Option<usize>,
    /// Scales the shared experts' output per token by `sigmoid(x · w)`, a learned
    /// `d_model → 1` projection without bias (Qwen2-MoE's `shared_expert_gate`), so
    /// that each token decides how much of the shared expert it takes. Default: false.
    #[config(default = false)]
    pub shared_expert_gate: bool,
    /// Biases on the shared experts' three projections (ERNIE-4.5-MoE's `use_bias`,
    /// which leaves the routed experts without). Default: false.
    #[config(default = false)]
    pub shared_expert_bias: bool,
    /// Expert capacity `ceil(capacity_factor · tokens · top_k / n_experts)`: an expert
    /// evaluates at most that many tokens per call, the earliest ones; later
    /// assignments are dropped (the token keeps only its residual for that expert).
    /// Default: none (no dropping, as HF at inference).
    #[config(default = "None")]
    pub capacity_factor: Option<f64>,
    /// Activation of the experts' gates (HF `hidden_act`). Default: SiLU.
    #[config(default = "Activation::Silu")]
    pub activation: Activation,
    /// How the routed experts are evaluated. Default: one expert at a time.
    #[config(default = "ExpertDispatch::PerExpert")]
    pub dispatch: ExpertDispatch,
    /// How each routed expert combines its gate and up halves. Default:
    /// `activation(gate) · up`; gpt-oss clamps ([`ExpertGlu::Clamped`]).
    #[config(default = "ExpertGlu::Gated")]
    pub expert_glu: ExpertGlu,
    /// Biases on the routed experts' projections (gpt-oss). Default: false.
    #[config(default = false)]
    pub expert_bias: bool,
    /// Each routed expert reads its token times the routing weight and its output is
    /// summed as it is (Llama 4), instead of weighting the output: the experts are not
    /// linear, so the two differ. Not with `expert_bias`. Default: false.
    #[config(default = false)]
    pub weighted_inputs: bool,
    /// Gemma-4's arrangement, with norms of this kind: the layer is also given the
    /// block's residual stream ([`Moe::forward_beside`]); the router reads that stream,
    /// the routed experts read it through a norm of their own
    /// (`pre_feedforward_layernorm_2`), and the shared experts (Gemma-4's dense
    /// feed-forward, which reads the block's normed input as usual) and the routed
    /// experts each have a norm on their output (`post_feedforward_layernorm_1`,
    /// `post_feedforward_layernorm_2`) before the two are summed. Default: none.
    #[config(default = "None")]
    pub stream_norms: Option<NormConfig>,
}

impl MoeConfig {
    /// Checks the configuration.
    ///
    /// # Errors
    /// The router's errors ([`RouterConfig::validate`]); [`ConfigError::Zero`] for a zero
    /// `d_ff` or `shared_d_ff`; [`ConfigError::Invalid`] for a capacity factor that is
    /// not positive, or a shared width or gate without shared experts.
    pub fn validate(&self) -> Result<(), ConfigError> {
        self.router.validate()?;
        ConfigError::check_positive(MODULE, "d_ff", self.d_ff)?;
        if let Some(width) = self.shared_d_ff {
            ConfigError::check_positive(MODULE, "shared_d_ff", width)?;
        }
        if self.n_shared_experts == 0 {
            for (field, set) in [
                ("shared_d_ff", self.shared_d_ff.is_some()),
                ("shared_expert_gate", self.shared_expert_gate),
                ("shared_expert_bias", self.shared_expert_bias),
            ] {
                if set {
                    return Err(ConfigError::Invalid {
                        module: MODULE,
                        field,
                        reason: "is set but n_shared_experts is 0: set n_shared_experts to 1 \
                                 or more, or leave it unset"
                            .into(),
                    });
                }
            }
        }
        if let Some(factor) = self.capacity_factor {
            ConfigError::check_positive_real(MODULE, "capacity_factor", factor)?;
        }
        if self.weighted_inputs && self.expert_bias {
            // Rows that only pad an expert's batch read zeros, which a biased expert
            // would not map to zero.
            return Err(ConfigError::Invalid {
                module: MODULE,
                field: "weighted_inputs",
                reason: "is not supported with expert_bias: set one of the two".into(),
            });
        }
        if let Some(norm) = &self.stream_norms {
            norm.validate()?;
            if norm.d_model() != self.router.d_model {
                return Err(ConfigError::Invalid {
                    module: MODULE,
                    field: "stream_norms.d_model",
                    reason: format!(
                        "must equal router.d_model {}, got {}",
                        self.router.d_model,
                        norm.d_model()
                    ),
                });
            }
        }
        Ok(())
    }

    /// Validates the configuration and builds the layer.
    ///
    /// # Errors
    /// See [`validate`](Self::validate).
    pub fn try_init(&self, device: &Device) -> Result<Moe, ConfigError> {
        self.validate()?;
        let d_model = self.router.d_model;
        let stream_norm = || {
            (self.stream_norms.as_ref())
                .map(|norm| norm.try_init(device))
                .transpose()
        };
        Ok(Moe {
            gate: self.router.try_init(device)?,
            experts: ExpertsConfig::new(d_model, self.d_ff, self.router.n_experts)
                .with_activation(self.activation)
                .with_glu(self.expert_glu)
                .with_bias(self.expert_bias)
                .try_init(device)?,
            shared_experts: (self.n_shared_experts > 0).then(|| {
                let width = self
                    .shared_d_ff
                    .unwrap_or(self.n_shared_experts * self.d_ff);
                SwiGluConfig::new(d_model, width)
                    .with_activation(self.activation)
                    .with_bias(self.shared_expert_bias)
                    .init(device)
            }),
            shared_expert_gate: self
                .shared_expert_gate
                .then(|| LinearConfig::new(d_model, 1).with_bias(false).init(device)),
            post_feedforward_layernorm_1: stream_norm()?,
            pre_feedforward_layernorm_2: stream_norm()?,
            post_feedforward_layernorm_2: stream_norm()?,
            capacity_factor: self.capacity_factor,
            dispatch: self.dispatch,
            weighted_inputs: self.weighted_inputs,
        })
    }
}

crate::builders::init_or_panic!(MoeConfig => Moe);

/// A sparse mixture-of-experts feed-forward layer. Field names are the Hugging Face keys
/// (see the module docs for the table).
#[derive(Module, Debug)]
pub struct Moe {
    /// The router (HF `gate`).
    pub gate: Router,
    /// The routed experts, stacked (transformers 5's `experts.gate_up_proj`,
    /// `experts.down_proj`).
    pub experts: Experts,
    /// The shared experts, fused into one SwiGLU, if any.
    pub shared_experts: Option<SwiGlu>,
    /// `d_model → 1`: the per-token sigmoid gate on the shared experts' output, if any.
    pub shared_expert_gate: Option<Linear>,
    /// The norm of the shared experts' output in Gemma-4's arrangement.
    pub post_feedforward_layernorm_1: Option<Norm>,
    /// The norm of the routed experts' input in Gemma-4's arrangement.
    pub pre_feedforward_layernorm_2: Option<Norm>,
    /// The norm of the routed experts' output in Gemma-4's arrangement.
    pub post_feedforward_layernorm_2: Option<Norm>,
    #[module(skip)]
    capacity_factor: Option<f64>,
    #[module(skip)]
    dispatch: ExpertDispatch,
    #[module(skip)]
    weighted_inputs: bool,
}

/// What a [`Moe`] layer returns: its output and, for training, the routing losses and
/// statistics.
#[derive(Clone, Debug)]
pub struct MoeOutput {
    /// `[batch, seq, d_model]`: the layer output (without the residual).
    pub output: Tensor<3>,
    /// `[1]`: the Switch/Mixtral load-balancing loss ([`load_balancing_loss`]); `top_k`
    /// when balanced. Multiply by a coefficient (HF `router_aux_loss_coef`, 0.001–0.02)
    /// and add to the training loss.
    pub aux_loss: Tensor<1>,
    /// `[1]`: the ST-MoE router z-loss ([`router_z_loss`]); its usual coefficient is 0.001.
    pub z_loss: Tensor<1>,
    /// `[tokens, n_experts]`: the router logits (HF `output_router_logits`), tokens in
    /// `batch`-major order.
    pub router_logits: Tensor<2>,
    /// Assignments per expert before capacity dropping (the input of
    /// [`Router::update_correction_bias`]).
    pub tokens_per_expert: Vec<usize>,
    /// Assignments dropped by the capacity limit.
    pub dropped: usize,
    /// Expert rows computed only as padding of uneven expert loads (0 when the experts
    /// ran one by one; see [`ExpertDispatch`]).
    pub padded_rows: usize,
}

impl Moe {
    /// Changes how the routed experts are evaluated (the outputs do not change).
    pub fn set_dispatch(&mut self, dispatch: ExpertDispatch) {
        self.dispatch = dispatch;
    }

    /// The routed experts' outputs, weighted, plus the shared experts'.
    ///
    /// # Shapes
    /// - x: `[batch, seq, d_model]`
    /// - output: see [`MoeOutput`]
    pub fn forward(&self, x: Tensor<3>) -> MoeOutput {
        self.forward_beside(x.clone(), x)
    }

    /// [`forward`](Self::forward) given the block's residual stream too, which the
    /// layer routes in Gemma-4's arrangement ([`MoeConfig::stream_norms`]); the other
    /// layers ignore it.
    ///
    /// # Shapes
    /// - x: `[batch, seq, d_model]`, the block's normed input
    /// - stream: `[batch, seq, d_model]`, the block's residual stream
    /// - output: see [`MoeOutput`]
    pub fn forward_beside(&self, x: Tensor<3>, stream: Tensor<3>) -> MoeOutput {
        let [batch, seq, d_model] = x.dims();
        let tokens = batch * seq;
        let (routed_input, expert_input) = self.routed_inputs(x.clone(), stream);
        let flat = expert_input.reshape([tokens, d_model]); // [tokens, d_model]
        let routing = self.gate.forward(routed_input.reshape([tokens, d_model]));
        let top_k = self.gate.top_k();
        let n_experts = self.experts.n_experts();
        let indices = routing_indices(routing.indices.clone());
        let capacity = self
            .capacity_factor
            .map(|factor| (factor * (tokens * top_k) as f64 / n_experts as f64).ceil() as usize);
        let plan = DispatchPlan::new(&indices, top_k, n_experts, capacity);
        let routed = self.experts.dispatch(
            flat,
            routing.weights.clone(),
            &plan,
            self.dispatch,
            self.weighted_inputs,
        );
        let output = self.combine(x, routed.reshape([batch, seq, d_model]));
        let probabilities = self.gate.balance_probabilities(routing.scores.clone());
        MoeOutput {
            output,
            aux_loss: load_balancing_loss(probabilities, &plan.routed),
            z_loss: router_z_loss(routing.logits.clone()),
            router_logits: routing.logits,
            dropped: plan.dropped(),
            padded_rows: match self.dispatch {
                ExpertDispatch::PerExpert => 0,
                ExpertDispatch::Batched => plan.padded_rows(),
            },
            tokens_per_expert: plan.routed,
        }
    }

    /// The test and benchmark reference: every expert on every token, weighted by the
    /// routing (zero for unchosen experts), without capacity limits. `n_experts` times
    /// the work of [`forward`](Self::forward).
    ///
    /// # Shapes
    /// - x: `[batch, seq, d_model]`
    /// - output: `[batch, seq, d_model]`
    pub fn forward_dense_reference(&self, x: Tensor<3>) -> Tensor<3> {
        let [batch, seq, d_model] = x.dims();
        let tokens = batch * seq;
        let n_experts = self.experts.n_experts();
        let (routed_input, expert_input) = self.routed_inputs(x.clone(), x.clone());
        let flat = expert_input.reshape([tokens, d_model]);
        let routing = self.gate.forward(routed_input.reshape([tokens, d_model]));
        // [tokens, n_experts]: each token's weight for every expert, zero if unchosen.
        let dense_weights = Tensor::<2>::zeros([tokens, n_experts], &flat.device()).scatter(
            1,
            routing.indices,
            routing.weights,
            burn::tensor::IndexingUpdateOp::Add,
        );
        let mut output = Tensor::<2>::zeros([tokens, d_model], &flat.device()).cast(x.dtype());
        for e in 0..n_experts {
            let weight = dense_weights.clone().narrow(1, e, 1).cast(x.dtype()); // [tokens, 1]
            output = output
                + match self.weighted_inputs {
                    true => self.experts.forward_expert(e, flat.clone() * weight),
                    false => self.experts.forward_expert(e, flat.clone()) * weight,
                };
        }
        self.combine(x, output.reshape([batch, seq, d_model]))
    }

    /// What the router and the routed experts read: `x` both, or in Gemma-4's
    /// arrangement the stream and the stream through `pre_feedforward_layernorm_2`.
    ///
    /// # Shapes
    /// - x, stream: `[batch, seq, d_model]`
    /// - output: the router's and the experts' inputs, `[batch, seq, d_model]` each
    fn routed_inputs(&self, x: Tensor<3>, stream: Tensor<3>) -> (Tensor<3>, Tensor<3>) {
        match &self.pre_feedforward_layernorm_2 {
            Some(norm) => (stream.clone(), norm.forward(stream)),
            None => (x.clone(), x),
        }
    }

    /// The layer's output: the routed experts' weighted output `routed` plus the shared
    /// experts' output of `x`, each through its norm in Gemma-4's arrangement.
    ///
    /// # Shapes
    /// - x, routed: `[batch, seq, d_model]`
    /// - output: `[batch, seq, d_model]`
    fn combine(&self, x: Tensor<3>, routed: Tensor<3>) -> Tensor<3> {
        let normed = |norm: &Option<Norm>, y: Tensor<3>| match norm {
            Some(norm) => norm.forward(y),
            None => y,
        };
        let routed = normed(&self.post_feedforward_layernorm_2, routed);
        match self.shared_output(x) {
            Some(shared) => normed(&self.post_feedforward_layernorm_1, shared) + routed,
            None => routed,
        }
    }

    /// The shared experts' output, through their gate if there is one; `None` without
    /// shared experts.
    ///
    /// # Shapes
    /// - x: `[batch, seq, d_model]`
    /// - output: `[batch, seq, d_model]`
    fn shared_output(&self, x: Tensor<3>) -> Option<Tensor<3>> {
        let shared = self.shared_experts.as_ref()?.forward(x.clone());
        Some(match &self.shared_expert_gate {
            // [batch, seq, 1], broadcast over the features.
            Some(gate) => shared * sigmoid(gate.forward(x)),
            None => shared,
        })
    }
}

/// The router's `[tokens, top_k]` choices on the host, row-major.
fn routing_indices(indices: Tensor<2, Int>) -> Vec<i64> {
    // Int tensors are i32 on some backends and i64 on others; convert either way. The
    // values come from our own top-k, so a failed read is a backend bug.
    indices
        .into_data()
        .convert::<i64>()
        .try_to_vec::<i64>()
        .unwrap_or_else(|error| panic!("Moe: reading the routing indices failed: {error:?}"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ffn::moe::RouterScoring;
    use crate::test_utils::{assert_close, test_devices};
    use burn::tensor::Distribution;

    /// A softmax-routed layer without shared experts (Mixtral's kind).
    fn softmax_moe(d_model: usize, d_ff: usize, n_experts: usize, top_k: usize) -> MoeConfig {
        MoeConfig::new(RouterConfig::new(d_model, n_experts, top_k), d_ff)
    }

    /// gpt-oss's MoE against transformers' `GptOssMLP` (tools/make_fixtures.py): router
    /// with bias and softmax over the selected logits, experts with biases and the
    /// clamped SwiGLU (some gates past the limit), both dispatch strategies.
    #[test]
    fn matches_gpt_oss_mlp() {
        use super::super::experts::ExpertGlu;
        use burn::module::Param;
        let fixture = crate::test_utils::Fixture::load("moe_gpt_oss");
        let glu = ExpertGlu::Clamped {
            alpha: 1.702,
            limit: 7.0,
        };
        for device in test_devices() {
            for dispatch in [ExpertDispatch::PerExpert, ExpertDispatch::Batched] {
                let mut moe = MoeConfig::new(RouterConfig::new(16, 4, 2).with_bias(true), 8)
                    .with_expert_glu(glu)
                    .with_expert_bias(true)
                    .with_dispatch(dispatch)
                    .init(&device);
                moe.gate.weight = Param::from_tensor(fixture.tensor("router.weight", &device));
                moe.gate.bias = Some(Param::from_tensor(fixture.tensor("router.bias", &device)));
                moe.experts = Experts::from_gpt_oss(
                    fixture.tensor("experts.gate_up_proj", &device),
                    fixture.tensor("experts.gate_up_proj_bias", &device),
                    fixture.tensor("experts.down_proj", &device),
                    fixture.tensor("experts.down_proj_bias", &device),
                    glu,
                );
                let x = fixture.tensor::<3>("x", &device);
                let name = format!("{dispatch:?} on {device:?}");
                assert_close(
                    moe.forward(x.clone()).output,
                    fixture.tensor("y", &device),
                    1e-4,
                    &name,
                );
                assert_close(
                    moe.forward_dense_reference(x),
                    fixture.tensor("y", &device),
                    1e-4,
                    "dense reference",
                );
            }
        }
    }

    #[test]
    fn one_expert_top_1_equals_that_expert() {
        for device in test_devices() {
            device.seed(21);
            let moe = softmax_moe(12, 20, 1, 1).init(&device);
            let x = Tensor::<3>::random([2, 5, 12], Distribution::Normal(0.0, 1.0), &device);
            let out = moe.forward(x.clone());
            assert_close(
                out.output,
                moe.experts.expert(0).forward(x),
                1e-5,
                "one expert",
            );
            assert_eq!(out.tokens_per_expert, vec![10]);
            // Everything on the one expert: f = 1, P = 1, loss = 1 · 1 · 1.
            assert_close(
                out.aux_loss,
                Tensor::from_floats([1.0], &device),
                1e-6,
                "aux",
            );
        }
    }

    #[test]
    fn sparse_dispatch_equals_dense_reference_with_groups_and_shared_experts() {
        for device in test_devices() {
            device.seed(22);
            let router = RouterConfig::new(12, 8, 3)
                .with_scoring(RouterScoring::Sigmoid)
                .with_n_group(4)
                .with_topk_group(2)
                .with_routed_scaling_factor(1.5)
                .with_score_correction_bias(true)
                .with_initializer(burn::module::Initializer::Normal {
                    mean: 0.0,
                    std: 0.5,
                });
            let mut moe = MoeConfig::new(router, 10)
                .with_n_shared_experts(2)
                .init(&device);
            let x = Tensor::<3>::random([3, 7, 12], Distribution::Normal(0.0, 1.0), &device);
            let reference = moe.forward_dense_reference(x.clone());
            for strategy in [ExpertDispatch::PerExpert, ExpertDispatch::Batched] {
                moe.set_dispatch(strategy);
                let out = moe.forward(x.clone());
                assert_eq!(out.tokens_per_expert.iter().sum::<usize>(), 21 * 3);
                assert_close(
                    out.output,
                    reference.clone(),
                    1e-5,
                    &format!("{strategy:?} vs dense"),
                );
            }
        }
    }

    /// Qwen2-MoE's shared expert: its own width, its output scaled per token by
    /// `sigmoid(x · w)`, added to the routed experts'.
    #[test]
    fn gated_shared_expert_adds_its_output_times_the_sigmoid_of_its_gate() {
        let device = Device::flex();
        device.seed(5);
        let mut moe = softmax_moe(12, 10, 4, 2)
            .with_n_shared_experts(1)
            .with_shared_d_ff(Some(6))
            .with_shared_expert_gate(true)
            .init(&device);
        let shared = moe.shared_experts.take().unwrap();
        assert_eq!(shared.gate_proj.weight.dims(), [12, 6]);
        let gate = moe.shared_expert_gate.take().unwrap();
        let x = Tensor::<3>::random([2, 5, 12], Distribution::Normal(0.0, 1.0), &device);
        let routed = moe.forward(x.clone()).output;
        // [2, 5, 1]: x · w by hand, through the sigmoid.
        let w = gate.weight.val().unsqueeze::<3>().expand([2, 12, 1]);
        let scale = burn::tensor::activation::sigmoid(x.clone().matmul(w));
        let expected = routed + shared.forward(x.clone()) * scale;
        moe.shared_experts = Some(shared);
        moe.shared_expert_gate = Some(gate);
        assert_close(
            moe.forward(x.clone()).output,
            expected.clone(),
            1e-6,
            "forward",
        );
        assert_close(
            moe.forward_dense_reference(x),
            expected,
            1e-5,
            "dense reference",
        );
    }

    #[test]
    fn a_shared_width_or_gate_without_shared_experts_is_an_error() {
        for config in [
            softmax_moe(4, 4, 2, 1).with_shared_d_ff(Some(8)),
            softmax_moe(4, 4, 2, 1).with_shared_expert_gate(true),
        ] {
            let error = config.validate().unwrap_err().to_string();
            assert!(error.contains("n_shared_experts is 0"), "{error}");
        }
        let error = softmax_moe(4, 4, 2, 1)
            .with_n_shared_experts(1)
            .with_shared_d_ff(Some(0))
            .validate()
            .unwrap_err();
        assert!(error.to_string().contains("shared_d_ff"), "{error}");
    }

    #[test]
    fn dropped_assignments_contribute_nothing() {
        for device in test_devices() {
            device.seed(23);
            // 2 experts, top-1, capacity factor 0.5: each expert keeps ceil(0.5·8/2) = 2
            // of its tokens; the others get zero (only their residual, outside).
            let moe = softmax_moe(6, 8, 2, 1)
                .with_capacity_factor(Some(0.5))
                .init(&device);
            let x = Tensor::<3>::random([1, 8, 6], Distribution::Normal(0.0, 1.0), &device);
            let out = moe.forward(x.clone());
            let routing = moe.gate.forward(x.clone().reshape([8, 6]));
            let chosen = routing_indices(routing.indices);
            let weights = routing.weights.into_data().try_to_vec::<f32>().unwrap();
            let mut seen = [0usize; 2];
            let mut rows = Vec::new();
            for (token, &expert) in chosen.iter().enumerate() {
                let expert = expert as usize;
                let row = x.clone().narrow(1, token, 1).reshape([1, 6]);
                rows.push(if seen[expert] < 2 {
                    moe.experts.expert(expert).forward(row) * weights[token]
                } else {
                    Tensor::zeros([1, 6], &device)
                });
                seen[expert] += 1;
            }
            assert_eq!(
                out.dropped,
                seen.iter().map(|&s| s.saturating_sub(2)).sum::<usize>()
            );
            let expected = Tensor::cat(rows, 0).reshape([1, 8, 6]);
            assert_close(out.output, expected, 1e-5, "capacity dropping");
        }
    }

    /// Asserts that a gradient exists, is finite and is not all zero. Reading it back
    /// also waits for the device's work: a test process that exits while lavapipe still
    /// compiles kernels can crash inside LLVM.
    fn assert_reached<const D: usize>(grad: Option<Tensor<D>>, what: &str, on: &str) {
        let values = grad
            .unwrap_or_else(|| panic!("no {what} gradient {on}"))
            .into_data()
            .try_to_vec::<f32>()
            .unwrap();
        assert!(
            values.iter().all(|v| v.is_finite()) && values.iter().any(|&v| v != 0.0),
            "{what} gradient {on}: {values:?}"
        );
    }

    #[test]
    fn gradients_reach_router_and_experts() {
        for device in test_devices() {
            let device = device.autodiff();
            device.seed(24);
            let moe = softmax_moe(6, 8, 4, 2).init(&device);
            let x = Tensor::<3>::random([2, 3, 6], Distribution::Normal(0.0, 1.0), &device)
                .require_grad();
            let out = moe.forward(x.clone());
            let loss = out.output.sum() + out.aux_loss * 0.01 + out.z_loss * 0.001;
            let grads = loss.backward();
            let on = format!("on {device:?}");
            assert_reached(moe.gate.weight.val().grad(&grads), "router", &on);
            assert_reached(x.grad(&grads), "input", &on);
            assert_reached(moe.experts.gate_up_proj.val().grad(&grads), "gate/up", &on);
            assert_reached(moe.experts.down_proj.val().grad(&grads), "down", &on);
        }
    }

    #[test]
    #[should_panic(expected = "MoeConfig: `capacity_factor` is invalid: must be positive")]
    fn init_panics_with_the_validation_message() {
        softmax_moe(4, 4, 2, 1)
            .with_capacity_factor(Some(0.0))
            .init(&Device::flex());
    }
}
