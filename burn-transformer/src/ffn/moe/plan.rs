//! Which decoder layers are sparse: Mixtral makes every layer a mixture of experts;
//! DeepSeek-V2/V3 keep the first `first_k_dense_replace` layers dense (3 in V3), then
//! use MoE every `moe_layer_freq` layers.
//!
//! A layer's feed-forward is then a [`FeedForwardConfig::SwiGlu`] or a
//! [`FeedForwardConfig::Moe`] ([`MoeLayerPlan::layer_config`]).

use burn::config::Config;
use serde_json::Value;

use super::layer::MoeConfig;
use crate::error::ConfigError;
use crate::ffn::{Activation, FeedForwardConfig, SwiGluConfig};

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
    /// [`ConfigError::Invalid`] for a value that is not a non-negative integer;
    /// [`ConfigError::Zero`] for a zero `moe_layer_freq`.
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
    use crate::ffn::FeedForward;
    use crate::test_utils::{assert_close, test_devices};
    use burn::tensor::{Distribution, Tensor};

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
        let dense = dense_config_from_hf(&serde_json::json!({
            "hidden_size": 16, "intermediate_size": 40, "hidden_act": "silu"
        }))
        .unwrap();
        assert_eq!((dense.d_model, dense.d_ff), (16, 40));
    }

    #[test]
    fn feed_forward_runs_dense_and_sparse_layers() {
        for device in test_devices() {
            device.seed(31);
            let dense = SwiGluConfig::new(8, 16);
            let moe = MoeConfig::mixtral(8, 6, 4, 2);
            let plan = MoeLayerPlan::new().with_first_k_dense_replace(1);
            let first = plan.layer_config(0, &dense, &moe).init(&device);
            let second = plan.layer_config(1, &dense, &moe).init(&device);
            assert!(!first.is_moe() && second.is_moe());
            let x = Tensor::<3>::random([2, 3, 8], Distribution::Normal(0.0, 1.0), &device);
            let out = first.forward_with_losses(x.clone());
            assert!(out.aux_loss.is_none());
            if let FeedForward::SwiGlu(mlp) = &first {
                assert_close(out.output, mlp.forward(x.clone()), 1e-6, "dense");
            }
            let out = second.forward_with_losses(x.clone());
            assert!(out.aux_loss.is_some() && out.z_loss.is_some());
            assert_close(
                out.output,
                second.forward(x),
                1e-6,
                "losses do not change the output",
            );
        }
    }
}
