//! A norm with weights of its own for each head: every head's vector is normalized
//! over its width, then scaled (and shifted) by that head's row of a `[heads, width]`
//! weight. Command R+'s QK-norm (`CohereLayerNorm` over `(heads, head_dim)`) and
//! StableLM-2-12B's (`StableLmLayerNormPerHead`, one `nn.LayerNorm` per head) are this
//! norm, centered as a LayerNorm.
//!
//! The statistics and the scaling are computed in float32 for half-precision inputs,
//! as `CohereLayerNorm` does.

use burn::config::Config;
use burn::module::{Module, Param};
use burn::nn::Initializer;
use burn::tensor::{DType, Device, Tensor};

use super::rms::normalized;
use crate::error::ConfigError;

const MODULE: &str = "PerHeadNormConfig";

/// Configuration of a [`PerHeadNorm`].
#[derive(Config, Debug)]
pub struct PerHeadNormConfig {
    /// Number of heads, each with its own weights.
    pub n_heads: usize,
    /// Width of each head's vector (the normalized axis).
    pub head_dim: usize,
    /// Added to the variance (or mean square) before the square root. Default: 1e-5.
    #[config(default = 1e-5)]
    pub eps: f64,
    /// Subtract each vector's mean first (LayerNorm); false: RMSNorm. Default: true.
    #[config(default = true)]
    pub centered: bool,
    /// Whether to add a learned shift per head. Default: false.
    #[config(default = false)]
    pub bias: bool,
    /// Scale by `1 + weight` instead of `weight` (the weight then starts at zeros).
    /// Default: false.
    #[config(default = false)]
    pub unit_offset: bool,
}

impl PerHeadNormConfig {
    /// Checks the configuration.
    ///
    /// # Errors
    /// [`ConfigError::Zero`] for zero heads or width; [`ConfigError::Invalid`] for an
    /// `eps` that is negative or not finite.
    pub fn validate(&self) -> Result<(), ConfigError> {
        ConfigError::check_positive(MODULE, "n_heads", self.n_heads)?;
        ConfigError::check_positive(MODULE, "head_dim", self.head_dim)?;
        ConfigError::check_non_negative(MODULE, "eps", self.eps)
    }

    /// Validates the configuration and initializes the weight (the identity scale) and
    /// the bias (zeros), if any.
    ///
    /// # Errors
    /// See [`PerHeadNormConfig::validate`].
    pub fn try_init(&self, device: &Device) -> Result<PerHeadNorm, ConfigError> {
        self.validate()?;
        let shape = [self.n_heads, self.head_dim];
        let scale = if self.unit_offset {
            Initializer::Zeros
        } else {
            Initializer::Ones
        };
        Ok(PerHeadNorm {
            weight: scale.init(shape, device),
            bias: self.bias.then(|| Initializer::Zeros.init(shape, device)),
            eps: self.eps,
            centered: self.centered,
            unit_offset: self.unit_offset,
        })
    }
}

crate::builders::init_or_panic!(PerHeadNormConfig => PerHeadNorm);

/// Normalization of each head's vector with that head's own weights.
#[derive(Module, Debug)]
pub struct PerHeadNorm {
    /// The learned scale, `[n_heads, head_dim]` (HF `weight`).
    pub weight: Param<Tensor<2>>,
    /// The learned shift, `[n_heads, head_dim]`, if any.
    pub bias: Option<Param<Tensor<2>>>,
    /// Added to the variance (or mean square).
    pub eps: f64,
    /// Whether each vector's mean is subtracted first (LayerNorm).
    #[module(skip)]
    pub centered: bool,
    /// Whether the scale is `1 + weight`.
    #[module(skip)]
    pub unit_offset: bool,
}

impl PerHeadNorm {
    /// `(x − mean) / sqrt(var + eps) · weight[h] + bias[h]` for the vectors of head `h`
    /// (without centering: `x / sqrt(mean(x²) + eps) · weight[h]`), in float32; the
    /// output has the input's dtype.
    ///
    /// # Shapes
    /// - x: `[batch, n_heads, ..., head_dim]` (heads on the second axis)
    /// - output: the same
    ///
    /// # Panics
    /// If the second or last axis of `x` differs from the weight's.
    pub fn forward<const D: usize>(&self, x: Tensor<D>) -> Tensor<D> {
        let [n_heads, head_dim] = self.weight.dims();
        let dims = x.dims();
        assert!(
            D >= 3 && dims[1] == n_heads && dims[D - 1] == head_dim,
            "PerHeadNorm: input {dims:?} is not [batch, {n_heads} heads, ..., {head_dim}]"
        );
        // [1, n_heads, 1, ..., head_dim]: each head's row broadcast over its vectors.
        let mut shape = [1; D];
        shape[1] = n_heads;
        shape[D - 1] = head_dim;
        let per_head = |param: &Param<Tensor<2>>| param.val().cast(DType::F32).reshape(shape);

        let dtype = x.dtype();
        let x = x.cast(DType::F32);
        let x = if self.centered {
            let mean = x.clone().mean_dim(D - 1);
            x - mean
        } else {
            x
        };
        // The biased variance of a centered vector is its mean square.
        let normed = normalized(x, self.eps);
        let scale = match self.unit_offset {
            true => per_head(&self.weight) + 1.0,
            false => per_head(&self.weight),
        };
        let scaled = normed * scale;
        let shifted = match &self.bias {
            Some(bias) => scaled + per_head(bias),
            None => scaled,
        };
        shifted.cast(dtype)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::norm::{LayerNormConfig, RmsNormConfig};
    use crate::test_utils::{assert_close, test_devices};
    use burn::tensor::Distribution;

    /// Each head normalized by its own weights equals a plain LayerNorm (or RMSNorm)
    /// holding that head's row, applied to that head alone: the definition of
    /// `StableLmLayerNormPerHead`.
    #[test]
    fn each_head_is_normalized_with_its_own_weights() {
        for device in test_devices() {
            device.seed(17);
            let [batch, heads, seq, width] = [2, 3, 5, 8];
            let x = Tensor::<4>::random(
                [batch, heads, seq, width],
                Distribution::Normal(0.5, 2.0),
                &device,
            );
            let weight = Tensor::<2>::random([heads, width], Distribution::Default, &device);
            let bias = Tensor::<2>::random([heads, width], Distribution::Default, &device);
            for (centered, with_bias, unit_offset) in [
                (true, false, false),
                (true, true, true),
                (false, false, false),
            ] {
                let mut norm = PerHeadNormConfig::new(heads, width)
                    .with_centered(centered)
                    .with_bias(with_bias)
                    .with_unit_offset(unit_offset)
                    .with_eps(1e-3)
                    .init(&device);
                norm.weight = Param::from_tensor(weight.clone());
                if with_bias {
                    norm.bias = Some(Param::from_tensor(bias.clone()));
                }
                let got = norm.forward(x.clone());
                for head in 0..heads {
                    let row = |t: &Tensor<2>| t.clone().narrow(0, head, 1).reshape([width]);
                    let scale = if unit_offset {
                        row(&weight) + 1.0
                    } else {
                        row(&weight)
                    };
                    let x_head = x.clone().narrow(1, head, 1);
                    let want = if centered {
                        let mut plain = LayerNormConfig::new(width)
                            .with_bias(with_bias)
                            .with_eps(1e-3)
                            .init(&device);
                        plain.weight = Some(Param::from_tensor(scale));
                        plain.bias = with_bias.then(|| Param::from_tensor(row(&bias)));
                        plain.forward(x_head)
                    } else {
                        let mut plain = RmsNormConfig::new(width).with_eps(1e-3).init(&device);
                        plain.weight = Some(Param::from_tensor(scale));
                        plain.forward(x_head)
                    };
                    let case = format!("centered {centered}, bias {with_bias}, head {head}");
                    assert_close(got.clone().narrow(1, head, 1), want, 1e-5, &case);
                }
            }
        }
    }

    #[test]
    fn a_zero_width_or_negative_eps_is_refused_by_name() {
        let error = PerHeadNormConfig::new(4, 0).validate().unwrap_err();
        assert!(error.to_string().contains("head_dim"), "{error}");
        let error = PerHeadNormConfig::new(4, 8)
            .with_eps(-1.0)
            .validate()
            .unwrap_err();
        assert!(error.to_string().contains("eps"), "{error}");
    }
}
