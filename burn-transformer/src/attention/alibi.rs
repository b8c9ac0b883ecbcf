//! The configuration of ALiBi in an attention module: which slopes its heads take (the
//! bias itself is [`crate::ops::alibi`]'s).

use burn::config::Config;

use crate::error::ConfigError;
use crate::ops::alibi::alibi_slopes;

/// ALiBi (Press et al., 2022) in place of a position encoding: each head adds
/// `slope · (j − p)` to its logits (see [`crate::ops::alibi`]).
///
/// ```rust
/// use burn_transformer::attention::AlibiConfig;
/// let slopes = AlibiConfig::new().slopes(4);
/// assert_eq!(slopes, vec![0.25, 0.0625, 0.015625, 0.00390625]);
/// ```
#[derive(Config, Debug, PartialEq)]
pub struct AlibiConfig {
    /// The steepest slope is `2^(−max_bias)` (see [`alibi_slopes`]). Default: 8, the
    /// paper's, BLOOM's and MPT's (`alibi_bias_max`).
    #[config(default = 8.0)]
    pub max_bias: f64,
    /// A factor on every slope: Falcon's ALiBi models add the bias before scaling the
    /// logits, so their slopes are scaled by `1/√head_dim`. Default: 1.
    #[config(default = 1.0)]
    pub slope_scale: f64,
}

impl AlibiConfig {
    /// The slope of each of `heads` heads.
    pub fn slopes(&self, heads: usize) -> Vec<f64> {
        alibi_slopes(heads, self.max_bias)
            .into_iter()
            .map(|slope| slope * self.slope_scale)
            .collect()
    }

    /// Checks that both numbers are finite and positive.
    pub fn validate(&self) -> Result<(), ConfigError> {
        ConfigError::check_positive_real(MODULE, "alibi.max_bias", self.max_bias)?;
        ConfigError::check_positive_real(MODULE, "alibi.slope_scale", self.slope_scale)
    }
}

const MODULE: &str = "AlibiConfig";
