//! Text generation: greedy decoding, sampling (temperature, top-k, top-p, min-p,
//! repetition penalty), batched beam search and self-speculative greedy decoding with a
//! model's multi-token-prediction module, all through the models' KV caches. A Hugging
//! Face checkpoint's own settings come from `hf::read_generation_config`.
//!
//! ```rust,no_run
//! # use burn_transformer::model::CausalLmConfig;
//! use burn_transformer::generate::{GenerationConfig, SamplingConfig, generate};
//! # let model = CausalLmConfig::tiny().init(&burn::tensor::Device::flex());
//! let config = GenerationConfig::greedy(16)
//!     .with_stop_tokens(vec![2])
//!     .with_sampling(SamplingConfig::sample(0.8, 42).with_top_p(Some(0.95)));
//! let outputs = generate(&model, &[vec![1, 17, 42], vec![1, 5]], &config, |event| {
//!     println!("row {} got token {}", event.row, event.token);
//! })?;
//! # Ok::<(), burn_transformer::generate::GenerateError>(())
//! ```

mod beam;
mod generation;
mod language_model;
mod sampler;
mod speculative;

pub use beam::{BeamSearchConfig, EarlyStopping, Hypothesis, beam_search};
pub use generation::{Generated, GenerationConfig, StopReason, TokenEvent, generate};
pub use language_model::{LanguageModel, Seq2SeqDecoding};
pub use sampler::{Sampler, SamplingConfig};
pub use speculative::{SpeculativeOutput, generate_speculative};
#[cfg(test)]
pub(crate) use {generation::left_pad, sampler::log_softmax};

use thiserror::Error;

/// Why generation could not start.
#[derive(Debug, Clone, PartialEq, Error)]
pub enum GenerateError {
    /// No prompts were given.
    #[error("no prompts to generate from")]
    EmptyBatch,
    /// A prompt has no tokens.
    #[error("prompt {row} is empty")]
    EmptyPrompt {
        /// Its index in the batch.
        row: usize,
    },
    /// A token id is not below the vocabulary size.
    #[error("token {token}{} is outside the vocabulary of {vocab_size} ids", match row {
        Some(row) => format!(" in prompt {row}"),
        None => " (the padding token)".to_string(),
    })]
    TokenOutOfVocabulary {
        /// The prompt holding it; `None` for the padding token.
        row: Option<usize>,
        /// The id.
        token: u32,
        /// The model's vocabulary size.
        vocab_size: usize,
    },
    /// A generation setting is out of range.
    #[error("invalid generation setting `{setting}`: {reason}")]
    InvalidSetting {
        /// The setting.
        setting: &'static str,
        /// What was expected.
        reason: String,
    },
}
