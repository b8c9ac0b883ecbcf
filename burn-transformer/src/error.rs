//! Typed errors for configurations: a caller can recover from these, and every
//! `init` that panics does so with the same message.

use thiserror::Error;

/// An invalid module configuration, found by a config's `validate` (or
/// `try_init`) before anything is allocated.
#[derive(Debug, Clone, PartialEq, Error)]
pub enum ConfigError {
    /// A size that must be positive is zero.
    #[error("{module}: `{field}` must be greater than 0")]
    Zero {
        /// The config type that failed validation.
        module: &'static str,
        /// The offending field.
        field: &'static str,
    },
    /// One size must divide another (`n_heads % n_kv_heads`, …).
    #[error(
        "{module}: `{numerator}` ({numerator_value}) must be divisible by `{denominator}` ({denominator_value})"
    )]
    NotDivisible {
        /// The config type that failed validation.
        module: &'static str,
        /// The field being divided.
        numerator: &'static str,
        /// Its value.
        numerator_value: usize,
        /// The field that must divide it.
        denominator: &'static str,
        /// Its value.
        denominator_value: usize,
    },
    /// A size that must be even is odd (a rotary dimension rotates pairs).
    #[error("{module}: `{field}` must be even, got {value}")]
    Odd {
        /// The config type that failed validation.
        module: &'static str,
        /// The offending field.
        field: &'static str,
        /// Its value.
        value: usize,
    },
    /// A probability outside `[0, 1)` (dropout, stochastic depth).
    #[error("{module}: `{field}` must be a probability in [0, 1), got {value}")]
    Probability {
        /// The config type that failed validation.
        module: &'static str,
        /// The offending field.
        field: &'static str,
        /// Its value.
        value: f64,
    },
    /// Any other invalid value, with the reason.
    #[error("{module}: `{field}` is invalid: {reason}")]
    Invalid {
        /// The config type that failed validation.
        module: &'static str,
        /// The offending field.
        field: &'static str,
        /// What was expected.
        reason: String,
    },
}

impl ConfigError {
    /// Checks that `value > 0`.
    pub(crate) fn check_positive(
        module: &'static str,
        field: &'static str,
        value: usize,
    ) -> Result<(), Self> {
        if value == 0 {
            Err(Self::Zero { module, field })
        } else {
            Ok(())
        }
    }

    /// Checks that `value` is a finite probability in `[0, 1)`.
    pub(crate) fn check_probability(
        module: &'static str,
        field: &'static str,
        value: f64,
    ) -> Result<(), Self> {
        if value.is_finite() && (0.0..1.0).contains(&value) {
            Ok(())
        } else {
            Err(Self::Probability {
                module,
                field,
                value,
            })
        }
    }

    /// Checks that `value` is finite and at least 0 (an epsilon, a loss weight).
    pub(crate) fn check_non_negative(
        module: &'static str,
        field: &'static str,
        value: f64,
    ) -> Result<(), Self> {
        Self::check_real(
            module,
            field,
            value,
            value >= 0.0,
            "finite and non-negative",
        )
    }

    /// Checks that `value` is finite and greater than 0 (a base, a soft-cap).
    pub(crate) fn check_positive_real(
        module: &'static str,
        field: &'static str,
        value: f64,
    ) -> Result<(), Self> {
        Self::check_real(module, field, value, value > 0.0, "positive")
    }

    /// Checks that `value` is finite (a scale).
    pub(crate) fn check_finite(
        module: &'static str,
        field: &'static str,
        value: f64,
    ) -> Result<(), Self> {
        Self::check_real(module, field, value, true, "finite")
    }

    /// [`ConfigError::Invalid`] ("must be {expected}") unless `value` is finite and
    /// `holds`.
    fn check_real(
        module: &'static str,
        field: &'static str,
        value: f64,
        holds: bool,
        expected: &str,
    ) -> Result<(), Self> {
        if value.is_finite() && holds {
            Ok(())
        } else {
            Err(Self::Invalid {
                module,
                field,
                reason: format!("must be {expected}, got {value}"),
            })
        }
    }

    /// Checks that `numerator_value % denominator_value == 0` (and the divisor is positive).
    pub(crate) fn check_divisible(
        module: &'static str,
        numerator: &'static str,
        numerator_value: usize,
        denominator: &'static str,
        denominator_value: usize,
    ) -> Result<(), Self> {
        Self::check_positive(module, denominator, denominator_value)?;
        if !numerator_value.is_multiple_of(denominator_value) {
            Err(Self::NotDivisible {
                module,
                numerator,
                numerator_value,
                denominator,
                denominator_value,
            })
        } else {
            Ok(())
        }
    }
}
