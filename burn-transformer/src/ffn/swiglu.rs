//! Gated feed-forward network ([Shazeer 2020](https://arxiv.org/abs/2002.05202)):
//! `down(act(gate(x)) · up(x))`. With SiLU it is SwiGLU (LLaMA, Mistral, Qwen); with
//! tanh-GELU it is GeGLU (Gemma).
//!
//! Field names are Hugging Face LLaMA's (`gate_proj`, `up_proj`, `down_proj`), so
//! `LlamaMLP` weights load by name.

use burn::config::Config;
use burn::module::{Initializer, Module};
use burn::nn::Linear;
use burn::tensor::{Device, Tensor};

use super::Activation;
use crate::error::ConfigError;
use crate::ops::gated_silu::gated_silu;
use crate::ops::linear::linear_rows;

const MODULE: &str = "SwiGluConfig";

/// Configuration of a [`SwiGlu`].
#[derive(Config, Debug)]
pub struct SwiGluConfig {
    /// Model width (HF `hidden_size`).
    pub d_model: usize,
    /// Hidden width (HF `intermediate_size`).
    pub d_ff: usize,
    /// Whether the three projections have a bias (HF `mlp_bias`). Default: false.
    #[config(default = false)]
    pub bias: bool,
    /// The gate's activation (HF `hidden_act`). Default: SiLU (SwiGLU).
    #[config(default = "Activation::Silu")]
    pub activation: Activation,
    /// Initializer of the projection weights. Default: Burn's (Kaiming-uniform);
    /// LLaMA-family models use a normal of `initializer_range`.
    #[config(default = "None")]
    pub initializer: Option<Initializer>,
}

impl SwiGluConfig {
    /// Checks the configuration.
    ///
    /// # Errors
    /// [`ConfigError::Zero`] for a zero size.
    pub fn validate(&self) -> Result<(), ConfigError> {
        ConfigError::check_positive(MODULE, "d_model", self.d_model)?;
        ConfigError::check_positive(MODULE, "d_ff", self.d_ff)
    }

    /// Validates the configuration and initializes the projections.
    ///
    /// # Errors
    /// See [`SwiGluConfig::validate`].
    pub fn try_init(&self, device: &Device) -> Result<SwiGlu, ConfigError> {
        self.validate()?;
        let linear = |d_input, d_output| {
            super::projection(d_input, d_output, self.bias, &self.initializer, device)
        };
        Ok(SwiGlu {
            gate_proj: linear(self.d_model, self.d_ff),
            up_proj: linear(self.d_model, self.d_ff),
            down_proj: linear(self.d_ff, self.d_model),
            activation: self.activation,
        })
    }
}

crate::builders::init_or_panic!(SwiGluConfig => SwiGlu);

/// Gated feed-forward network (SwiGLU by default).
#[derive(Module, Debug)]
pub struct SwiGlu {
    /// `d_model → d_ff`, through the activation.
    pub gate_proj: Linear,
    /// `d_model → d_ff`, linear.
    pub up_proj: Linear,
    /// `d_ff → d_model`.
    pub down_proj: Linear,
    /// Applied to the gate.
    #[module(skip)]
    pub activation: Activation,
}

impl SwiGlu {
    /// `down_proj(act(gate_proj(x)) · up_proj(x))`.
    ///
    /// # Shapes
    /// - x: `[..., d_model]`
    /// - output: `[..., d_model]`
    pub fn forward<const D: usize>(&self, x: Tensor<D>) -> Tensor<D> {
        let gate = linear_rows(&self.gate_proj, x.clone());
        let up = linear_rows(&self.up_proj, x);
        let hidden = match self.activation {
            // One fused pass forward and backward on flex (see `crate::ops::gated_silu`).
            Activation::Silu => gated_silu(gate, up),
            activation => activation.forward(gate) * up,
        };
        linear_rows(&self.down_proj, hidden)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_utils::{Fixture, assert_close, test_devices};

    #[test]
    fn matches_llama_mlp() {
        for (name, bias, activation) in [
            ("swiglu", false, Activation::Silu),
            ("swiglu_bias", true, Activation::Silu),
            ("geglu", false, Activation::GeluTanh),
        ] {
            let fixture = Fixture::load(name);
            for device in test_devices() {
                let mut mlp = SwiGluConfig::new(16, 40)
                    .with_bias(bias)
                    .with_activation(activation)
                    .init(&device);
                mlp.gate_proj = fixture.linear("gate_proj", &device);
                mlp.up_proj = fixture.linear("up_proj", &device);
                mlp.down_proj = fixture.linear("down_proj", &device);
                let y = mlp.forward(fixture.tensor::<3>("x", &device));
                assert_close(y, fixture.tensor("y", &device), 1e-5, name);
            }
        }
    }

    #[test]
    fn no_bias_by_default() {
        let mlp = SwiGluConfig::new(8, 16).init(&burn::tensor::Device::flex());
        assert!(mlp.gate_proj.bias.is_none() && mlp.up_proj.bias.is_none());
        assert!(mlp.down_proj.bias.is_none());
        assert_eq!(mlp.num_params(), 3 * 8 * 16);
    }

    #[test]
    fn invalid_configs_return_typed_errors() {
        assert_eq!(
            SwiGluConfig::new(0, 8).validate(),
            Err(ConfigError::Zero {
                module: MODULE,
                field: "d_model"
            })
        );
    }

    #[test]
    #[should_panic(expected = "SwiGluConfig: `d_ff` must be greater than 0")]
    fn init_panics_with_the_validation_message() {
        SwiGluConfig::new(8, 0).init(&burn::tensor::Device::flex());
    }
}
