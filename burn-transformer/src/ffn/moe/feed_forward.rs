//! The feed-forward half of a decoder layer: a dense SwiGLU or a sparse MoE, and the
//! plan that says which layers are which.
//!
//! - Mixtral: every layer is sparse ([`MoeLayerPlan::all_sparse`]).
//! - DeepSeek-V2/V3: the first `first_k_dense_replace` layers are dense SwiGLU (3 in V3),
//!   then MoE every `moe_layer_freq` layers ([`MoeLayerPlan::from_hf_config`]).
//!
//! Loading note: Burn names an enum module's parameters with the variant
//! (`mlp.Moe.gate.weight`). Hugging Face keys have no such level, so load with
//! burn-store's `skip_enum_variants(true)`, which makes the path `mlp.gate.weight`.

use burn::config::Config;
use burn::module::Module;
use burn::tensor::{Device, Tensor};
use serde_json::Value;

use super::layer::{Moe, MoeConfig};
use crate::error::ConfigError;
use crate::ffn::{Activation, SwiGlu, SwiGluConfig};

/// Configuration of a [`FeedForward`].
#[derive(Config, Debug)]
pub enum FeedForwardConfig {
    /// A dense gated FFN (LLaMA's MLP; DeepSeek's dense layers).
    SwiGlu(SwiGluConfig),
    /// A sparse mixture of experts.
    Moe(MoeConfig),
}

impl FeedForwardConfig {
    /// Checks the configuration.
    ///
    /// # Errors
    /// The errors of the variant's config.
    pub fn validate(&self) -> Result<(), ConfigError> {
        match self {
            Self::SwiGlu(config) => config.validate(),
            Self::Moe(config) => config.validate(),
        }
    }

    /// Validates the configuration and builds the layer.
    ///
    /// # Errors
    /// See [`validate`](Self::validate).
    pub fn try_init(&self, device: &Device) -> Result<FeedForward, ConfigError> {
        Ok(match self {
            Self::SwiGlu(config) => FeedForward::SwiGlu(config.try_init(device)?),
            Self::Moe(config) => FeedForward::Moe(config.try_init(device)?),
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

/// A decoder layer's feed-forward network (HF `mlp`).
// One per layer, built once and never moved in a loop: boxing the larger variant
// would add an indirection to every checkpoint path for nothing.
#[allow(clippy::large_enum_variant)]
#[derive(Module, Debug)]
pub enum FeedForward {
    /// Dense: `gate_proj`, `up_proj`, `down_proj`.
    SwiGlu(SwiGlu),
    /// Sparse: `gate`, `experts`, `shared_experts`.
    Moe(Moe),
}

/// The output of a [`FeedForward`]: the hidden states and, for MoE layers, the routing
/// losses to add to the training loss.
#[derive(Clone, Debug)]
pub struct FeedForwardOutput {
    /// `[batch, seq, d_model]`, without the residual.
    pub output: Tensor<3>,
    /// `[1]`: the load-balancing loss of an MoE layer.
    pub aux_loss: Option<Tensor<1>>,
    /// `[1]`: the router z-loss of an MoE layer.
    pub z_loss: Option<Tensor<1>>,
}

impl FeedForward {
    /// Applies the layer.
    ///
    /// # Shapes
    /// - x: `[batch, seq, d_model]`
    /// - output: see [`FeedForwardOutput`]
    pub fn forward(&self, x: Tensor<3>) -> FeedForwardOutput {
        match self {
            Self::SwiGlu(mlp) => FeedForwardOutput {
                output: mlp.forward(x),
                aux_loss: None,
                z_loss: None,
            },
            Self::Moe(moe) => {
                let out = moe.forward(x);
                FeedForwardOutput {
                    output: out.output,
                    aux_loss: Some(out.aux_loss),
                    z_loss: Some(out.z_loss),
                }
            }
        }
    }

    /// Whether this is a mixture of experts.
    pub fn is_moe(&self) -> bool {
        matches!(self, Self::Moe(_))
    }
}

/// Which decoder layers are sparse.
#[derive(Config, Debug, PartialEq, Eq)]
pub struct MoeLayerPlan {
    /// The first layers are dense (HF `first_k_dense_replace`). Default: 0.
    #[config(default = 0)]
    pub first_k_dense_replace: usize,
    /// After those, layer `i` is sparse when `i % moe_layer_freq == 0` (HF
    /// `moe_layer_freq`). Default: 1 (every layer).
    #[config(default = 1)]
    pub moe_layer_freq: usize,
}

impl MoeLayerPlan {
    /// Every layer sparse (Mixtral).
    pub fn all_sparse() -> Self {
        Self::new()
    }

    /// Reads `first_k_dense_replace` and `moe_layer_freq` (defaults 0 and 1).
    ///
    /// # Errors
    /// [`ConfigError::Invalid`] for a value that is not a non-negative integer, or a zero
    /// `moe_layer_freq`.
    pub fn from_hf_config(config: &Value) -> Result<Self, ConfigError> {
        let read = |key: &'static str, default: usize| match config.get(key) {
            None | Some(Value::Null) => Ok(default),
            Some(value) => value
                .as_u64()
                .map(|v| v as usize)
                .ok_or_else(|| ConfigError::Invalid {
                    module: "MoeLayerPlan",
                    field: key,
                    reason: format!("expected a non-negative integer, got {value}"),
                }),
        };
        let plan = Self::new()
            .with_first_k_dense_replace(read("first_k_dense_replace", 0)?)
            .with_moe_layer_freq(read("moe_layer_freq", 1)?);
        ConfigError::check_positive("MoeLayerPlan", "moe_layer_freq", plan.moe_layer_freq)?;
        Ok(plan)
    }

    /// Whether layer `layer` (0-based) is a mixture of experts.
    pub fn is_moe(&self, layer: usize) -> bool {
        layer >= self.first_k_dense_replace && layer.is_multiple_of(self.moe_layer_freq.max(1))
    }

    /// The feed-forward config of layer `layer`: `moe` where sparse, else `dense`.
    pub fn layer_config(
        &self,
        layer: usize,
        dense: &SwiGluConfig,
        moe: &MoeConfig,
    ) -> FeedForwardConfig {
        if self.is_moe(layer) {
            FeedForwardConfig::Moe(moe.clone())
        } else {
            FeedForwardConfig::SwiGlu(dense.clone())
        }
    }
}

/// The dense SwiGLU of a Hugging Face MoE model's dense layers: `hidden_size`,
/// `intermediate_size`, `hidden_act` (default silu).
///
/// # Errors
/// [`ConfigError::Invalid`] naming a missing or malformed key.
pub fn dense_config_from_hf(config: &Value) -> Result<SwiGluConfig, ConfigError> {
    let read = |key: &'static str| {
        config
            .get(key)
            .and_then(Value::as_u64)
            .map(|v| v as usize)
            .ok_or_else(|| ConfigError::Invalid {
                module: "SwiGluConfig",
                field: key,
                reason: "missing or not a non-negative integer".into(),
            })
    };
    let activation = match config.get("hidden_act").and_then(Value::as_str) {
        Some(name) => Activation::from_hf_name(name)?,
        None => Activation::Silu,
    };
    Ok(
        SwiGluConfig::new(read("hidden_size")?, read("intermediate_size")?)
            .with_activation(activation),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_utils::{assert_close, test_devices};
    use burn::tensor::Distribution;

    #[test]
    fn deepseek_v3_has_three_dense_layers_then_moe() {
        let plan = MoeLayerPlan::from_hf_config(&serde_json::json!({
            "first_k_dense_replace": 3, "moe_layer_freq": 1
        }))
        .unwrap();
        let sparse: Vec<bool> = (0..6).map(|layer| plan.is_moe(layer)).collect();
        assert_eq!(sparse, [false, false, false, true, true, true]);
        assert!((0..4).all(|layer| MoeLayerPlan::all_sparse().is_moe(layer)));
        let every_other = MoeLayerPlan::new()
            .with_first_k_dense_replace(1)
            .with_moe_layer_freq(2);
        let sparse: Vec<bool> = (0..5).map(|layer| every_other.is_moe(layer)).collect();
        assert_eq!(sparse, [false, false, true, false, true]);
    }

    #[test]
    fn feed_forward_dispatches_to_its_variant() {
        for device in test_devices() {
            device.seed(31);
            let dense = SwiGluConfig::new(8, 16);
            let moe = MoeConfig::mixtral(8, 6, 4, 2);
            let plan = MoeLayerPlan::new().with_first_k_dense_replace(1);
            let first = plan.layer_config(0, &dense, &moe).init(&device);
            let second = plan.layer_config(1, &dense, &moe).init(&device);
            assert!(!first.is_moe() && second.is_moe());
            let x = Tensor::<3>::random([2, 3, 8], Distribution::Normal(0.0, 1.0), &device);
            let out = first.forward(x.clone());
            assert!(out.aux_loss.is_none());
            if let FeedForward::SwiGlu(mlp) = &first {
                assert_close(out.output, mlp.forward(x.clone()), 1e-6, "dense");
            }
            let out = second.forward(x);
            assert!(out.aux_loss.is_some() && out.z_loss.is_some());
            assert_eq!(out.output.dims(), [2, 3, 8]);
        }
    }
}
