//! Stochastic depth (Huang et al., 2016): drop a residual branch for whole samples.

use burn::config::Config;
use burn::module::Flag;
use burn::module::{Module, Param};
use burn::tensor::{Distribution, Tensor};

use crate::error::ConfigError;

/// Configuration of [`StochasticDepth`].
#[derive(Config, Debug)]
pub struct StochasticDepthConfig {
    /// Probability of dropping the branch for a sample, in `[0, 1)`. Default: 0.
    #[config(default = 0.0)]
    pub prob: f64,
}

impl StochasticDepthConfig {
    /// Checks the probability.
    pub fn validate(&self) -> Result<(), ConfigError> {
        ConfigError::check_probability("StochasticDepthConfig", "prob", self.prob)
    }

    /// Builds the layer, or returns why the configuration is invalid.
    pub fn try_init(&self) -> Result<StochasticDepth, ConfigError> {
        self.validate()?;
        Ok(StochasticDepth {
            prob: self.prob,
            training: Param::from_bool(true),
        })
    }

    /// Builds the layer.
    ///
    /// # Panics
    /// If `prob` is not in `[0, 1)`.
    pub fn init(&self) -> StochasticDepth {
        self.try_init().unwrap_or_else(|error| panic!("{error}"))
    }
}

/// Drops a residual branch per sample during training, scaling the kept ones by
/// `1/(1-p)` so the expectation is unchanged; the identity in eval.
///
/// Like Burn's dropout, it is active only while the module is in training mode
/// and the tensors are on an autodiff device.
#[derive(Module, Debug)]
pub struct StochasticDepth {
    /// Probability of dropping a sample's branch.
    pub prob: f64,
    /// Training mode flag (`Module::valid()` turns it off).
    pub training: Param<Flag>,
}

impl StochasticDepth {
    /// Whether the next forward drops anything.
    pub fn is_active(&self, branch: &Tensor<3>) -> bool {
        self.prob > 0.0 && self.training.is_enabled() && branch.device().is_autodiff()
    }

    /// Applies stochastic depth to a residual branch's output.
    ///
    /// # Shapes
    /// - branch: `[batch, seq, d_model]`
    /// - output: `[batch, seq, d_model]`
    pub fn forward(&self, branch: Tensor<3>) -> Tensor<3> {
        if !self.is_active(&branch) {
            return branch;
        }
        let [batch, _, _] = branch.dims();
        let keep = 1.0 - self.prob;
        // One draw per sample: [batch, 1, 1] broadcast over positions and features.
        let mask = Tensor::<3>::random(
            [batch, 1, 1],
            Distribution::Bernoulli(keep),
            &branch.device(),
        );
        branch * mask / keep
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_utils::test_devices;

    #[test]
    fn drops_whole_samples_and_rescales_in_training() {
        for device in test_devices() {
            let device = device.autodiff();
            device.seed(11);
            let layer = StochasticDepthConfig::new().with_prob(0.5).init();
            let branch = Tensor::<3>::ones([64, 3, 4], &device);
            let output = layer.forward(branch).into_data().convert::<f32>();
            let values = output.try_to_vec::<f32>().unwrap();
            let mut dropped = 0;
            for sample in values.chunks(12) {
                // A sample is either entirely dropped or entirely kept and scaled by 2.
                assert!(
                    sample.iter().all(|v| *v == 0.0) || sample.iter().all(|v| *v == 2.0),
                    "{sample:?}"
                );
                dropped += (sample[0] == 0.0) as usize;
            }
            assert!(
                (10..=54).contains(&dropped),
                "dropped {dropped} of 64 samples"
            );
        }
    }

    #[test]
    fn identity_in_eval_and_without_autodiff() {
        let device = burn::tensor::Device::flex();
        let layer = StochasticDepthConfig::new().with_prob(0.9).init();
        let branch = Tensor::<3>::ones([8, 2, 2], &device);
        // Not an autodiff device: inference.
        assert_eq!(
            layer.forward(branch.clone()).sum().into_scalar::<f32>(),
            32.0
        );
        // Autodiff device but eval mode.
        let layer = layer.valid();
        let branch = branch.to_device(&device.clone().autodiff());
        assert_eq!(layer.forward(branch).sum().into_scalar::<f32>(), 32.0);
    }

    #[test]
    fn rejects_probability_one() {
        let error = StochasticDepthConfig::new()
            .with_prob(1.0)
            .try_init()
            .unwrap_err();
        assert!(matches!(error, ConfigError::Probability { .. }), "{error}");
    }
}
