//! The generation loop: prefill the prompts, then one token per step through the KV
//! caches, until a stop token or `max_new_tokens`.
//!
//! Prompts of different lengths run as one batch with left padding: every prompt ends
//! at the last column, the padded positions are masked as keys (and their queries
//! see nothing, giving zeros, never NaN). RoPE rotates by absolute column, so a
//! padded row's tokens sit `pad` positions later than alone; attention depends only
//! on position differences, so its logits equal the unpadded row's up to float
//! rounding (this does not hold for RoPE variants whose frequencies depend on the
//! total length: dynamic NTK and LongRoPE beyond their original context).

use burn::tensor::{Bool, Device, Int, Tensor, TensorData};

use super::GenerateError;
use super::model::LanguageModel;
use super::sampler::{Sampler, SamplingConfig};

/// Settings of [`generate`].
#[derive(Debug, Clone, PartialEq)]
pub struct GenerationConfig {
    /// At most this many new tokens per prompt. Default: 32.
    pub max_new_tokens: usize,
    /// A row stops after producing one of these (it is included in the output).
    /// Default: none.
    pub stop_tokens: Vec<u32>,
    /// The token fed as left padding and after a row stopped (never attended to).
    /// Default: 0.
    pub pad_token: u32,
    /// How each token is chosen. Default: greedy.
    pub sampling: SamplingConfig,
}

impl Default for GenerationConfig {
    fn default() -> Self {
        Self {
            max_new_tokens: 32,
            stop_tokens: Vec::new(),
            pad_token: 0,
            sampling: SamplingConfig::greedy(),
        }
    }
}

impl GenerationConfig {
    /// Greedy decoding of at most `max_new_tokens` tokens.
    pub fn greedy(max_new_tokens: usize) -> Self {
        Self {
            max_new_tokens,
            ..Self::default()
        }
    }

    /// Sets the stop tokens.
    pub fn with_stop_tokens(mut self, stop_tokens: Vec<u32>) -> Self {
        self.stop_tokens = stop_tokens;
        self
    }

    /// Sets the padding token.
    pub fn with_pad_token(mut self, pad_token: u32) -> Self {
        self.pad_token = pad_token;
        self
    }

    /// Sets how tokens are chosen.
    pub fn with_sampling(mut self, sampling: SamplingConfig) -> Self {
        self.sampling = sampling;
        self
    }
}

/// Why a row stopped.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StopReason {
    /// It produced a stop token (the last token of the output).
    StopToken,
    /// It reached `max_new_tokens`.
    MaxNewTokens,
}

/// The continuation of one prompt.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Generated {
    /// The new tokens (without the prompt).
    pub tokens: Vec<u32>,
    /// Why generation stopped.
    pub stop: StopReason,
}

/// One new token, as given to the streaming callback.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TokenEvent {
    /// The prompt's index in the batch.
    pub row: usize,
    /// The token.
    pub token: u32,
    /// Its index among the row's new tokens.
    pub step: usize,
}

/// Continues each prompt, calling `on_token` for every new token as soon as it is
/// chosen (rows of one step in order).
///
/// # Errors
/// [`GenerateError`] for an empty batch or prompt, a token outside the vocabulary,
/// or invalid sampling settings.
pub fn generate<M: LanguageModel>(
    model: &M,
    prompts: &[Vec<u32>],
    config: &GenerationConfig,
    mut on_token: impl FnMut(TokenEvent),
) -> Result<Vec<Generated>, GenerateError> {
    let mut sampler = Sampler::new(config.sampling.clone())?;
    check_prompts(prompts, model.vocab_size(), config.pad_token)?;
    let batch = prompts.len();
    let vocab = model.vocab_size();
    let device = model.device();
    let mut histories: Vec<Vec<u32>> = prompts.to_vec();
    let mut outputs: Vec<Option<Generated>> = vec![None; batch];
    let mut generated: Vec<Vec<u32>> = vec![Vec::new(); batch];
    if config.max_new_tokens == 0 {
        return Ok(generated
            .into_iter()
            .map(|tokens| Generated {
                tokens,
                stop: StopReason::MaxNewTokens,
            })
            .collect());
    }

    let (tokens, padding) = left_pad(prompts, config.pad_token, &device);
    let mut cache = model.new_cache(batch);
    let logits = model.forward_step(tokens, padding, &mut cache);
    let [_, prompt_len, _] = logits.dims();
    let mut last = logits.narrow(1, prompt_len - 1, 1); // [batch, 1, vocab]

    for step in 0..config.max_new_tokens {
        let rows = last_logits(last, batch, vocab);
        let mut next = vec![config.pad_token; batch];
        for (row, mut logits) in rows.into_iter().enumerate() {
            if outputs[row].is_some() {
                continue;
            }
            let token = sampler.choose(&mut logits, &histories[row]);
            histories[row].push(token);
            generated[row].push(token);
            next[row] = token;
            on_token(TokenEvent { row, token, step });
            if config.stop_tokens.contains(&token) {
                outputs[row] = Some(Generated {
                    tokens: std::mem::take(&mut generated[row]),
                    stop: StopReason::StopToken,
                });
            }
        }
        if outputs.iter().all(Option::is_some) || step + 1 == config.max_new_tokens {
            break;
        }
        // Finished rows keep decoding padding: cheaper than reshaping the batch, and
        // their outputs are ignored.
        let tokens = Tensor::<2, Int>::from_data(
            TensorData::new(next.iter().map(|&t| t as i64).collect(), [batch, 1]),
            &device,
        );
        last = model.forward_step(tokens, None, &mut cache);
    }
    Ok(outputs
        .into_iter()
        .zip(generated)
        .map(|(output, tokens)| {
            output.unwrap_or(Generated {
                tokens,
                stop: StopReason::MaxNewTokens,
            })
        })
        .collect())
}

/// Checks that the batch and every prompt are non-empty and every id is in the
/// vocabulary.
pub(crate) fn check_prompts(
    prompts: &[Vec<u32>],
    vocab_size: usize,
    pad_token: u32,
) -> Result<(), GenerateError> {
    if prompts.is_empty() {
        return Err(GenerateError::EmptyBatch);
    }
    if pad_token as usize >= vocab_size {
        return Err(GenerateError::TokenOutOfVocabulary {
            row: None,
            token: pad_token,
            vocab_size,
        });
    }
    for (row, prompt) in prompts.iter().enumerate() {
        if prompt.is_empty() {
            return Err(GenerateError::EmptyPrompt { row });
        }
        if let Some(&token) = prompt.iter().find(|&&t| t as usize >= vocab_size) {
            return Err(GenerateError::TokenOutOfVocabulary {
                row: Some(row),
                token,
                vocab_size,
            });
        }
    }
    Ok(())
}

/// Left-pads the prompts to the longest one.
///
/// # Shapes
/// - returns tokens `[batch, max_len]` and, if any prompt is shorter, the key padding
///   `[batch, max_len]` (`true` = padding)
pub fn left_pad(
    prompts: &[Vec<u32>],
    pad_token: u32,
    device: &Device,
) -> (Tensor<2, Int>, Option<Tensor<2, Bool>>) {
    let batch = prompts.len();
    let max_len = prompts.iter().map(Vec::len).max().unwrap_or(0);
    let mut tokens = Vec::with_capacity(batch * max_len);
    let mut padded = Vec::with_capacity(batch * max_len);
    for prompt in prompts {
        let pad = max_len - prompt.len();
        tokens.extend(std::iter::repeat_n(pad_token as i64, pad));
        tokens.extend(prompt.iter().map(|&t| t as i64));
        padded.extend(std::iter::repeat_n(true, pad));
        padded.extend(std::iter::repeat_n(false, prompt.len()));
    }
    let any_padding = padded.iter().any(|&p| p);
    let tokens = Tensor::from_data(TensorData::new(tokens, [batch, max_len]), device);
    let padding =
        any_padding.then(|| Tensor::from_data(TensorData::new(padded, [batch, max_len]), device));
    (tokens, padding)
}

/// `[batch, 1, vocab]` logits to one host `Vec<f32>` per row.
pub(crate) fn last_logits(logits: Tensor<3>, batch: usize, vocab: usize) -> Vec<Vec<f32>> {
    let values = logits
        .reshape([batch, vocab])
        .into_data()
        .convert::<f32>()
        .try_into_vec::<f32>()
        .unwrap_or_else(|error| panic!("logits are not readable as f32: {error:?}"));
    values.chunks(vocab).map(<[f32]>::to_vec).collect()
}
