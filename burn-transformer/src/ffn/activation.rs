//! The activations of feed-forward layers, named as Hugging Face's `hidden_act` /
//! `activation_function` values name them.

use burn::config::Config;
use burn::tensor::Tensor;
use burn::tensor::activation::{gelu, gelu_approximate, relu, silu};

/// A feed-forward activation.
#[derive(Config, Debug, Copy, PartialEq, Eq)]
pub enum Activation {
    /// Exact GELU, `x·Φ(x)` with the erf (`"gelu"`; BERT, BART, Whisper).
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
}

impl Activation {
    /// Applies the activation elementwise.
    ///
    /// # Shapes
    /// - x: any
    /// - output: the shape of `x`
    pub fn forward<const D: usize>(&self, x: Tensor<D>) -> Tensor<D> {
        match self {
            Self::Gelu => gelu(x),
            Self::GeluTanh => gelu_approximate(x),
            Self::Relu => relu(x),
            Self::Silu => silu(x),
            Self::Relu2 => relu(x).powi_scalar(2),
        }
    }
}
