//! The activations of feed-forward layers, named as Hugging Face's `hidden_act` /
//! `activation_function` values name them.

use burn::config::Config;
use burn::tensor::Tensor;
use burn::tensor::activation::{gelu, gelu_approximate, relu, silu};

use crate::device::backend_name;

/// A feed-forward activation.
#[derive(Config, Debug, Copy, PartialEq, Eq)]
pub enum Activation {
    /// Exact GELU, `x·Φ(x)` with the erf (`"gelu"`; BERT, BART, Whisper, GPT-NeoX).
    Gelu,
    /// Tanh approximation of GELU, `0.5x(1 + tanh(√(2/π)(x + 0.044715x³)))`
    /// (`"gelu_new"`, `"gelu_pytorch_tanh"`, `"gelu_fast"`; GPT-2, Gemma).
    GeluTanh,
    /// `max(0, x)` (`"relu"`; the original Transformer, T5, OPT).
    Relu,
    /// `x·σ(x)` (`"silu"`, `"swish"`; LLaMA's gate).
    Silu,
    /// `max(0, x)²` (`"relu2"`; Primer, Arcee's ungated feed-forward).
    Relu2,
    /// xIELU (`"xielu"`; Apertus), whose two factors are learned: the ungated
    /// [`DenseFfn`](super::DenseFfn) holds them ([`Xielu`](super::Xielu), HF `act_fn`);
    /// anywhere else this is xIELU at its initial factors, a fixed function.
    Xielu,
}

impl Activation {
    /// Applies the activation elementwise.
    ///
    /// # Shapes
    /// - x: any
    /// - output: the shape of `x`
    pub fn forward<const D: usize>(&self, x: Tensor<D>) -> Tensor<D> {
        match self {
            Self::Gelu => exact_gelu(x),
            Self::GeluTanh => gelu_approximate(x),
            Self::Relu => relu(x),
            Self::Silu => silu(x),
            Self::Relu2 => relu(x).powi_scalar(2),
            Self::Xielu => super::xielu::xielu_at_initial_factors(x),
        }
    }
}

/// `x·Φ(x) = x · (1 + erf(x/√2)) / 2`, with its exact derivative on every backend.
///
/// Burn's `gelu` op is exact forward, but the backward pass that Burn 0.22 gives every
/// backend without its own (ndarray, wgpu, cuda) differentiates the tanh approximation
/// instead, off by up to 2e-3 (flex's own backward is exact). Elsewhere the formula is
/// spelled out, so that autodiff differentiates the erf.
fn exact_gelu<const D: usize>(x: Tensor<D>) -> Tensor<D> {
    if backend_name(&x.device()) == "flex" {
        return gelu(x);
    }
    let phi = (x.clone() * std::f64::consts::FRAC_1_SQRT_2).erf() + 1.0;
    x * phi * 0.5
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_utils::{assert_close, model_test_devices};
    use burn::tensor::TensorData;

    /// Exact GELU and its derivative `Φ(x) + x·φ(x)` on every backend, against values
    /// computed here in f64 (the tanh approximation's derivative is off by ~1e-3 at
    /// x = ±1.5).
    #[test]
    fn exact_gelu_has_the_exact_gradient() {
        let xs = [-3.0f64, -1.5, -0.5, 0.0, 0.7, 1.5, 2.5];
        let pdf = |x: f64| (-x * x / 2.0).exp() / (2.0 * std::f64::consts::PI).sqrt();
        let cdf = |x: f64| 0.5 * (1.0 + erf_series(x / std::f64::consts::SQRT_2));
        let values: Vec<f32> = xs.iter().map(|&x| (x * cdf(x)) as f32).collect();
        let slopes: Vec<f32> = xs.iter().map(|&x| (cdf(x) + x * pdf(x)) as f32).collect();
        for device in model_test_devices() {
            let device = device.autodiff();
            let data = TensorData::new(xs.iter().map(|&x| x as f32).collect(), [xs.len()]);
            let x = Tensor::<1>::from_data(data, &device).require_grad();
            let y = Activation::Gelu.forward(x.clone());
            let expected =
                Tensor::<1>::from_data(TensorData::new(values.clone(), [xs.len()]), &device);
            assert_close(y.clone(), expected, 1e-5, "GELU");
            let grads = y.sum().backward();
            let slope = x.grad(&grads).unwrap();
            let expected =
                Tensor::<1>::from_data(TensorData::new(slopes.clone(), [xs.len()]), &device);
            assert_close(slope, expected, 1e-5, "GELU's derivative");
        }
    }

    /// The error function from its Taylor series (in f64, to far below f32's rounding
    /// for the |x| ≤ 2.2 used here).
    fn erf_series(x: f64) -> f64 {
        let mut term = x;
        let mut sum = x;
        for n in 1..60 {
            term *= -x * x / n as f64;
            sum += term / (2 * n + 1) as f64;
        }
        sum * 2.0 / std::f64::consts::PI.sqrt()
    }
}
