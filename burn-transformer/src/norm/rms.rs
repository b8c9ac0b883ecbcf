//! RMSNorm ([Zhang & Sennrich 2019](https://arxiv.org/abs/1910.07467)): scale each
//! vector by the inverse of its root mean square, then by a learned weight. No mean
//! subtraction, no bias. Equal to Hugging Face's `LlamaRMSNorm` (and, with
//! `unit_offset`, `GemmaRMSNorm`).
//!
//! The statistics are always computed in float32: for f16/bf16 inputs the sum of
//! squares would overflow or lose precision (f16 tops out at 65504, so a 4096-wide
//! vector of values around 4 already overflows).

use burn::config::Config;
use burn::module::{Module, Param};
use burn::nn::Initializer;
use burn::tensor::{DType, Device, Tensor};

use crate::error::ConfigError;
use crate::ops::rms_norm::fused_rms_norm;

const MODULE: &str = "RmsNormConfig";

/// Configuration of an [`RmsNorm`].
#[derive(Config, Debug)]
pub struct RmsNormConfig {
    /// Size of the normalized (last) axis.
    pub d_model: usize,
    /// Added to the mean square before the square root. Default: 1e-6 (LLaMA's
    /// `rms_norm_eps`).
    #[config(default = 1e-6)]
    pub eps: f64,
    /// Scale by `1 + weight` instead of `weight`, with the weight initialized to zeros
    /// (Gemma). Default: false.
    #[config(default = false)]
    pub unit_offset: bool,
    /// Whether to multiply by a learned scale (false: nanochat's RMSNorm, which has no
    /// parameters). Default: true.
    #[config(default = true)]
    pub scale: bool,
}

impl RmsNormConfig {
    /// Checks the configuration.
    ///
    /// # Errors
    /// [`ConfigError::Zero`] for a zero `d_model`; [`ConfigError::Invalid`] for an `eps`
    /// that is negative or not finite.
    pub fn validate(&self) -> Result<(), ConfigError> {
        ConfigError::check_positive(MODULE, "d_model", self.d_model)?;
        ConfigError::check_non_negative(MODULE, "eps", self.eps)
    }

    /// Validates the configuration and initializes the weight (ones, or zeros with
    /// `unit_offset`: the identity scale either way).
    ///
    /// # Errors
    /// See [`RmsNormConfig::validate`].
    pub fn try_init(&self, device: &Device) -> Result<RmsNorm, ConfigError> {
        self.validate()?;
        let initializer = if self.unit_offset {
            Initializer::Zeros
        } else {
            Initializer::Ones
        };
        Ok(RmsNorm {
            weight: self.scale.then(|| initializer.init([self.d_model], device)),
            eps: self.eps,
            unit_offset: self.unit_offset,
        })
    }
}

crate::builders::init_or_panic!(RmsNormConfig => RmsNorm);

/// Root-mean-square normalization over the last axis.
#[derive(Module, Debug)]
pub struct RmsNorm {
    /// The learned scale, `[d_model]` (HF `weight`); `None` for a norm without one.
    pub weight: Option<Param<Tensor<1>>>,
    /// Added to the mean square.
    pub eps: f64,
    /// Whether the scale is `1 + weight` (Gemma).
    pub unit_offset: bool,
}

impl RmsNorm {
    /// Normalizes the last axis.
    ///
    /// - default: `weight · (x_f32 / sqrt(mean(x_f32²) + eps)).to(dtype)`, as
    ///   `LlamaRMSNorm` (the product happens in the input's dtype);
    /// - `unit_offset`: `(x_f32 / sqrt(mean(x_f32²) + eps) · (1 + weight_f32)).to(dtype)`,
    ///   as `GemmaRMSNorm` (the product happens in float32);
    /// - without a scale: `(x_f32 / sqrt(mean(x_f32²) + eps)).to(dtype)`, as nanochat's.
    ///
    /// The output has the input's dtype.
    ///
    /// # Shapes
    /// - x: `[..., d_model]`
    /// - output: `[..., d_model]`
    ///
    /// # Panics
    /// If the last axis of `x` is not `d_model`.
    pub fn forward<const D: usize>(&self, x: Tensor<D>) -> Tensor<D> {
        let Some(weight) = &self.weight else {
            // nanochat's: `(x_f32 / sqrt(mean(x_f32²) + eps)).to(dtype)`.
            let dtype = x.dtype();
            return normalized(x.cast(DType::F32), self.eps).cast(dtype);
        };
        let [d_model] = weight.dims();
        assert_eq!(
            x.dims()[D - 1],
            d_model,
            "RmsNorm: input last axis {} differs from d_model {d_model}",
            x.dims()[D - 1]
        );
        // In f32 both forms are one fused op on flex.
        if let Some(normed) = fused_rms_norm(x.clone(), weight.val(), self.eps, self.unit_offset) {
            return normed;
        }
        let dtype = x.dtype();
        let normed = normalized(x.cast(DType::F32), self.eps);
        // [1, ..., 1, d_model]: the weight broadcast over the leading axes.
        let weight = weight.val().unsqueeze::<D>();
        if self.unit_offset {
            (normed * (weight.cast(DType::F32) + 1.0)).cast(dtype)
        } else {
            normed.cast(dtype) * weight.cast(dtype)
        }
    }
}

/// `x / sqrt(mean(x²) + eps)` over the last axis (a LayerNorm's after centring `x`).
pub(super) fn normalized<const D: usize>(x: Tensor<D>, eps: f64) -> Tensor<D> {
    // [..., 1]: one statistic per vector.
    let mean_square = x.clone().square().mean_dim(D - 1);
    x * (mean_square + eps).sqrt().recip()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_utils::{Fixture, assert_close, max_abs_diff, test_devices};
    use burn::tensor::TensorData;

    fn with_weight(config: RmsNormConfig, weight: Tensor<1>) -> RmsNorm {
        let mut norm = config.init(&weight.device());
        norm.weight = Some(Param::from_tensor(weight));
        norm
    }

    /// LLaMA's `LlamaRMSNorm` (scale by the weight) and Gemma's `GemmaRMSNorm` (scale
    /// by `1 + weight`).
    #[test]
    fn matches_llama_and_gemma_rms_norm() {
        for (name, unit_offset) in [("rms_norm", false), ("rms_norm_gemma", true)] {
            let fixture = Fixture::load(name);
            for device in test_devices() {
                let norm = with_weight(
                    RmsNormConfig::new(32)
                        .with_eps(fixture.scalar("eps") as f64)
                        .with_unit_offset(unit_offset),
                    fixture.tensor("weight", &device),
                );
                let y = norm.forward(fixture.tensor::<3>("x", &device));
                assert_close(y, fixture.tensor("y", &device), 1e-5, name);
            }
        }
    }

    /// Without a scale (nanochat's) the norm has no parameters and equals one whose
    /// weight is ones, in f32 and in f16.
    #[test]
    fn without_a_scale_it_is_the_bare_normalization() {
        for device in test_devices() {
            device.seed(29);
            let bare = RmsNormConfig::new(16).with_scale(false).init(&device);
            assert_eq!(bare.num_params(), 0);
            let ones = RmsNormConfig::new(16).init(&device);
            let x = Tensor::<3>::random([2, 3, 16], burn::tensor::Distribution::Default, &device);
            for dtype in [DType::F32, DType::F16] {
                let x = x.clone().cast(dtype);
                let (got, want) = (bare.forward(x.clone()), ones.forward(x.cast(DType::F32)));
                assert_eq!(got.dtype(), dtype);
                assert_close(got.cast(DType::F32), want, 2e-3, "without a scale");
            }
        }
    }

    #[test]
    fn f16_input_returns_f16_with_f32_statistics() {
        let fixture = Fixture::load("rms_norm");
        for device in test_devices() {
            let norm = with_weight(
                RmsNormConfig::new(32).with_eps(fixture.scalar("eps") as f64),
                fixture.tensor::<1>("f16.weight", &device).cast(DType::F16),
            );
            let x = fixture.tensor::<3>("f16.x", &device).cast(DType::F16);
            let y = norm.forward(x);
            assert_eq!(y.dtype(), DType::F16, "output dtype on {device:?}");
            // HF rounds the normalized value to f16, then multiplies in f16: one or two
            // f16 ulps (2^-10 relative) of |y| ≤ 8.
            assert_close(
                y.cast(DType::F32),
                fixture.tensor("f16.y", &device),
                8.0 * 2.0 * 2f32.powi(-10),
                "rms_norm f16",
            );
        }
    }

    #[test]
    fn statistics_do_not_overflow_in_f16() {
        for device in test_devices() {
            // Mean square 90000 overflows f16 (max 65504); in f32 it is exact.
            let values: Vec<f32> = (0..64usize)
                .map(|i| if i.is_multiple_of(2) { 300.0 } else { -300.0 })
                .collect();
            let x = Tensor::<2>::from_data(TensorData::new(values, [1, 64]), &device);
            let norm = RmsNormConfig::new(64).init(&device);
            let y = norm.forward(x.clone().cast(DType::F16)).cast(DType::F32);
            let expected = x / 300.0;
            let diff = max_abs_diff(y, expected);
            assert!(
                diff < 1e-3,
                "f16 statistics overflowed on {device:?}: {diff}"
            );
        }
    }

    #[test]
    fn invalid_configs_return_typed_errors() {
        assert_eq!(
            RmsNormConfig::new(0).validate(),
            Err(ConfigError::Zero {
                module: MODULE,
                field: "d_model"
            })
        );
        assert!(matches!(
            RmsNormConfig::new(4).with_eps(-1.0).validate(),
            Err(ConfigError::Invalid { field: "eps", .. })
        ));
    }

    #[test]
    #[should_panic(expected = "RmsNormConfig: `eps` is invalid: must be finite and non-negative")]
    fn init_panics_with_the_validation_message() {
        RmsNormConfig::new(4)
            .with_eps(f64::NAN)
            .init(&Device::flex());
    }
}
