//! A choice of feed-forward layer, for blocks and models configured at run time.

use burn::config::Config;
use burn::module::Module;
use burn::tensor::{Device, Tensor};

use super::moe::{Moe, MoeConfig};
use super::{DenseFfn, DenseFfnConfig, SwiGlu, SwiGluConfig};
use crate::error::ConfigError;

/// Which feed-forward layer a block uses.
#[derive(Config, Debug)]
pub enum FeedForwardConfig {
    /// Linear → activation → linear (GELU/ReLU; the original Transformer, GPT-2).
    Dense(DenseFfnConfig),
    /// Gated linear unit with SiLU (LLaMA family).
    SwiGlu(SwiGluConfig),
    /// Sparse mixture of SwiGLU experts (Mixtral, DeepSeek); see
    /// [`MoeLayerPlan`](super::MoeLayerPlan) for which layers are sparse.
    Moe(MoeConfig),
}

impl FeedForwardConfig {
    /// Checks the configuration.
    pub fn validate(&self) -> Result<(), ConfigError> {
        match self {
            Self::Dense(config) => config.validate(),
            Self::SwiGlu(config) => config.validate(),
            Self::Moe(config) => config.validate(),
        }
    }

    /// The model width the layer reads and writes.
    pub fn d_model(&self) -> usize {
        match self {
            Self::Dense(config) => config.d_model,
            Self::SwiGlu(config) => config.d_model,
            Self::Moe(config) => config.router.d_model,
        }
    }

    /// Builds the layer, or returns why the configuration is invalid.
    pub fn try_init(&self, device: &Device) -> Result<FeedForward, ConfigError> {
        Ok(match self {
            Self::Dense(config) => FeedForward::Dense(config.try_init(device)?),
            Self::SwiGlu(config) => FeedForward::SwiGlu(config.try_init(device)?),
            Self::Moe(config) => FeedForward::Moe(config.try_init(device)?),
        })
    }
}

crate::builders::init_or_panic!(FeedForwardConfig => FeedForward);

/// A feed-forward layer chosen at run time.
///
/// Burn names an enum module's parameters with the variant (`mlp.Moe.gate.weight`);
/// Hugging Face keys have no such level, so load checkpoints with burn-store's
/// `skip_enum_variants(true)` (`mlp.gate.weight`).
// One per layer, built once: boxing the larger variant would buy nothing.
#[allow(clippy::large_enum_variant)]
#[derive(Module, Debug)]
pub enum FeedForward {
    /// Linear → activation → linear.
    Dense(DenseFfn),
    /// SwiGLU.
    SwiGlu(SwiGlu),
    /// Sparse mixture of experts.
    Moe(Moe),
}

/// The output of [`FeedForward::forward_with_losses`]: the hidden states and, for an
/// MoE layer, its routing losses to add to the training loss.
#[derive(Clone, Debug)]
pub struct FeedForwardOutput {
    /// `[batch, seq, d_model]`, without the residual.
    pub output: Tensor<3>,
    /// `[1]`: the load-balancing loss of an MoE layer ([`MoeOutput::aux_loss`]).
    ///
    /// [`MoeOutput::aux_loss`]: super::MoeOutput::aux_loss
    pub aux_loss: Option<Tensor<1>>,
    /// `[1]`: the router z-loss of an MoE layer ([`MoeOutput::z_loss`]).
    ///
    /// [`MoeOutput::z_loss`]: super::MoeOutput::z_loss
    pub z_loss: Option<Tensor<1>>,
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
            // The routing losses are dropped here: training uses forward_with_losses.
            Self::Moe(moe) => moe.forward(x).output,
        }
    }

    /// Applies the layer and returns an MoE layer's routing losses with its output.
    ///
    /// # Shapes
    /// - x: `[batch, seq, d_model]`
    /// - output: see [`FeedForwardOutput`]
    pub fn forward_with_losses(&self, x: Tensor<3>) -> FeedForwardOutput {
        self.forward_with_losses_beside(x.clone(), x)
    }

    /// [`forward_with_losses`](Self::forward_with_losses) given the block's residual
    /// stream too, which Gemma-4's mixture of experts routes
    /// ([`MoeConfig::stream_norms`]); every other layer ignores it.
    ///
    /// # Shapes
    /// - x: `[batch, seq, d_model]`, the block's normed input
    /// - stream: `[batch, seq, d_model]`, the block's residual stream
    /// - output: see [`FeedForwardOutput`]
    pub fn forward_with_losses_beside(&self, x: Tensor<3>, stream: Tensor<3>) -> FeedForwardOutput {
        match self {
            Self::Moe(moe) => {
                let out = moe.forward_beside(x, stream);
                FeedForwardOutput {
                    output: out.output,
                    aux_loss: Some(out.aux_loss),
                    z_loss: Some(out.z_loss),
                }
            }
            dense => FeedForwardOutput {
                output: dense.forward(x),
                aux_loss: None,
                z_loss: None,
            },
        }
    }

    /// Whether this is a mixture of experts.
    pub fn is_moe(&self) -> bool {
        matches!(self, Self::Moe(_))
    }
}
