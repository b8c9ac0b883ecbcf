//! Which decoder layers are sparse: Mixtral makes every layer a mixture of experts;
//! DeepSeek-V2/V3 keep the first `first_k_dense_replace` layers dense (3 in V3), then
//! use MoE every `moe_layer_freq` layers; Qwen3-MoE makes every
//! `decoder_sparse_step`-th layer sparse (counting from 1) except the layers it lists
//! as dense (`mlp_only_layers`); ERNIE-4.5 makes sparse every `moe_layer_interval`-th
//! layer (counting from 1) from `moe_layer_start_index` to `moe_layer_end_index`.
//!
//! A layer's feed-forward is then a [`FeedForwardConfig::SwiGlu`] or a
//! [`FeedForwardConfig::Moe`] ([`MoeLayerPlan::layer_config`]).

use burn::config::Config;

use super::layer::MoeConfig;
use crate::ffn::{FeedForwardConfig, SwiGluConfig};

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
    /// Layer `i` is sparse only when `(i + 1) % decoder_sparse_step == 0` (HF
    /// `decoder_sparse_step`, Qwen3-MoE). Default: 1 (every layer).
    #[config(default = 1)]
    pub decoder_sparse_step: usize,
    /// Layers that stay dense whatever the rules above say (HF `mlp_only_layers`).
    /// Default: none.
    #[config(default = "Vec::new()")]
    pub dense_layers: Vec<usize>,
    /// The last layer that may be sparse; those after it are dense (HF
    /// `moe_layer_end_index`, ERNIE-4.5). Default: none (no limit).
    #[config(default = "None")]
    pub last_sparse_layer: Option<usize>,
}

impl MoeLayerPlan {
    /// Every layer sparse (Mixtral).
    pub fn all_sparse() -> Self {
        Self::new()
    }

    /// Whether layer `layer` (0-based) is a mixture of experts.
    pub fn is_moe(&self, layer: usize) -> bool {
        layer >= self.first_k_dense_replace
            && layer.is_multiple_of(self.moe_layer_freq.max(1))
            && (layer + 1).is_multiple_of(self.decoder_sparse_step.max(1))
            && !self.dense_layers.contains(&layer)
            && self.last_sparse_layer.is_none_or(|last| layer <= last)
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ffn::FeedForward;
    use crate::ffn::moe::RouterConfig;
    use crate::test_utils::{assert_close, test_devices};
    use burn::tensor::{Distribution, Tensor};

    #[test]
    fn dense_first_layers_then_every_moe_layer_freq() {
        let deepseek_v3 = MoeLayerPlan::new().with_first_k_dense_replace(3);
        let sparse: Vec<bool> = (0..6).map(|layer| deepseek_v3.is_moe(layer)).collect();
        assert_eq!(sparse, [false, false, false, true, true, true]);
        assert!((0..4).all(|layer| MoeLayerPlan::all_sparse().is_moe(layer)));
        let every_other = MoeLayerPlan::new()
            .with_first_k_dense_replace(1)
            .with_moe_layer_freq(2);
        let sparse: Vec<bool> = (0..5).map(|layer| every_other.is_moe(layer)).collect();
        assert_eq!(sparse, [false, false, true, false, true]);
        // Qwen3-MoE: every second layer counting from 1, layer 3 kept dense.
        let qwen = MoeLayerPlan::new()
            .with_decoder_sparse_step(2)
            .with_dense_layers(vec![3]);
        let sparse: Vec<bool> = (0..6).map(|layer| qwen.is_moe(layer)).collect();
        assert_eq!(sparse, [false, true, false, false, false, true]);
        // ERNIE-4.5: layers 1 to 3 sparse, the rest dense.
        let ernie = MoeLayerPlan::new()
            .with_first_k_dense_replace(1)
            .with_last_sparse_layer(Some(3));
        let sparse: Vec<bool> = (0..6).map(|layer| ernie.is_moe(layer)).collect();
        assert_eq!(sparse, [false, true, true, true, false, false]);
    }

    #[test]
    fn feed_forward_runs_dense_and_sparse_layers() {
        for device in test_devices() {
            device.seed(31);
            let dense = SwiGluConfig::new(8, 16);
            let moe = MoeConfig::new(RouterConfig::new(8, 4, 2), 6);
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
