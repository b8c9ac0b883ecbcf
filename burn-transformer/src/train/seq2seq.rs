//! Sequence-to-sequence training of the encoder-decoder [`Transformer`] on the
//! generated digit tasks of [`digits`](super::digits) (reverse, sort or add digit
//! strings: tasks that need attention).
//!
//! Training is teacher forced (the decoder reads the target shifted right behind a
//! start token), with label smoothing, the Noam schedule and padding masks on both
//! sides (examples have different lengths). Evaluation decodes held-out examples
//! greedily and with beam search and counts exact matches.

use std::sync::Arc;

use burn::config::Config;
use burn::module::Module;
use burn::tensor::{Device, Tensor};
use burn::train::metric::AccuracyMetric;
use burn::train::{InferenceStep, Learner, SequenceOutput, TrainOutput, TrainStep};

use super::data::digits::{BOS, EOS, PAD, VOCAB_SIZE, pad_rows};
use super::data::{DigitTask, Example, Seq2SeqBatch, Seq2SeqLoader};
use super::progress::History;
use super::run::{RunOptions, Schedule, check_resumed_model, launch, prepare};
use super::step::{StepPart, StepSettings, adamw, require_positive, train_step, validation_output};
use super::{TrainError, cross_entropy, host_init, noam, to_training_device};
use crate::generate::{BeamSearchConfig, GenerationConfig, Seq2SeqDecoding, beam_search, generate};
use crate::model::{Transformer, TransformerConfig};

/// The encoder-decoder [`Transformer`] as a burn-train model: teacher-forced cross
/// entropy over the non-padding target positions.
#[derive(Module, Debug)]
pub struct Seq2SeqTask {
    /// The model.
    pub model: Transformer,
    #[module(skip)]
    settings: StepSettings,
}

impl Seq2SeqTask {
    /// Wraps `model` for training.
    pub fn new(model: Transformer, settings: StepSettings) -> Self {
        Self { model, settings }
    }

    /// Teacher-forced logits of a batch.
    ///
    /// # Shapes
    /// - output: `[batch, seq_tgt, vocab]`
    pub fn logits(&self, batch: &Seq2SeqBatch) -> Tensor<3> {
        self.model.forward(
            batch.source.clone(),
            batch.target_input.clone(),
            Some(batch.source_padding.clone()),
            Some(batch.target_padding.clone()),
        )
    }
}

impl TrainStep for Seq2SeqTask {
    type Input = Seq2SeqBatch;
    type Output = SequenceOutput;

    fn step(&self, batch: Seq2SeqBatch) -> TrainOutput<SequenceOutput> {
        let (device, targets) = (batch.source.device(), batch.target_output.clone());
        train_step(
            self,
            &self.settings,
            &device,
            StepPart {
                step: batch.step,
                share: batch.share,
                micro_batches: 1,
                scaler: None,
            },
            targets,
            |_| {
                let logits = self.logits(&batch);
                let loss = cross_entropy(
                    logits.clone(),
                    batch.target_output.clone(),
                    self.settings.label_smoothing,
                    Some(PAD),
                );
                (loss, logits)
            },
        )
    }
}

impl InferenceStep for Seq2SeqTask {
    type Input = Seq2SeqBatch;
    type Output = SequenceOutput;

    fn step(&self, batch: Seq2SeqBatch) -> SequenceOutput {
        validation_output(self.logits(&batch), batch.target_output, Some(PAD))
    }
}

/// Settings of a sequence-to-sequence run on a [`DigitTask`].
#[derive(Config, Debug)]
pub struct Seq2SeqTrainingConfig {
    /// The task. Default: reverse.
    #[config(default = "DigitTask::Reverse")]
    pub task: DigitTask,
    /// Fewest digits per number. Default: 3.
    #[config(default = 3)]
    pub min_len: usize,
    /// Most digits per number. Default: 10.
    #[config(default = 10)]
    pub max_len: usize,
    /// Examples per batch. Default: 64.
    #[config(default = 64)]
    pub batch_size: usize,
    /// Optimizer steps. Default: 1200.
    #[config(default = 1200)]
    pub steps: usize,
    /// Validate and checkpoint every this many steps. Default: 200.
    #[config(default = 200)]
    pub eval_interval: usize,
    /// Held-out batches per validation. Default: 4.
    #[config(default = 4)]
    pub eval_batches: usize,
    /// Scale of the Noam schedule. Default: 1.
    #[config(default = 1.0)]
    pub noam_factor: f64,
    /// Warm-up steps of the Noam schedule. Default: 200.
    #[config(default = 200)]
    pub warmup_steps: usize,
    /// Label smoothing (the paper's 0.1). Default: 0.1.
    #[config(default = 0.1)]
    pub label_smoothing: f64,
    /// Global gradient-norm clip. Default: 1.0.
    #[config(default = "Some(1.0)")]
    pub grad_clip: Option<f64>,
    /// AdamW weight decay (matrices only). Default: 0.
    #[config(default = 0.0)]
    pub weight_decay: f64,
    /// Seed of initialization, examples and dropout. Default: 42.
    #[config(default = 42)]
    pub seed: u64,
}

impl Seq2SeqTrainingConfig {
    /// Checks the settings.
    ///
    /// # Errors
    /// [`TrainError::InvalidSetting`] naming the flag.
    pub fn validate(&self) -> Result<(), TrainError> {
        require_positive(&[
            ("min-len", self.min_len),
            ("batch-size", self.batch_size),
            ("steps", self.steps),
            ("eval-interval", self.eval_interval),
            ("eval-batches", self.eval_batches),
            ("warmup", self.warmup_steps),
        ])?;
        if self.max_len < self.min_len || self.max_len > 30 {
            return Err(TrainError::setting(
                "max-len",
                format!(
                    "must be in [min-len = {}, 30], got {}",
                    self.min_len, self.max_len
                ),
            ));
        }
        self.step_settings().validate()?;
        if !(self.noam_factor.is_finite() && self.noam_factor > 0.0) {
            return Err(TrainError::setting(
                "noam-factor",
                format!("must be positive, got {}", self.noam_factor),
            ));
        }
        Ok(())
    }

    /// What each training step of this run needs.
    pub fn step_settings(&self) -> StepSettings {
        StepSettings {
            label_smoothing: self.label_smoothing,
            grad_clip: self.grad_clip,
            seed: self.seed,
        }
    }
}

/// The outcome of [`train_seq2seq`].
#[derive(Debug)]
pub struct Seq2SeqRunResult {
    /// The trained model (eval mode, non-autodiff device).
    pub model: Transformer,
    /// Every loss of the run.
    pub history: History,
    /// The step the run started from.
    pub start_step: usize,
}

/// Trains a [`Transformer`] of `model_config` on `training.task` with burn-train
/// (AdamW with β = (0.9, 0.98), ε = 1e-9 and the Noam schedule, as the paper).
///
/// # Errors
/// [`TrainError`] for invalid settings, a vocabulary that is not
/// [`VOCAB_SIZE`], a missing checkpoint when resuming, or a burn-train failure.
pub fn train_seq2seq(
    model_config: &TransformerConfig,
    training: &Seq2SeqTrainingConfig,
    device: &Device,
    options: &RunOptions,
) -> Result<Seq2SeqRunResult, TrainError> {
    training.validate()?;
    options.check_parallel_batch(training.batch_size)?;
    model_config.validate()?;
    if model_config.src_vocab_size != VOCAB_SIZE || model_config.tgt_vocab_size != VOCAB_SIZE {
        return Err(TrainError::setting(
            "vocab-size",
            format!("digit tasks have {VOCAB_SIZE} token ids on both sides"),
        ));
    }
    let schedule = Schedule {
        steps: training.steps,
        eval_interval: training.eval_interval,
        tokens_per_step: training.batch_size * (training.task.max_target_len(training.max_len) + 1),
        checkpoint_activations: false,
    };
    let prepared = prepare(options, schedule)?;
    let model = host_init(training.seed, |host| model_config.try_init(host))?;
    let task = Seq2SeqTask::new(model, training.step_settings());
    check_resumed_model(&task, options, &prepared)?;

    let autodiff = device.clone().autodiff();
    let task = to_training_device(task, device);
    let learner = Learner::new(
        task,
        adamw(0.9, 0.98, 1e-9, training.weight_decay as f32),
        noam(
            training.noam_factor,
            training.warmup_steps,
            model_config.d_model,
        )?,
    );
    let train_loader = Seq2SeqLoader::training(
        training.task,
        training.min_len,
        training.max_len,
        training.batch_size,
        training.eval_interval,
        training.steps,
        training.seed,
        prepared.resumed_epoch.unwrap_or(0),
        &autodiff,
    )
    .with_first_step(prepared.start_step);
    let valid_loader = Seq2SeqLoader::validation(
        training.task,
        training.min_len,
        training.max_len,
        training.batch_size,
        training.eval_batches,
        training.seed,
        device,
    );
    let (task, history) = launch(
        learner,
        Arc::new(train_loader),
        Arc::new(valid_loader),
        AccuracyMetric::new().with_pad_token(PAD as usize),
        device,
        options,
        schedule,
        &prepared,
    )?;
    Ok(Seq2SeqRunResult {
        model: task.model,
        history,
        start_step: prepared.start_step,
    })
}

/// Exact-match accuracy of greedy and beam decoding.
#[derive(Debug, Clone)]
pub struct Seq2SeqEvaluation {
    /// Examples evaluated.
    pub examples: usize,
    /// Fraction decoded exactly (and stopped) by greedy decoding.
    pub greedy: f64,
    /// Fraction decoded exactly by beam search (its best hypothesis), if run.
    pub beam: Option<f64>,
    /// A few greedy mistakes: (source, expected, decoded), rendered.
    pub mistakes: Vec<(String, String, String)>,
}

/// Decodes `examples` greedily and, with `num_beams > 1`, with beam search, in
/// batches of `batch_size`, and counts outputs equal to the target followed by
/// [`EOS`].
///
/// # Errors
/// [`TrainError::InvalidSetting`] when decoding rejects its settings.
pub fn evaluate_exact_match(
    model: &Transformer,
    examples: &[Example],
    max_target_len: usize,
    num_beams: usize,
    batch_size: usize,
) -> Result<Seq2SeqEvaluation, TrainError> {
    let device = model.embed_tokens.weight.device();
    let decode_error =
        |error: crate::generate::GenerateError| TrainError::setting("decoding", error.to_string());
    let expected = |example: &Example| {
        let mut tokens = example.target.clone();
        tokens.push(EOS);
        tokens
    };
    let mut greedy_hits = 0;
    let mut beam_hits = 0;
    let mut mistakes = Vec::new();
    for chunk in examples.chunks(batch_size.max(1)) {
        let sources: Vec<Vec<u32>> = chunk.iter().map(|e| e.source.clone()).collect();
        let (source, padding) = pad_rows(&sources, &device);
        let memory = model.encode(source, Some(padding.clone()));
        let decoding = Seq2SeqDecoding::new(model, memory, Some(padding));
        let prompts = vec![vec![BOS]; chunk.len()];
        let greedy = generate(
            &decoding,
            &prompts,
            &GenerationConfig::greedy(max_target_len + 1)
                .with_stop_tokens(vec![EOS])
                .with_pad_token(PAD),
            |_| {},
        )
        .map_err(decode_error)?;
        for (example, output) in chunk.iter().zip(&greedy) {
            if output.tokens == expected(example) {
                greedy_hits += 1;
            } else if mistakes.len() < 5 {
                // The decoded text up to its EOS; a missing EOS is a mistake too.
                let decoded = match output.tokens.split_last() {
                    Some((&EOS, body)) => DigitTask::render(body),
                    _ => format!("{} (no end token)", DigitTask::render(&output.tokens)),
                };
                mistakes.push((
                    DigitTask::render(&example.source),
                    DigitTask::render(&example.target),
                    decoded,
                ));
            }
        }
        if num_beams > 1 {
            let mut config = BeamSearchConfig::new(num_beams, max_target_len + 1);
            config.stop_tokens = vec![EOS];
            config.pad_token = PAD;
            let beams = beam_search(&decoding, &prompts, &config).map_err(decode_error)?;
            for (example, hypotheses) in chunk.iter().zip(&beams) {
                if hypotheses.first().map(|h| &h.tokens) == Some(&expected(example)) {
                    beam_hits += 1;
                }
            }
        }
    }
    let total = examples.len().max(1) as f64;
    Ok(Seq2SeqEvaluation {
        examples: examples.len(),
        greedy: greedy_hits as f64 / total,
        beam: (num_beams > 1).then(|| beam_hits as f64 / total),
        mistakes,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::block::BlockKind;
    use crate::io::tests::TempDir;
    use crate::train::test_examples;
    use crate::train::tests::interrupted_copy;

    /// Without dropout: dropout masks come from the device's random generator, which
    /// tests running in parallel share. The program's test
    /// (`examples/tests/train_seq2seq_cli.rs`) checks resuming with dropout, in a
    /// process of its own.
    #[test]
    fn training_resumes_exactly_and_decodes() {
        let model = TransformerConfig::tiny(VOCAB_SIZE, VOCAB_SIZE)
            .with_block_kind(BlockKind::PreNorm)
            .with_dropout(0.0)
            .with_share_embeddings(true);
        let training = Seq2SeqTrainingConfig::new()
            .with_min_len(2)
            .with_max_len(4)
            .with_batch_size(16)
            .with_steps(9)
            .with_eval_interval(3)
            .with_eval_batches(1)
            .with_warmup_steps(3);
        let device = Device::flex();
        let straight = TempDir::with_prefix("s2s-straight").unwrap();
        let full = train_seq2seq(
            &model,
            &training,
            &device,
            &RunOptions::quiet(straight.path()),
        )
        .unwrap();
        assert_eq!(full.history.train.len(), 9);
        assert_eq!(full.history.validation.len(), 3);
        assert!(full.history.validation.iter().all(|p| p.accuracy.is_some()));
        let first = full.history.train[0].loss;
        let last = full.history.train[8].loss;
        assert!(last < first, "the loss should fall: {first} -> {last}");

        // Resume from round 2.
        let crashed = TempDir::with_prefix("s2s-crashed").unwrap();
        interrupted_copy(straight.path(), crashed.path());
        let options = RunOptions {
            resume: true,
            ..RunOptions::quiet(crashed.path())
        };
        let resumed = train_seq2seq(&model, &training, &device, &options).unwrap();
        assert_eq!(resumed.start_step, 6);
        assert_eq!(resumed.history.train, full.history.train);
        assert_eq!(resumed.history.validation, full.history.validation);

        let examples = test_examples(DigitTask::Reverse, 2, 4, 12, 1);
        let evaluation = evaluate_exact_match(&full.model, &examples, 4, 2, 5).unwrap();
        assert_eq!(evaluation.examples, 12);
        assert!((0.0..=1.0).contains(&evaluation.greedy));
        assert!(evaluation.beam.is_some_and(|b| (0.0..=1.0).contains(&b)));
    }
}
