//! A block's per-layer input branch (Gemma-4's per-layer embeddings, "PLE"): after the
//! block's sublayers, a narrow gate of the stream is multiplied by an input of the
//! layer's own (a causal language model makes them from its tokens with its
//! `PerLayerEmbedding`), projected back to the model width, normed and added to the
//! stream:
//!
//! ```text
//! x + norm(projection(act(gate(x)) · input))
//! ```

use burn::config::Config;
use burn::module::{Initializer, Module};
use burn::nn::{Linear, LinearConfig};
use burn::tensor::{Device, Tensor};

use crate::error::ConfigError;
use crate::ffn::Activation;
use crate::norm::{Norm, NormConfig};
use crate::ops::linear::linear_rows;

const MODULE: &str = "PerLayerInputConfig";

/// Configuration of a [`PerLayerInput`].
#[derive(Config, Debug)]
pub struct PerLayerInputConfig {
    /// Width of the stream (HF `hidden_size`).
    pub d_model: usize,
    /// Width of the layer's input (HF `hidden_size_per_layer_input`).
    pub width: usize,
    /// The norm of the branch's output (HF `post_per_layer_input_norm`), of width
    /// `d_model`.
    pub norm: NormConfig,
    /// The gate's activation (HF `hidden_activation`). Default: tanh-GELU.
    #[config(default = "Activation::GeluTanh")]
    pub activation: Activation,
    /// Initializer of the projection weights. Default: normal, std 0.02.
    #[config(default = "Initializer::Normal { mean: 0.0, std: 0.02 }")]
    pub initializer: Initializer,
}

impl PerLayerInputConfig {
    /// Checks the configuration.
    ///
    /// # Errors
    /// [`ConfigError::Zero`] for a zero width; [`ConfigError::Invalid`] for a norm
    /// whose width is not `d_model`.
    pub fn validate(&self) -> Result<(), ConfigError> {
        ConfigError::check_positive(MODULE, "d_model", self.d_model)?;
        ConfigError::check_positive(MODULE, "width", self.width)?;
        self.norm.validate()?;
        if self.norm.d_model() != self.d_model {
            return Err(ConfigError::Invalid {
                module: MODULE,
                field: "norm.d_model",
                reason: format!(
                    "must equal d_model {}, got {}",
                    self.d_model,
                    self.norm.d_model()
                ),
            });
        }
        Ok(())
    }

    /// Builds the branch, or returns why the configuration is invalid.
    ///
    /// # Errors
    /// See [`validate`](Self::validate).
    pub fn try_init(&self, device: &Device) -> Result<PerLayerInput, ConfigError> {
        self.validate()?;
        let linear = |d_input, d_output| {
            LinearConfig::new(d_input, d_output)
                .with_bias(false)
                .with_initializer(self.initializer.clone())
                .init(device)
        };
        Ok(PerLayerInput {
            gate: linear(self.d_model, self.width),
            projection: linear(self.width, self.d_model),
            norm: self.norm.try_init(device)?,
            activation: self.activation,
        })
    }
}

crate::builders::init_or_panic!(PerLayerInputConfig => PerLayerInput);

/// The per-layer input branch of a block (HF `per_layer_input_gate`,
/// `per_layer_projection`, `post_per_layer_input_norm`).
#[derive(Module, Debug)]
pub struct PerLayerInput {
    /// `[d_model] -> [width]`
    pub gate: Linear,
    /// `[width] -> [d_model]`
    pub projection: Linear,
    /// The norm of the branch's output.
    pub norm: Norm,
    #[module(skip)]
    activation: Activation,
}

impl PerLayerInput {
    /// The stream with the branch added.
    ///
    /// # Shapes
    /// - x: `[batch, seq, d_model]`
    /// - input: `[batch, seq, width]`, the layer's own input
    /// - output: `[batch, seq, d_model]`
    pub fn forward(&self, x: Tensor<3>, input: Tensor<3>) -> Tensor<3> {
        let gated = self.activation.forward(linear_rows(&self.gate, x.clone())) * input;
        x + self.norm.forward(linear_rows(&self.projection, gated))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_utils::{assert_close, test_devices};
    use burn::tensor::Distribution;

    /// The branch equals its formula, written with plain tensor ops.
    #[test]
    fn adds_the_normed_projection_of_the_gated_input() {
        for device in test_devices() {
            device.seed(3);
            let branch = PerLayerInputConfig::new(8, 3, NormConfig::rms(8)).init(&device);
            let x = Tensor::<3>::random([2, 4, 8], Distribution::Normal(0.0, 1.0), &device);
            let input = Tensor::<3>::random([2, 4, 3], Distribution::Normal(0.0, 1.0), &device);
            let gate = x.clone().matmul(branch.gate.weight.val().unsqueeze::<3>());
            // tanh-GELU written out.
            let cubic = gate.clone() + gate.clone().powi_scalar(3) * 0.044715;
            let gelu =
                gate.clone() * ((cubic * (2.0 / std::f64::consts::PI).sqrt()).tanh() + 1.0) * 0.5;
            let projected =
                (gelu * input.clone()).matmul(branch.projection.weight.val().unsqueeze::<3>());
            let rms = (projected.clone().powi_scalar(2).mean_dim(2) + 1e-6).sqrt();
            let expected = x.clone() + projected / rms;
            assert_close(branch.forward(x, input), expected, 1e-5, "per-layer input");
        }
    }
}
