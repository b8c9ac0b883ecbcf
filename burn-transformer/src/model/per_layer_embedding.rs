//! Per-layer embeddings ("PLE", Gemma-4 E2B/E4B): one input per decoder layer, read
//! by that layer's per-layer branch ([`PerLayerInput`](crate::block::PerLayerInput)).
//! Each mixes what the token is (a row of a second embedding table holding every
//! layer's slice side by side, scaled by `√width`) with what the model's input
//! embedding says in context (projected to every layer's slice, scaled by
//! `1/√d_model` and normed slice by slice):
//!
//! ```text
//! inputs = (norm(projection(x) / √d_model) + embed_tokens(tokens) · √width) / √2
//! ```

use burn::config::Config;
use burn::module::{Initializer, Module};
use burn::nn::{Embedding, EmbeddingConfig, Linear, LinearConfig};
use burn::tensor::{Device, Int, Tensor};

use crate::error::ConfigError;
use crate::norm::{Norm, NormConfig};
use crate::ops::linear::linear_rows;

const MODULE: &str = "PerLayerEmbeddingConfig";

/// Configuration of a [`PerLayerEmbedding`].
#[derive(Config, Debug)]
pub struct PerLayerEmbeddingConfig {
    /// Number of token ids in the table (HF `vocab_size_per_layer_input`).
    pub vocab_size: usize,
    /// Width of the model's input embeddings (HF `hidden_size`).
    pub d_model: usize,
    /// Number of decoder layers, one input each.
    pub n_layers: usize,
    /// Width of one layer's input (HF `hidden_size_per_layer_input`).
    pub width: usize,
    /// The norm of each layer's projected slice (HF `per_layer_projection_norm`), of
    /// width `width`.
    pub norm: NormConfig,
    /// Initializer of the table and the projection. Default: normal, std 0.02.
    #[config(default = "Initializer::Normal { mean: 0.0, std: 0.02 }")]
    pub initializer: Initializer,
}

impl PerLayerEmbeddingConfig {
    /// Checks the configuration.
    ///
    /// # Errors
    /// [`ConfigError::Zero`] for a zero size; [`ConfigError::Invalid`] for a norm whose
    /// width is not `width`.
    pub fn validate(&self) -> Result<(), ConfigError> {
        ConfigError::check_positive(MODULE, "vocab_size", self.vocab_size)?;
        ConfigError::check_positive(MODULE, "d_model", self.d_model)?;
        ConfigError::check_positive(MODULE, "n_layers", self.n_layers)?;
        ConfigError::check_positive(MODULE, "width", self.width)?;
        self.norm.validate()?;
        if self.norm.d_model() != self.width {
            return Err(ConfigError::Invalid {
                module: MODULE,
                field: "norm.d_model",
                reason: format!(
                    "must equal width {}, got {}",
                    self.width,
                    self.norm.d_model()
                ),
            });
        }
        Ok(())
    }

    /// Builds the module, or returns why the configuration is invalid.
    ///
    /// # Errors
    /// See [`validate`](Self::validate).
    pub fn try_init(&self, device: &Device) -> Result<PerLayerEmbedding, ConfigError> {
        self.validate()?;
        let packed = self.n_layers * self.width;
        Ok(PerLayerEmbedding {
            embed_tokens: EmbeddingConfig::new(self.vocab_size, packed)
                .with_initializer(self.initializer.clone())
                .init(device),
            projection: LinearConfig::new(self.d_model, packed)
                .with_bias(false)
                .with_initializer(self.initializer.clone())
                .init(device),
            norm: self.norm.try_init(device)?,
            n_layers: self.n_layers,
            width: self.width,
        })
    }
}

crate::builders::init_or_panic!(PerLayerEmbeddingConfig => PerLayerEmbedding);

/// The inputs of every layer's per-layer branch (HF `embed_tokens_per_layer`,
/// `per_layer_model_projection`, `per_layer_projection_norm`).
#[derive(Module, Debug)]
pub struct PerLayerEmbedding {
    /// `[vocab_size, n_layers · width]`: each token's slice for every layer, first
    /// layer first.
    pub embed_tokens: Embedding,
    /// `[d_model] -> [n_layers · width]`
    pub projection: Linear,
    /// The norm of each layer's projected slice.
    pub norm: Norm,
    #[module(skip)]
    n_layers: usize,
    #[module(skip)]
    width: usize,
}

impl PerLayerEmbedding {
    /// Every layer's input.
    ///
    /// # Shapes
    /// - tokens: `[batch, seq]`, each below the table's `vocab_size`
    /// - embeddings: `[batch, seq, d_model]`, the model's input embeddings of `tokens`
    /// - output: `[batch, seq, n_layers, width]`
    pub fn forward(&self, tokens: Tensor<2, Int>, embeddings: Tensor<3>) -> Tensor<4> {
        let [batch, seq, d_model] = embeddings.dims();
        let shape = [batch, seq, self.n_layers, self.width];
        let identity =
            self.embed_tokens.forward(tokens).reshape(shape) * (self.width as f64).sqrt();
        let context =
            (linear_rows(&self.projection, embeddings) / (d_model as f64).sqrt()).reshape(shape);
        (self.norm.forward(context) + identity) * std::f64::consts::FRAC_1_SQRT_2
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_utils::{assert_close, test_devices};
    use burn::tensor::Distribution;

    /// Each layer's input is its slice of the formula, computed layer by layer with
    /// plain tensor ops.
    #[test]
    fn each_layer_reads_its_own_slice() {
        for device in test_devices() {
            device.seed(5);
            let (d_model, layers, width) = (6, 3, 2);
            let module =
                PerLayerEmbeddingConfig::new(10, d_model, layers, width, NormConfig::rms(width))
                    .init(&device);
            let tokens = Tensor::<2, Int>::from_data([[1, 9, 4], [0, 3, 3]], &device);
            let x = Tensor::<3>::random([2, 3, d_model], Distribution::Normal(0.0, 1.0), &device);
            let inputs = module.forward(tokens.clone(), x.clone());
            assert_eq!(inputs.dims(), [2, 3, layers, width]);
            let table = module.embed_tokens.weight.val();
            let projection = module.projection.weight.val();
            for layer in 0..layers {
                let columns = layer * width..(layer + 1) * width;
                let rows = table
                    .clone()
                    .slice([0..10, columns.clone()])
                    .select(0, tokens.clone().flatten::<1>(0, 1))
                    .reshape([2, 3, width]);
                let context = x.clone().matmul(
                    projection
                        .clone()
                        .slice([0..d_model, columns])
                        .unsqueeze::<3>(),
                ) / (d_model as f64).sqrt();
                let normed = context.clone() / (context.powi_scalar(2).mean_dim(2) + 1e-6).sqrt();
                let expected = (normed + rows * (width as f64).sqrt()) / 2f64.sqrt();
                let actual = inputs.clone().narrow(2, layer, 1).squeeze_dim::<3>(2);
                assert_close(actual, expected, 1e-5, "per-layer input");
            }
        }
    }
}
