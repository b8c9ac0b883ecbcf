//! Choosing the next token from logits: greedy or sampled, with the logit processors
//! of Hugging Face's `generate` applied in its order (repetition penalty, then for
//! sampling temperature, top-k, top-p, min-p).
//!
//! Choices are made on the host from one `[vocab]` row of float32 logits, with a
//! seeded random generator: a seed gives the same tokens on every backend and run.

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use super::GenerateError;

/// How tokens are chosen.
#[derive(Debug, Clone, PartialEq)]
pub struct SamplingConfig {
    /// Sample from the distribution; `false` takes the most likely token (greedy).
    pub do_sample: bool,
    /// Divides the logits before sampling; must be > 0. Default: 1.
    pub temperature: f32,
    /// Keep only the `k` most likely tokens. Default: none.
    pub top_k: Option<usize>,
    /// Keep the smallest set of most likely tokens whose probabilities sum to at
    /// least `p` (nucleus sampling), in (0, 1]. Default: none.
    pub top_p: Option<f32>,
    /// Keep only the tokens at least `p` times as likely as the most likely one
    /// (min-p sampling, Nguyen et al. 2024), in [0, 1]. Default: none.
    pub min_p: Option<f32>,
    /// Penalizes tokens already in the prompt or the output (CTRL, Keskar et al.
    /// 2019): a positive logit is divided by it, a negative one multiplied; must be
    /// > 0, 1 disables it. Applies to greedy decoding too. Default: 1.
    pub repetition_penalty: f32,
    /// Seed of the random generator. Default: 0.
    pub seed: u64,
}

impl Default for SamplingConfig {
    fn default() -> Self {
        Self::greedy()
    }
}

crate::builders::setters!(SamplingConfig {
    /// Sets top-k filtering.
    with_top_k => top_k: Option<usize>,
    /// Sets top-p (nucleus) filtering.
    with_top_p => top_p: Option<f32>,
    /// Sets min-p filtering.
    with_min_p => min_p: Option<f32>,
    /// Sets the repetition penalty.
    with_repetition_penalty => repetition_penalty: f32,
});

impl SamplingConfig {
    /// Greedy decoding: always the most likely token.
    pub fn greedy() -> Self {
        Self {
            do_sample: false,
            temperature: 1.0,
            top_k: None,
            top_p: None,
            min_p: None,
            repetition_penalty: 1.0,
            seed: 0,
        }
    }

    /// Sampling at `temperature`, with no top-k, top-p or min-p filter.
    pub fn sample(temperature: f32, seed: u64) -> Self {
        Self {
            do_sample: true,
            temperature,
            seed,
            ..Self::greedy()
        }
    }

    /// Checks the values.
    ///
    /// # Errors
    /// [`GenerateError::InvalidSetting`] naming the setting.
    pub fn validate(&self) -> Result<(), GenerateError> {
        let invalid = |setting: &'static str, reason: String| {
            Err(GenerateError::InvalidSetting { setting, reason })
        };
        if !(self.temperature.is_finite() && self.temperature > 0.0) {
            return invalid(
                "temperature",
                format!("must be > 0, got {}", self.temperature),
            );
        }
        if self.top_k == Some(0) {
            return invalid("top_k", "must be at least 1".into());
        }
        if let Some(p) = self.top_p
            && !(p > 0.0 && p <= 1.0)
        {
            return invalid("top_p", format!("must be in (0, 1], got {p}"));
        }
        if let Some(p) = self.min_p
            && !(0.0..=1.0).contains(&p)
        {
            return invalid("min_p", format!("must be in [0, 1], got {p}"));
        }
        if !(self.repetition_penalty.is_finite() && self.repetition_penalty > 0.0) {
            return invalid(
                "repetition_penalty",
                format!("must be > 0, got {}", self.repetition_penalty),
            );
        }
        Ok(())
    }
}

/// Chooses tokens, one row of logits at a time.
#[derive(Debug, Clone)]
pub struct Sampler {
    config: SamplingConfig,
    rng: StdRng,
}

impl Sampler {
    /// A sampler seeded with `config.seed`.
    ///
    /// # Errors
    /// See [`SamplingConfig::validate`].
    pub fn new(config: SamplingConfig) -> Result<Self, GenerateError> {
        config.validate()?;
        let rng = StdRng::seed_from_u64(config.seed);
        Ok(Self { config, rng })
    }

    /// The settings.
    pub fn config(&self) -> &SamplingConfig {
        &self.config
    }

    /// Applies the logit processors to one row of logits in place, as transformers'
    /// `generate` does before it chooses: the repetition penalty, and when sampling,
    /// the temperature and the top-k, top-p and min-p filters (filtered tokens become
    /// `-inf`). `history` is the prompt and the tokens generated so far.
    pub fn process(&self, logits: &mut [f32], history: &[u32]) {
        apply_repetition_penalty(logits, history, self.config.repetition_penalty);
        if !self.config.do_sample {
            return;
        }
        let temperature = self.config.temperature;
        if temperature != 1.0 {
            logits.iter_mut().for_each(|l| *l /= temperature);
        }
        if let Some(k) = self.config.top_k {
            apply_top_k(logits, k);
        }
        if let Some(p) = self.config.top_p {
            apply_top_p(logits, p);
        }
        if let Some(p) = self.config.min_p {
            apply_min_p(logits, p);
        }
    }

    /// Chooses the next token from one row of logits. `history` is the prompt and the
    /// tokens generated so far (for the repetition penalty). `logits` is modified in
    /// place by the processors ([`Sampler::process`]).
    pub fn choose(&mut self, logits: &mut [f32], history: &[u32]) -> u32 {
        self.process(logits, history);
        if !self.config.do_sample {
            return argmax(logits);
        }
        let probs = softmax(logits);
        let draw: f32 = self.rng.random();
        let mut cumulative = 0.0;
        let mut last_possible = 0;
        for (token, &prob) in probs.iter().enumerate() {
            if prob > 0.0 {
                last_possible = token;
                cumulative += prob;
                if draw < cumulative {
                    return token as u32;
                }
            }
        }
        // Rounding left the cumulative sum just below the draw.
        last_possible as u32
    }
}

/// The index of the largest logit (the first one on ties, as `torch.argmax`).
pub(crate) fn argmax(logits: &[f32]) -> u32 {
    let mut best = 0;
    for (token, &logit) in logits.iter().enumerate() {
        if logit > logits[best] || logits[best].is_nan() {
            best = token;
        }
    }
    best as u32
}

/// HF's `RepetitionPenaltyLogitsProcessor`: each token seen once or more is penalized
/// once.
pub(crate) fn apply_repetition_penalty(logits: &mut [f32], history: &[u32], penalty: f32) {
    if penalty == 1.0 {
        return;
    }
    let mut seen = vec![false; logits.len()];
    for &token in history {
        let token = token as usize;
        if token < logits.len() && !seen[token] {
            seen[token] = true;
            let logit = &mut logits[token];
            *logit = if *logit < 0.0 {
                *logit * penalty
            } else {
                *logit / penalty
            };
        }
    }
}

/// Keeps the `k` largest logits (and any tied with the k-th), `-inf` elsewhere.
pub(crate) fn apply_top_k(logits: &mut [f32], k: usize) {
    if k >= logits.len() {
        return;
    }
    let mut sorted: Vec<f32> = logits.to_vec();
    sorted.sort_unstable_by(|a, b| b.total_cmp(a));
    let threshold = sorted[k - 1];
    logits
        .iter_mut()
        .filter(|l| **l < threshold)
        .for_each(|l| *l = f32::NEG_INFINITY);
}

/// Keeps the smallest set of most likely tokens whose probability sums to at least
/// `p` (always at least one), `-inf` elsewhere. As transformers states it: the least
/// likely tokens whose probabilities sum to at most `1 - p` are removed (which decides
/// the rounding cases as it does).
pub(crate) fn apply_top_p(logits: &mut [f32], p: f32) {
    if p >= 1.0 {
        return;
    }
    let probs = softmax(logits);
    let mut ascending: Vec<usize> = (0..logits.len()).collect();
    ascending.sort_by(|&a, &b| logits[a].total_cmp(&logits[b]));
    // The most likely token always stays.
    ascending.pop();
    let mut cumulative = 0.0f64;
    for token in ascending {
        cumulative += f64::from(probs[token]);
        if cumulative > f64::from(1.0 - p) {
            break;
        }
        logits[token] = f32::NEG_INFINITY;
    }
}

/// Keeps the tokens whose probability is at least `p` times the largest one (and
/// always the most likely token), `-inf` elsewhere.
pub(crate) fn apply_min_p(logits: &mut [f32], p: f32) {
    let probs = softmax(logits);
    let top = probs.iter().copied().fold(0.0f32, f32::max);
    let threshold = p * top;
    let best = argmax(logits) as usize;
    for (token, logit) in logits.iter_mut().enumerate() {
        if probs[token] < threshold && token != best {
            *logit = f32::NEG_INFINITY;
        }
    }
}

/// Softmax of one row (in f64 for the sum); `-inf` entries get probability 0.
pub(crate) fn softmax(logits: &[f32]) -> Vec<f32> {
    let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    if !max.is_finite() {
        // Everything masked: uniform rather than NaN.
        return vec![1.0 / logits.len() as f32; logits.len()];
    }
    let exps: Vec<f64> = logits.iter().map(|&l| ((l - max) as f64).exp()).collect();
    let total: f64 = exps.iter().sum();
    exps.iter().map(|&e| (e / total) as f32).collect()
}

/// `log_softmax` of one row, in f64 for the sum.
pub(crate) fn log_softmax(logits: &[f32]) -> Vec<f32> {
    let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    if !max.is_finite() {
        return vec![-(logits.len() as f32).ln(); logits.len()];
    }
    let total: f64 = logits.iter().map(|&l| ((l - max) as f64).exp()).sum();
    let log_total = total.ln() as f32;
    logits.iter().map(|&l| l - max - log_total).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn repetition_penalty_follows_transformers() {
        let mut logits = vec![2.0, -2.0, 1.0, 0.5];
        apply_repetition_penalty(&mut logits, &[0, 1, 1], 2.0);
        assert_eq!(logits, vec![1.0, -4.0, 1.0, 0.5]);
    }

    #[test]
    fn top_k_top_p_and_min_p_filter_the_tail() {
        let mut logits = vec![1.0, 3.0, 2.0, 0.0];
        apply_top_k(&mut logits, 2);
        assert_eq!(logits, vec![f32::NEG_INFINITY, 3.0, 2.0, f32::NEG_INFINITY]);

        // Probabilities ≈ [0.64, 0.24, 0.09, 0.03].
        let mut logits = vec![3.0, 2.0, 1.0, 0.0];
        apply_top_p(&mut logits, 0.8);
        assert_eq!(logits, vec![3.0, 2.0, f32::NEG_INFINITY, f32::NEG_INFINITY]);
        let mut logits = vec![3.0, 2.0, 1.0, 0.0];
        apply_top_p(&mut logits, 0.1);
        assert_eq!(logits[1..], [f32::NEG_INFINITY; 3]);

        // Min-p 0.2 keeps the tokens at least 0.2 · 0.64 likely.
        let mut logits = vec![3.0, 2.0, 1.0, 0.0];
        apply_min_p(&mut logits, 0.2);
        assert_eq!(logits, vec![3.0, 2.0, f32::NEG_INFINITY, f32::NEG_INFINITY]);
        let mut logits = vec![3.0, 2.0, 1.0, 0.0];
        apply_min_p(&mut logits, 1.0);
        assert_eq!(logits[1..], [f32::NEG_INFINITY; 3]);
    }

    #[test]
    fn seeded_sampling_is_reproducible_and_follows_the_distribution() {
        let config = SamplingConfig::sample(1.0, 42);
        let logits = [0.0f32, (3.0f32).ln(), f32::NEG_INFINITY];
        let draw = |config: &SamplingConfig| {
            let mut sampler = Sampler::new(config.clone()).unwrap();
            (0..4000)
                .map(|_| sampler.choose(&mut logits.clone(), &[]))
                .collect::<Vec<_>>()
        };
        let first = draw(&config);
        assert_eq!(first, draw(&config), "same seed, same tokens");
        assert_ne!(first, draw(&SamplingConfig::sample(1.0, 7)));
        let ones = first.iter().filter(|&&t| t == 1).count() as f32 / first.len() as f32;
        assert!(
            (ones - 0.75).abs() < 0.03,
            "token 1 drawn {ones} of the time"
        );
        assert!(!first.contains(&2), "a -inf logit is never drawn");
    }

    #[test]
    fn invalid_settings_are_named() {
        let error = Sampler::new(SamplingConfig::sample(0.0, 0)).unwrap_err();
        assert!(matches!(
            error,
            GenerateError::InvalidSetting {
                setting: "temperature",
                ..
            }
        ));
        let error = Sampler::new(SamplingConfig::greedy().with_top_p(Some(1.5))).unwrap_err();
        assert!(error.to_string().contains("top_p"), "{error}");
    }
}
