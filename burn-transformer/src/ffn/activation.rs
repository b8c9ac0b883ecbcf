//! The activations of feed-forward layers, named as Hugging Face's `hidden_act` /
//! `activation_function` values name them.

use burn::config::Config;
use burn::tensor::Tensor;
use burn::tensor::activation::{gelu, gelu_approximate, relu, silu};

use crate::error::ConfigError;

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
        }
    }

    /// Reads a Hugging Face activation name (`hidden_act`, `activation_function`).
    ///
    /// # Errors
    /// [`ConfigError::Invalid`] for a name this crate does not implement.
    pub fn from_hf_name(name: &str) -> Result<Self, ConfigError> {
        match name {
            "gelu" => Ok(Self::Gelu),
            "gelu_new" | "gelu_pytorch_tanh" | "gelu_fast" | "gelu_python_tanh" => {
                Ok(Self::GeluTanh)
            }
            "relu" => Ok(Self::Relu),
            "silu" | "swish" => Ok(Self::Silu),
            other => Err(ConfigError::Invalid {
                module: "Activation",
                field: "hidden_act",
                reason: format!(
                    "unsupported activation \"{other}\" (expected gelu, gelu_new, \
                     gelu_pytorch_tanh, gelu_fast, relu, silu or swish)"
                ),
            }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_hugging_face_names() {
        assert_eq!(Activation::from_hf_name("gelu"), Ok(Activation::Gelu));
        assert_eq!(
            Activation::from_hf_name("gelu_pytorch_tanh"),
            Ok(Activation::GeluTanh)
        );
        assert_eq!(Activation::from_hf_name("swish"), Ok(Activation::Silu));
        assert!(matches!(
            Activation::from_hf_name("quick_gelu"),
            Err(ConfigError::Invalid {
                field: "hidden_act",
                ..
            })
        ));
    }
}
