//! Sinusoidal absolute position encoding ("Attention Is All You Need",
//! [Vaswani et al. 2017](https://arxiv.org/abs/1706.03762)), added to token embeddings.
//!
//! Feature `j` of position `p` uses the angle `p / base^(2⌊j/2⌋ / d_model)`; half the
//! features take its sine, half its cosine. [`SinusoidalLayout`] says which:
//! interleaved as in the paper (and XLM, tensor2tensor's successors) or sines first,
//! then cosines (Marian, fairseq-style models in transformers).
//!
//! The encoding has no parameters and any length: a table of the first
//! `max_position_embeddings` positions is precomputed, later positions are computed
//! per call.

use burn::config::Config;
use burn::module::Module;
use burn::tensor::{Device, Tensor, TensorData};

use crate::error::ConfigError;

const MODULE: &str = "SinusoidalPositionConfig";

/// Where the sines and cosines go.
#[derive(Config, Debug, Copy, PartialEq, Eq)]
pub enum SinusoidalLayout {
    /// `sin` at even features, `cos` at odd ones (the paper; XLM).
    Interleaved,
    /// All sines (`⌈d/2⌉` features), then all cosines (Marian).
    Concatenated,
}

/// Configuration of a [`SinusoidalPosition`].
#[derive(Config, Debug)]
pub struct SinusoidalPositionConfig {
    /// Embedding size.
    pub d_model: usize,
    /// Base wavelength. Default: 10000 (the paper).
    #[config(default = 10000.0)]
    pub base: f64,
    /// Positions precomputed at init (a cache size, not a limit). Default: 2048.
    #[config(default = 2048)]
    pub max_position_embeddings: usize,
    /// Placement of sines and cosines. Default: interleaved (the paper).
    #[config(default = "SinusoidalLayout::Interleaved")]
    pub layout: SinusoidalLayout,
}

impl SinusoidalPositionConfig {
    /// Checks the configuration.
    ///
    /// # Errors
    /// [`ConfigError::Zero`] for a zero `d_model`; [`ConfigError::Invalid`] for a base
    /// that is not positive and finite.
    pub fn validate(&self) -> Result<(), ConfigError> {
        ConfigError::check_positive(MODULE, "d_model", self.d_model)?;
        ConfigError::check_positive_real(MODULE, "base", self.base)
    }

    /// Validates the configuration and precomputes the table.
    ///
    /// # Errors
    /// See [`SinusoidalPositionConfig::validate`].
    pub fn try_init(&self, device: &Device) -> Result<SinusoidalPosition, ConfigError> {
        self.validate()?;
        let table = encoding_data(
            self.d_model,
            self.base,
            self.layout,
            0,
            self.max_position_embeddings,
        );
        Ok(SinusoidalPosition {
            table: Tensor::from_data(table, device),
            d_model: self.d_model,
            base: self.base,
            layout: self.layout,
        })
    }
}

crate::builders::init_or_panic!(SinusoidalPositionConfig => SinusoidalPosition);

/// Rows `start..end` of the encoding, `[end - start, d_model]`, computed in f64 and
/// rounded (transformers computes these tables in float64 with numpy too).
fn encoding_data(
    d_model: usize,
    base: f64,
    layout: SinusoidalLayout,
    start: usize,
    end: usize,
) -> TensorData {
    let frequency = |j: usize| base.powf(-((2 * (j / 2)) as f64) / d_model as f64);
    // Feature j's angle uses frequency(j) and takes sin when `sine(j)`.
    let sines = d_model.div_ceil(2);
    let (frequencies, sine): (Vec<f64>, Vec<bool>) = (0..d_model)
        .map(|j| match layout {
            SinusoidalLayout::Interleaved => (frequency(j), j.is_multiple_of(2)),
            // Sines use the even features' frequencies, cosines the odd ones'.
            SinusoidalLayout::Concatenated if j < sines => (frequency(2 * j), true),
            SinusoidalLayout::Concatenated => (frequency(2 * (j - sines) + 1), false),
        })
        .unzip();
    let mut values = Vec::with_capacity((end - start) * d_model);
    for position in start..end {
        for (frequency, sine) in frequencies.iter().zip(&sine) {
            let angle = position as f64 * frequency;
            values.push(if *sine { angle.sin() } else { angle.cos() } as f32);
        }
    }
    TensorData::new(values, [end - start, d_model])
}

/// Sinusoidal position encoding, added to embeddings. No parameters: the table is a
/// constant, neither trained nor saved.
#[derive(Module, Debug)]
pub struct SinusoidalPosition {
    /// The first positions: `[max_position_embeddings, d_model]`.
    table: Tensor<2>,
    d_model: usize,
    base: f64,
    #[module(skip)]
    layout: SinusoidalLayout,
}

impl SinusoidalPosition {
    /// Adds the encoding of positions `offset .. offset + seq` to `x` (the offset is the
    /// number of tokens already decoded).
    ///
    /// # Shapes
    /// - x: `[batch, seq, d_model]`
    /// - output: `[batch, seq, d_model]`
    ///
    /// # Panics
    /// If the last axis of `x` is not `d_model`.
    pub fn forward(&self, x: Tensor<3>, offset: usize) -> Tensor<3> {
        let [_, seq, d_model] = x.dims();
        assert_eq!(
            d_model, self.d_model,
            "SinusoidalPosition: input d_model {d_model} differs from the configured {}",
            self.d_model
        );
        let encoding = self.encoding(offset, seq, &x.device()).cast(x.dtype());
        // [1, seq, d_model]: the same positions for every sequence of the batch.
        x + encoding.unsqueeze_dim(0)
    }

    /// The encoding of positions `offset .. offset + seq`.
    ///
    /// # Shapes
    /// - output: `[seq, d_model]`
    pub fn encoding(&self, offset: usize, seq: usize, device: &Device) -> Tensor<2> {
        let end = offset + seq;
        let [cached, _] = self.table.dims();
        if end <= cached {
            let rows = self.table.clone().narrow(0, offset, seq);
            if rows.device() == *device {
                rows
            } else {
                rows.to_device(device)
            }
        } else {
            let rows = encoding_data(self.d_model, self.base, self.layout, offset, end);
            Tensor::from_data(rows, device)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_utils::{Fixture, assert_close, test_devices};

    #[test]
    fn matches_xlm_and_marian_tables() {
        let fixture = Fixture::load("sinusoidal");
        for device in test_devices() {
            for d_model in [16, 15] {
                for (layout, key) in [
                    (SinusoidalLayout::Interleaved, "interleaved"),
                    (SinusoidalLayout::Concatenated, "concatenated"),
                ] {
                    let expected = fixture.tensor::<2>(&format!("d{d_model}.{key}"), &device);
                    // Cached (40 ≤ 64) and computed on the fly (table of 8).
                    for cached in [64, 8] {
                        let module = SinusoidalPositionConfig::new(d_model)
                            .with_layout(layout)
                            .with_max_position_embeddings(cached)
                            .init(&device);
                        assert_close(
                            module.encoding(0, 40, &device),
                            expected.clone(),
                            1e-5,
                            &format!("d{d_model} {key} cache {cached}"),
                        );
                        assert_close(
                            module.encoding(6, 30, &device),
                            expected.clone().narrow(0, 6, 30),
                            1e-5,
                            &format!("d{d_model} {key} cache {cached} offset 6"),
                        );
                    }
                }
            }
        }
    }

    #[test]
    fn forward_adds_the_encoding_at_the_offset() {
        for device in test_devices() {
            let module = SinusoidalPositionConfig::new(16).init(&device);
            let x = Tensor::<3>::random([2, 5, 16], burn::tensor::Distribution::Default, &device);
            let expected = x.clone() + module.encoding(3, 5, &device).unsqueeze_dim(0);
            assert_close(module.forward(x, 3), expected, 0.0, "offset 3");
        }
    }

    #[test]
    fn invalid_configs_return_typed_errors() {
        assert_eq!(
            SinusoidalPositionConfig::new(0).validate(),
            Err(ConfigError::Zero {
                module: MODULE,
                field: "d_model"
            })
        );
        assert!(matches!(
            SinusoidalPositionConfig::new(8).with_base(0.0).validate(),
            Err(ConfigError::Invalid { field: "base", .. })
        ));
    }

    #[test]
    #[should_panic(expected = "SinusoidalPositionConfig: `d_model` must be greater than 0")]
    fn init_panics_with_the_validation_message() {
        SinusoidalPositionConfig::new(0).init(&Device::flex());
    }
}
