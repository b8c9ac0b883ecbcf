//! LayerNorm ([Ba et al. 2016](https://arxiv.org/abs/1607.06450)): normalize each vector
//! to zero mean and unit variance, then scale and (optionally) shift. Equal to
//! `torch.nn.LayerNorm` over the last axis, with its parameter names (`weight`, `bias`),
//! so Hugging Face checkpoints load by name. With `unit_offset` the scale is
//! `1 + weight` (Nemotron's `LayerNorm1P`); without `scale` and `bias` it has no
//! parameters (OLMo's).
//!
//! The statistics are computed in float32 for half-precision inputs, like [`RmsNorm`]'s.
//!
//! [`RmsNorm`]: super::RmsNorm

use burn::config::Config;
use burn::module::{Module, Param};
use burn::nn::Initializer;
use burn::tensor::module::layer_norm;
use burn::tensor::{DType, Device, Tensor};

use crate::error::ConfigError;

const MODULE: &str = "LayerNormConfig";

/// Configuration of a [`LayerNorm`].
#[derive(Config, Debug)]
pub struct LayerNormConfig {
    /// Size of the normalized (last) axis.
    pub d_model: usize,
    /// Added to the variance before the square root. Default: 1e-5 (PyTorch).
    #[config(default = 1e-5)]
    pub eps: f64,
    /// Whether to multiply by a learned scale (false: OLMo's LayerNorm, which has
    /// none). Default: true.
    #[config(default = true)]
    pub scale: bool,
    /// Whether to add a learned shift. Default: true.
    #[config(default = true)]
    pub bias: bool,
    /// Scale by `1 + weight` instead of `weight` (Nemotron's `LayerNorm1P`), the weight
    /// then starting at zeros. Default: false.
    #[config(default = false)]
    pub unit_offset: bool,
}

impl LayerNormConfig {
    /// Checks the configuration.
    ///
    /// # Errors
    /// [`ConfigError::Zero`] for a zero `d_model`; [`ConfigError::Invalid`] for an `eps`
    /// that is negative or not finite.
    pub fn validate(&self) -> Result<(), ConfigError> {
        ConfigError::check_positive(MODULE, "d_model", self.d_model)?;
        ConfigError::check_non_negative(MODULE, "eps", self.eps)
    }

    /// Validates the configuration and initializes weight (ones; zeros with
    /// `unit_offset`: the identity scale either way) and bias (zeros), each if any.
    ///
    /// # Errors
    /// See [`LayerNormConfig::validate`].
    pub fn try_init(&self, device: &Device) -> Result<LayerNorm, ConfigError> {
        self.validate()?;
        let scale = if self.unit_offset {
            Initializer::Zeros
        } else {
            Initializer::Ones
        };
        Ok(LayerNorm {
            weight: self.scale.then(|| scale.init([self.d_model], device)),
            bias: self
                .bias
                .then(|| Initializer::Zeros.init([self.d_model], device)),
            eps: self.eps,
            unit_offset: self.unit_offset,
        })
    }
}

crate::builders::init_or_panic!(LayerNormConfig => LayerNorm);

/// Layer normalization over the last axis.
#[derive(Module, Debug)]
pub struct LayerNorm {
    /// The learned scale, `[d_model]` (HF `weight`), if any.
    pub weight: Option<Param<Tensor<1>>>,
    /// The learned shift, `[d_model]` (HF `bias`), if any.
    pub bias: Option<Param<Tensor<1>>>,
    /// Added to the variance.
    pub eps: f64,
    /// Whether the scale is `1 + weight` (Nemotron). Set by the configuration, not
    /// saved with the weights.
    #[module(skip)]
    pub unit_offset: bool,
}

impl LayerNorm {
    /// `(x − mean) / sqrt(var + eps) · weight + bias` (`1 + weight` with `unit_offset`;
    /// a missing weight or bias is 1 or 0), with the biased variance over the last
    /// axis. The output has the input's dtype.
    ///
    /// # Shapes
    /// - x: `[..., d_model]`
    /// - output: `[..., d_model]`
    ///
    /// # Panics
    /// If the last axis of `x` is not the weight's `d_model`.
    pub fn forward<const D: usize>(&self, x: Tensor<D>) -> Tensor<D> {
        let d_model = x.dims()[D - 1];
        if let Some(weight) = &self.weight {
            let [width] = weight.dims();
            assert_eq!(
                d_model, width,
                "LayerNorm: input last axis {d_model} differs from d_model {width}"
            );
        }
        let dtype = x.dtype();
        let weight = match (&self.weight, self.unit_offset) {
            (Some(weight), true) => weight.val() + 1.0,
            (Some(weight), false) => weight.val(),
            // Burn's op takes a scale: ones on the input's device, in its float type.
            (None, _) => Tensor::<1>::ones([d_model], &x.device()).cast(dtype),
        };
        let bias = self.bias.as_ref().map(|bias| bias.val());
        if matches!(dtype, DType::F16 | DType::BF16) {
            // Burn's layer_norm op takes one dtype: widen everything, narrow the result.
            layer_norm(
                x.cast(DType::F32),
                weight.cast(DType::F32),
                bias.map(|bias| bias.cast(DType::F32)),
                self.eps,
            )
            .cast(dtype)
        } else {
            layer_norm(x, weight, bias, self.eps)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_utils::{Fixture, assert_close, test_devices};

    #[test]
    fn matches_torch_layer_norm_with_and_without_bias() {
        let fixture = Fixture::load("layer_norm");
        for device in test_devices() {
            for (bias, prefix) in [(true, "bias"), (false, "no_bias")] {
                let mut norm = LayerNormConfig::new(24).with_bias(bias).init(&device);
                norm.weight = Some(Param::from_tensor(
                    fixture.tensor(&format!("{prefix}.weight"), &device),
                ));
                if bias {
                    norm.bias = Some(Param::from_tensor(
                        fixture.tensor(&format!("{prefix}.bias"), &device),
                    ));
                }
                assert_eq!(norm.bias.is_some(), bias);
                let y = norm.forward(fixture.tensor::<3>("x", &device));
                assert_close(
                    y,
                    fixture.tensor(&format!("{prefix}.y"), &device),
                    1e-5,
                    &format!("layer_norm {prefix}"),
                );
            }
        }
    }

    /// With `unit_offset` the scale is `1 + weight`: the same as a plain LayerNorm
    /// holding `1 + weight`.
    #[test]
    fn unit_offset_scales_by_one_plus_the_weight() {
        for device in test_devices() {
            device.seed(5);
            let x = Tensor::<3>::random([2, 3, 8], burn::tensor::Distribution::Default, &device);
            let mut offset = LayerNormConfig::new(8).with_unit_offset(true).init(&device);
            let mut plain = LayerNormConfig::new(8).init(&device);
            assert_eq!(
                offset
                    .weight
                    .as_ref()
                    .unwrap()
                    .val()
                    .into_data()
                    .try_to_vec::<f32>()
                    .unwrap(),
                [0.0; 8]
            );
            let weight = Tensor::<1>::random([8], burn::tensor::Distribution::Default, &device);
            let bias = Tensor::<1>::random([8], burn::tensor::Distribution::Default, &device);
            offset.weight = Some(Param::from_tensor(weight.clone()));
            offset.bias = Some(Param::from_tensor(bias.clone()));
            plain.weight = Some(Param::from_tensor(weight + 1.0));
            plain.bias = Some(Param::from_tensor(bias));
            assert_close(
                offset.forward(x.clone()),
                plain.forward(x),
                1e-6,
                "1 + weight",
            );
        }
    }

    /// Without scale and shift (OLMo's) it has no parameters and only standardizes.
    #[test]
    fn without_parameters_it_standardizes() {
        for device in test_devices() {
            device.seed(6);
            let norm = LayerNormConfig::new(8)
                .with_scale(false)
                .with_bias(false)
                .init(&device);
            assert_eq!(norm.num_params(), 0);
            let x = Tensor::<3>::random([2, 3, 8], burn::tensor::Distribution::Default, &device);
            let centred = x.clone() - x.clone().mean_dim(2);
            let variance = centred.clone().square().mean_dim(2);
            let expected = centred / (variance + 1e-5).sqrt();
            assert_close(norm.forward(x), expected, 1e-5, "standardized");
        }
    }

    #[test]
    fn f16_input_returns_f16() {
        let fixture = Fixture::load("layer_norm");
        for device in test_devices() {
            let mut norm = LayerNormConfig::new(24).init(&device);
            norm.weight = Some(Param::from_tensor(fixture.tensor("bias.weight", &device)));
            norm.bias = Some(Param::from_tensor(fixture.tensor("bias.bias", &device)));
            let x = fixture.tensor::<3>("x", &device);
            let y = norm.forward(x.cast(DType::F16));
            assert_eq!(y.dtype(), DType::F16);
            // f16 rounding of the input and output: a few 2^-11 relative steps of |y| < 8.
            assert_close(
                y.cast(DType::F32),
                fixture.tensor("bias.y", &device),
                1e-2,
                "f16",
            );
        }
    }

    #[test]
    fn invalid_configs_return_typed_errors() {
        assert_eq!(
            LayerNormConfig::new(0).validate(),
            Err(ConfigError::Zero {
                module: MODULE,
                field: "d_model"
            })
        );
    }

    #[test]
    #[should_panic(expected = "LayerNormConfig: `d_model` must be greater than 0")]
    fn init_panics_with_the_validation_message() {
        LayerNormConfig::new(0).init(&Device::flex());
    }
}
