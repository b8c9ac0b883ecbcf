//! Batched beam search with length penalty and early stopping, as Hugging Face's
//! `generate(num_beams=…)`.
//!
//! Each prompt keeps `num_beams` running hypotheses, all rows of one batch through the
//! model. A step scores every continuation of every beam by its summed log
//! probability (with the repetition penalty applied to each step's log probabilities,
//! as transformers' processors are), keeps the `2·num_beams` best per prompt, moves those ending in a stop
//! token to the finished list (scored `sum_logprobs / generated_len^length_penalty`)
//! and continues the best `num_beams` others, reordering the KV caches to follow
//! their beams.

use burn::tensor::{Int, Tensor, TensorData};

use super::GenerateError;
use super::generation::{check_prompts, last_logits, left_pad};
use super::language_model::LanguageModel;
use super::sampler::{apply_repetition_penalty, log_softmax};

/// When a prompt's search is done (HF's `early_stopping`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EarlyStopping {
    /// As soon as `num_beams` hypotheses finished (HF `True`).
    Immediate,
    /// When no running beam can beat the worst finished one, judged at the current
    /// length (HF `False`, the default).
    Heuristic,
    /// Only when no running beam can beat the worst finished one at any length up
    /// to `max_new_tokens` (HF `"never"`: the canonical beam search).
    Never,
}

/// Settings of [`beam_search`].
#[derive(Debug, Clone, PartialEq)]
pub struct BeamSearchConfig {
    /// Number of beams per prompt; 1 is greedy decoding. Default: 4.
    pub num_beams: usize,
    /// At most this many new tokens. Default: 32.
    pub max_new_tokens: usize,
    /// Exponent of the length normalization: scores are divided by
    /// `generated_len^length_penalty`; > 0 favours longer outputs. Default: 1.
    pub length_penalty: f32,
    /// When to stop. Default: [`EarlyStopping::Heuristic`].
    pub early_stopping: EarlyStopping,
    /// HF's `repetition_penalty`: a step's log probability of every token already in
    /// the prompt or the beam is multiplied by it (they are negative, so > 1 penalizes).
    /// Default: 1 (none).
    pub repetition_penalty: f32,
    /// Tokens that finish a hypothesis. Default: none.
    pub stop_tokens: Vec<u32>,
    /// Left padding and filler token. Default: 0.
    pub pad_token: u32,
}

impl Default for BeamSearchConfig {
    fn default() -> Self {
        Self {
            num_beams: 4,
            max_new_tokens: 32,
            length_penalty: 1.0,
            early_stopping: EarlyStopping::Heuristic,
            repetition_penalty: 1.0,
            stop_tokens: Vec::new(),
            pad_token: 0,
        }
    }
}

impl BeamSearchConfig {
    /// `num_beams` beams, at most `max_new_tokens` tokens, other settings default.
    pub fn new(num_beams: usize, max_new_tokens: usize) -> Self {
        Self {
            num_beams,
            max_new_tokens,
            ..Self::default()
        }
    }
}

crate::builders::setters!(BeamSearchConfig {
    /// Sets the length penalty.
    with_length_penalty => length_penalty: f32,
    /// Sets the early stopping rule.
    with_early_stopping => early_stopping: EarlyStopping,
    /// Sets the repetition penalty.
    with_repetition_penalty => repetition_penalty: f32,
    /// Sets the stop tokens.
    with_stop_tokens => stop_tokens: Vec<u32>,
    /// Sets the padding token.
    with_pad_token => pad_token: u32,
});

/// One finished hypothesis.
#[derive(Debug, Clone, PartialEq)]
pub struct Hypothesis {
    /// The new tokens (with the stop token, if it ended with one).
    pub tokens: Vec<u32>,
    /// Summed log probability divided by `len^length_penalty`.
    pub score: f32,
}

/// The finished hypotheses of one prompt, best first, at most `num_beams`.
#[derive(Debug, Clone, Default)]
struct Finished {
    hypotheses: Vec<Hypothesis>,
    done: bool,
}

impl Finished {
    fn worst_score(&self) -> f32 {
        self.hypotheses
            .iter()
            .map(|h| h.score)
            .fold(f32::INFINITY, f32::min)
    }

    fn add(&mut self, hypothesis: Hypothesis, num_beams: usize) {
        if self.hypotheses.len() < num_beams || hypothesis.score > self.worst_score() {
            self.hypotheses.push(hypothesis);
            // Stable: an earlier hypothesis wins ties, as in transformers.
            self.hypotheses.sort_by(|a, b| b.score.total_cmp(&a.score));
            self.hypotheses.truncate(num_beams);
        }
    }
}

/// A running beam.
#[derive(Debug, Clone)]
struct Beam {
    tokens: Vec<u32>,
    sum_logprobs: f32,
}

/// Beam search over a batch of prompts; returns the best hypotheses of each prompt,
/// best first (`num_beams` of them unless fewer finished).
///
/// # Errors
/// [`GenerateError`] for an empty batch or prompt, a token outside the vocabulary,
/// `num_beams == 0`, or sequences longer than a model's learned positions.
pub fn beam_search<M: LanguageModel>(
    model: &M,
    prompts: &[Vec<u32>],
    config: &BeamSearchConfig,
) -> Result<Vec<Vec<Hypothesis>>, GenerateError> {
    check_prompts(prompts, model.vocab_size(), config.pad_token)?;
    if config.num_beams == 0 {
        return Err(GenerateError::InvalidSetting {
            setting: "num_beams",
            reason: "must be at least 1".into(),
        });
    }
    if !(config.repetition_penalty.is_finite() && config.repetition_penalty > 0.0) {
        return Err(GenerateError::InvalidSetting {
            setting: "repetition_penalty",
            reason: format!("must be > 0, got {}", config.repetition_penalty),
        });
    }
    // Beams keep every token: the prompt, then the new ones but the last, are fed.
    let longest = prompts.iter().map(Vec::len).max().unwrap_or(0);
    if let Some(positions) = model.max_positions()
        && longest + config.max_new_tokens.max(1) - 1 > positions
    {
        return Err(GenerateError::InvalidSetting {
            setting: "max_new_tokens",
            reason: format!(
                "a prompt of {longest} tokens and {} new ones exceed the model's {positions} \
                 learned positions: ask for at most {} new tokens or shorten the prompt",
                config.max_new_tokens,
                (positions + 1).saturating_sub(longest)
            ),
        });
    }
    let beams_per_prompt = config.num_beams;
    let batch = prompts.len();
    let rows = batch * beams_per_prompt;
    let vocab = model.vocab_size();
    let device = model.device();
    let length_score = |sum: f32, len: usize| sum / (len.max(1) as f32).powf(config.length_penalty);

    // Row `b·num_beams + k` is beam k of prompt b.
    let expanded: Vec<Vec<u32>> = prompts
        .iter()
        .flat_map(|prompt| std::iter::repeat_n(prompt.clone(), beams_per_prompt))
        .collect();
    let mut finished: Vec<Finished> = vec![Finished::default(); batch];
    if config.max_new_tokens == 0 {
        return Ok(finished.into_iter().map(|f| f.hypotheses).collect());
    }
    // Only beam 0 starts live: the others are copies and would repeat its choices.
    let mut beams: Vec<Beam> = (0..rows)
        .map(|row| Beam {
            tokens: Vec::new(),
            sum_logprobs: if row % beams_per_prompt == 0 {
                0.0
            } else {
                f32::NEG_INFINITY
            },
        })
        .collect();

    let (tokens, padding) = left_pad(&expanded, config.pad_token, &device);
    let mut cache = model.new_cache(rows);
    let prompt_len = tokens.dims()[1];
    let mut last = model.forward_last(tokens, padding, &mut cache);
    let mut cached = prompt_len;

    for step in 0..config.max_new_tokens {
        let generated_len = step + 1;
        let row_logits = last_logits(last, rows, vocab);
        let mut next_beams: Vec<Beam> = Vec::with_capacity(rows);
        let mut source_rows: Vec<i64> = Vec::with_capacity(rows);
        for (prompt, finished) in finished.iter_mut().enumerate() {
            let first_row = prompt * beams_per_prompt;
            if finished.done {
                for k in 0..beams_per_prompt {
                    next_beams.push(beams[first_row + k].clone());
                    source_rows.push((first_row + k) as i64);
                }
                continue;
            }
            // Candidates (score, beam, token) of every beam of this prompt.
            let mut candidates: Vec<(f32, usize, u32)> = Vec::new();
            for k in 0..beams_per_prompt {
                let beam = &beams[first_row + k];
                if beam.sum_logprobs == f32::NEG_INFINITY {
                    continue;
                }
                let mut logprobs = log_softmax(&row_logits[first_row + k]);
                if config.repetition_penalty != 1.0 {
                    let history = [prompts[prompt].as_slice(), &beam.tokens].concat();
                    apply_repetition_penalty(&mut logprobs, &history, config.repetition_penalty);
                }
                for (token, logprob) in logprobs.into_iter().enumerate() {
                    candidates.push((beam.sum_logprobs + logprob, k, token as u32));
                }
            }
            // Best first; ties by beam then token, so results do not depend on sorting.
            candidates.sort_by(|a, b| b.0.total_cmp(&a.0).then(a.1.cmp(&b.1)).then(a.2.cmp(&b.2)));
            candidates.truncate(2 * beams_per_prompt);

            let mut chosen = 0;
            for (rank, &(score, k, token)) in candidates.iter().enumerate() {
                let beam = &beams[first_row + k];
                if config.stop_tokens.contains(&token) {
                    // A stop token among the worse half cannot displace running beams.
                    if rank < beams_per_prompt {
                        let mut tokens = beam.tokens.clone();
                        tokens.push(token);
                        finished.add(
                            Hypothesis {
                                score: length_score(score, generated_len),
                                tokens,
                            },
                            beams_per_prompt,
                        );
                    }
                } else if chosen < beams_per_prompt {
                    let mut tokens = beam.tokens.clone();
                    tokens.push(token);
                    next_beams.push(Beam {
                        tokens,
                        sum_logprobs: score,
                    });
                    source_rows.push((first_row + k) as i64);
                    chosen += 1;
                }
            }
            // Fewer candidates than beams (tiny vocabularies): pad with dead beams.
            while chosen < beams_per_prompt {
                next_beams.push(Beam {
                    tokens: vec![config.pad_token; generated_len],
                    sum_logprobs: f32::NEG_INFINITY,
                });
                source_rows.push(first_row as i64);
                chosen += 1;
            }
            let best_running = next_beams[first_row..first_row + beams_per_prompt]
                .iter()
                .map(|b| b.sum_logprobs)
                .fold(f32::NEG_INFINITY, f32::max);
            finished.done = is_done(
                finished,
                best_running,
                generated_len,
                config,
                beams_per_prompt,
            );
        }
        beams = next_beams;
        if finished.iter().all(|f| f.done) || step + 1 == config.max_new_tokens {
            break;
        }
        if model.cache_rebuild_length() == Some(cached) {
            // The sequences grow past the length at which cached keys go stale: run
            // every beam's whole sequence through a fresh cache.
            let sequences: Vec<Vec<u32>> = expanded
                .iter()
                .zip(&beams)
                .map(|(prompt, beam)| [prompt.as_slice(), &beam.tokens].concat())
                .collect();
            let (tokens, padding) = left_pad(&sequences, config.pad_token, &device);
            cache = model.new_cache(rows);
            cached = tokens.dims()[1];
            last = model.forward_last(tokens, padding, &mut cache);
            continue;
        }
        let indices = Tensor::<1, Int>::from_data(TensorData::new(source_rows, [rows]), &device);
        model.select_cache(&mut cache, indices);
        let next: Vec<i64> = beams
            .iter()
            .map(|b| b.tokens.last().copied().unwrap_or(config.pad_token) as i64)
            .collect();
        let tokens = Tensor::<2, Int>::from_data(TensorData::new(next, [rows, 1]), &device);
        last = model.forward_step(tokens, None, &mut cache);
        cached += 1;
    }

    // Prompts still searching at the end keep their running beams as hypotheses.
    for (prompt, finished) in finished.iter_mut().enumerate() {
        if finished.done {
            continue;
        }
        for k in 0..beams_per_prompt {
            let beam = &beams[prompt * beams_per_prompt + k];
            if beam.sum_logprobs > f32::NEG_INFINITY {
                finished.add(
                    Hypothesis {
                        score: length_score(beam.sum_logprobs, beam.tokens.len()),
                        tokens: beam.tokens.clone(),
                    },
                    beams_per_prompt,
                );
            }
        }
    }
    Ok(finished.into_iter().map(|f| f.hypotheses).collect())
}

/// Whether a prompt's search can stop (HF's `BeamHypotheses.is_done`).
fn is_done(
    finished: &Finished,
    best_running_sum: f32,
    generated_len: usize,
    config: &BeamSearchConfig,
    num_beams: usize,
) -> bool {
    if finished.hypotheses.len() < num_beams {
        return false;
    }
    let best_possible = match config.early_stopping {
        EarlyStopping::Immediate => return true,
        EarlyStopping::Heuristic => {
            best_running_sum / (generated_len as f32).powf(config.length_penalty)
        }
        EarlyStopping::Never => {
            // With a positive penalty the best case is the longest; otherwise now.
            let len = if config.length_penalty > 0.0 {
                config.max_new_tokens
            } else {
                generated_len
            };
            best_running_sum / (len as f32).powf(config.length_penalty)
        }
    };
    finished.worst_score() >= best_possible
}
