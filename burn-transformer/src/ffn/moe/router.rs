//! The token router of a mixture-of-experts layer: scores every expert for every token
//! and keeps the `top_k` best, as Mixtral (softmax, renormalized top-k) and DeepSeek-V3
//! (sigmoid, group-limited, with an aux-loss-free balancing bias) route; plus the
//! training losses that keep the routing balanced.
//!
//! Routing, step by step (HF `MixtralTopKRouter`, `DeepseekV3TopkRouter`):
//! 1. `logits = x · Wᵀ` in float32 (`W` is `gate.weight`, `[n_experts, d_model]`).
//! 2. `scores = softmax(logits)` or `sigmoid(logits)`.
//! 3. Selection uses `scores + e_score_correction_bias` (the bias steers *which*
//!    experts are chosen, never their weights). With `n_group > 1` the experts are split
//!    into groups, each group is scored (sum of its two best experts, DeepSeek-V3; or its
//!    best, DeepSeek-V2), and only experts of the `topk_group` best groups stay eligible.
//! 4. `top_k` experts by that selection score; their weights are the *unbiased* scores,
//!    divided by their sum when `norm_topk_prob`, times `routed_scaling_factor`.
//!
//! Gemma-4's router (`Gemma4TextRouter`) adds two learned scales: its input is
//! `x / rms(x) · scale · d_model^-½` (an RMSNorm without parameters, HF `router.scale`)
//! instead of `x`, and each chosen weight is multiplied by its expert's
//! `per_expert_scale` after the normalization.

use burn::config::Config;
use burn::module::{Initializer, Module, Param};
use burn::tensor::activation::{sigmoid, softmax};
use burn::tensor::{DType, Device, IndexingUpdateOp, Int, Tensor, TensorData};

use crate::error::ConfigError;
use crate::norm::{RmsNorm, RmsNormConfig};

const MODULE: &str = "RouterConfig";

/// How the router turns logits into expert affinities.
#[derive(Config, Debug, Copy, PartialEq, Eq)]
pub enum RouterScoring {
    /// `softmax(logits)` over the experts (Mixtral, Qwen-MoE, DeepSeek-V2).
    Softmax,
    /// `sigmoid(logits)` per expert (DeepSeek-V3).
    Sigmoid,
}

/// How a group of experts is scored in group-limited routing.
#[derive(Config, Debug, Copy, PartialEq, Eq)]
pub enum GroupScoring {
    /// The sum of the group's two best selection scores (DeepSeek-V3's `noaux_tc`).
    TopTwoSum,
    /// The group's best selection score (DeepSeek-V2's `group_limited_greedy`).
    Max,
}

/// Configuration of a [`Router`]. Field names follow Hugging Face's MoE configs.
#[derive(Config, Debug)]
pub struct RouterConfig {
    /// Width of the routed hidden states (HF `hidden_size`).
    pub d_model: usize,
    /// Number of routed experts (HF `num_local_experts`, `n_routed_experts`).
    pub n_experts: usize,
    /// Experts per token (HF `num_experts_per_tok`).
    pub top_k: usize,
    /// Affinity function. Default: softmax (Mixtral).
    #[config(default = "RouterScoring::Softmax")]
    pub scoring: RouterScoring,
    /// Divide the top-k weights by their sum (HF `norm_topk_prob`; Mixtral always
    /// does). Default: true.
    #[config(default = true)]
    pub norm_topk_prob: bool,
    /// Multiplies the final weights (HF `routed_scaling_factor`). Default: 1.
    #[config(default = 1.0)]
    pub routed_scaling_factor: f64,
    /// Number of expert groups (HF `n_group`); must divide `n_experts`. Default: 1 (no
    /// group limit).
    #[config(default = 1)]
    pub n_group: usize,
    /// Groups a token may pick experts from (HF `topk_group`). Default: 1.
    #[config(default = 1)]
    pub topk_group: usize,
    /// Score of a group. Default: sum of its top two (DeepSeek-V3).
    #[config(default = "GroupScoring::TopTwoSum")]
    pub group_scoring: GroupScoring,
    /// Add the balancing bias `e_score_correction_bias` (DeepSeek-V3's aux-loss-free
    /// load balancing) to the selection scores. Default: false.
    #[config(default = false)]
    pub score_correction_bias: bool,
    /// A learned bias on the logits (gpt-oss's `router.bias`). Default: false.
    #[config(default = false)]
    pub bias: bool,
    /// Routes `x / rms(x) · input_scale · d_model^-½` instead of `x`: an RMSNorm
    /// without parameters with this epsilon, then a learned scale `[d_model]`
    /// initialized to 1 (Gemma-4's `router.norm` and `router.scale`). Default: none.
    #[config(default = "None")]
    pub input_norm_eps: Option<f64>,
    /// Multiplies each chosen weight by a learned factor of its expert, `[n_experts]`,
    /// initialized to 1, after the normalization (Gemma-4's `per_expert_scale`).
    /// Default: false.
    #[config(default = false)]
    pub per_expert_scale: bool,
    /// Initializer of the router weight. Default: normal, std 0.02 (HF
    /// `initializer_range`).
    #[config(default = "Initializer::Normal { mean: 0.0, std: 0.02 }")]
    pub initializer: Initializer,
}

impl RouterConfig {
    /// Checks the configuration.
    ///
    /// # Errors
    /// - [`ConfigError::Zero`]: a size is 0.
    /// - [`ConfigError::NotDivisible`]: `n_experts % n_group != 0`.
    /// - [`ConfigError::Invalid`]: `top_k` larger than the experts of `topk_group`
    ///   groups, `topk_group > n_group`, or a non-finite `routed_scaling_factor`.
    pub fn validate(&self) -> Result<(), ConfigError> {
        ConfigError::check_positive(MODULE, "d_model", self.d_model)?;
        ConfigError::check_positive(MODULE, "n_experts", self.n_experts)?;
        ConfigError::check_positive(MODULE, "top_k", self.top_k)?;
        ConfigError::check_positive(MODULE, "topk_group", self.topk_group)?;
        ConfigError::check_divisible(MODULE, "n_experts", self.n_experts, "n_group", self.n_group)?;
        if self.topk_group > self.n_group {
            return Err(ConfigError::Invalid {
                module: MODULE,
                field: "topk_group",
                reason: format!(
                    "must be at most n_group = {}, got {}",
                    self.n_group, self.topk_group
                ),
            });
        }
        let eligible = self.topk_group * (self.n_experts / self.n_group);
        if self.top_k > eligible {
            return Err(ConfigError::Invalid {
                module: MODULE,
                field: "top_k",
                reason: format!(
                    "must be at most the {eligible} experts of the topk_group best groups, got {}",
                    self.top_k
                ),
            });
        }
        if !self.routed_scaling_factor.is_finite() {
            return Err(ConfigError::Invalid {
                module: MODULE,
                field: "routed_scaling_factor",
                reason: format!("must be finite, got {}", self.routed_scaling_factor),
            });
        }
        Ok(())
    }

    /// Validates the configuration and builds the router.
    ///
    /// # Errors
    /// See [`validate`](Self::validate).
    pub fn try_init(&self, device: &Device) -> Result<Router, ConfigError> {
        self.validate()?;
        let weight = self.initializer.init_with(
            [self.n_experts, self.d_model],
            Some(self.d_model),
            Some(self.n_experts),
            device,
        );
        // A buffer, not a trained weight: it is moved by `update_correction_bias`.
        let e_score_correction_bias = self.score_correction_bias.then(|| {
            Param::from_tensor(Tensor::zeros([self.n_experts], device)).set_require_grad(false)
        });
        let ones = |size: usize| Param::from_tensor(Tensor::ones([size], device));
        Ok(Router {
            weight,
            bias: self
                .bias
                .then(|| Param::from_tensor(Tensor::zeros([self.n_experts], device))),
            input_norm: self
                .input_norm_eps
                .map(|eps| {
                    RmsNormConfig::new(self.d_model)
                        .with_eps(eps)
                        .with_scale(false)
                        .try_init(device)
                })
                .transpose()?,
            input_scale: self.input_norm_eps.map(|_| ones(self.d_model)),
            per_expert_scale: self.per_expert_scale.then(|| ones(self.n_experts)),
            e_score_correction_bias,
            top_k: self.top_k,
            scoring: self.scoring,
            norm_topk_prob: self.norm_topk_prob,
            routed_scaling_factor: self.routed_scaling_factor,
            n_group: self.n_group,
            topk_group: self.topk_group,
            group_scoring: self.group_scoring,
        })
    }
}

crate::builders::init_or_panic!(RouterConfig => Router);

/// Chooses `top_k` experts per token and their weights.
///
/// `weight` keeps Hugging Face's `[n_experts, d_model]` layout (HF `gate.weight`, loaded
/// without a transpose), and `e_score_correction_bias` is HF's buffer of that name.
#[derive(Module, Debug)]
pub struct Router {
    /// `[n_experts, d_model]`.
    pub weight: Param<Tensor<2>>,
    /// `[n_experts]`: added to the logits (gpt-oss), if any.
    pub bias: Option<Param<Tensor<1>>>,
    /// The norm of the routed input, without parameters (Gemma-4), if any.
    pub input_norm: Option<RmsNorm>,
    /// `[d_model]`: the scale of the normed input (HF `router.scale`), with `input_norm`.
    pub input_scale: Option<Param<Tensor<1>>>,
    /// `[n_experts]`: each expert's factor on its weights (HF `per_expert_scale`), if any.
    pub per_expert_scale: Option<Param<Tensor<1>>>,
    /// `[n_experts]`: added to the scores for selection only (DeepSeek-V3).
    pub e_score_correction_bias: Option<Param<Tensor<1>>>,
    #[module(skip)]
    top_k: usize,
    #[module(skip)]
    scoring: RouterScoring,
    #[module(skip)]
    norm_topk_prob: bool,
    #[module(skip)]
    routed_scaling_factor: f64,
    #[module(skip)]
    n_group: usize,
    #[module(skip)]
    topk_group: usize,
    #[module(skip)]
    group_scoring: GroupScoring,
}

/// The routing decision for a batch of tokens.
#[derive(Clone, Debug)]
pub struct Routing {
    /// `[tokens, n_experts]`, float32: the router logits.
    pub logits: Tensor<2>,
    /// `[tokens, n_experts]`, float32: softmax or sigmoid of the logits.
    pub scores: Tensor<2>,
    /// `[tokens, top_k]`, float32: the chosen experts' weights (differentiable).
    pub weights: Tensor<2>,
    /// `[tokens, top_k]`: the chosen experts.
    pub indices: Tensor<2, Int>,
}

impl Router {
    /// Number of routed experts.
    pub fn n_experts(&self) -> usize {
        self.weight.dims()[0]
    }

    /// Experts per token.
    pub fn top_k(&self) -> usize {
        self.top_k
    }

    /// The affinity function.
    pub fn scoring(&self) -> RouterScoring {
        self.scoring
    }

    /// Routes each token.
    ///
    /// # Shapes
    /// - x: `[tokens, d_model]`
    /// - output: see [`Routing`]
    pub fn forward(&self, x: Tensor<2>) -> Routing {
        // float32 like HF: routing decisions must not flip with the activation dtype.
        let x = x.cast(DType::F32);
        let x = match (&self.input_norm, &self.input_scale) {
            (Some(norm), Some(scale)) => {
                let [_, d_model] = x.dims();
                norm.forward(x)
                    * scale.val().cast(DType::F32).unsqueeze_dim::<2>(0)
                    * (d_model as f64).powf(-0.5)
            }
            _ => x,
        };
        let weight = self.weight.val().cast(DType::F32);
        let logits = x.matmul(weight.transpose()); // [tokens, n_experts]
        let logits = match &self.bias {
            Some(bias) => logits + bias.val().cast(DType::F32).unsqueeze_dim::<2>(0),
            None => logits,
        };
        let scores = match self.scoring {
            RouterScoring::Softmax => softmax(logits.clone(), 1),
            RouterScoring::Sigmoid => sigmoid(logits.clone()),
        };
        // Selection is not differentiable: detach it so the bias and the masks never
        // reach the gradient (weights come from `scores` below).
        let mut choice = scores.clone().detach();
        if let Some(bias) = &self.e_score_correction_bias {
            choice = choice + bias.val().cast(DType::F32).detach().unsqueeze_dim::<2>(0);
        }
        if self.n_group > 1 {
            choice = self.limit_to_best_groups(choice);
        }
        let (_, indices) = choice.topk_with_indices(self.top_k, 1); // [tokens, top_k]
        let mut weights = scores.clone().gather(1, indices.clone()); // [tokens, top_k]
        if self.norm_topk_prob {
            // HF DeepSeek adds 1e-20 so that all-zero sigmoid weights stay finite.
            weights = weights.clone() / (weights.sum_dim(1) + 1e-20);
        }
        if self.routed_scaling_factor != 1.0 {
            weights = weights * self.routed_scaling_factor;
        }
        if let Some(scale) = &self.per_expert_scale {
            let [tokens, top_k] = indices.dims();
            let chosen = indices.clone().reshape([tokens * top_k]);
            let factors = scale.val().cast(DType::F32).select(0, chosen);
            weights = weights * factors.reshape([tokens, top_k]);
        }
        Routing {
            logits,
            scores,
            weights,
            indices,
        }
    }

    /// Sets the selection score of every expert outside the `topk_group` best groups
    /// to `-inf`.
    ///
    /// # Shapes
    /// - choice: `[tokens, n_experts]`
    /// - output: `[tokens, n_experts]`
    fn limit_to_best_groups(&self, choice: Tensor<2>) -> Tensor<2> {
        let [tokens, n_experts] = choice.dims();
        let per_group = n_experts / self.n_group;
        let grouped = choice.clone().reshape([tokens, self.n_group, per_group]); // [tokens, n_group, per_group]
        let group_scores = match self.group_scoring {
            GroupScoring::TopTwoSum => grouped.topk(per_group.min(2), 2).sum_dim(2),
            GroupScoring::Max => grouped.max_dim(2),
        }
        .reshape([tokens, self.n_group]); // [tokens, n_group]
        let (_, best) = group_scores.topk_with_indices(self.topk_group, 1); // [tokens, topk_group]
        let device = choice.device();
        let kept = Tensor::<2>::zeros([tokens, self.n_group], &device).scatter(
            1,
            best,
            Tensor::ones([tokens, self.topk_group], &device),
            IndexingUpdateOp::Add,
        ); // [tokens, n_group], 1 for kept groups
        let hidden = kept
            .reshape([tokens, self.n_group, 1])
            .expand([tokens, self.n_group, per_group])
            .reshape([tokens, n_experts])
            .equal_elem(0.0);
        choice.mask_fill(hidden, f64::NEG_INFINITY)
    }

    /// Per-token probabilities over the experts for the load-balancing loss: the softmax,
    /// or the sigmoid scores normalized to sum to 1 (DeepSeek-V3's `s'`).
    ///
    /// # Shapes
    /// - scores: `[tokens, n_experts]`
    /// - output: `[tokens, n_experts]`
    pub fn balance_probabilities(&self, scores: Tensor<2>) -> Tensor<2> {
        match self.scoring {
            RouterScoring::Softmax => scores,
            RouterScoring::Sigmoid => scores.clone() / scores.sum_dim(1),
        }
    }

    /// One step of DeepSeek-V3's aux-loss-free balancing: each expert's bias moves by
    /// `rate` towards balance, `b_i += rate · sign(mean_load − load_i)`.
    ///
    /// Call it between training steps with the [`tokens_per_expert`] of the step.
    /// Without a correction bias the router is returned unchanged.
    ///
    /// # Panics
    /// If `tokens_per_expert` does not have one count per expert.
    ///
    /// [`tokens_per_expert`]: super::MoeOutput::tokens_per_expert
    pub fn update_correction_bias(mut self, tokens_per_expert: &[usize], rate: f64) -> Self {
        let n_experts = self.n_experts();
        assert_eq!(
            tokens_per_expert.len(),
            n_experts,
            "Router: one token count per expert"
        );
        let Some(bias) = self.e_score_correction_bias.take() else {
            return self;
        };
        let mean = tokens_per_expert.iter().sum::<usize>() as f64 / n_experts as f64;
        let step: Vec<f32> = tokens_per_expert
            .iter()
            .map(|&load| {
                let gap = mean - load as f64;
                (rate
                    * if gap > 0.0 {
                        1.0
                    } else if gap < 0.0 {
                        -1.0
                    } else {
                        0.0
                    }) as f32
            })
            .collect();
        let bias = bias.val();
        let (device, dtype) = (bias.device(), bias.dtype());
        let step = Tensor::<1>::from_data(TensorData::new(step, [n_experts]), &device).cast(dtype);
        self.e_score_correction_bias =
            Some(Param::from_tensor((bias + step).detach()).set_require_grad(false));
        self
    }
}

/// The load-balancing loss of Switch Transformer / Mixtral (HF
/// `load_balancing_loss_func` for one layer): `n_experts · Σ_i f_i · P_i`, where `f_i`
/// is the number of top-k assignments to expert `i` divided by the number of tokens
/// (so `Σ f_i = top_k`) and `P_i` the mean routing probability of expert `i`. It is
/// `top_k` when the routing is perfectly uniform. Only `P` carries a gradient.
///
/// # Shapes
/// - probabilities: `[tokens, n_experts]` (see [`Router::balance_probabilities`])
/// - output: `[1]`
///
/// # Panics
/// If `tokens_per_expert` does not have one count per expert.
pub fn load_balancing_loss(probabilities: Tensor<2>, tokens_per_expert: &[usize]) -> Tensor<1> {
    let [tokens, n_experts] = probabilities.dims();
    assert_eq!(
        tokens_per_expert.len(),
        n_experts,
        "load_balancing_loss: one token count per expert"
    );
    let fractions: Vec<f32> = tokens_per_expert
        .iter()
        .map(|&count| count as f32 / tokens.max(1) as f32)
        .collect();
    let device = probabilities.device();
    let fractions = Tensor::<1>::from_data(TensorData::new(fractions, [n_experts]), &device);
    let mean_probability = probabilities.mean_dim(0).reshape([n_experts]); // [n_experts]
    (fractions * mean_probability).sum() * n_experts as f64
}

/// The router z-loss of ST-MoE (Zoph et al., 2022, eq. 5): the mean over tokens of
/// `logsumexp(logits)²`. It keeps logits small, so the router's softmax stays stable.
///
/// # Shapes
/// - logits: `[tokens, n_experts]`
/// - output: `[1]`
pub fn router_z_loss(logits: Tensor<2>) -> Tensor<1> {
    let [tokens, _] = logits.dims();
    if tokens == 0 {
        return Tensor::zeros([1], &logits.device());
    }
    // Shifting by the detached max keeps exp() finite; the shift cancels exactly.
    let max = logits.clone().max_dim(1).detach(); // [tokens, 1]
    let log_sum_exp = (logits - max.clone()).exp().sum_dim(1).log() + max; // [tokens, 1]
    log_sum_exp.square().mean().reshape([1])
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_utils::{assert_close, test_devices};

    #[test]
    fn balancing_loss_matches_the_formula_on_a_hand_computed_case() {
        for device in test_devices() {
            // 4 tokens, 3 experts, top-2.
            let probabilities = Tensor::<2>::from_floats(
                [
                    [0.5, 0.3, 0.2],
                    [0.6, 0.1, 0.3],
                    [0.2, 0.7, 0.1],
                    [0.4, 0.4, 0.2],
                ],
                &device,
            );
            // Top-2 picks: {0,1}, {0,2}, {1,0}, {0,1}: expert 0 four times, 1 three, 2 once.
            let loss = load_balancing_loss(probabilities, &[4, 3, 1]);
            // f = [1, 0.75, 0.25], P = [0.425, 0.375, 0.2];
            // 3 · (0.425 + 0.28125 + 0.05) = 3 · 0.75625 = 2.26875.
            assert_close(
                loss,
                Tensor::from_floats([2.26875], &device),
                1e-6,
                "hand-computed balancing loss",
            );
        }
    }

    #[test]
    fn uniform_routing_gives_top_k() {
        for device in test_devices() {
            let probabilities = Tensor::<2>::ones([8, 4], &device) / 4.0;
            let loss = load_balancing_loss(probabilities, &[4, 4, 4, 4]);
            assert_close(loss, Tensor::from_floats([2.0], &device), 1e-6, "uniform");
        }
    }

    #[test]
    fn z_loss_is_mean_squared_log_sum_exp() {
        for device in test_devices() {
            let logits = Tensor::<2>::from_floats([[0.0, 0.0], [1000.0, 1000.0]], &device);
            // lse = ln 2 and 1000 + ln 2; the large row stays finite.
            let ln2 = 2f32.ln();
            let expected = (ln2 * ln2 + (1000.0 + ln2) * (1000.0 + ln2)) / 2.0;
            let z = router_z_loss(logits).into_scalar_f32();
            assert!(
                ((z - expected) / expected).abs() < 1e-6,
                "{z} vs {expected}"
            );
        }
    }

    trait IntoScalarF32 {
        fn into_scalar_f32(self) -> f32;
    }
    impl IntoScalarF32 for Tensor<1> {
        fn into_scalar_f32(self) -> f32 {
            self.into_data()
                .convert::<f32>()
                .try_to_vec::<f32>()
                .unwrap()[0]
        }
    }

    #[test]
    fn group_limit_keeps_only_the_best_groups() {
        for device in test_devices() {
            // 6 experts in 3 groups of 2; only the best group may be used.
            let mut router = RouterConfig::new(2, 6, 2)
                .with_scoring(RouterScoring::Sigmoid)
                .with_n_group(3)
                .with_topk_group(1)
                .with_norm_topk_prob(false)
                .init(&device);
            // Logits are x · Wᵀ with x = [1, 0]: the first column of W.
            // Expert scores (logits): group 0 = {3, -3}, group 1 = {2, 2}, group 2 = {2.5, 0}.
            // Top-two sums of sigmoids pick group 1; the global top-2 would be {0, 2}.
            let logits = [3.0, -3.0, 2.0, 2.0, 2.5, 0.0];
            let weight: Vec<f32> = logits.iter().flat_map(|&l| [l, 0.0]).collect();
            router.weight =
                Param::from_tensor(Tensor::from_data(TensorData::new(weight, [6, 2]), &device));
            let routing = router.forward(Tensor::from_floats([[1.0, 0.0]], &device));
            let mut chosen = routing
                .indices
                .into_data()
                .convert::<i64>()
                .try_to_vec::<i64>()
                .unwrap();
            chosen.sort();
            assert_eq!(chosen, vec![2, 3], "on {device:?}");
            let s = 1.0 / (1.0 + (-2.0f32).exp());
            assert_close(
                routing.weights,
                Tensor::from_floats([[s, s]], &device),
                1e-6,
                "unnormalized sigmoid weights",
            );
        }
    }

    #[test]
    fn correction_bias_changes_selection_not_weights() {
        for device in test_devices() {
            let mut router = RouterConfig::new(1, 3, 1)
                .with_scoring(RouterScoring::Sigmoid)
                .with_norm_topk_prob(false)
                .with_score_correction_bias(true)
                .init(&device);
            router.weight = Param::from_tensor(Tensor::from_floats([[1.0], [0.5], [0.0]], &device));
            router.e_score_correction_bias = Some(Param::from_tensor(Tensor::from_floats(
                [0.0, 0.0, 0.9],
                &device,
            )));
            let routing = router.forward(Tensor::from_floats([[1.0]], &device));
            let chosen = routing
                .indices
                .into_data()
                .convert::<i64>()
                .try_to_vec::<i64>()
                .unwrap();
            assert_eq!(chosen, vec![2]);
            // The weight is sigmoid(0) = 0.5, without the bias.
            assert_close(
                routing.weights,
                Tensor::from_floats([[0.5]], &device),
                1e-6,
                "w",
            );
        }
    }

    #[test]
    fn bias_update_moves_towards_balance() {
        for device in test_devices() {
            let router = RouterConfig::new(4, 5, 1)
                .with_score_correction_bias(true)
                .init(&device)
                .update_correction_bias(&[10, 2, 4, 4, 5], 0.01);
            let bias = router.e_score_correction_bias.unwrap().val();
            // Mean load 5: the overloaded expert's bias drops, the underloaded ones'
            // rise, the expert exactly at the mean keeps its bias.
            assert_close(
                bias,
                Tensor::from_floats([-0.01, 0.01, 0.01, 0.01, 0.0], &device),
                1e-7,
                "bias step",
            );
        }
    }

    #[test]
    fn invalid_configs_return_typed_errors() {
        assert!(matches!(
            RouterConfig::new(4, 6, 2).with_n_group(4).validate(),
            Err(ConfigError::NotDivisible { .. })
        ));
        assert!(matches!(
            RouterConfig::new(4, 8, 5)
                .with_n_group(4)
                .with_topk_group(2)
                .validate(),
            Err(ConfigError::Invalid { field: "top_k", .. })
        ));
        assert_eq!(
            RouterConfig::new(4, 8, 0).validate(),
            Err(ConfigError::Zero {
                module: MODULE,
                field: "top_k"
            })
        );
    }
}
