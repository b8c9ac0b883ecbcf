//! Gated DeltaNet (Yang, Kautz & Hatamizadeh, 2024), the linear attention of
//! Qwen3-Next and Qwen3.5's hybrid stacks (three of every four layers there).
//!
//! Each position projects queries, keys and values, which pass a short causal
//! convolution and SiLU; queries and keys are L2-normalized (queries also scaled by
//! `d_k^-½`). A per-head state is decayed by `exp(g)`, `g = −exp(A_log) ·
//! softplus(a + dt_bias)`, and corrected toward each value with strength `β = σ(b)`
//! ([`gated_delta_rule`]); the output read by the queries is RMS-normed per head,
//! gated by `SiLU(z)` and projected back. Key heads may be fewer than value heads: each
//! serves `n_value_heads / n_key_heads` consecutive value heads.
//!
//! Decoding carries a fixed-size state ([`RecurrentCache`]): the convolution's last
//! inputs and the rule's matrices. Padded positions (left padding of a batch) are
//! zeroed at the input, so they add nothing to the state, as transformers does. In a
//! half-precision model the rule and its state run in f32 (from the normalization of
//! the queries and keys to the rule's output), as transformers runs them.
//!
//! Field names follow transformers' `Qwen3_5GatedDeltaNet` (`in_proj_qkv`, `in_proj_z`,
//! `in_proj_b`, `in_proj_a`, `conv1d`, `dt_bias`, `norm`, `out_proj`; `A_log` is our
//! `a_log`). Qwen3-Next stores the projections fused group by group; its loader
//! reorders them into these.

use burn::config::Config;
use burn::module::{Initializer, Module, Param};
use burn::nn::{Linear, LinearConfig};
use burn::tensor::activation::{sigmoid, silu, softplus};
use burn::tensor::{Bool, DType, Device, Tensor};

use super::recurrent_cache::RecurrentCache;
use super::short_conv::ShortConv;
use crate::error::ConfigError;
use crate::norm::{RmsNorm, RmsNormConfig};
use crate::ops::delta_rule::gated_delta_rule;
use crate::ops::linear::linear_rows;

const MODULE: &str = "GatedDeltaNetConfig";

/// Added to the squared norm before the L2 normalization of queries and keys (as
/// flash-linear-attention and transformers).
const L2_NORM_EPS: f64 = 1e-6;

/// Configuration of a [`GatedDeltaNet`].
#[derive(Config, Debug)]
pub struct GatedDeltaNetConfig {
    /// Width of the input and output hidden states.
    pub d_model: usize,
    /// Number of query/key heads (HF `linear_num_key_heads`).
    pub n_key_heads: usize,
    /// Number of value heads, a multiple of `n_key_heads` (HF
    /// `linear_num_value_heads`).
    pub n_value_heads: usize,
    /// Width of one query/key head (HF `linear_key_head_dim`).
    pub key_head_dim: usize,
    /// Width of one value head (HF `linear_value_head_dim`).
    pub value_head_dim: usize,
    /// Taps of the short convolution (HF `linear_conv_kernel_dim`). Default: 4.
    #[config(default = 4)]
    pub conv_kernel: usize,
    /// Epsilon of the output's RMSNorm. Default: 1e-6.
    #[config(default = 1e-6)]
    pub norm_eps: f64,
    /// Initializer of the projections. Default: normal, std 0.02.
    #[config(default = "Initializer::Normal { mean: 0.0, std: 0.02 }")]
    pub initializer: Initializer,
}

impl GatedDeltaNetConfig {
    /// Width of the queries (and of the keys) of all heads.
    pub fn key_width(&self) -> usize {
        self.n_key_heads * self.key_head_dim
    }

    /// Width of the values of all heads.
    pub fn value_width(&self) -> usize {
        self.n_value_heads * self.value_head_dim
    }

    /// Checks the configuration.
    ///
    /// # Errors
    /// [`ConfigError::Zero`] for a zero size; [`ConfigError::NotDivisible`] when the
    /// value heads are not a multiple of the key heads; [`ConfigError::Invalid`] for a
    /// negative or non-finite `norm_eps`.
    pub fn validate(&self) -> Result<(), ConfigError> {
        for (field, value) in [
            ("d_model", self.d_model),
            ("n_key_heads", self.n_key_heads),
            ("key_head_dim", self.key_head_dim),
            ("value_head_dim", self.value_head_dim),
            ("conv_kernel", self.conv_kernel),
        ] {
            ConfigError::check_positive(MODULE, field, value)?;
        }
        ConfigError::check_positive(MODULE, "n_value_heads", self.n_value_heads)?;
        ConfigError::check_divisible(
            MODULE,
            "n_value_heads",
            self.n_value_heads,
            "n_key_heads",
            self.n_key_heads,
        )?;
        ConfigError::check_non_negative(MODULE, "norm_eps", self.norm_eps)
    }

    /// Builds the layer, or returns why the configuration is invalid.
    ///
    /// # Errors
    /// See [`validate`](Self::validate).
    pub fn try_init(&self, device: &Device) -> Result<GatedDeltaNet, ConfigError> {
        self.validate()?;
        let linear = |d_in: usize, d_out: usize| {
            LinearConfig::new(d_in, d_out)
                .with_bias(false)
                .with_initializer(self.initializer.clone())
                .init(device)
        };
        let conv_width = 2 * self.key_width() + self.value_width();
        Ok(GatedDeltaNet {
            in_proj_qkv: linear(self.d_model, conv_width),
            in_proj_z: linear(self.d_model, self.value_width()),
            in_proj_b: linear(self.d_model, self.n_value_heads),
            in_proj_a: linear(self.d_model, self.n_value_heads),
            conv1d: ShortConv::new(conv_width, self.conv_kernel, device),
            dt_bias: Initializer::Ones.init([self.n_value_heads], device),
            // Decay rates A from 1 to 16 (Mamba-2's range; transformers draws A
            // uniformly from 0.01 to 16).
            a_log: Initializer::Uniform {
                min: 0.0,
                max: 16f64.ln(),
            }
            .init([self.n_value_heads], device),
            norm: RmsNormConfig::new(self.value_head_dim)
                .with_eps(self.norm_eps)
                .try_init(device)?,
            out_proj: linear(self.value_width(), self.d_model),
            n_key_heads: self.n_key_heads,
            n_value_heads: self.n_value_heads,
            key_head_dim: self.key_head_dim,
            value_head_dim: self.value_head_dim,
        })
    }
}

crate::builders::init_or_panic!(GatedDeltaNetConfig => GatedDeltaNet);

/// A Gated DeltaNet layer.
#[derive(Module, Debug)]
pub struct GatedDeltaNet {
    /// `[d_model] -> [2 · n_key_heads · key_head_dim + n_value_heads · value_head_dim]`:
    /// the queries, keys and values, one after the other.
    pub in_proj_qkv: Linear,
    /// `[d_model] -> [n_value_heads · value_head_dim]`: the output gate `z`.
    pub in_proj_z: Linear,
    /// `[d_model] -> [n_value_heads]`: the correction strength before its sigmoid.
    pub in_proj_b: Linear,
    /// `[d_model] -> [n_value_heads]`: the decay's input `a`.
    pub in_proj_a: Linear,
    /// The short convolution of the queries, keys and values.
    pub conv1d: ShortConv,
    /// The decay's bias, `[n_value_heads]`.
    pub dt_bias: Param<Tensor<1>>,
    /// The log of the decay rates `A`, `[n_value_heads]` (HF `A_log`).
    pub a_log: Param<Tensor<1>>,
    /// The RMSNorm of each value head's output, before the gate.
    pub norm: RmsNorm,
    /// `[n_value_heads · value_head_dim] -> [d_model]`
    pub out_proj: Linear,
    #[module(skip)]
    n_key_heads: usize,
    #[module(skip)]
    n_value_heads: usize,
    #[module(skip)]
    key_head_dim: usize,
    #[module(skip)]
    value_head_dim: usize,
}

/// The delta rule's inputs for some positions, and what the layer needs around it.
struct RuleInputs {
    /// `[batch, value_heads, seq, d_k]`, normalized and scaled; f32, as the four below.
    queries: Tensor<4>,
    /// `[batch, value_heads, seq, d_k]`, normalized.
    keys: Tensor<4>,
    /// `[batch, value_heads, seq, d_v]`
    values: Tensor<4>,
    /// `[batch, value_heads, seq]`
    log_decay: Tensor<3>,
    /// `[batch, value_heads, seq]`
    beta: Tensor<3>,
    /// The gate `z`, `[batch, seq, value_heads, d_v]`, in the model's float type.
    gate: Tensor<4>,
    /// The convolution's history after these positions.
    conv_history: Tensor<3>,
}

impl GatedDeltaNet {
    /// Number of value heads (the heads of the state and the output).
    pub fn n_value_heads(&self) -> usize {
        self.n_value_heads
    }

    /// The layer over a whole sequence, from an empty state.
    ///
    /// # Shapes
    /// - x: `[batch, seq, d_model]`
    /// - key_padding: `[batch, seq]`, `true` for padded positions
    /// - output: `[batch, seq, d_model]`
    pub fn forward(&self, x: Tensor<3>, key_padding: Option<Tensor<2, Bool>>) -> Tensor<3> {
        let inputs = self.rule_inputs(x, key_padding, None);
        let state = self.zero_state(&inputs);
        self.output(inputs, state).0
    }

    /// The layer over new positions, continuing from `cache`'s state, which it then
    /// holds the state after them.
    ///
    /// # Shapes
    /// - x: `[batch, new, d_model]`
    /// - key_padding: `[batch, new]` for the new positions, `true` = padded
    /// - output: `[batch, new, d_model]`
    pub fn forward_cached(
        &self,
        x: Tensor<3>,
        cache: &mut RecurrentCache,
        key_padding: Option<Tensor<2, Bool>>,
    ) -> Tensor<3> {
        let new = x.dims()[1];
        let inputs = self.rule_inputs(x, key_padding, cache.conv.clone());
        let state = cache
            .state
            .clone()
            .unwrap_or_else(|| self.zero_state(&inputs));
        let conv_history = inputs.conv_history.clone();
        let (output, state) = self.output(inputs, state);
        cache.advance(conv_history, state, new);
        output
    }

    /// [`forward`](Self::forward) that also returns the layer's mixing weights: the
    /// rule's output at `t` is `Σ_s a[t, s] · v_s` over the convolved values `v_s`
    /// (before the norm and the gate). They are not probabilities: the delta rule
    /// subtracts what the state already predicts, so they take either sign and rows do
    /// not sum to 1. Computed by running the rule on one-hot values: `O(seq²)`, for
    /// inspection.
    ///
    /// # Shapes
    /// - as [`forward`](Self::forward), plus the weights `[batch, n_value_heads, seq, seq]`
    pub fn forward_with_weights(
        &self,
        x: Tensor<3>,
        key_padding: Option<Tensor<2, Bool>>,
    ) -> (Tensor<3>, Tensor<4>) {
        let inputs = self.rule_inputs(x, key_padding, None);
        let [batch, heads, seq, d_k] = inputs.queries.dims();
        let device = inputs.queries.device();
        let one_hot: Tensor<4> = Tensor::<2>::eye(seq, &device)
            .unsqueeze::<4>()
            .expand([batch, heads, seq, seq]);
        let (weights, _) = gated_delta_rule(
            inputs.queries.clone(),
            inputs.keys.clone(),
            one_hot,
            inputs.log_decay.clone(),
            inputs.beta.clone(),
            Tensor::zeros([batch, heads, d_k, seq], (&device, DType::F32)),
        );
        let state = self.zero_state(&inputs);
        (self.output(inputs, state).0, weights)
    }

    /// The projections, convolution and normalizations before the rule.
    fn rule_inputs(
        &self,
        x: Tensor<3>,
        key_padding: Option<Tensor<2, Bool>>,
        conv_history: Option<Tensor<3>>,
    ) -> RuleInputs {
        let [batch, seq, _] = x.dims();
        // Padded positions enter as zeros: no key, no value, no correction.
        let x = match key_padding {
            Some(padding) => {
                let kept = padding.bool_not().float().cast(x.dtype());
                x * kept.unsqueeze_dim::<3>(2)
            }
            None => x,
        };
        let (mixed, conv_history) = self
            .conv1d
            .forward(linear_rows(&self.in_proj_qkv, x.clone()), conv_history);
        // The rule runs in f32 whatever the model's float type (as transformers runs
        // it): its state sums every earlier position, beyond half precision's digits.
        let mixed = silu(mixed).cast(DType::F32); // [batch, seq, 2 · key_width + value_width]
        let key_width = self.n_key_heads * self.key_head_dim;
        let value_width = self.n_value_heads * self.value_head_dim;
        let heads = |t: Tensor<3>, n: usize, width: usize| {
            t.reshape([batch, seq, n, width]).swap_dims(1, 2) // [batch, n, seq, width]
        };
        let group = self.n_value_heads / self.n_key_heads;
        let queries = repeat_heads(
            l2_normalized(heads(
                mixed.clone().narrow(2, 0, key_width),
                self.n_key_heads,
                self.key_head_dim,
            )),
            group,
        ) * (self.key_head_dim as f64).powf(-0.5);
        let keys = repeat_heads(
            l2_normalized(heads(
                mixed.clone().narrow(2, key_width, key_width),
                self.n_key_heads,
                self.key_head_dim,
            )),
            group,
        );
        let values = heads(
            mixed.narrow(2, 2 * key_width, value_width),
            self.n_value_heads,
            self.value_head_dim,
        );
        let rates = self.a_log.val().cast(DType::F32).exp().unsqueeze::<3>(); // [1, 1, value_heads]
        let log_decay = (softplus(
            linear_rows(&self.in_proj_a, x.clone()).cast(DType::F32)
                + self.dt_bias.val().cast(DType::F32).unsqueeze::<3>(),
            1.0,
        ) * rates)
            .neg()
            .swap_dims(1, 2); // [batch, value_heads, seq]
        let beta = sigmoid(linear_rows(&self.in_proj_b, x.clone()))
            .cast(DType::F32)
            .swap_dims(1, 2);
        let gate = linear_rows(&self.in_proj_z, x).reshape([
            batch,
            seq,
            self.n_value_heads,
            self.value_head_dim,
        ]);
        RuleInputs {
            queries,
            keys,
            values,
            log_decay,
            beta,
            gate,
            conv_history,
        }
    }

    /// The rule from `state`, its output normed, gated and projected; and the state
    /// after the positions.
    fn output(&self, inputs: RuleInputs, state: Tensor<4>) -> (Tensor<3>, Tensor<4>) {
        let RuleInputs {
            queries,
            keys,
            values,
            log_decay,
            beta,
            gate,
            ..
        } = inputs;
        let (read, state) = gated_delta_rule(queries, keys, values, log_decay, beta, state);
        let read = read.cast(gate.dtype());
        let [batch, heads, seq, d_v] = read.dims();
        let read = self.norm.forward(read.swap_dims(1, 2)) * silu(gate); // [batch, seq, heads, d_v]
        let output = linear_rows(&self.out_proj, read.reshape([batch, seq, heads * d_v]));
        (output, state)
    }

    /// The state before any position, `[batch, value_heads, d_k, d_v]`, in f32.
    fn zero_state(&self, inputs: &RuleInputs) -> Tensor<4> {
        let batch = inputs.queries.dims()[0];
        Tensor::zeros(
            [
                batch,
                self.n_value_heads,
                self.key_head_dim,
                self.value_head_dim,
            ],
            (&inputs.queries.device(), DType::F32),
        )
    }
}

/// `x / √(Σx² + ε)` over the last axis.
fn l2_normalized(x: Tensor<4>) -> Tensor<4> {
    let norm = (x.clone().powi_scalar(2).sum_dim(3) + L2_NORM_EPS).sqrt();
    x / norm
}

/// Each head repeated `times` times in place (head `h` becomes heads `h·times` to
/// `h·times + times − 1`), so that key heads line up with the value heads they serve.
///
/// # Shapes
/// - x: `[batch, heads, seq, width]`
/// - output: `[batch, heads · times, seq, width]`
fn repeat_heads(x: Tensor<4>, times: usize) -> Tensor<4> {
    if times == 1 {
        return x;
    }
    let [batch, heads, seq, width] = x.dims();
    x.unsqueeze_dim::<5>(2)
        .expand([batch, heads, times, seq, width])
        .reshape([batch, heads * times, seq, width])
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_utils::{Fixture, assert_close, test_devices};
    use burn::tensor::{Distribution, TensorData};

    fn config() -> GatedDeltaNetConfig {
        // Two key heads serving four value heads.
        GatedDeltaNetConfig::new(16, 2, 4, 8, 6)
    }

    /// Weights at the scale of a trained layer: the defaults' std 0.02 would leave
    /// every output near zero.
    fn layer(device: &Device) -> GatedDeltaNet {
        config()
            .with_initializer(Initializer::Normal {
                mean: 0.0,
                std: 0.3,
            })
            .init(device)
    }

    /// The layer against transformers' `Qwen3_5GatedDeltaNet` (the chunked torch path)
    /// with every weight perturbed, over 70 positions (two chunks) of a batch of two
    /// (tools/make_fixtures.py).
    #[test]
    fn matches_transformers_gated_delta_net() {
        let fixture = Fixture::load("gated_delta_net");
        for device in test_devices() {
            let mut layer = GatedDeltaNetConfig::new(24, 2, 4, 8, 6)
                .with_conv_kernel(3)
                .init(&device);
            layer.in_proj_qkv = fixture.linear("in_proj_qkv", &device);
            layer.in_proj_z = fixture.linear("in_proj_z", &device);
            layer.in_proj_b = fixture.linear("in_proj_b", &device);
            layer.in_proj_a = fixture.linear("in_proj_a", &device);
            layer.out_proj = fixture.linear("out_proj", &device);
            layer.conv1d.weight = Param::from_tensor(fixture.tensor("conv1d.weight", &device));
            layer.dt_bias = Param::from_tensor(fixture.tensor("dt_bias", &device));
            layer.a_log = Param::from_tensor(fixture.tensor("A_log", &device));
            layer.norm.weight = Some(Param::from_tensor(fixture.tensor("norm.weight", &device)));
            let x = fixture.tensor("x", &device);
            assert_close(
                layer.forward(x, None),
                fixture.tensor("y", &device),
                2e-5,
                "gated delta net",
            );
        }
    }

    /// Decoding through the state, a prompt then one position at a time, equals the
    /// layer over the whole sequence.
    #[test]
    fn cached_decoding_equals_the_whole_sequence() {
        for device in test_devices() {
            device.seed(4);
            let layer = layer(&device);
            let x = Tensor::<3>::random([2, 7, 16], Distribution::Normal(0.0, 1.0), &device);
            let whole = layer.forward(x.clone(), None);
            let mut cache = RecurrentCache::new();
            let mut steps = vec![layer.forward_cached(x.clone().narrow(1, 0, 3), &mut cache, None)];
            for position in 3..7 {
                steps.push(layer.forward_cached(
                    x.clone().narrow(1, position, 1),
                    &mut cache,
                    None,
                ));
            }
            assert_eq!(cache.position(), 7);
            assert_close(Tensor::cat(steps, 1), whole, 1e-5, "cached decoding");
        }
    }

    /// Left padding changes nothing for the real positions: a padded row's outputs
    /// equal those of the row alone.
    #[test]
    fn left_padding_leaves_the_real_positions_unchanged() {
        let device = Device::flex();
        device.seed(6);
        let layer = layer(&device);
        let x = Tensor::<3>::random([1, 5, 16], Distribution::Normal(0.0, 1.0), &device);
        let alone = layer.forward(x.clone(), None);
        let padded = Tensor::cat(
            vec![
                Tensor::random([1, 3, 16], Distribution::Normal(0.0, 1.0), &device),
                x,
            ],
            1,
        );
        // Padding on the left: the first 3 positions of 8.
        let padding = Tensor::<2, Bool>::from_data(
            TensorData::from([[true, true, true, false, false, false, false, false]]),
            &device,
        );
        let output = layer.forward(padded, Some(padding)).narrow(1, 3, 5);
        assert_close(output, alone, 1e-5, "left padding");
    }

    /// The mixing weights give the rule's output from the convolved values.
    #[test]
    fn weights_mix_the_values_into_the_rule_output() {
        let device = Device::flex();
        device.seed(7);
        let layer = layer(&device);
        let x = Tensor::<3>::random([2, 6, 16], Distribution::Normal(0.0, 1.0), &device);
        let (output, weights) = layer.forward_with_weights(x.clone(), None);
        assert_close(output, layer.forward(x.clone(), None), 1e-6, "output");
        let inputs = layer.rule_inputs(x, None, None);
        let state = layer.zero_state(&inputs);
        let (read, _) = gated_delta_rule(
            inputs.queries,
            inputs.keys,
            inputs.values.clone(),
            inputs.log_decay,
            inputs.beta,
            state,
        );
        assert_close(
            weights.matmul(inputs.values),
            read,
            1e-5,
            "weights · values",
        );
    }

    #[test]
    fn invalid_configs_return_typed_errors() {
        let uneven = GatedDeltaNetConfig::new(16, 3, 4, 8, 8).validate();
        assert!(
            matches!(
                uneven,
                Err(ConfigError::NotDivisible {
                    numerator: "n_value_heads",
                    ..
                })
            ),
            "{uneven:?}"
        );
        let no_taps = config().with_conv_kernel(0).validate();
        assert!(
            matches!(
                no_taps,
                Err(ConfigError::Zero {
                    field: "conv_kernel",
                    ..
                })
            ),
            "{no_taps:?}"
        );
    }
}
