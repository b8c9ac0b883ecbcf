//! Reading a Hugging Face `generation_config.json`: the decoding a checkpoint asks
//! for (its end-of-text tokens, sampling settings, beams), which transformers'
//! `generate` starts from.
//!
//! transformers fills what the file leaves out with its global defaults (greedy;
//! when sampling: temperature 1, top-k 50, no top-p or min-p; no repetition penalty;
//! one beam), so [`HfGenerationConfig::default`] is what `generate` uses for a model
//! without the file. The warpers are kept even when the file does not sample, because
//! a caller that turns sampling on (transformers' `generate(do_sample=True)`) samples
//! with them. Keys whose processors we do not implement (`typical_p`,
//! `no_repeat_ngram_size`, …) are named in [`HfGenerationConfig::unapplied_keys`]
//! when the file gives them an effective value.

use std::path::Path;

use serde::Deserialize;
use serde_json::Value;

use super::error::HfError;
use super::keys::{KeyError, TokenIds, read_json, read_keys};
use crate::generate::{EarlyStopping, SamplingConfig};

/// The file name of a checkpoint's decoding settings.
pub const GENERATION_CONFIG_FILE: &str = "generation_config.json";

/// transformers' `top_k` when neither the file nor the caller sets one.
const DEFAULT_TOP_K: usize = 50;

/// Keys of transformers' `GenerationConfig` with a processor this crate does not
/// implement, each with the value that leaves decoding unchanged (`None`: unset).
const UNAPPLIED_KEYS: [(&str, Option<f64>); 15] = [
    ("typical_p", Some(1.0)),
    ("epsilon_cutoff", Some(0.0)),
    ("eta_cutoff", Some(0.0)),
    ("top_h", None),
    ("no_repeat_ngram_size", Some(0.0)),
    ("min_length", Some(0.0)),
    ("min_new_tokens", Some(0.0)),
    ("bad_words_ids", None),
    ("suppress_tokens", None),
    ("begin_suppress_tokens", None),
    ("forced_bos_token_id", None),
    ("forced_eos_token_id", None),
    ("exponential_decay_length_penalty", None),
    ("sequence_bias", None),
    ("guidance_scale", Some(1.0)),
];

/// A checkpoint's decoding settings, as transformers' `generate` reads them.
#[derive(Debug, Clone, PartialEq)]
pub struct HfGenerationConfig {
    /// `eos_token_id` (a number or a list); `None` when the file does not set it, and
    /// then `config.json`'s apply ([`HfConfig::eos_token_ids`](super::HfConfig)).
    pub eos_token_ids: Option<Vec<u32>>,
    /// `pad_token_id`, if set.
    pub pad_token_id: Option<u32>,
    /// `do_sample`, `temperature`, `top_k` (0: none), `top_p` (1: none), `min_p` and
    /// `repetition_penalty`, with transformers' defaults for those left out; seed 0.
    pub sampling: SamplingConfig,
    /// `num_beams`: beam search when above 1. Default: 1.
    pub num_beams: usize,
    /// `length_penalty` of beam search. Default: 1.
    pub length_penalty: f32,
    /// `early_stopping` of beam search (`true`, `false` or `"never"`). Default: `false`.
    pub early_stopping: EarlyStopping,
    /// One note per key set to a value whose processor this crate does not apply.
    pub unapplied_keys: Vec<String>,
}

impl Default for HfGenerationConfig {
    /// transformers' defaults: greedy, and top-k 50 for a caller that samples.
    fn default() -> Self {
        Self {
            eos_token_ids: None,
            pad_token_id: None,
            sampling: SamplingConfig::greedy().with_top_k(Some(DEFAULT_TOP_K)),
            num_beams: 1,
            length_penalty: 1.0,
            early_stopping: EarlyStopping::Heuristic,
            unapplied_keys: Vec::new(),
        }
    }
}

/// The keys read; a missing key and `null` both mean "transformers' default".
#[derive(Deserialize)]
struct GenerationKeys {
    eos_token_id: Option<TokenIds>,
    pad_token_id: Option<u32>,
    do_sample: Option<bool>,
    temperature: Option<f32>,
    top_k: Option<usize>,
    top_p: Option<f32>,
    min_p: Option<f32>,
    repetition_penalty: Option<f32>,
    num_beams: Option<usize>,
    length_penalty: Option<f32>,
    early_stopping: Option<Value>,
}

/// Reads `dir/generation_config.json`; `None` when the folder has none.
///
/// # Errors
/// As [`HfGenerationConfig::from_file`].
pub fn read_generation_config(
    dir: impl AsRef<Path>,
) -> Result<Option<HfGenerationConfig>, HfError> {
    let path = dir.as_ref().join(GENERATION_CONFIG_FILE);
    if !path.is_file() {
        return Ok(None);
    }
    HfGenerationConfig::from_file(path).map(Some)
}

impl HfGenerationConfig {
    /// Reads `path` (a `generation_config.json`).
    ///
    /// # Errors
    /// [`HfError::Io`], [`HfError::Json`], or [`HfError::Field`] naming a key of the
    /// wrong type or out of range (a temperature of 0 with `do_sample`, a `top_p`
    /// above 1, …).
    pub fn from_file(path: impl AsRef<Path>) -> Result<Self, HfError> {
        let path = path.as_ref();
        Self::from_value(&read_json(path)?, path)
    }

    /// Reads an already parsed `generation_config.json`; `path` only names it in
    /// errors.
    ///
    /// # Errors
    /// As [`HfGenerationConfig::from_file`], without the I/O and JSON syntax.
    pub fn from_value(value: &Value, path: impl AsRef<Path>) -> Result<Self, HfError> {
        Self::read(value).map_err(|error| error.in_file(path.as_ref()))
    }

    fn read(value: &Value) -> Result<Self, KeyError> {
        let keys: GenerationKeys = read_keys(value, None)?;
        let defaults = Self::default();
        let do_sample = keys.do_sample.unwrap_or(false);
        // transformers refuses a temperature of 0 only where it samples; elsewhere the
        // key is ignored, and so is an out-of-range value.
        let temperature = match keys.temperature {
            Some(t) if t.is_finite() && t > 0.0 => t,
            Some(t) if do_sample => {
                return Err(KeyError::new(
                    "temperature",
                    format!("must be > 0 to sample (`do_sample` is true), got {t}"),
                ));
            }
            _ => 1.0,
        };
        let top_k = match keys.top_k {
            Some(0) => None,
            Some(k) => Some(k),
            None => defaults.sampling.top_k,
        };
        let top_p = match keys.top_p {
            Some(p) if p > 0.0 && p < 1.0 => Some(p),
            Some(1.0) => None,
            Some(p) => {
                return Err(KeyError::new(
                    "top_p",
                    format!("must be in (0, 1], got {p}"),
                ));
            }
            None => None,
        };
        if let Some(p) = keys.min_p
            && !(0.0..=1.0).contains(&p)
        {
            return Err(KeyError::new(
                "min_p",
                format!("must be in [0, 1], got {p}"),
            ));
        }
        let repetition_penalty = keys.repetition_penalty.unwrap_or(1.0);
        if !(repetition_penalty.is_finite() && repetition_penalty > 0.0) {
            return Err(KeyError::new(
                "repetition_penalty",
                format!("must be > 0 (1 disables it), got {repetition_penalty}"),
            ));
        }
        let num_beams = keys.num_beams.unwrap_or(1);
        if num_beams == 0 {
            return Err(KeyError::new("num_beams", "must be at least 1"));
        }
        let length_penalty = keys.length_penalty.unwrap_or(1.0);
        if !length_penalty.is_finite() {
            return Err(KeyError::new(
                "length_penalty",
                format!("must be finite, got {length_penalty}"),
            ));
        }
        let early_stopping = match &keys.early_stopping {
            None | Some(Value::Bool(false)) => EarlyStopping::Heuristic,
            Some(Value::Bool(true)) => EarlyStopping::Immediate,
            Some(Value::String(never)) if never == "never" => EarlyStopping::Never,
            Some(other) => {
                return Err(KeyError::new(
                    "early_stopping",
                    format!("expected true, false or \"never\", got {other}"),
                ));
            }
        };
        Ok(Self {
            eos_token_ids: keys.eos_token_id.map(|ids| ids.0),
            pad_token_id: keys.pad_token_id,
            sampling: SamplingConfig {
                do_sample,
                temperature,
                top_k,
                top_p,
                min_p: keys.min_p,
                repetition_penalty,
                seed: 0,
            },
            num_beams,
            length_penalty,
            early_stopping,
            unapplied_keys: unapplied_keys(value),
        })
    }
}

/// Notes on the keys of [`UNAPPLIED_KEYS`] that `config` sets to an effective value.
fn unapplied_keys(config: &Value) -> Vec<String> {
    UNAPPLIED_KEYS
        .iter()
        .filter_map(|&(key, neutral)| {
            let value = config.get(key)?;
            let neutral = match value {
                Value::Null => true,
                Value::Array(items) => items.is_empty(),
                Value::Number(number) => number.as_f64() == neutral,
                _ => false,
            };
            (!neutral).then(|| {
                format!("`{key}: {value}` asks for a logit processor this decoder does not apply: ignored")
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::generate::Sampler;
    use crate::test_utils::fixture_dir;

    fn read(value: Value) -> Result<HfGenerationConfig, HfError> {
        HfGenerationConfig::from_value(&value, "generation_config.json")
    }

    #[test]
    fn missing_keys_take_transformers_defaults() {
        let config = read(json!({"transformers_version": "5.24.0"})).unwrap();
        assert_eq!(config, HfGenerationConfig::default());
        assert!(!config.sampling.do_sample);
        assert_eq!(config.sampling.top_k, Some(50));
        assert_eq!(config.eos_token_ids, None);
    }

    #[test]
    fn reads_the_settings_of_a_published_checkpoint() {
        // Qwen2.5-Instruct's file.
        let config = read(json!({
            "bos_token_id": 151643, "pad_token_id": 151643, "do_sample": true,
            "eos_token_id": [151645, 151643], "repetition_penalty": 1.05,
            "temperature": 0.7, "top_p": 0.8, "top_k": 20
        }))
        .unwrap();
        assert_eq!(config.eos_token_ids, Some(vec![151645, 151643]));
        assert_eq!(config.pad_token_id, Some(151643));
        let sampling = &config.sampling;
        assert!(sampling.do_sample);
        assert_eq!(
            (sampling.temperature, sampling.top_k, sampling.top_p),
            (0.7, Some(20), Some(0.8))
        );
        assert_eq!(sampling.repetition_penalty, 1.05);
        assert!(config.unapplied_keys.is_empty());
        sampling.validate().unwrap();
    }

    #[test]
    fn neutral_values_switch_processors_off_and_others_are_noted() {
        let config = read(json!({
            "eos_token_id": 7, "top_k": 0, "top_p": 1.0, "num_beams": 3,
            "early_stopping": "never", "typical_p": 1.0, "no_repeat_ngram_size": 3,
            "suppress_tokens": [], "begin_suppress_tokens": [220]
        }))
        .unwrap();
        assert_eq!(config.eos_token_ids, Some(vec![7]));
        assert_eq!((config.sampling.top_k, config.sampling.top_p), (None, None));
        assert_eq!(config.num_beams, 3);
        assert_eq!(config.early_stopping, EarlyStopping::Never);
        assert_eq!(
            config.unapplied_keys.len(),
            2,
            "{:?}",
            config.unapplied_keys
        );
        assert!(config.unapplied_keys[0].contains("no_repeat_ngram_size: 3"));
        assert!(config.unapplied_keys[1].contains("begin_suppress_tokens"));
    }

    #[test]
    fn bad_values_name_their_key() {
        let field = |value: Value| match read(value) {
            Err(HfError::Field { field, reason, .. }) => format!("{field}: {reason}"),
            other => panic!("expected a field error, got {other:?}"),
        };
        assert!(field(json!({"do_sample": true, "temperature": 0.0})).starts_with("temperature"));
        assert!(field(json!({"top_p": 1.5})).starts_with("top_p"));
        assert!(field(json!({"min_p": -0.1})).starts_with("min_p"));
        assert!(field(json!({"repetition_penalty": 0})).starts_with("repetition_penalty"));
        assert!(field(json!({"early_stopping": "sometimes"})).starts_with("early_stopping"));
        assert!(field(json!({"eos_token_id": "</s>"})).starts_with("eos_token_id"));
        // Not sampling: transformers ignores the temperature.
        assert_eq!(
            read(json!({"temperature": 0.0}))
                .unwrap()
                .sampling
                .temperature,
            1.0
        );
    }

    /// Logits after transformers' processors, for the settings of a
    /// `generation_config.json`: `tools/make_hf_models.py processors`.
    #[test]
    fn processors_of_a_file_match_transformers() {
        #[derive(serde::Deserialize)]
        struct Case {
            generation_config: Value,
            history: Vec<u32>,
            logits: Vec<f32>,
            /// `None`: removed (`-inf`).
            processed: Vec<Option<f32>>,
        }
        let path = fixture_dir().join("hf/processors.json");
        let text = std::fs::read_to_string(&path)
            .unwrap_or_else(|e| panic!("{}: {e} (run tools/make_hf_models.py)", path.display()));
        let cases: Vec<Case> = serde_json::from_str(&text).unwrap();
        let removed = |case: &Case| case.processed.iter().filter(|p| p.is_none()).count();
        assert!(
            cases
                .iter()
                .any(|case| removed(case) == case.logits.len() - 1)
        );
        assert!(cases.iter().any(|case| (1..40).contains(&removed(case))));
        for case in &cases {
            let config = read(case.generation_config.clone()).unwrap();
            let sampler = Sampler::new(config.sampling.clone()).unwrap();
            let mut logits = case.logits.clone();
            sampler.process(&mut logits, &case.history);
            for (token, (&ours, &theirs)) in logits.iter().zip(&case.processed).enumerate() {
                let what = format!("{}, token {token}", case.generation_config);
                match theirs {
                    None => assert_eq!(ours, f32::NEG_INFINITY, "{what}: kept"),
                    Some(theirs) => assert!(
                        (ours - theirs).abs() <= 1e-5 * theirs.abs().max(1.0),
                        "{what}: {ours} vs {theirs}"
                    ),
                }
            }
        }
    }
}
