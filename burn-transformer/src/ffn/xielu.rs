//! xIELU (Huang et al., 2024, [arXiv:2411.13010](https://arxiv.org/abs/2411.13010)), the
//! activation of Apertus' feed-forward: a learned mix of a quadratic for positive inputs
//! and an ELU-like curve for negative ones,
//!
//! ```text
//! x > 0:  α_p·x² + β·x
//! x ≤ 0:  α_n·(expm1(min(x, ε)) − x) + β·x
//! ```
//!
//! with `α_p = softplus(a_p)` and `α_n = β + softplus(a_n)`, where `a_p` and `a_n` are the
//! learned parameters (HF `act_fn.alpha_p`, `act_fn.alpha_n`, each of shape `[1]`), so
//! both stay positive and `α_n > β` whatever training does to them. transformers'
//! `XIELUActivation`, whose `beta` and `eps` are fixed buffers.

use burn::config::Config;
use burn::module::{Module, Param};
use burn::tensor::activation::softplus;
use burn::tensor::{Device, Tensor};

use crate::error::ConfigError;

const MODULE: &str = "XieluConfig";

/// Configuration of an [`Xielu`] activation.
#[derive(Config, Debug)]
pub struct XieluConfig {
    /// Initial `α_p`, the positive side's quadratic factor; must be positive.
    /// Default: 0.8.
    #[config(default = 0.8)]
    pub alpha_p: f64,
    /// Initial `α_n`, the negative side's factor; must exceed `beta`. Default: 0.8.
    #[config(default = 0.8)]
    pub alpha_n: f64,
    /// The linear term on both sides. Default: 0.5.
    #[config(default = 0.5)]
    pub beta: f64,
    /// The largest input of `expm1` (a small negative number keeps the negative side's
    /// derivative finite at 0). Default: -1e-6.
    #[config(default = -1e-6)]
    pub eps: f64,
}

impl XieluConfig {
    /// Checks the configuration.
    ///
    /// # Errors
    /// [`ConfigError::Invalid`] for an `alpha_p` that is not positive, an `alpha_n` not
    /// above `beta`, or a value that is not finite.
    pub fn validate(&self) -> Result<(), ConfigError> {
        ConfigError::check_positive_real(MODULE, "alpha_p", self.alpha_p)?;
        ConfigError::check_finite(MODULE, "beta", self.beta)?;
        ConfigError::check_finite(MODULE, "eps", self.eps)?;
        if !(self.alpha_n.is_finite() && self.alpha_n > self.beta) {
            return Err(ConfigError::Invalid {
                module: MODULE,
                field: "alpha_n",
                reason: format!(
                    "must be finite and above beta {}, got {}",
                    self.beta, self.alpha_n
                ),
            });
        }
        Ok(())
    }

    /// Validates the configuration and initializes the learned parameters at the
    /// configured `α_p` and `α_n`.
    ///
    /// # Errors
    /// See [`XieluConfig::validate`].
    pub fn try_init(&self, device: &Device) -> Result<Xielu, ConfigError> {
        self.validate()?;
        // softplus⁻¹(y) = ln(expm1(y)).
        let raw = |value: f64| {
            let value = value.exp_m1().ln() as f32;
            Param::from_tensor(Tensor::<1>::from_floats([value], device))
        };
        Ok(Xielu {
            alpha_p: raw(self.alpha_p),
            alpha_n: raw(self.alpha_n - self.beta),
            beta: self.beta,
            eps: self.eps,
        })
    }
}

crate::builders::init_or_panic!(XieluConfig => Xielu);

/// The xIELU activation with its learned parameters.
#[derive(Module, Debug)]
pub struct Xielu {
    /// `softplus⁻¹(α_p)`, `[1]` (HF `alpha_p`).
    pub alpha_p: Param<Tensor<1>>,
    /// `softplus⁻¹(α_n − β)`, `[1]` (HF `alpha_n`).
    pub alpha_n: Param<Tensor<1>>,
    /// The linear term (a fixed buffer in transformers).
    pub beta: f64,
    /// The largest input of `expm1` (a fixed buffer in transformers).
    pub eps: f64,
}

impl Xielu {
    /// Applies xIELU elementwise (see the module's documentation).
    ///
    /// # Shapes
    /// - x: any
    /// - output: the shape of `x`
    pub fn forward<const D: usize>(&self, x: Tensor<D>) -> Tensor<D> {
        let dtype = x.dtype();
        // [1, …, 1]: a factor broadcast over every element.
        let factor = |raw: &Param<Tensor<1>>| softplus(raw.val(), 1.0).cast(dtype).reshape([1; D]);
        let alpha_p = factor(&self.alpha_p);
        let alpha_n = factor(&self.alpha_n) + self.beta;
        xielu(x, alpha_p, alpha_n, self.beta, self.eps)
    }
}

/// xIELU with the factors of a fresh [`XieluConfig`] (what
/// [`Activation::Xielu`](super::Activation::Xielu) computes outside a layer that learns
/// them).
pub(super) fn xielu_at_initial_factors<const D: usize>(x: Tensor<D>) -> Tensor<D> {
    let config = XieluConfig::new();
    let factor = |value: f64| Tensor::<D>::full([1; D], value, &x.device()).cast(x.dtype());
    let (alpha_p, alpha_n) = (factor(config.alpha_p), factor(config.alpha_n));
    xielu(x, alpha_p, alpha_n, config.beta, config.eps)
}

/// The formula of the module's documentation, with `α_p` and `α_n` given.
///
/// # Shapes
/// - x: any
/// - alpha_p, alpha_n: `[1, …, 1]`
/// - output: the shape of `x`
fn xielu<const D: usize>(
    x: Tensor<D>,
    alpha_p: Tensor<D>,
    alpha_n: Tensor<D>,
    beta: f64,
    eps: f64,
) -> Tensor<D> {
    let linear = x.clone() * beta;
    let positive = x.clone().square() * alpha_p + linear.clone();
    let clipped = x.clone().clamp_max(eps);
    let negative = (expm1(clipped) - x.clone()) * alpha_n + linear;
    negative.mask_where(x.greater_elem(0.0), positive)
}

/// `eˣ − 1` without the cancellation of `exp(x) − 1` near 0 (Burn has no `expm1`):
/// below `|x| = 1/2` its Taylor series to `x⁸` (the next term is under 1e-8 of the
/// result), elsewhere `exp(x) − 1`, exact to f32's rounding there. A backend's `tanh` is
/// no way around it: lavapipe's cancels near 0 as `exp` does.
fn expm1<const D: usize>(x: Tensor<D>) -> Tensor<D> {
    // Horner's form of x + x²/2! + … + x⁸/8!.
    let series = (2..=8)
        .rev()
        .fold(x.ones_like(), |sum, n| sum * x.clone() / n as f64 + 1.0)
        * x.clone();
    let near_zero = x.clone().abs().lower_elem(0.5);
    (x.exp() - 1.0).mask_where(near_zero, series)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_utils::test_devices;

    /// The formula in f64 at a few points either side of 0 and around `eps`, with the
    /// parameters moved away from their initial values.
    #[test]
    fn matches_the_formula_on_both_sides() {
        let inputs = [
            -30.0f64, -3.0, -0.5, -1e-3, -2e-6, -1e-7, 0.0, 1e-7, 0.3, 2.0, 7.5,
        ];
        let (a_p, a_n, beta, eps) = (0.3f64, -0.7f64, 0.4f64, -1e-6f64);
        let softplus = |v: f64| v.exp().ln_1p();
        let want: Vec<f64> = inputs
            .iter()
            .map(|&x| {
                if x > 0.0 {
                    softplus(a_p) * x * x + beta * x
                } else {
                    (beta + softplus(a_n)) * (x.min(eps).exp_m1() - x) + beta * x
                }
            })
            .collect();
        for device in test_devices() {
            let mut xielu = XieluConfig::new()
                .with_beta(beta)
                .with_eps(eps)
                .init(&device);
            xielu.alpha_p = Param::from_tensor(Tensor::from_floats([a_p as f32], &device));
            xielu.alpha_n = Param::from_tensor(Tensor::from_floats([a_n as f32], &device));
            let x = Tensor::<1>::from_floats(inputs.map(|x| x as f32), &device);
            let got: Vec<f32> = xielu.forward(x).into_data().try_to_vec::<f32>().unwrap();
            for ((&x, &got), &want) in inputs.iter().zip(&got).zip(&want) {
                // Relative to f32's rounding (`exp(x) − 1` would be off by ~6e-8
                // absolute near 0, 7% of the value at -2e-6).
                let tolerance = 2e-6 * want.abs() + 1e-9;
                assert!(
                    (f64::from(got) - want).abs() <= tolerance,
                    "xIELU({x}) = {got}, want {want} on {device:?}"
                );
            }
        }
    }

    /// The initial parameters give the configured `α_p` and `α_n`.
    #[test]
    fn initial_parameters_are_the_configured_factors() {
        let device = Device::flex();
        let xielu = XieluConfig::new().with_alpha_p(1.5).init(&device);
        let x = Tensor::<1>::from_floats([2.0, -50.0], &device);
        let got: Vec<f32> = xielu.forward(x).into_data().try_to_vec::<f32>().unwrap();
        // x = 2: 1.5·4 + 0.5·2; x = -50: α_n·(−1 + 50) − 25 with α_n = 0.8.
        assert!((got[0] - 7.0).abs() < 1e-5, "{got:?}");
        assert!((got[1] - (0.8 * 49.0 - 25.0)).abs() < 1e-4, "{got:?}");
        let fresh = XieluConfig::new().init(&device);
        let x = Tensor::<2>::from_floats([[-2.0, -1e-7], [0.25, 3.0]], &device);
        let fixed = crate::ffn::Activation::Xielu.forward(x.clone());
        crate::test_utils::assert_close(fixed, fresh.forward(x), 1e-6, "initial factors");
        let error = XieluConfig::new().with_alpha_n(0.5).validate().unwrap_err();
        assert!(error.to_string().contains("alpha_n"), "{error}");
    }
}
