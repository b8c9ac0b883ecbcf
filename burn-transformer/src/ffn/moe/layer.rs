//! The sparse mixture-of-experts feed-forward layer (Shazeer et al., 2017; Switch
//! Transformer, Fedus et al., 2021): a router picks `top_k` of `n_experts` SwiGLU
//! experts per token, and the token's output is the weighted sum of theirs, plus the
//! always-on shared experts (DeepSeekMoE).
//!
//! Equal to Hugging Face's `MixtralSparseMoeBlock` (softmax router, no shared expert)
//! and `DeepseekV3MoE` (sigmoid, group-limited router with a balancing bias, shared
//! experts); see [`MoeConfig::mixtral`], [`MoeConfig::deepseek_v3`] and
//! [`MoeConfig::from_hf_config`].
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
//! | `shared_experts.gate_proj/up_proj/down_proj.weight` | `shared_experts` (one SwiGLU of width `n_shared_experts · d_ff`) |

use burn::config::Config;
use burn::module::Module;
use burn::tensor::{Device, Int, Tensor};
use serde_json::{Map, Value};

use super::experts::{DispatchPlan, ExpertDispatch, Experts, ExpertsConfig};
use super::router::{
    GroupScoring, Router, RouterConfig, RouterScoring, load_balancing_loss, router_z_loss,
};
use crate::error::ConfigError;
use crate::ffn::{Activation, SwiGlu, SwiGluConfig};

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
}

impl MoeConfig {
    /// Mixtral's sparse block: softmax router with renormalized top-k, no shared expert
    /// (Mixtral 8x7B: `mixtral(4096, 14336, 8, 2)`).
    pub fn mixtral(d_model: usize, d_ff: usize, n_experts: usize, top_k: usize) -> Self {
        Self::new(RouterConfig::new(d_model, n_experts, top_k), d_ff)
    }

    /// DeepSeek-V3's MoE: 256 routed experts of width 2048 in 8 groups (4 eligible), top-8,
    /// sigmoid scores with the correction bias, renormalized and scaled by 2.5, one
    /// shared expert.
    pub fn deepseek_v3() -> Self {
        let router = RouterConfig::new(7168, 256, 8)
            .with_scoring(RouterScoring::Sigmoid)
            .with_routed_scaling_factor(2.5)
            .with_n_group(8)
            .with_topk_group(4)
            .with_score_correction_bias(true);
        Self::new(router, 2048).with_n_shared_experts(1)
    }

    /// Reads the MoE of a Hugging Face `config.json` (Mixtral, DeepSeek-V2/V3, Qwen-MoE
    /// style keys):
    /// - experts: `n_routed_experts`, else `num_local_experts`, else `num_experts`;
    ///   `num_experts_per_tok`; width `moe_intermediate_size`, else `intermediate_size`;
    /// - `n_shared_experts` (default 0), `routed_scaling_factor` (default 1), `n_group`
    ///   and `topk_group` (default 1), `hidden_act` (default silu);
    /// - scoring: `scoring_func` when present, else sigmoid for `model_type`
    ///   `deepseek_v3`, softmax otherwise;
    /// - `norm_topk_prob`: the key, else true for `mixtral` and `deepseek_v3`, false
    ///   otherwise (transformers' defaults);
    /// - the correction bias for `deepseek_v3` or `topk_method: "noaux_tc"`; group score
    ///   max for `topk_method: "group_limited_greedy"` (DeepSeek-V2).
    ///
    /// # Errors
    /// [`ConfigError::Invalid`] naming the key that is missing or malformed.
    pub fn from_hf_config(config: &Value) -> Result<Self, ConfigError> {
        let object = config
            .as_object()
            .ok_or_else(|| invalid("config", "expected a JSON object".into()))?;
        let first = |keys: &[&'static str]| -> Result<usize, ConfigError> {
            for key in keys {
                if let Some(value) = json_usize(object, key)? {
                    return Ok(value);
                }
            }
            Err(invalid(
                keys[0],
                format!("missing (also looked for {keys:?})"),
            ))
        };
        let model_type = object
            .get("model_type")
            .and_then(Value::as_str)
            .unwrap_or("");
        let topk_method = object
            .get("topk_method")
            .and_then(Value::as_str)
            .unwrap_or("");
        let scoring = match object.get("scoring_func").and_then(Value::as_str) {
            Some("softmax") => RouterScoring::Softmax,
            Some("sigmoid") => RouterScoring::Sigmoid,
            Some(other) => {
                return Err(invalid(
                    "scoring_func",
                    format!("expected softmax or sigmoid, got {other}"),
                ));
            }
            None if model_type == "deepseek_v3" => RouterScoring::Sigmoid,
            None => RouterScoring::Softmax,
        };
        let norm_topk_prob = match object.get("norm_topk_prob") {
            Some(Value::Bool(value)) => *value,
            None | Some(Value::Null) => matches!(model_type, "mixtral" | "deepseek_v3"),
            Some(value) => {
                return Err(invalid(
                    "norm_topk_prob",
                    format!("expected a bool, got {value}"),
                ));
            }
        };
        let routed_scaling_factor = match object.get("routed_scaling_factor") {
            None | Some(Value::Null) => 1.0,
            Some(value) => value.as_f64().ok_or_else(|| {
                invalid(
                    "routed_scaling_factor",
                    format!("expected a number, got {value}"),
                )
            })?,
        };
        let activation = match object.get("hidden_act").and_then(Value::as_str) {
            Some(name) => Activation::from_hf_name(name)?,
            None => Activation::Silu,
        };
        let router = RouterConfig::new(
            first(&["hidden_size"])?,
            first(&["n_routed_experts", "num_local_experts", "num_experts"])?,
            first(&["num_experts_per_tok"])?,
        )
        .with_scoring(scoring)
        .with_norm_topk_prob(norm_topk_prob)
        .with_routed_scaling_factor(routed_scaling_factor)
        .with_n_group(json_usize(object, "n_group")?.unwrap_or(1))
        .with_topk_group(json_usize(object, "topk_group")?.unwrap_or(1))
        .with_group_scoring(if topk_method == "group_limited_greedy" {
            GroupScoring::Max
        } else {
            GroupScoring::TopTwoSum
        })
        .with_score_correction_bias(model_type == "deepseek_v3" || topk_method == "noaux_tc");
        Ok(Self::new(
            router,
            first(&["moe_intermediate_size", "intermediate_size"])?,
        )
        .with_n_shared_experts(json_usize(object, "n_shared_experts")?.unwrap_or(0))
        .with_activation(activation))
    }

    /// Checks the configuration.
    ///
    /// # Errors
    /// The router's errors ([`RouterConfig::validate`]); [`ConfigError::Zero`] for a zero
    /// `d_ff`; [`ConfigError::Invalid`] for a capacity factor that is not positive.
    pub fn validate(&self) -> Result<(), ConfigError> {
        self.router.validate()?;
        ConfigError::check_positive(MODULE, "d_ff", self.d_ff)?;
        if let Some(factor) = self.capacity_factor
            && !(factor.is_finite() && factor > 0.0)
        {
            return Err(invalid(
                "capacity_factor",
                format!("must be positive, got {factor}"),
            ));
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
        Ok(Moe {
            gate: self.router.try_init(device)?,
            experts: ExpertsConfig::new(d_model, self.d_ff, self.router.n_experts)
                .with_activation(self.activation)
                .try_init(device)?,
            shared_experts: (self.n_shared_experts > 0).then(|| {
                SwiGluConfig::new(d_model, self.n_shared_experts * self.d_ff)
                    .with_activation(self.activation)
                    .init(device)
            }),
            capacity_factor: self.capacity_factor,
            dispatch: self.dispatch,
        })
    }

    /// Builds the layer.
    ///
    /// # Panics
    /// If the configuration is invalid, with the message of [`validate`](Self::validate).
    pub fn init(&self, device: &Device) -> Moe {
        self.try_init(device)
            .unwrap_or_else(|error| panic!("{error}"))
    }
}

fn invalid(field: &'static str, reason: String) -> ConfigError {
    ConfigError::Invalid {
        module: MODULE,
        field,
        reason,
    }
}

fn json_usize(
    object: &Map<String, Value>,
    key: &'static str,
) -> Result<Option<usize>, ConfigError> {
    match object.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(value) => value
            .as_u64()
            .map(|v| Some(v as usize))
            .ok_or_else(|| invalid(key, format!("expected a non-negative integer, got {value}"))),
    }
}

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
    #[module(skip)]
    capacity_factor: Option<f64>,
    #[module(skip)]
    dispatch: ExpertDispatch,
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
        let [batch, seq, d_model] = x.dims();
        let tokens = batch * seq;
        let flat = x.clone().reshape([tokens, d_model]); // [tokens, d_model]
        let routing = self.gate.forward(flat.clone());
        let top_k = self.gate.top_k();
        let n_experts = self.experts.n_experts();
        let indices = routing_indices(routing.indices.clone());
        let capacity = self
            .capacity_factor
            .map(|factor| (factor * (tokens * top_k) as f64 / n_experts as f64).ceil() as usize);
        let plan = DispatchPlan::new(&indices, top_k, n_experts, capacity);
        let routed = self
            .experts
            .dispatch(flat, routing.weights.clone(), &plan, self.dispatch);
        let mut output = routed.reshape([batch, seq, d_model]);
        if let Some(shared) = &self.shared_experts {
            output = output + shared.forward(x);
        }
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
        let flat = x.clone().reshape([tokens, d_model]);
        let routing = self.gate.forward(flat.clone());
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
            output = output + self.experts.forward_expert(e, flat.clone()) * weight;
        }
        let mut output = output.reshape([batch, seq, d_model]);
        if let Some(shared) = &self.shared_experts {
            output = output + shared.forward(x);
        }
        output
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
    use crate::test_utils::{Fixture, assert_close, fixture_dir, test_devices};
    use burn::module::Param;
    use burn::nn::{Linear, LinearConfig};
    use burn::tensor::Distribution;

    fn load_linear(fixture: &Fixture, prefix: &str, device: &Device) -> Linear {
        let weight = fixture.tensor::<2>(&format!("{prefix}.weight"), device);
        let [d_output, d_input] = weight.dims();
        let mut linear = LinearConfig::new(d_input, d_output)
            .with_bias(false)
            .init(device);
        linear.weight = Param::from_tensor(weight.transpose());
        linear
    }

    fn hf_config(name: &str) -> Value {
        let path = fixture_dir().join(format!("{name}.json"));
        let text = std::fs::read_to_string(&path)
            .unwrap_or_else(|e| panic!("{}: {e} (run tools/make_fixtures.py)", path.display()));
        serde_json::from_str(&text).unwrap()
    }

    /// A layer holding the fixture's weights (fused experts, as transformers 5 stores them).
    fn load(name: &str, model_type: &str, device: &Device) -> (Fixture, Moe) {
        let fixture = Fixture::load(name);
        let mut json = hf_config(name);
        json["model_type"] = Value::from(model_type);
        let config = MoeConfig::from_hf_config(&json).unwrap();
        let mut moe = config.init(device);
        moe.gate.weight = Param::from_tensor(fixture.tensor("gate.weight", device));
        if fixture.contains("gate.e_score_correction_bias") {
            moe.gate.e_score_correction_bias = Some(Param::from_tensor(
                fixture.tensor("gate.e_score_correction_bias", device),
            ));
        }
        moe.experts = Experts::from_fused(
            fixture.tensor("experts.gate_up_proj", device),
            fixture.tensor("experts.down_proj", device),
            config.activation,
        );
        if let Some(shared) = &mut moe.shared_experts {
            shared.gate_proj = load_linear(&fixture, "shared_experts.gate_proj", device);
            shared.up_proj = load_linear(&fixture, "shared_experts.up_proj", device);
            shared.down_proj = load_linear(&fixture, "shared_experts.down_proj", device);
        }
        (fixture, moe)
    }

    fn sorted_rows(indices: Tensor<2, Int>) -> Vec<Vec<i64>> {
        let [_, k] = indices.dims();
        routing_indices(indices)
            .chunks(k)
            .map(|row| {
                let mut row = row.to_vec();
                row.sort();
                row
            })
            .collect()
    }

    #[test]
    fn matches_hugging_face_moe_layers() {
        for (name, model_type) in [
            ("moe_deepseek_v3", "deepseek_v3"),
            ("moe_deepseek_v3_unnormalized", "deepseek_v3"),
            ("moe_mixtral", "mixtral"),
        ] {
            for device in test_devices() {
                let (fixture, mut moe) = load(name, model_type, &device);
                let x = fixture.tensor::<3>("x", &device);
                let out = moe.forward(x.clone());
                assert_close(
                    out.router_logits.clone(),
                    fixture.tensor("router_logits", &device),
                    1e-5,
                    &format!("{name} logits"),
                );
                let routing = moe.gate.forward(x.clone().reshape([18, 16]));
                assert_eq!(
                    sorted_rows(routing.indices),
                    sorted_rows(Tensor::from_data(fixture.data("topk_indices"), &device)),
                    "{name} choices on {device:?}"
                );
                assert_close(out.output, fixture.tensor("y", &device), 1e-5, name);
                for strategy in [ExpertDispatch::PerExpert, ExpertDispatch::Batched] {
                    moe.set_dispatch(strategy);
                    let y = moe.forward(x.clone()).output;
                    let what = format!("{name} {strategy:?}");
                    assert_close(y, fixture.tensor("y", &device), 1e-5, &what);
                }
                assert_close(
                    moe.forward_dense_reference(x),
                    fixture.tensor("y", &device),
                    1e-5,
                    name,
                );
                if fixture.contains("aux_loss") {
                    assert_close(
                        out.aux_loss,
                        fixture.tensor("aux_loss", &device),
                        1e-5,
                        "aux",
                    );
                    assert_close(out.z_loss, fixture.tensor("z_loss", &device), 1e-4, "z");
                }
            }
        }
    }

    #[test]
    fn one_expert_top_1_equals_that_expert() {
        for device in test_devices() {
            device.seed(21);
            let moe = MoeConfig::mixtral(12, 20, 1, 1).init(&device);
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

    #[test]
    fn dropped_assignments_contribute_nothing() {
        for device in test_devices() {
            device.seed(23);
            // 2 experts, top-1, capacity factor 0.5: each expert keeps ceil(0.5·8/2) = 2
            // of its tokens; the others get zero (only their residual, outside).
            let moe = MoeConfig::mixtral(6, 8, 2, 1)
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

    #[test]
    fn gradients_reach_router_and_experts() {
        for device in test_devices() {
            let device = device.autodiff();
            device.seed(24);
            let moe = MoeConfig::mixtral(6, 8, 4, 2).init(&device);
            let x = Tensor::<3>::random([2, 3, 6], Distribution::Normal(0.0, 1.0), &device)
                .require_grad();
            let out = moe.forward(x.clone());
            let loss = out.output.sum() + out.aux_loss * 0.01 + out.z_loss * 0.001;
            let grads = loss.backward();
            assert!(
                moe.gate.weight.val().grad(&grads).is_some(),
                "router gradient on {device:?}"
            );
            assert!(x.grad(&grads).is_some(), "input gradient");
            assert!(moe.experts.gate_up_proj.val().grad(&grads).is_some());
            assert!(moe.experts.down_proj.val().grad(&grads).is_some());
        }
    }

    #[test]
    fn reads_hugging_face_configs() {
        let config = MoeConfig::from_hf_config(&serde_json::json!({
            "model_type": "mixtral", "hidden_size": 4096, "intermediate_size": 14336,
            "num_local_experts": 8, "num_experts_per_tok": 2, "hidden_act": "silu"
        }))
        .unwrap();
        assert_eq!(config.router.n_experts, 8);
        assert!(config.router.norm_topk_prob);
        assert_eq!(config.router.scoring, RouterScoring::Softmax);
        let config = MoeConfig::from_hf_config(&serde_json::json!({
            "model_type": "deepseek_v3", "hidden_size": 7168, "moe_intermediate_size": 2048,
            "intermediate_size": 18432, "n_routed_experts": 256, "num_experts_per_tok": 8,
            "n_group": 8, "topk_group": 4, "n_shared_experts": 1, "routed_scaling_factor": 2.5,
            "norm_topk_prob": true, "scoring_func": "sigmoid", "topk_method": "noaux_tc"
        }))
        .unwrap();
        let reference = MoeConfig::deepseek_v3();
        assert_eq!(config.d_ff, reference.d_ff);
        assert_eq!(config.router.n_group, reference.router.n_group);
        assert!(config.router.score_correction_bias);
        assert_eq!(config.router.scoring, RouterScoring::Sigmoid);
        config.validate().unwrap();
        assert!(matches!(
            MoeConfig::from_hf_config(&serde_json::json!({"hidden_size": 8})),
            Err(ConfigError::Invalid { .. })
        ));
    }

    #[test]
    #[should_panic(expected = "MoeConfig: `capacity_factor` is invalid: must be positive")]
    fn init_panics_with_the_validation_message() {
        MoeConfig::mixtral(4, 4, 2, 1)
            .with_capacity_factor(Some(0.0))
            .init(&Device::flex());
    }
}
