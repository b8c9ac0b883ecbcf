//! A choice of normalization layer, for blocks and models configured at run time.

use burn::config::Config;
use burn::module::Module;
use burn::tensor::{Device, Tensor};

use super::{LayerNorm, LayerNormConfig, RmsNorm, RmsNormConfig};
use crate::error::ConfigError;

/// Which normalization a block or model uses.
#[derive(Config, Debug)]
pub enum NormConfig {
    /// Root-mean-square normalization (LLaMA family).
    Rms(RmsNormConfig),
    /// Layer normalization (the original Transformer, GPT-2, BART).
    Layer(LayerNormConfig),
}

impl NormConfig {
    /// RMSNorm over `d_model` with LLaMA's default epsilon.
    pub fn rms(d_model: usize) -> Self {
        Self::Rms(RmsNormConfig::new(d_model))
    }

    /// LayerNorm over `d_model` with PyTorch's default epsilon.
    pub fn layer(d_model: usize) -> Self {
        Self::Layer(LayerNormConfig::new(d_model))
    }

    /// The normalized width.
    pub fn d_model(&self) -> usize {
        match self {
            Self::Rms(config) => config.d_model,
            Self::Layer(config) => config.d_model,
        }
    }

    /// Checks the configuration.
    pub fn validate(&self) -> Result<(), ConfigError> {
        match self {
            Self::Rms(config) => config.validate(),
            Self::Layer(config) => config.validate(),
        }
    }

    /// Builds the layer, or returns why the configuration is invalid.
    pub fn try_init(&self, device: &Device) -> Result<Norm, ConfigError> {
        Ok(match self {
            Self::Rms(config) => Norm::Rms(config.try_init(device)?),
            Self::Layer(config) => Norm::Layer(config.try_init(device)?),
        })
    }
}

crate::builders::init_or_panic!(NormConfig => Norm);

/// A normalization layer chosen at run time.
#[derive(Module, Debug)]
pub enum Norm {
    /// RMSNorm.
    Rms(RmsNorm),
    /// LayerNorm.
    Layer(LayerNorm),
}

impl Norm {
    /// Normalizes the last axis.
    ///
    /// # Shapes
    /// - x: `[..., d_model]`
    /// - output: `[..., d_model]`
    pub fn forward<const D: usize>(&self, x: Tensor<D>) -> Tensor<D> {
        match self {
            Self::Rms(norm) => norm.forward(x),
            Self::Layer(norm) => norm.forward(x),
        }
    }
}
