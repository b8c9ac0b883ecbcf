//! Query temperature by position (Llama 4's attention temperature tuning, Ministral-3's
//! `llama_4_scaling_beta`): the queries of position `p` are multiplied by
//! `1 + β · ln(1 + ⌊(p + offset) / interval⌋)`, so that attention stays sharp far past
//! the context the model was pre-trained on (`interval`, its original context). Llama 4
//! counts positions from 1 (`offset` 1, its `floor_scale` the interval), Ministral-3
//! from 0. Until `p + offset` reaches `interval` the factor is 1.
//!
//! Positions count from the first token of the sequence (of the padded batch, for
//! left-padded rows).

use burn::config::Config;
use burn::tensor::{Tensor, TensorData};

use crate::error::ConfigError;

/// The query temperature of [`MultiHeadAttentionConfig::query_temperature`](super::MultiHeadAttentionConfig).
#[derive(Config, Debug, PartialEq)]
pub struct QueryTemperatureConfig {
    /// `β`: how fast the factor grows with each further `interval`.
    pub beta: f64,
    /// Positions per step of the factor (the original context).
    pub interval: usize,
    /// Added to each position before the division (Llama 4: 1). Default: 0.
    #[config(default = 0)]
    pub position_offset: usize,
}

impl QueryTemperatureConfig {
    /// Checks the values.
    ///
    /// # Errors
    /// [`ConfigError`] naming a `beta` that is not finite or a zero `interval`.
    pub fn validate(&self) -> Result<(), ConfigError> {
        const MODULE: &str = "QueryTemperatureConfig";
        ConfigError::check_finite(MODULE, "beta", self.beta)?;
        ConfigError::check_positive(MODULE, "interval", self.interval)
    }

    /// The factor of position `position`.
    pub fn factor(&self, position: usize) -> f64 {
        let steps = (position + self.position_offset) / self.interval;
        1.0 + self.beta * (steps as f64).ln_1p()
    }

    /// `queries` of positions `offset .. offset + seq` times their factors (unchanged
    /// when every factor is 1).
    ///
    /// # Shapes
    /// - queries: `[batch, heads, seq, head_dim]`
    /// - output: `[batch, heads, seq, head_dim]`
    pub fn scale(&self, queries: Tensor<4>, offset: usize) -> Tensor<4> {
        let [_, _, seq, _] = queries.dims();
        if (offset + seq + self.position_offset).saturating_sub(1) < self.interval {
            return queries;
        }
        // transformers computes the factor in float32 and casts it to the queries' type.
        let factors: Vec<f32> = (offset..offset + seq)
            .map(|position| self.factor(position) as f32)
            .collect();
        let device = queries.device();
        let factors = Tensor::<4>::from_data(TensorData::new(factors, [1, 1, seq, 1]), &device)
            .cast(queries.dtype());
        queries * factors
    }
}

#[cfg(test)]
mod tests {
    use burn::tensor::Device;

    use super::*;
    use crate::test_utils::assert_close;

    #[test]
    fn factors_grow_by_log_steps_of_the_interval() {
        let temperature = QueryTemperatureConfig::new(0.1, 4);
        let factors: Vec<f64> = (0..13).map(|p| temperature.factor(p)).collect();
        assert_eq!(factors[..4], [1.0; 4]);
        assert!((factors[4] - (1.0 + 0.1 * 2f64.ln())).abs() < 1e-12);
        assert!((factors[12] - (1.0 + 0.1 * 4f64.ln())).abs() < 1e-12);

        let device = Device::flex();
        let queries = Tensor::<4>::ones([1, 2, 3, 2], &device);
        // Positions 3, 4 and 5: 1, then 1 + 0.1 ln 2 twice.
        let scaled = temperature.scale(queries.clone(), 3);
        let step = (1.0 + 0.1 * 2f64.ln()) as f32;
        let expected = Tensor::<4>::from_data(
            TensorData::new(
                [[1.0, 1.0], [step, step], [step, step]].concat().repeat(2),
                [1, 2, 3, 2],
            ),
            &device,
        );
        assert_close(scaled, expected.clone(), 1e-7, "scaled queries");
        assert!(temperature.validate().is_ok());
        // Counted from 1 (Llama 4): position 3 takes the first step.
        let from_one = temperature.clone().with_position_offset(1);
        assert_eq!(from_one.factor(2), 1.0);
        assert_eq!(from_one.factor(3), temperature.factor(4));
        let scaled = from_one.scale(queries.narrow(2, 0, 1), 3);
        assert_close(scaled, expected.narrow(2, 1, 1), 1e-7, "from one");
        assert!(QueryTemperatureConfig::new(0.1, 0).validate().is_err());
    }
}
