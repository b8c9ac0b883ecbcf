//! The classic position-wise feed-forward network ("Attention Is All You Need"):
//! `fc2(dropout(act(fc1(x))))`, applied to every position independently.
//!
//! Field names follow the Hugging Face encoder-decoder checkpoints (BART, Marian, OPT,
//! Whisper, M2M-100: `fc1`, `fc2`), so their weights load by name.

use burn::config::Config;
use burn::module::{Initializer, Module};
use burn::nn::{Dropout, DropoutConfig, Linear};
use burn::tensor::{Device, Tensor};

use super::{Activation, Xielu, XieluConfig};
use crate::error::ConfigError;

const MODULE: &str = "DenseFfnConfig";

/// Configuration of a [`DenseFfn`].
#[derive(Config, Debug)]
pub struct DenseFfnConfig {
    /// Model width (input and output size).
    pub d_model: usize,
    /// Hidden width (HF `ffn_dim`, `intermediate_size`, `d_ff`).
    pub d_ff: usize,
    /// Activation between the two projections. Default: exact GELU.
    #[config(default = "Activation::Gelu")]
    pub activation: Activation,
    /// Dropout on the hidden activations during training (HF `activation_dropout`), in
    /// [0, 1). Default: 0.
    #[config(default = 0.0)]
    pub dropout: f64,
    /// Whether both projections have a bias. Default: true.
    #[config(default = true)]
    pub bias: bool,
    /// Initializer of the projection weights. Default: Burn's (Kaiming-uniform);
    /// decoder-only models use a normal of `initializer_range`.
    #[config(default = "None")]
    pub initializer: Option<Initializer>,
}

impl DenseFfnConfig {
    /// Checks the configuration.
    ///
    /// # Errors
    /// [`ConfigError::Zero`] for a zero size; [`ConfigError::Probability`] for a dropout
    /// outside [0, 1).
    pub fn validate(&self) -> Result<(), ConfigError> {
        ConfigError::check_positive(MODULE, "d_model", self.d_model)?;
        ConfigError::check_positive(MODULE, "d_ff", self.d_ff)?;
        ConfigError::check_probability(MODULE, "dropout", self.dropout)
    }

    /// Validates the configuration and initializes the projections.
    ///
    /// # Errors
    /// See [`DenseFfnConfig::validate`].
    pub fn try_init(&self, device: &Device) -> Result<DenseFfn, ConfigError> {
        self.validate()?;
        let linear = |d_input, d_output| {
            super::projection(d_input, d_output, self.bias, &self.initializer, device)
        };
        Ok(DenseFfn {
            fc1: linear(self.d_model, self.d_ff),
            fc2: linear(self.d_ff, self.d_model),
            dropout: DropoutConfig::new(self.dropout).init(),
            act_fn: (self.activation == Activation::Xielu)
                .then(|| XieluConfig::new().try_init(device))
                .transpose()?,
            activation: self.activation,
        })
    }
}

crate::builders::init_or_panic!(DenseFfnConfig => DenseFfn);

/// Two-layer feed-forward network with an activation and dropout between.
#[derive(Module, Debug)]
pub struct DenseFfn {
    /// `d_model → d_ff`.
    pub fc1: Linear,
    /// `d_ff → d_model`.
    pub fc2: Linear,
    /// On the hidden activations; active only on autodiff devices in training.
    pub dropout: Dropout,
    /// The activation's learned parameters, for xIELU (HF `act_fn`); `None` for the
    /// others.
    pub act_fn: Option<Xielu>,
    /// Between `fc1` and `fc2`.
    #[module(skip)]
    pub activation: Activation,
}

impl DenseFfn {
    /// `fc2(dropout(act(fc1(x))))`.
    ///
    /// # Shapes
    /// - x: `[..., d_model]`
    /// - output: `[..., d_model]`
    pub fn forward<const D: usize>(&self, x: Tensor<D>) -> Tensor<D> {
        let projected = self.fc1.forward(x);
        let hidden = match &self.act_fn {
            Some(xielu) => xielu.forward(projected),
            None => self.activation.forward(projected),
        };
        self.fc2.forward(self.dropout.forward(hidden))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_utils::{Fixture, assert_close, test_devices};

    #[test]
    fn matches_pytorch_for_each_activation() {
        for (name, activation, bias) in [
            ("ffn_gelu", Activation::Gelu, true),
            ("ffn_gelu_tanh", Activation::GeluTanh, true),
            ("ffn_relu", Activation::Relu, false),
            ("ffn_silu", Activation::Silu, true),
        ] {
            let fixture = Fixture::load(name);
            for device in test_devices() {
                let mut ffn = DenseFfnConfig::new(16, 32)
                    .with_activation(activation)
                    .with_bias(bias)
                    .with_dropout(0.1)
                    .init(&device);
                ffn.fc1 = fixture.linear("fc1", &device);
                ffn.fc2 = fixture.linear("fc2", &device);
                // Not an autodiff device: dropout is the identity.
                let y = ffn.forward(fixture.tensor::<3>("x", &device));
                assert_close(y, fixture.tensor("y", &device), 1e-5, name);
            }
        }
    }

    #[test]
    fn bias_flag_controls_both_projections() {
        let device = Device::flex();
        let with = DenseFfnConfig::new(4, 8).init(&device);
        assert!(with.fc1.bias.is_some() && with.fc2.bias.is_some());
        let without = DenseFfnConfig::new(4, 8).with_bias(false).init(&device);
        assert!(without.fc1.bias.is_none() && without.fc2.bias.is_none());
        assert_eq!(without.num_params(), 2 * 4 * 8);
    }

    #[test]
    fn invalid_configs_return_typed_errors() {
        assert_eq!(
            DenseFfnConfig::new(4, 0).validate(),
            Err(ConfigError::Zero {
                module: MODULE,
                field: "d_ff"
            })
        );
        assert!(matches!(
            DenseFfnConfig::new(4, 8).with_dropout(-0.1).validate(),
            Err(ConfigError::Probability {
                field: "dropout",
                ..
            })
        ));
    }

    #[test]
    #[should_panic(expected = "DenseFfnConfig: `dropout` must be a probability in [0, 1), got 1")]
    fn init_panics_with_the_validation_message() {
        DenseFfnConfig::new(4, 8)
            .with_dropout(1.0)
            .init(&Device::flex());
    }
}
