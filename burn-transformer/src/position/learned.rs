//! Learned absolute position embedding (BERT, GPT-2): one trained vector per position,
//! added to the token embeddings. Unlike sinusoidal or rotary positions it cannot go
//! beyond the positions it was trained for.
//!
//! Absolute positions make left padding visible: a prompt padded on the left would
//! start at position 3 instead of 0. Positions therefore count a row's real tokens
//! only ([`LearnedPosition::forward_padded`]), as transformers numbers them in
//! generation (`attention_mask.cumsum(-1) - 1`), so that a padded prompt is embedded
//! as it is alone.

use burn::config::Config;
use burn::module::{Module, Param};
use burn::nn::Initializer;
use burn::tensor::{Bool, Device, Int, Tensor};

use crate::error::ConfigError;

const MODULE: &str = "LearnedPositionConfig";

/// Configuration of a [`LearnedPosition`].
#[derive(Config, Debug)]
pub struct LearnedPositionConfig {
    /// Number of positions (GPT-2's `n_positions`, BERT's `max_position_embeddings`).
    pub max_position_embeddings: usize,
    /// Embedding size.
    pub d_model: usize,
    /// Rows of the table before position 0, never read (OPT keeps 2: position `p`
    /// reads row `p + 2`). Default: 0.
    #[config(default = 0)]
    pub reserved_rows: usize,
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
            weight: self.initializer.init(
                [
                    self.reserved_rows + self.max_position_embeddings,
                    self.d_model,
                ],
                device,
            ),
            reserved_rows: self.reserved_rows,
        })
    }
}

crate::builders::init_or_panic!(LearnedPositionConfig => LearnedPosition);

/// Learned absolute position embedding.
#[derive(Module, Debug)]
pub struct LearnedPosition {
    /// One row per position, after the reserved rows: `[reserved_rows +
    /// max_position_embeddings, d_model]` (HF `wpe.weight`, `position_embeddings.weight`,
    /// OPT's `embed_positions.weight`).
    pub weight: Param<Tensor<2>>,
    #[module(skip)]
    reserved_rows: usize,
}

impl LearnedPosition {
    /// The number of positions this embedding holds.
    pub fn max_position_embeddings(&self) -> usize {
        self.weight.dims()[0] - self.reserved_rows
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

    /// Adds the embedding of each token's position, counting only real tokens: a
    /// padded position takes no number, so the tokens after it keep those they would
    /// have without it (padded positions themselves get position 0; nothing attends to
    /// them). Without padding this is [`forward`](Self::forward).
    ///
    /// `offset` positions were seen before (the decoding cache's length), `padded_before`
    /// of them padding in each row.
    ///
    /// # Shapes
    /// - x: `[batch, seq, d_model]`
    /// - padded_before: `[batch]`
    /// - key_padding: `[batch, seq]`, `true` for padding
    /// - output: `[batch, seq, d_model]`
    ///
    /// # Panics
    /// As [`forward`](Self::forward): if `offset + seq > max_position_embeddings`.
    pub fn forward_padded(
        &self,
        x: Tensor<3>,
        offset: usize,
        padded_before: Option<Tensor<1, Int>>,
        key_padding: Option<Tensor<2, Bool>>,
    ) -> Tensor<3> {
        if padded_before.is_none() && key_padding.is_none() {
            return self.forward(x, offset);
        }
        let [batch, seq, d_model] = x.dims();
        // Checks the range: no position exceeds offset + seq − 1.
        let table = self.embedding(0, offset + seq);
        let device = x.device();
        // [batch, seq]: the absolute index, less the padding up to and including it.
        let mut positions = Tensor::<1, Int>::arange(offset as i64..(offset + seq) as i64, &device)
            .unsqueeze_dim::<2>(0)
            .expand([batch, seq]);
        if let Some(padding) = key_padding {
            positions = positions - padding.int().cumsum(1);
        }
        if let Some(before) = padded_before {
            positions = positions - before.unsqueeze_dim::<2>(1).expand([batch, seq]);
        }
        let positions = positions.clamp_min(0).reshape([batch * seq]);
        // [batch, seq, d_model]
        let embedded = table.select(0, positions).reshape([batch, seq, d_model]);
        x + embedded
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
        self.weight
            .val()
            .narrow(0, self.reserved_rows + offset, seq)
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
            reserved_rows: 0,
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

    /// Padded positions take no number: each row's real tokens are embedded at the
    /// positions they have alone, through a cache as in one pass.
    #[test]
    fn padding_takes_no_position() {
        for device in test_devices() {
            let module = table(&device);
            let x = Tensor::<3>::zeros([2, 3, 4], &device);
            let padding = Tensor::<2, Bool>::from_data(
                TensorData::new(vec![true, true, false, false, false, false], [2, 3]),
                &device,
            );
            // Row 0: two pads (position 0), then its first token at position 0; row 1
            // unpadded at positions 0, 1, 2.
            let rows = |positions: &[usize]| -> Vec<f32> {
                positions
                    .iter()
                    .flat_map(|&p| (4 * p..4 * p + 4).map(|v| v as f32))
                    .collect()
            };
            let expected = [rows(&[0, 0, 0]), rows(&[0, 1, 2])].concat();
            let expected = Tensor::<3>::from_data(TensorData::new(expected, [2, 3, 4]), &device);
            let y = module.forward_padded(x.clone(), 0, None, Some(padding));
            assert_close(y, expected, 0.0, "left padding");

            // Two more tokens after 3 seen, of which row 0 had 2 padded: row 0 is at
            // positions 1, 2, row 1 at 3, 4.
            let before = Tensor::<1, Int>::from_data(TensorData::new(vec![2i64, 0], [2]), &device);
            let y = module.forward_padded(x.narrow(1, 0, 2), 3, Some(before), None);
            let expected = [rows(&[1, 2]), rows(&[3, 4])].concat();
            let expected = Tensor::<3>::from_data(TensorData::new(expected, [2, 2, 4]), &device);
            assert_close(y, expected, 0.0, "after padding");
        }
    }

    /// Reserved rows are skipped: position 0 reads the row after them.
    #[test]
    fn reserved_rows_come_before_position_0() {
        let device = Device::flex();
        let mut module = table(&device);
        module.reserved_rows = 2;
        assert_eq!(module.max_position_embeddings(), 4);
        let y = module.forward(Tensor::zeros([1, 2, 4], &device), 1);
        // Positions 1 and 2 are rows 3 and 4: 12..20.
        let expected: Vec<f32> = (12..20).map(|v| v as f32).collect();
        let expected = Tensor::<3>::from_data(TensorData::new(expected, [1, 2, 4]), &device);
        assert_close(y, expected, 0.0, "reserved rows");
        let config = LearnedPositionConfig::new(16, 8).with_reserved_rows(2);
        assert_eq!(config.init(&device).weight.dims(), [18, 8]);
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
