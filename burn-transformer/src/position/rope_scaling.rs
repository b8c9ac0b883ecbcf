//! RoPE frequency scaling: the `rope_type` variants of Hugging Face transformers'
//! `modeling_rope_utils`, and the inverse frequencies each one gives.
//!
//! Every variant changes only two things: the inverse frequencies `inv_freq[i]`
//! (one per rotated pair) and an attention scaling folded into `cos`/`sin`.
//! - `default`: `inv_freq[i] = theta^(-2i/d)` ([RoFormer](https://arxiv.org/abs/2104.09864)).
//! - `linear`: positions interpolated by `factor` (`inv_freq / factor`,
//!   [Chen et al. 2023](https://arxiv.org/abs/2306.15595)).
//! - `dynamic`: NTK-aware base growth once a sequence exceeds `max_position_embeddings`.
//! - `yarn`: per-frequency blend of interpolation and extrapolation plus an attention
//!   factor ([YaRN](https://arxiv.org/abs/2309.00071)).
//! - `llama3`: low frequencies divided by `factor`, high ones kept, a smooth ramp between
//!   (Llama 3.1).
//! - `longrope`: per-frequency rescale factors, short and long sets
//!   ([LongRoPE](https://arxiv.org/abs/2402.13753), Phi-3).
//! - `proportional`: the default frequencies of the whole head, of which only a leading
//!   fraction turns; the other pairs have frequency 0 and pass through (Gemma-4).
//!
//! # Precision
//! The frequencies are computed on the host, reproducing transformers' float32
//! arithmetic step by step (its `torch` ops run in float32; its scalar bookkeeping in
//! Python floats, i.e. f64). Transcendentals (`pow`, `cos`, `sin`) are evaluated in f64
//! and rounded, so an inverse frequency may differ from PyTorch's by one float32 ulp.

use std::borrow::Cow;
use std::f64::consts::PI;

use burn::config::Config;

use crate::error::ConfigError;

const MODULE: &str = "RopeScaling";

/// How RoPE frequencies are scaled for longer contexts, named and parameterised like
/// Hugging Face's `rope_scaling` / `rope_parameters` (`rope_type` and its keys).
///
/// `original_max_position_embeddings` is the pre-training context length; where it is
/// `None` the [`RopeConfig`](super::RopeConfig)'s `max_position_embeddings` stands in
/// (as transformers' config standardisation does).
///
/// Build the variants with many optional keys through [`RopeScaling::yarn`] and
/// [`RopeScaling::longrope`].
#[derive(Config, Debug, PartialEq)]
pub enum RopeScaling {
    /// No scaling (`rope_type: "default"`).
    Default,
    /// Position interpolation: every inverse frequency divided by `factor`.
    Linear {
        /// Context extension factor (> 0).
        factor: f64,
    },
    /// Dynamic NTK scaling: for a call whose positions reach `seq_len >
    /// max_position_embeddings`, the base becomes
    /// `theta · (factor·seq_len/max_position_embeddings − (factor − 1))^(d/(d−2))`.
    Dynamic {
        /// Scaling factor (> 0).
        factor: f64,
    },
    /// YaRN: extrapolate high frequencies, interpolate low ones (by `factor`), with a
    /// linear ramp between `beta_fast` and `beta_slow` rotations, and scale attention by
    /// the attention factor.
    Yarn {
        /// Context extension factor (> 0).
        factor: f64,
        /// Pre-training context length. Default: `max_position_embeddings`.
        original_max_position_embeddings: Option<usize>,
        /// Multiplies cos/sin (so q·k by its square). Default: derived from `factor`,
        /// `mscale`, `mscale_all_dim` as in the paper (`0.1·ln(factor) + 1`).
        attention_factor: Option<f64>,
        /// Rotations bounding the extrapolated band. Default: 32.
        beta_fast: Option<f64>,
        /// Rotations bounding the interpolated band. Default: 1.
        beta_slow: Option<f64>,
        /// DeepSeek's numerator scale of the attention factor. Default: none.
        mscale: Option<f64>,
        /// DeepSeek's denominator scale of the attention factor. Default: none.
        mscale_all_dim: Option<f64>,
        /// Round the correction range outwards to whole dimensions. Default: true.
        truncate: Option<bool>,
    },
    /// Llama 3.1: wavelengths longer than `original / low_freq_factor` are divided by
    /// `factor`, those shorter than `original / high_freq_factor` kept, a smooth blend
    /// between.
    Llama3 {
        /// Scaling factor for low frequencies (> 0).
        factor: f64,
        /// Lower wavelength bound factor (> 0).
        low_freq_factor: f64,
        /// Upper wavelength bound factor (> `low_freq_factor`).
        high_freq_factor: f64,
        /// Pre-training context length. Default: `max_position_embeddings`.
        original_max_position_embeddings: Option<usize>,
    },
    /// LongRoPE: per-pair rescale factors; `long_factor` once a call's positions exceed
    /// `original_max_position_embeddings`, `short_factor` otherwise.
    LongRope {
        /// One factor per rotated pair (`rotary_dim / 2`), for short contexts.
        short_factor: Vec<f64>,
        /// One factor per rotated pair (`rotary_dim / 2`), for long contexts.
        long_factor: Vec<f64>,
        /// Extension factor, used only to derive the attention factor.
        /// Default: `max_position_embeddings / original_max_position_embeddings`.
        factor: Option<f64>,
        /// Multiplies cos/sin. Default: `sqrt(1 + ln(factor)/ln(original))`, 1 if
        /// `factor <= 1`.
        attention_factor: Option<f64>,
        /// Pre-training context length. Default: `max_position_embeddings`.
        original_max_position_embeddings: Option<usize>,
    },
    /// Gemma-4's proportional RoPE: the default frequencies of every pair of the head
    /// (exponents over the whole `rotary_dim`), divided by `factor`, of which only the
    /// first `floor(rotated_fraction · rotary_dim / 2)` are kept; the other pairs get
    /// frequency 0 and pass through unrotated. Unlike a partial rotary factor, the
    /// rotated pairs span the whole head (feature `i` pairs with `i + rotary_dim/2`)
    /// and their frequencies are those of a full-width rotation.
    Proportional {
        /// Position interpolation factor (> 0; transformers' default 1).
        factor: f64,
        /// Fraction of the pairs that turn, in [0, 1] (the `partial_rotary_factor` of
        /// a proportional `rope_parameters` object).
        rotated_fraction: f64,
    },
}

impl RopeScaling {
    /// YaRN with the paper's defaults for every optional key.
    pub fn yarn(factor: f64, original_max_position_embeddings: usize) -> Self {
        Self::Yarn {
            factor,
            original_max_position_embeddings: Some(original_max_position_embeddings),
            attention_factor: None,
            beta_fast: None,
            beta_slow: None,
            mscale: None,
            mscale_all_dim: None,
            truncate: None,
        }
    }

    /// LongRoPE with the default factor and attention factor.
    pub fn longrope(
        short_factor: Vec<f64>,
        long_factor: Vec<f64>,
        original_max_position_embeddings: usize,
    ) -> Self {
        Self::LongRope {
            short_factor,
            long_factor,
            factor: None,
            attention_factor: None,
            original_max_position_embeddings: Some(original_max_position_embeddings),
        }
    }

    /// The Hugging Face `rope_type` name of this variant.
    pub fn rope_type(&self) -> &'static str {
        match self {
            Self::Default => "default",
            Self::Linear { .. } => "linear",
            Self::Dynamic { .. } => "dynamic",
            Self::Yarn { .. } => "yarn",
            Self::Llama3 { .. } => "llama3",
            Self::LongRope { .. } => "longrope",
            Self::Proportional { .. } => "proportional",
        }
    }

    /// Checks the factors for a rotary dimension `rotary_dim`.
    pub(crate) fn validate(&self, rotary_dim: usize) -> Result<(), ConfigError> {
        match self {
            Self::Default => Ok(()),
            Self::Linear { factor } => check_positive("factor", *factor),
            Self::Dynamic { factor } => {
                check_positive("factor", *factor)?;
                // The NTK exponent is d / (d - 2).
                if rotary_dim <= 2 {
                    return Err(invalid(
                        "factor",
                        format!(
                            "dynamic NTK scaling needs a rotary dimension > 2, got {rotary_dim}"
                        ),
                    ));
                }
                Ok(())
            }
            Self::Yarn {
                factor,
                original_max_position_embeddings,
                attention_factor,
                beta_fast,
                beta_slow,
                mscale,
                mscale_all_dim,
                truncate: _,
            } => {
                check_positive("factor", *factor)?;
                check_original(*original_max_position_embeddings)?;
                if let Some(value) = attention_factor {
                    check_positive("attention_factor", *value)?;
                }
                for (field, value) in [
                    ("beta_fast", beta_fast),
                    ("beta_slow", beta_slow),
                    ("mscale", mscale),
                    ("mscale_all_dim", mscale_all_dim),
                ] {
                    if let Some(value) = value
                        && !value.is_finite()
                    {
                        return Err(invalid(field, format!("must be finite, got {value}")));
                    }
                }
                Ok(())
            }
            Self::Llama3 {
                factor,
                low_freq_factor,
                high_freq_factor,
                original_max_position_embeddings,
            } => {
                check_positive("factor", *factor)?;
                check_positive("low_freq_factor", *low_freq_factor)?;
                check_positive("high_freq_factor", *high_freq_factor)?;
                check_original(*original_max_position_embeddings)?;
                if high_freq_factor <= low_freq_factor {
                    return Err(invalid(
                        "high_freq_factor",
                        format!(
                            "must be greater than low_freq_factor ({low_freq_factor}), got \
                             {high_freq_factor}"
                        ),
                    ));
                }
                Ok(())
            }
            Self::LongRope {
                short_factor,
                long_factor,
                factor,
                attention_factor,
                original_max_position_embeddings,
            } => {
                for (field, factors) in
                    [("short_factor", short_factor), ("long_factor", long_factor)]
                {
                    if factors.len() != rotary_dim / 2 {
                        return Err(invalid(
                            field,
                            format!(
                                "needs one factor per rotated pair ({}), got {}",
                                rotary_dim / 2,
                                factors.len()
                            ),
                        ));
                    }
                    if let Some(bad) = factors.iter().find(|f| !(f.is_finite() && **f > 0.0)) {
                        return Err(invalid(
                            field,
                            format!("factors must be positive, got {bad}"),
                        ));
                    }
                }
                if let Some(value) = factor {
                    check_positive("factor", *value)?;
                }
                if let Some(value) = attention_factor {
                    check_positive("attention_factor", *value)?;
                }
                check_original(*original_max_position_embeddings)
            }
            Self::Proportional {
                factor,
                rotated_fraction,
            } => {
                check_positive("factor", *factor)?;
                if !(0.0..=1.0).contains(rotated_fraction) {
                    return Err(invalid(
                        "rotated_fraction",
                        format!("must be in [0, 1], got {rotated_fraction}"),
                    ));
                }
                Ok(())
            }
        }
    }
}

fn invalid(field: &'static str, reason: String) -> ConfigError {
    ConfigError::Invalid {
        module: MODULE,
        field,
        reason,
    }
}

fn check_positive(field: &'static str, value: f64) -> Result<(), ConfigError> {
    ConfigError::check_positive_real(MODULE, field, value)
}

fn check_original(original: Option<usize>) -> Result<(), ConfigError> {
    match original {
        Some(0) => Err(ConfigError::Zero {
            module: MODULE,
            field: "original_max_position_embeddings",
        }),
        _ => Ok(()),
    }
}

/// `x^y` of two float32 values, evaluated in f64 and rounded (PyTorch's float32 `pow`
/// is accurate to about one ulp).
fn powf32(x: f32, y: f32) -> f32 {
    (x as f64).powf(y as f64) as f32
}

/// `theta^(i/dim)` for `i = 0, 2, 4, …` in float32, as `base ** (arange(0, dim, 2) / dim)`.
fn pos_freqs(theta: f32, dim: usize) -> impl Iterator<Item = f32> {
    (0..dim)
        .step_by(2)
        .map(move |i| powf32(theta, i as f32 / dim as f32))
}

/// The default inverse frequencies `1 / theta^(2i/dim)`, in float32.
fn default_inv_freq(theta: f32, dim: usize) -> Vec<f32> {
    pos_freqs(theta, dim).map(|p| 1.0 / p).collect()
}

/// YaRN's magnitude correction `0.1·mscale·ln(scale) + 1`, or 1 when `scale ≤ 1`
/// (transformers' `get_mscale` / DeepSeek's `yarn_get_mscale`). The rotary embedding's
/// attention factor is a ratio of two of these; DeepSeek's latent attention also folds
/// its square into the softmax scale.
pub(crate) fn yarn_get_mscale(scale: f64, mscale: f64) -> f64 {
    if scale <= 1.0 {
        1.0
    } else {
        0.1 * mscale * scale.ln() + 1.0
    }
}

/// A resolved frequency plan: the scaling with every default filled in for one rotary
/// dimension and context length, and the inverse frequencies of the common case.
#[derive(Clone, Debug)]
pub(crate) struct RopeFrequencies {
    scaling: RopeScaling,
    theta: f64,
    rotary_dim: usize,
    max_position_embeddings: usize,
    /// The inverse frequencies used while a call stays within the "base" regime.
    base: Vec<f32>,
    attention_scaling: f64,
}

impl RopeFrequencies {
    /// Resolves a validated scaling.
    pub(crate) fn new(
        scaling: &RopeScaling,
        theta: f64,
        rotary_dim: usize,
        max_position_embeddings: usize,
    ) -> Self {
        let mut plan = Self {
            scaling: scaling.clone(),
            theta,
            rotary_dim,
            max_position_embeddings,
            base: Vec::new(),
            attention_scaling: 1.0,
        };
        plan.attention_scaling = plan.compute_attention_scaling();
        plan.base = plan.compute(None);
        plan
    }

    /// The inverse frequencies of the common case: within `max_position_embeddings` for
    /// dynamic NTK, within `original_max_position_embeddings` for LongRoPE (short
    /// factors), always for the other scalings.
    pub(crate) fn base(&self) -> &[f32] {
        &self.base
    }

    /// The factor folded into cos and sin.
    pub(crate) fn attention_scaling(&self) -> f64 {
        self.attention_scaling
    }

    fn original(&self, original: Option<usize>) -> usize {
        original.unwrap_or(self.max_position_embeddings)
    }

    fn compute_attention_scaling(&self) -> f64 {
        match &self.scaling {
            RopeScaling::Yarn {
                factor,
                attention_factor,
                mscale,
                mscale_all_dim,
                ..
            } => match (attention_factor, mscale, mscale_all_dim) {
                (Some(value), _, _) => *value,
                // transformers tests truthiness: a zero mscale counts as absent.
                (None, Some(m), Some(m_all)) if *m != 0.0 && *m_all != 0.0 => {
                    yarn_get_mscale(*factor, *m) / yarn_get_mscale(*factor, *m_all)
                }
                _ => yarn_get_mscale(*factor, 1.0),
            },
            RopeScaling::LongRope {
                factor,
                attention_factor,
                original_max_position_embeddings,
                ..
            } => {
                let original = self.original(*original_max_position_embeddings) as f64;
                let factor = factor.unwrap_or(self.max_position_embeddings as f64 / original);
                match attention_factor {
                    Some(value) => *value,
                    None if factor <= 1.0 => 1.0,
                    None => (1.0 + factor.ln() / original.ln()).sqrt(),
                }
            }
            _ => 1.0,
        }
    }

    /// The inverse frequencies for a call whose positions end (exclusive) at `seq_len`
    /// (borrowed when they are the base ones).
    pub(crate) fn for_length(&self, seq_len: usize) -> Cow<'_, [f32]> {
        match &self.scaling {
            RopeScaling::Dynamic { .. } if seq_len > self.max_position_embeddings => {
                Cow::Owned(self.compute(Some(seq_len)))
            }
            RopeScaling::LongRope {
                original_max_position_embeddings,
                ..
            } if seq_len > self.original(*original_max_position_embeddings) => {
                Cow::Owned(self.compute(Some(seq_len)))
            }
            _ => Cow::Borrowed(&self.base),
        }
    }

    /// LongRoPE's original context: a sequence growing past it switches every position
    /// to the long factors, so keys cached at the short factors are stale; `None` for
    /// the other scalings.
    pub(crate) fn cache_rebuild_length(&self) -> Option<usize> {
        match &self.scaling {
            RopeScaling::LongRope {
                original_max_position_embeddings,
                ..
            } => Some(self.original(*original_max_position_embeddings)),
            _ => None,
        }
    }

    /// Whether a call ending at `seq_len` uses the base inverse frequencies (so a table
    /// built from them applies).
    pub(crate) fn is_base(&self, seq_len: usize) -> bool {
        matches!(self.for_length(seq_len), Cow::Borrowed(_))
    }

    /// transformers' `rope_init_fn(config, seq_len=seq_len)` for this scaling.
    fn compute(&self, seq_len: Option<usize>) -> Vec<f32> {
        let dim = self.rotary_dim;
        let theta = self.theta as f32;
        match &self.scaling {
            RopeScaling::Default => default_inv_freq(theta, dim),
            RopeScaling::Linear { factor } => {
                let factor = *factor as f32;
                default_inv_freq(theta, dim)
                    .into_iter()
                    .map(|f| f / factor)
                    .collect()
            }
            RopeScaling::Dynamic { factor } => match seq_len {
                Some(seq_len) if seq_len > self.max_position_embeddings => {
                    // transformers computes the grown base with float32 tensor ops
                    // (`seq_len` is a tensor there).
                    let growth = (*factor as f32 * seq_len as f32)
                        / self.max_position_embeddings as f32
                        - (*factor - 1.0) as f32;
                    let exponent = (dim as f64 / (dim as f64 - 2.0)) as f32;
                    let base = theta * powf32(growth, exponent);
                    default_inv_freq(base, dim)
                }
                _ => {
                    // At or below max_position_embeddings the growth term is 1: Python
                    // floats give exactly `theta` for it.
                    let max = self.max_position_embeddings as f64;
                    let growth = (*factor * max / max) - (*factor - 1.0);
                    let base = self.theta * growth.powf(dim as f64 / (dim as f64 - 2.0));
                    default_inv_freq(base as f32, dim)
                }
            },
            RopeScaling::Yarn {
                factor,
                original_max_position_embeddings,
                beta_fast,
                beta_slow,
                truncate,
                ..
            } => {
                let original = self.original(*original_max_position_embeddings) as f64;
                // `x or default` in Python: zero counts as unset.
                let beta_fast = beta_fast.filter(|b| *b != 0.0).unwrap_or(32.0);
                let beta_slow = beta_slow.filter(|b| *b != 0.0).unwrap_or(1.0);
                let truncate = truncate.unwrap_or(true);
                let correction_dim = |rotations: f64| {
                    (dim as f64 * (original / (rotations * 2.0 * PI)).ln())
                        / (2.0 * self.theta.ln())
                };
                let (mut low, mut high) = (correction_dim(beta_fast), correction_dim(beta_slow));
                if truncate {
                    low = low.floor();
                    high = high.ceil();
                }
                let low = low.max(0.0);
                let mut high = high.min(dim as f64 - 1.0);
                if low == high {
                    // transformers' guard against a zero-width ramp.
                    high += 0.001;
                }
                let factor = *factor as f32;
                let (low32, span32) = (low as f32, (high - low) as f32);
                pos_freqs(theta, dim)
                    .enumerate()
                    .map(|(i, pos_freq)| {
                        let extrapolation = 1.0 / pos_freq;
                        let interpolation = 1.0 / (factor * pos_freq);
                        let ramp = ((i as f32 - low32) / span32).clamp(0.0, 1.0);
                        let extrapolation_factor = 1.0 - ramp;
                        interpolation * (1.0 - extrapolation_factor)
                            + extrapolation * extrapolation_factor
                    })
                    .collect()
            }
            RopeScaling::Llama3 {
                factor,
                low_freq_factor,
                high_freq_factor,
                original_max_position_embeddings,
            } => {
                let original = self.original(*original_max_position_embeddings) as f64;
                let low_wavelen = (original / low_freq_factor) as f32;
                let high_wavelen = (original / high_freq_factor) as f32;
                let factor32 = *factor as f32;
                let (low32, span32) = (
                    *low_freq_factor as f32,
                    (high_freq_factor - low_freq_factor) as f32,
                );
                default_inv_freq(theta, dim)
                    .into_iter()
                    .map(|inv_freq| {
                        let wavelen = (2.0 * PI) as f32 / inv_freq;
                        let scaled = if wavelen > low_wavelen {
                            inv_freq / factor32
                        } else {
                            inv_freq
                        };
                        // `~(w < high) * ~(w > low)` in transformers; wavelengths are never NaN.
                        let medium = wavelen >= high_wavelen && wavelen <= low_wavelen;
                        if medium {
                            let smooth = (original as f32 / wavelen - low32) / span32;
                            (1.0 - smooth) * scaled / factor32 + smooth * scaled
                        } else {
                            scaled
                        }
                    })
                    .collect()
            }
            RopeScaling::LongRope {
                short_factor,
                long_factor,
                original_max_position_embeddings,
                ..
            } => {
                let original = self.original(*original_max_position_embeddings);
                let factors = match seq_len {
                    Some(seq_len) if seq_len > original => long_factor,
                    _ => short_factor,
                };
                pos_freqs(theta, dim)
                    .zip(factors)
                    .map(|(pos_freq, ext)| 1.0 / (*ext as f32 * pos_freq))
                    .collect()
            }
            RopeScaling::Proportional {
                factor,
                rotated_fraction,
            } => {
                // transformers: `int(fraction * head_dim // 2)` pairs turn.
                let rotated = (rotated_fraction * dim as f64 / 2.0).floor() as usize;
                let factor = *factor as f32;
                default_inv_freq(theta, dim)
                    .into_iter()
                    .enumerate()
                    .map(|(pair, f)| if pair < rotated { f / factor } else { 0.0 })
                    .collect()
            }
        }
    }
}
