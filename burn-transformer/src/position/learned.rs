//! Learned absolute position embedding (BERT, GPT-2): one trained vector per position,
//! added to the token embeddings. Unlike sinusoidal or rotary positions it cannot go
//! beyond the positions it was trained for.

use burn::config::Config;
use burn::module::{Module, Param};
use burn::nn::Initializer;
use burn::tensor::{Device, Tensor};

use crate::error::ConfigError;

const MODULE: &str = "LearnedPositionConfig";

/// Configuration of a [`LearnedPosition`].
#[derive(Config, Debug)]
pub struct LearnedPositionConfig {
    /// Number of positions (GPT-2's `n_positions`, BERT's `max_position_embeddings`).
    pub max_position_embeddings: usize,
    /// Embedding size.
    pub d_model: usize,
    /// Initial values. Default: normal with std 0.02 (GPT-2, BERT).
    #[config(default = "Initializer::Normal { mean: 0.0, std: 0.02 }")]
    pub initializer: Initializer,
}

impl LearnedPositionConfig {
    /// Checks the configuration.
    ///
    /// # Errors
    /// [`ConfigError::Zero`] when a size is 0.
    pub fn validate(&self) -> Result<(), ConfigError> {
        ConfigError::check_positive(
            MODULE,
            "max_position_embeddings",
            self.max_position_embeddings,
        )?;
        ConfigError::check_positive(MODULE, "d_model", self.d_model)
    }

    /// Validates the configuration and initializes the embedding.
    ///
    /// # Errors
    /// See [`LearnedPositionConfig::validate`].
    pub fn try_init(&self, device: &Device) -> Result<LearnedPosition, ConfigError> {
        self.validate()?;
        Ok(LearnedPosition {
            weight: self
                .initializer
                .init([self.max_position_embeddings, self.d_model], device),
        })
    }
}

crate::builders::init_or_panic!(LearnedPositionConfig => LearnedPosition);

/// Learned absolute position embedding.
#[derive(Module, Debug)]
pub struct LearnedPosition {
    /// One row per position: `[max_position_embeddings, d_model]` (HF `wpe.weight`,
    /// `position_embeddings.weight`).
    pub weight: Param<Tensor<2>>,
}

impl LearnedPosition {
    /// The number of positions this embedding holds.
    pub fn max_position_embeddings(&self) -> usize {
        self.weight.dims()[0]
    }

    /// Adds the embeddings of positions `offset .. offset + seq` to `x` (the offset is
    /// the number of tokens already decoded).
    ///
    /// # Shapes
    /// - x: `[batch, seq, d_model]`
    /// - output: `[batch, seq, d_model]`
    ///
    /// # Panics
    /// If `offset + seq > max_position_embeddings` (a learned table has no rows for
    /// later positions: truncate the input or use a model with relative positions), or
    /// if the last axis of `x` is not `d_model`.
    pub fn forward(&self, x: Tensor<3>, offset: usize) -> Tensor<3> {
        let [_, seq, d_model] = x.dims();
        let [_, expected] = self.weight.dims();
        assert_eq!(
            d_model, expected,
            "LearnedPosition: input d_model {d_model} differs from the embedding's {expected}"
        );
        // [1, seq, d_model]: the same positions for every sequence of the batch.
        x + self.embedding(offset, seq).unsqueeze_dim(0)
    }

    /// The embeddings of positions `offset .. offset + seq`.
    ///
    /// # Shapes
    /// - output: `[seq, d_model]`
    ///
    /// # Panics
    /// If `offset + seq > max_position_embeddings`.
    pub fn embedding(&self, offset: usize, seq: usize) -> Tensor<2> {
        let max = self.max_position_embeddings();
        assert!(
            offset + seq <= max,
            "LearnedPosition: positions {offset}..{} exceed the {max} learned positions \
             (max_position_embeddings)",
            offset + seq
        );
        self.weight.val().narrow(0, offset, seq)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_utils::{assert_close, test_devices};
    use burn::tensor::TensorData;

    fn table(device: &Device) -> LearnedPosition {
        let values: Vec<f32> = (0..6 * 4).map(|v| v as f32).collect();
        LearnedPosition {
            weight: Param::from_tensor(Tensor::from_data(TensorData::new(values, [6, 4]), device)),
        }
    }

    #[test]
    fn adds_the_rows_at_the_offset() {
        for device in test_devices() {
            let module = table(&device);
            let x = Tensor::<3>::ones([2, 3, 4], &device);
            let y = module.forward(x, 2);
            // Rows 2, 3, 4 of the table are 8..20, plus one.
            let expected: Vec<f32> = (8..20).chain(8..20).map(|v| v as f32 + 1.0).collect();
            let expected = Tensor::<3>::from_data(TensorData::new(expected, [2, 3, 4]), &device);
            assert_close(y, expected, 0.0, "offset 2");
        }
    }

    #[test]
    fn default_init_has_the_configured_shape_and_is_trainable() {
        let module = LearnedPositionConfig::new(16, 8).init(&Device::flex());
        assert_eq!(module.weight.dims(), [16, 8]);
        assert_eq!(module.num_params(), 16 * 8);
        assert_eq!(module.max_position_embeddings(), 16);
    }

    #[test]
    #[should_panic(expected = "positions 4..7 exceed the 6 learned positions")]
    fn panics_beyond_the_learned_positions() {
        let device = Device::flex();
        table(&device).forward(Tensor::zeros([1, 3, 4], &device), 4);
    }

    #[test]
    fn invalid_configs_return_typed_errors() {
        assert_eq!(
            LearnedPositionConfig::new(0, 8).validate(),
            Err(ConfigError::Zero {
                module: MODULE,
                field: "max_position_embeddings"
            })
        );
    }

    #[test]
    #[should_panic(expected = "LearnedPositionConfig: `d_model` must be greater than 0")]
    fn init_panics_with_the_validation_message() {
        LearnedPositionConfig::new(8, 0).init(&Device::flex());
    }
}
