//! Self-speculative greedy decoding with the model's own multi-token-prediction
//! module (DeepSeek-V3 §2.2 and §5.4.3): each step the module drafts the token after
//! next, and one pass of the model over `[next, draft]` both checks the draft and, when
//! the draft is right, gives the token after it. Every emitted token is the model's own
//! greedy choice, so the output is plain greedy decoding's; a right draft saves one
//! pass of the model.
//!
//! ```text
//! known: cache up to token n, next = t(n+1) (the model's choice), MTP cache up to n−1
//! 1. draft  = argmax MTP(h(n), t(n+1))                       (predicts t(n+2))
//! 2. logits = model([t(n+1), draft])     → choice at n+1, and at n+2 if the draft holds
//! 3. choice == draft: emit draft and the choice at n+2 (two tokens for one pass)
//!    otherwise:       restore the cache to n, run [t(n+1)] alone, emit its choice
//! ```
//!
//! A rejected draft costs one more pass of a single token: the caches cannot drop a
//! position (sliding-window caches have already rolled), so the step restarts from a
//! copy taken before it (copies share the tensors, they do not duplicate them). The
//! multi-token-prediction module only ever reads positions whose next token is
//! decided, so its cache never rolls back.

use burn::tensor::{Int, Tensor, TensorData};

use super::generation::check_prompts;
use super::{GenerateError, Generated, GenerationConfig, SamplingConfig, StopReason};
use crate::model::CausalLm;

/// What [`generate_speculative`] did besides the tokens.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SpeculativeOutput {
    /// The continuation, equal to greedy decoding's.
    pub generated: Generated,
    /// Drafts proposed by the multi-token-prediction module.
    pub drafted: usize,
    /// Drafts the model agreed with (each saved one pass of the model).
    pub accepted: usize,
    /// Passes of the model (prefill included; a rejected draft costs two).
    pub model_passes: usize,
}

impl SpeculativeOutput {
    /// The share of drafts the model agreed with (0 when nothing was drafted).
    pub fn acceptance_rate(&self) -> f64 {
        match self.drafted {
            0 => 0.0,
            drafted => self.accepted as f64 / drafted as f64,
        }
    }
}

/// Continues one prompt greedily, drafting with the model's first multi-token-
/// prediction module and verifying with the model (see the module docs); calls
/// `on_token` with every new token as soon as it is decided.
///
/// # Errors
/// [`GenerateError::InvalidSetting`] for a model without multi-token prediction
/// (`speculative`), sampling other than greedy (`sampling`) or a `max_context`
/// (`max_context`: the drafts need the whole cache); an empty prompt or a token
/// outside the vocabulary as [`generate`](super::generate).
pub fn generate_speculative(
    model: &CausalLm,
    prompt: &[u32],
    config: &GenerationConfig,
    mut on_token: impl FnMut(u32),
) -> Result<SpeculativeOutput, GenerateError> {
    check_settings(model, config)?;
    check_prompts(&[prompt.to_vec()], model.vocab_size(), config.pad_token)?;
    let device = model.device();
    let row = |tokens: &[u32]| {
        let data: Vec<i64> = tokens.iter().map(|&t| t as i64).collect();
        Tensor::<2, Int>::from_data(TensorData::new(data, [1, tokens.len()]), &device)
    };
    let mut tokens = Vec::with_capacity(config.max_new_tokens);
    let mut output = SpeculativeOutput {
        generated: Generated {
            tokens: Vec::new(),
            stop: StopReason::MaxNewTokens,
        },
        drafted: 0,
        accepted: 0,
        model_passes: 1,
    };
    if config.max_new_tokens == 0 {
        return Ok(output);
    }
    // Emits a token; `false` once generation is over.
    let mut emit = |token: u32, tokens: &mut Vec<u32>| {
        tokens.push(token);
        on_token(token);
        !config.stop_tokens.contains(&token) && tokens.len() < config.max_new_tokens
    };

    let mut cache = model.new_cache();
    let mut mtp_caches = model.new_mtp_caches();
    let mtp_cache = &mut mtp_caches[0];
    // The draft module reads every prompt state; the first choice needs the last
    // position's logits only.
    let hidden = model.cached_states(row(prompt), &mut cache, None, prompt.len());
    let last = hidden.clone().narrow(1, prompt.len() - 1, 1);
    let mut next = greedy_choices(model.logits(last))[0];
    let mut going = emit(next, &mut tokens);
    // The MTP module's inputs not yet in its cache: states whose next token is known.
    let mut pending_hidden = hidden;
    let mut pending_next: Vec<u32> = prompt[1..].iter().copied().chain([next]).collect();
    while going {
        let draft_logits = model
            .draft_cached(pending_hidden, row(&pending_next), mtp_cache)
            .expect("checked: the model has a multi-token-prediction module");
        let draft = *greedy_choices(draft_logits)
            .last()
            .expect("one position at least");
        output.drafted += 1;

        let before = cache.clone();
        let (logits, hidden) =
            model.forward_cached_with_hidden(row(&[next, draft]), &mut cache, None);
        output.model_passes += 1;
        let choices = greedy_choices(logits);
        if choices[0] == draft {
            output.accepted += 1;
            going = emit(draft, &mut tokens);
            if going {
                going = emit(choices[1], &mut tokens);
            }
            pending_hidden = hidden;
            pending_next = vec![draft, choices[1]];
            next = choices[1];
        } else {
            cache = before;
            let (logits, hidden) = model.forward_cached_with_hidden(row(&[next]), &mut cache, None);
            output.model_passes += 1;
            let choice = greedy_choices(logits)[0];
            going = emit(choice, &mut tokens);
            pending_hidden = hidden;
            pending_next = vec![choice];
            next = choice;
        }
    }
    let stopped = tokens
        .last()
        .is_some_and(|token| config.stop_tokens.contains(token));
    output.generated = Generated {
        tokens,
        stop: match stopped {
            true => StopReason::StopToken,
            false => StopReason::MaxNewTokens,
        },
    };
    Ok(output)
}

/// The settings self-speculative decoding supports.
fn check_settings(model: &CausalLm, config: &GenerationConfig) -> Result<(), GenerateError> {
    if model.mtp_depth() == 0 {
        return Err(GenerateError::InvalidSetting {
            setting: "speculative",
            reason: "the model has no multi-token-prediction module to draft with (train \
                     one with mtp_depth ≥ 1, or load a checkpoint that has one)"
                .into(),
        });
    }
    if let Some(length) = model.cache_rebuild_length() {
        return Err(GenerateError::InvalidSetting {
            setting: "speculative",
            reason: format!(
                "the model's rotary embedding (LongRoPE) changes every position's rotation \
                 once the sequence passes {length} tokens, which the drafting cache cannot \
                 follow; decode with generate"
            ),
        });
    }
    if config.sampling != SamplingConfig::greedy() {
        return Err(GenerateError::InvalidSetting {
            setting: "sampling",
            reason: "self-speculative decoding is greedy; drop the sampling settings".into(),
        });
    }
    if config.max_context.is_some() {
        return Err(GenerateError::InvalidSetting {
            setting: "max_context",
            reason: "self-speculative decoding keeps the whole context".into(),
        });
    }
    Ok(())
}

/// The most likely token at every position of a single row.
///
/// # Shapes
/// - logits: `[1, seq, vocab]`
fn greedy_choices(logits: Tensor<3>) -> Vec<u32> {
    let [_, seq, _] = logits.dims();
    let choices = logits.argmax(2).reshape([seq]).into_data();
    choices
        .convert::<i64>()
        .try_into_vec::<i64>()
        .expect("argmax gives integers")
        .into_iter()
        .map(|token| token as u32)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::generate::generate;
    use crate::model::CausalLmConfig;
    use crate::position::RopeConfig;
    use crate::test_utils::model_test_devices;
    use burn::tensor::Device;

    fn config() -> CausalLmConfig {
        CausalLmConfig::new(12, 32, 2, 4, 48, RopeConfig::new(8))
            .with_n_kv_heads(Some(2))
            .with_mtp_depth(1)
    }

    fn plain_greedy(model: &CausalLm, prompt: &[u32], config: &GenerationConfig) -> Vec<u32> {
        generate(model, &[prompt.to_vec()], config, |_| {})
            .unwrap()
            .remove(0)
            .tokens
    }

    /// Untrained, the drafts are mostly wrong: every rejection path runs, and the
    /// tokens are greedy decoding's.
    #[test]
    fn rejected_drafts_keep_greedy_tokens() {
        for device in model_test_devices() {
            device.seed(8);
            let model = config().init(&device);
            let settings = GenerationConfig::greedy(12);
            let prompt = [3, 1, 4, 1, 5];
            let mut streamed = Vec::new();
            let output =
                generate_speculative(&model, &prompt, &settings, |t| streamed.push(t)).unwrap();
            assert_eq!(
                output.generated.tokens,
                plain_greedy(&model, &prompt, &settings)
            );
            assert_eq!(streamed, output.generated.tokens);
            assert_eq!(output.generated.stop, StopReason::MaxNewTokens);
            assert!(output.drafted > 0);
            // Each draft costs one pass, and one more when rejected.
            assert_eq!(
                output.model_passes,
                1 + output.drafted + (output.drafted - output.accepted)
            );
        }
    }

    /// Trained on a repeating sequence, the module drafts right: accepted drafts give
    /// two tokens per pass, and the tokens are still greedy decoding's (stop tokens
    /// and the length limit included).
    #[cfg(feature = "train")]
    #[test]
    fn accepted_drafts_keep_greedy_tokens() {
        use burn::module::Module;
        use burn::optim::{AdamWConfig, GradientsParams};
        use burn::tensor::activation::log_softmax;

        let device = Device::flex().autodiff();
        device.seed(9);
        let mut model = config().init(&device);
        let period: Vec<i64> = vec![0, 3, 7, 1, 9, 4, 11];
        let sequence: Vec<i64> = period.iter().cycle().take(33).copied().collect();
        let tokens = |range: std::ops::Range<usize>| {
            Tensor::<2, Int>::from_data(
                TensorData::new(sequence[range.clone()].to_vec(), [1, range.len()]),
                &device,
            )
        };
        let nll = |logits: Tensor<3>, targets: Tensor<2, Int>| {
            let [_, seq, vocab] = logits.dims();
            let log_probs = log_softmax(logits.reshape([seq, vocab]), 1);
            -log_probs.gather(1, targets.reshape([seq, 1])).mean()
        };
        let mut optimizer = AdamWConfig::new().init();
        for _ in 0..150 {
            let output = model.forward_with_mtp(tokens(0..32));
            let loss = nll(output.logits, tokens(1..33))
                + nll(output.mtp_logits[0].clone(), tokens(2..33));
            let grads = GradientsParams::from_grads(loss.backward(), &model);
            model = optimizer.step(1e-2, model, grads);
        }
        let model = model.valid();
        let prompt = [0, 3, 7];
        let settings = GenerationConfig::greedy(17);
        let output = generate_speculative(&model, &prompt, &settings, |_| {}).unwrap();
        assert_eq!(
            output.generated.tokens,
            plain_greedy(&model, &prompt, &settings)
        );
        assert!(
            output.acceptance_rate() > 0.8,
            "drafts accepted: {} of {}",
            output.accepted,
            output.drafted
        );
        assert!(output.model_passes < 1 + settings.max_new_tokens);
        // A stop token ends the output where greedy decoding ends it.
        let stopping = settings.with_stop_tokens(vec![9]);
        let output = generate_speculative(&model, &prompt, &stopping, |_| {}).unwrap();
        assert_eq!(
            output.generated.tokens,
            plain_greedy(&model, &prompt, &stopping)
        );
        assert_eq!(output.generated.stop, StopReason::StopToken);
    }

    #[test]
    fn unsupported_settings_are_named() {
        let device = Device::flex();
        let without = config().with_mtp_depth(0).init(&device);
        let greedy = GenerationConfig::greedy(4);
        let error = generate_speculative(&without, &[1], &greedy, |_| {}).unwrap_err();
        assert!(matches!(
            error,
            GenerateError::InvalidSetting {
                setting: "speculative",
                ..
            }
        ));
        let model = config().init(&device);
        let sampled = greedy.clone().with_sampling(SamplingConfig::sample(0.8, 1));
        let error = generate_speculative(&model, &[1], &sampled, |_| {}).unwrap_err();
        assert!(matches!(
            error,
            GenerateError::InvalidSetting {
                setting: "sampling",
                ..
            }
        ));
        let error = generate_speculative(&model, &[], &greedy, |_| {}).unwrap_err();
        assert_eq!(error, GenerateError::EmptyPrompt { row: 0 });
        let error = generate_speculative(&model, &[40], &greedy, |_| {}).unwrap_err();
        assert!(matches!(error, GenerateError::TokenOutOfVocabulary { .. }));
    }
}
