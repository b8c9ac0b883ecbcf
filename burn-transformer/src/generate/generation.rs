//! The generation loop: prefill the prompts, then one token per step through the KV
//! caches, until a stop token or `max_new_tokens`.
//!
//! With [`GenerationConfig::max_context`], every token is predicted from at most that
//! many of the latest tokens, as a model trained on windows of that length saw them:
//! once the cache is full, each step prefills the latest `max_context` tokens into an
//! empty cache instead of appending one. A model with learned positions (GPT-2) caps
//! the context at its number of positions ([`LanguageModel::max_positions`]), as
//! nanoGPT's sampling crops to its block size.
//!
//! Prompts of different lengths run as one batch with left padding: every prompt ends
//! at the last column, the padded positions are masked as keys (and their queries
//! see nothing, giving zeros, never NaN). RoPE rotates by absolute column, so a
//! padded row's tokens sit `pad` positions later than alone; attention depends only
//! on position differences, so its logits equal the unpadded row's up to float
//! rounding (this does not hold for RoPE variants whose frequencies depend on the
//! total length: dynamic NTK and LongRoPE beyond their original context). Learned
//! positions count a row's real tokens only, so there too a padded row is numbered
//! as alone.

use burn::tensor::{Bool, Device, Int, Tensor, TensorData};

use super::GenerateError;
use super::language_model::LanguageModel;
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
    /// Predict each token from at most this many of the latest tokens (the context a
    /// model was trained on); `None` keeps every token. Default: `None`.
    pub max_context: Option<usize>,
}

impl Default for GenerationConfig {
    fn default() -> Self {
        Self {
            max_new_tokens: 32,
            stop_tokens: Vec::new(),
            pad_token: 0,
            sampling: SamplingConfig::greedy(),
            max_context: None,
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
}

crate::builders::setters!(GenerationConfig {
    /// Sets the stop tokens.
    with_stop_tokens => stop_tokens: Vec<u32>,
    /// Sets the padding token.
    with_pad_token => pad_token: u32,
    /// Sets how tokens are chosen.
    with_sampling => sampling: SamplingConfig,
    /// Sets the most tokens each prediction sees.
    with_max_context => max_context: Option<usize>,
});

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
/// invalid sampling settings or a `max_context` of 0.
pub fn generate<M: LanguageModel>(
    model: &M,
    prompts: &[Vec<u32>],
    config: &GenerationConfig,
    mut on_token: impl FnMut(TokenEvent),
) -> Result<Vec<Generated>, GenerateError> {
    let mut sampler = Sampler::new(config.sampling.clone())?;
    check_prompts(prompts, model.vocab_size(), config.pad_token)?;
    if config.max_context == Some(0) {
        return Err(GenerateError::InvalidSetting {
            setting: "max_context",
            reason: "must be at least 1".into(),
        });
    }
    // A model with learned positions cannot see more than it has.
    let config = &GenerationConfig {
        max_context: match (config.max_context, model.max_positions()) {
            (Some(limit), Some(positions)) => Some(limit.min(positions)),
            (limit, positions) => limit.or(positions),
        },
        ..config.clone()
    };
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

    let (mut cache, mut cached, mut last) = prefill(model, &histories, config, &device);
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
        // A window full (a run's training context), or a sequence about to grow past
        // the length at which the cached keys go stale: predict from a fresh cache.
        if config.max_context.is_some_and(|limit| cached >= limit)
            || model.cache_rebuild_length() == Some(cached)
        {
            (cache, cached, last) = prefill(model, &histories, config, &device);
            continue;
        }
        // Finished rows keep decoding padding: cheaper than reshaping the batch, and
        // their outputs are ignored.
        let tokens = Tensor::<2, Int>::from_data(
            TensorData::new(next.iter().map(|&t| t as i64).collect(), [batch, 1]),
            &device,
        );
        last = model.forward_step(tokens, None, &mut cache);
        cached += 1;
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

/// Runs the latest tokens of every row (at most `max_context` of them) through an
/// empty cache; returns the cache, the number of positions it holds, and the logits
/// of the last position `[batch, 1, vocab]`.
fn prefill<M: LanguageModel>(
    model: &M,
    histories: &[Vec<u32>],
    config: &GenerationConfig,
    device: &Device,
) -> (M::Cache, usize, Tensor<3>) {
    let windows: Vec<Vec<u32>> = histories
        .iter()
        .map(|tokens| {
            let keep = config.max_context.unwrap_or(tokens.len()).min(tokens.len());
            tokens[tokens.len() - keep..].to_vec()
        })
        .collect();
    let (tokens, padding) = left_pad(&windows, config.pad_token, device);
    let mut cache = model.new_cache(histories.len());
    let positions = tokens.dims()[1];
    let last = model.forward_last(tokens, padding, &mut cache);
    (cache, positions, last)
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
pub(crate) fn left_pad(
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::generate::{BeamSearchConfig, beam_search};
    use crate::model::{CausalLm, CausalLmConfig};
    use crate::position::RopeConfig;
    use crate::test_utils::model_test_devices;

    fn tiny_model(vocab: usize, device: &Device) -> CausalLm {
        CausalLmConfig::new(vocab, 32, 2, 4, 64, RopeConfig::new(8))
            .with_n_kv_heads(Some(2))
            .with_norm_eps(1e-5)
            .init(device)
    }

    /// The loop `max_context` must agree with: every token is chosen from a whole
    /// forward pass over the latest `context` tokens alone (positions from 0), with no
    /// cache.
    fn windowed_reference(
        model: &CausalLm,
        prompt: &[u32],
        new_tokens: usize,
        context: usize,
        sampling: SamplingConfig,
    ) -> Vec<u32> {
        let device = LanguageModel::device(model);
        let vocab = model.vocab_size();
        let mut sampler = Sampler::new(sampling).unwrap();
        let mut tokens = prompt.to_vec();
        for _ in 0..new_tokens {
            let window = &tokens[tokens.len().saturating_sub(context)..];
            let ids: Vec<i64> = window.iter().map(|&t| t as i64).collect();
            let input =
                Tensor::<2, Int>::from_data(TensorData::new(ids, [1, window.len()]), &device);
            let last = window.len() - 1;
            let logits = model.forward(input, None).narrow(1, last, 1); // [1, 1, vocab]
            let mut logits = last_logits(logits, 1, vocab).remove(0);
            tokens.push(sampler.choose(&mut logits, &tokens));
        }
        tokens.split_off(prompt.len())
    }

    #[test]
    fn max_context_predicts_from_the_latest_window_as_a_full_pass_does() {
        for device in model_test_devices() {
            let model = tiny_model(11, &device);
            for (prompt, context) in [(vec![1, 2, 3], 8), (vec![4, 9, 2, 7, 7, 1, 3, 5, 0, 2], 4)] {
                for sampling in [SamplingConfig::greedy(), SamplingConfig::sample(1.0, 5)] {
                    let expected =
                        windowed_reference(&model, &prompt, 20, context, sampling.clone());
                    let config = GenerationConfig::greedy(20)
                        .with_sampling(sampling)
                        .with_max_context(Some(context));
                    let mut streamed = Vec::new();
                    let got = generate(&model, std::slice::from_ref(&prompt), &config, |event| {
                        streamed.push(event.token)
                    })
                    .unwrap()
                    .remove(0);
                    assert_eq!(got.tokens, expected, "{device:?}, context {context}");
                    assert_eq!(streamed, expected, "streamed as chosen");
                    assert!(got.tokens.iter().all(|&t| t < 11));
                }
            }
        }
    }

    #[test]
    fn max_context_keeps_each_row_of_a_padded_batch_to_its_own_window() {
        let device = Device::flex();
        let model = tiny_model(13, &device);
        let prompts = vec![vec![1, 2], vec![3, 4, 5, 6, 7, 8, 9]];
        let config = GenerationConfig::greedy(12).with_max_context(Some(5));
        let batched = generate(&model, &prompts, &config, |_| {}).unwrap();
        for (prompt, output) in prompts.iter().zip(&batched) {
            let alone = windowed_reference(&model, prompt, 12, 5, SamplingConfig::greedy());
            assert_eq!(output.tokens, alone, "prompt {prompt:?}");
        }
        let zero = GenerationConfig::greedy(1).with_max_context(Some(0));
        assert!(matches!(
            generate(&model, &prompts, &zero, |_| {}),
            Err(GenerateError::InvalidSetting { .. })
        ));
    }

    /// A model with learned positions generates past them, each token predicted from
    /// as many of the latest tokens as it has positions (a padded batch too); beam
    /// search, which keeps whole sequences, refuses to go past them.
    #[test]
    fn learned_positions_bound_the_context() {
        let device = Device::flex();
        let model = crate::model::causal_lm_tests::small_gpt().init(&device);
        let positions = model.max_positions().unwrap();
        let prompts = vec![vec![1, 2, 3], vec![3, 4, 5, 6, 7, 8, 9]];
        let config = GenerationConfig::greedy(12);
        let batched = generate(&model, &prompts, &config, |_| {}).unwrap();
        for (prompt, output) in prompts.iter().zip(&batched) {
            let alone = windowed_reference(&model, prompt, 12, positions, SamplingConfig::greedy());
            assert_eq!(output.tokens, alone, "prompt {prompt:?}");
        }
        let narrower = GenerationConfig::greedy(12).with_max_context(Some(5));
        let output = generate(&model, &prompts[..1], &narrower, |_| {}).unwrap();
        let alone = windowed_reference(&model, &prompts[0], 12, 5, SamplingConfig::greedy());
        assert_eq!(output[0].tokens, alone, "the smaller context wins");

        // The longest prompt (7 tokens) and 2 new ones fill the 8 positions.
        let fits = BeamSearchConfig::new(2, 2);
        assert!(beam_search(&model, &prompts, &fits).is_ok());
        let error = beam_search(&model, &prompts, &BeamSearchConfig::new(2, 3)).unwrap_err();
        assert!(error.to_string().contains("8 learned positions"), "{error}");
    }
}
