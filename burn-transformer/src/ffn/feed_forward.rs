//! A choice of feed-forward layer, for blocks and models configured at run time.

use burn::config::Config;
use burn::module::Module;
use burn::tensor::{Device, Tensor};

use super::{DenseFfn, DenseFfnConfig, SwiGlu, SwiGluConfig};
use crate::error::ConfigError;

/// Which feed-forward layer a block uses.
#[derive(Config, Debug)]
pub enum FeedForwardConfig {
    /// Linear → activation → linear (GELU/ReLU; the original Transformer, GPT-2).
    Dense(DenseFfnConfig),
    /// Gated linear unit with SiLU (LLaMA family).
    SwiGlu(SwiGluConfig),
}

impl FeedForwardConfig {
    /// Checks the configuration.
    pub fn validate(&self) -> Result<(), ConfigError> {
        match self {
            Self::Dense(config) => config.validate(),
            Self::SwiGlu(config) => config.validate(),
        }
    }

    /// The model width the layer reads and writes.
    pub fn d_model(&self) -> usize {
        match self {
            Self::Dense(config) => config.d_model,
            Self::SwiGlu(config) => config.d_model,
        }
    }

    /// Builds the layer, or returns why the configuration is invalid.
    pub fn try_init(&self, device: &Device) -> Result<FeedForward, ConfigError> {
        Ok(match self {
            Self::Dense(config) => FeedForward::Dense(config.try_init(device)?),
            Self::SwiGlu(config) => FeedForward::SwiGlu(config.try_init(device)?),
        })
    }

    /// Builds the layer.
    ///
    /// # Panics
    /// If the configuration is invalid, with the message of [`validate`](Self::validate).
    pub fn init(&self, device: &Device) -> FeedForward {
        self.try_init(device)
            .unwrap_or_else(|error| panic!("{error}"))
    }
}

/// A feed-forward layer chosen at run time.
#[derive(Module, Debug)]
pub enum FeedForward {
    /// Linear → activation → linear.
    Dense(DenseFfn),
    /// SwiGLU.
    SwiGlu(SwiGlu),
}

impl FeedForward {
    /// Applies the layer position-wise.
    ///
    /// # Shapes
    /// - x: `[batch, seq, d_model]`
    /// - output: `[batch, seq, d_model]`
    pub fn forward(&self, x: Tensor<3>) -> Tensor<3> {
        match self {
            Self::Dense(ffn) => ffn.forward(x),
            Self::SwiGlu(ffn) => ffn.forward(x),
        }
    }
}
