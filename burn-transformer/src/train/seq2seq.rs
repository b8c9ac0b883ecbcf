//! Sequence-to-sequence training of the encoder-decoder [`Transformer`] on generated
//! digit tasks that need attention: reversing a digit string (each output digit is
//! read from a position that moves with the output), sorting it, or adding two
//! numbers.
//!
//! Training is teacher forced (the decoder reads the target shifted right behind a
//! start token), with label smoothing, the Noam schedule and padding masks on both
//! sides (examples have different lengths). Evaluation decodes held-out examples
//! greedily and with beam search and counts exact matches. Held-out examples are
//! disjoint from training ones by construction: an example is held out when a hash
//! of its source falls in one tenth of the hash space, and the training stream
//! never emits those.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use burn::config::Config;
use burn::data::dataloader::{DataLoader, DataLoaderIterator, Progress};
use burn::data::dataset::DatasetError;
use burn::module::Module;
use burn::optim::GradientsParams;
use burn::tensor::{Bool, Device, Int, Tensor, TensorData};
use burn::train::metric::{AccuracyMetric, LearningRateMetric, LossMetric};
use burn::train::{
    InferenceStep, Learner, SequenceOutput, SupervisedTraining, TrainOutput, TrainStep,
};

use super::lm::{StepSettings, adamw};
use super::progress::History;
use super::run::{RunOptions, Schedule, configure, finish, prepare};
use super::{
    SplitMix64, TrainError, clip_grad_norm, cross_entropy, host_init, noam, step_seed,
    to_training_device,
};
use crate::generate::{BeamSearchConfig, GenerationConfig, Seq2SeqDecoding, beam_search, generate};
use crate::model::{Transformer, TransformerConfig};

/// Padding (never predicted: left out of the loss).
pub const PAD: u32 = 0;
/// Start of the decoder's input.
pub const BOS: u32 = 1;
/// End of the target.
pub const EOS: u32 = 2;
/// The id of digit 0; digits are `DIGIT0..DIGIT0 + 10`.
pub const DIGIT0: u32 = 3;
/// The `+` of addition problems.
pub const PLUS: u32 = 13;
/// Number of token ids of every digit task.
pub const VOCAB_SIZE: usize = 14;

/// Salt of the validation examples' stream.
const VALIDATION_SALT: u64 = 0x5365_7132_5365_7156;
/// Salt of the test examples' stream.
const TEST_SALT: u64 = 0x5465_7374_5365_7473;
/// One example in this many is held out (by a hash of its source).
const HOLD_OUT_ONE_IN: u64 = 10;

/// A generated sequence-to-sequence task over digit strings.
#[derive(Config, Debug, Copy, PartialEq, Eq)]
pub enum DigitTask {
    /// `3 1 4 1 5` → `5 1 4 1 3`.
    Reverse,
    /// `3 1 4 1 5` → `1 1 3 4 5`.
    Sort,
    /// `1 2 3 + 4 5` → `1 6 8` (operands of up to the length's digits).
    Add,
}

/// One source/target pair, as token ids (no BOS, no EOS).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Example {
    /// The input.
    pub source: Vec<u32>,
    /// The expected output.
    pub target: Vec<u32>,
}

impl DigitTask {
    /// Parses `reverse`, `sort` or `add`.
    ///
    /// # Errors
    /// [`TrainError::InvalidSetting`] listing the tasks.
    pub fn parse(name: &str) -> Result<Self, TrainError> {
        match name.to_ascii_lowercase().as_str() {
            "reverse" => Ok(Self::Reverse),
            "sort" => Ok(Self::Sort),
            "add" | "addition" => Ok(Self::Add),
            other => Err(TrainError::setting(
                "task",
                format!("unknown task `{other}`: expected reverse, sort or add"),
            )),
        }
    }

    /// An example whose digit strings have `min_len..=max_len` digits.
    pub fn sample(&self, rng: &mut SplitMix64, min_len: usize, max_len: usize) -> Example {
        let digits = |rng: &mut SplitMix64| -> Vec<u32> {
            let len = min_len + rng.below(max_len - min_len + 1);
            (0..len).map(|_| rng.below(10) as u32).collect()
        };
        let as_tokens = |digits: &[u32]| digits.iter().map(|d| DIGIT0 + d).collect::<Vec<_>>();
        match self {
            Self::Reverse => {
                let source = digits(rng);
                let target: Vec<u32> = source.iter().rev().copied().collect();
                Example {
                    source: as_tokens(&source),
                    target: as_tokens(&target),
                }
            }
            Self::Sort => {
                let source = digits(rng);
                let mut target = source.clone();
                target.sort_unstable();
                Example {
                    source: as_tokens(&source),
                    target: as_tokens(&target),
                }
            }
            Self::Add => {
                let a = digits(rng);
                let b = digits(rng);
                let value = |d: &[u32]| d.iter().fold(0u128, |n, &d| n * 10 + d as u128);
                let sum: Vec<u32> = (value(&a) + value(&b))
                    .to_string()
                    .bytes()
                    .map(|b| (b - b'0') as u32)
                    .collect();
                let mut source = as_tokens(&a);
                source.push(PLUS);
                source.extend(as_tokens(&b));
                Example {
                    source,
                    target: as_tokens(&sum),
                }
            }
        }
    }

    /// The longest target of examples with at most `max_len` digits per number.
    pub fn max_target_len(&self, max_len: usize) -> usize {
        match self {
            Self::Reverse | Self::Sort => max_len,
            Self::Add => max_len + 1,
        }
    }

    /// Renders token ids as text (`31415`, `123+45`).
    pub fn render(tokens: &[u32]) -> String {
        tokens
            .iter()
            .map(|&t| match t {
                PAD => '_',
                BOS => '^',
                EOS => '$',
                PLUS => '+',
                t if (DIGIT0..DIGIT0 + 10).contains(&t) => char::from(b'0' + (t - DIGIT0) as u8),
                _ => '?',
            })
            .collect()
    }
}

/// Whether an example belongs to the held-out part (a hash of its source).
pub fn is_held_out(example: &Example) -> bool {
    let mut hash = SplitMix64::new(0x6865_6c64, example.source.len() as u64);
    let mut h = hash.next_u64();
    for &token in &example.source {
        h = SplitMix64::new(h, token as u64).next_u64();
    }
    h.is_multiple_of(HOLD_OUT_ONE_IN)
}

/// Draws an example from the training part (`held_out == false`) or the held-out
/// part.
fn draw(
    task: DigitTask,
    rng: &mut SplitMix64,
    min_len: usize,
    max_len: usize,
    held_out: bool,
) -> Example {
    loop {
        let example = task.sample(rng, min_len, max_len);
        if is_held_out(&example) == held_out {
            return example;
        }
    }
}

/// `count` held-out examples for the final evaluation (seeded; same every call).
pub fn test_examples(
    task: DigitTask,
    min_len: usize,
    max_len: usize,
    count: usize,
    seed: u64,
) -> Vec<Example> {
    let mut rng = SplitMix64::new(seed ^ TEST_SALT, 0);
    (0..count)
        .map(|_| draw(task, &mut rng, min_len, max_len, true))
        .collect()
}

/// A padded batch of examples.
#[derive(Debug, Clone)]
pub struct Seq2SeqBatch {
    /// `[batch, seq_src]`, right-padded with [`PAD`].
    pub source: Tensor<2, Int>,
    /// `[batch, seq_src]`, `true` at padding.
    pub source_padding: Tensor<2, Bool>,
    /// `[batch, seq_tgt]`: [`BOS`] then the target (the decoder's input).
    pub target_input: Tensor<2, Int>,
    /// `[batch, seq_tgt]`: the target then [`EOS`] (what is predicted); [`PAD`] after.
    pub target_output: Tensor<2, Int>,
    /// `[batch, seq_tgt]`, `true` at padding.
    pub target_padding: Tensor<2, Bool>,
    /// The global step (training) or batch index (validation).
    pub step: usize,
}

/// Pads `rows` on the right to their longest length.
fn pad_rows(rows: &[Vec<u32>], device: &Device) -> (Tensor<2, Int>, Tensor<2, Bool>) {
    let width = rows.iter().map(Vec::len).max().unwrap_or(1).max(1);
    let mut ids = Vec::with_capacity(rows.len() * width);
    let mut padding = Vec::with_capacity(rows.len() * width);
    for row in rows {
        for column in 0..width {
            let token = row.get(column).copied();
            ids.push(token.unwrap_or(PAD) as i64);
            padding.push(token.is_none());
        }
    }
    let shape = [rows.len(), width];
    (
        Tensor::from_data(TensorData::new(ids, shape), device),
        Tensor::from_data(TensorData::new(padding, shape), device),
    )
}

impl Seq2SeqBatch {
    /// A batch of `examples` on `device`.
    pub fn new(examples: &[Example], step: usize, device: &Device) -> Self {
        let sources: Vec<Vec<u32>> = examples.iter().map(|e| e.source.clone()).collect();
        let inputs: Vec<Vec<u32>> = examples
            .iter()
            .map(|e| {
                std::iter::once(BOS)
                    .chain(e.target.iter().copied())
                    .collect()
            })
            .collect();
        let outputs: Vec<Vec<u32>> = examples
            .iter()
            .map(|e| {
                e.target
                    .iter()
                    .copied()
                    .chain(std::iter::once(EOS))
                    .collect()
            })
            .collect();
        let (source, source_padding) = pad_rows(&sources, device);
        let (target_input, target_padding) = pad_rows(&inputs, device);
        let (target_output, _) = pad_rows(&outputs, device);
        Self {
            source,
            source_padding,
            target_input,
            target_output,
            target_padding,
            step,
        }
    }
}

#[derive(Debug, Clone)]
enum Stream {
    Training { next_epoch: Arc<AtomicUsize> },
    Validation,
}

/// A burn-train [`DataLoader`] of generated digit-task batches: training batches of
/// step `s` depend only on `(seed, s)`; validation batches are fixed held-out ones.
#[derive(Debug, Clone)]
pub struct Seq2SeqLoader {
    task: DigitTask,
    min_len: usize,
    max_len: usize,
    batch_size: usize,
    batches: usize,
    total_steps: Option<usize>,
    seed: u64,
    stream: Stream,
    device: Device,
}

impl Seq2SeqLoader {
    /// Training batches, `steps_per_epoch` per pass, from epoch `start_epoch`.
    #[allow(clippy::too_many_arguments)]
    pub fn training(
        task: DigitTask,
        min_len: usize,
        max_len: usize,
        batch_size: usize,
        steps_per_epoch: usize,
        total_steps: usize,
        seed: u64,
        start_epoch: usize,
        device: &Device,
    ) -> Self {
        Self {
            task,
            min_len,
            max_len,
            batch_size,
            batches: steps_per_epoch,
            total_steps: Some(total_steps),
            seed,
            stream: Stream::Training {
                next_epoch: Arc::new(AtomicUsize::new(start_epoch)),
            },
            device: device.clone(),
        }
    }

    /// The same `batches` held-out batches at every pass.
    pub fn validation(
        task: DigitTask,
        min_len: usize,
        max_len: usize,
        batch_size: usize,
        batches: usize,
        seed: u64,
        device: &Device,
    ) -> Self {
        Self {
            task,
            min_len,
            max_len,
            batch_size,
            batches,
            total_steps: None,
            seed: seed ^ VALIDATION_SALT,
            stream: Stream::Validation,
            device: device.clone(),
        }
    }

    /// The batch of step (or validation index) `step`.
    pub fn batch(&self, step: usize) -> Seq2SeqBatch {
        let mut rng = SplitMix64::new(self.seed, step as u64);
        let held_out = matches!(self.stream, Stream::Validation);
        let examples: Vec<Example> = (0..self.batch_size)
            .map(|_| draw(self.task, &mut rng, self.min_len, self.max_len, held_out))
            .collect();
        Seq2SeqBatch::new(&examples, step, &self.device)
    }
}

struct Seq2SeqIterator<'a> {
    loader: &'a Seq2SeqLoader,
    base: usize,
    count: usize,
    next: usize,
}

impl Iterator for Seq2SeqIterator<'_> {
    type Item = Result<Seq2SeqBatch, DatasetError>;

    fn next(&mut self) -> Option<Self::Item> {
        (self.next < self.count).then(|| {
            let batch = self.loader.batch(self.base + self.next);
            self.next += 1;
            Ok(batch)
        })
    }
}

impl DataLoaderIterator<Seq2SeqBatch> for Seq2SeqIterator<'_> {
    fn progress(&self) -> Progress {
        Progress::new(
            self.next * self.loader.batch_size,
            self.count * self.loader.batch_size,
            Some("examples".into()),
        )
    }
}

impl DataLoader<Seq2SeqBatch> for Seq2SeqLoader {
    fn iter<'a>(&'a self) -> Box<dyn DataLoaderIterator<Seq2SeqBatch> + 'a> {
        let base = match &self.stream {
            Stream::Training { next_epoch } => {
                next_epoch.fetch_add(1, Ordering::SeqCst) * self.batches
            }
            Stream::Validation => 0,
        };
        let count = match self.total_steps {
            Some(total) => self.batches.min(total.saturating_sub(base)),
            None => self.batches,
        };
        Box::new(Seq2SeqIterator {
            loader: self,
            base,
            count,
            next: 0,
        })
    }

    fn num_items(&self) -> usize {
        self.batches * self.batch_size
    }

    fn to_device(&self, device: &Device) -> Arc<dyn DataLoader<Seq2SeqBatch>> {
        let mut loader = self.clone();
        loader.device = device.clone();
        Arc::new(loader)
    }

    fn slice(&self, start: usize, end: usize) -> Arc<dyn DataLoader<Seq2SeqBatch>> {
        let mut loader = self.clone();
        loader.batches = (end.saturating_sub(start) / self.batch_size).max(1);
        Arc::new(loader)
    }
}

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
        // Dropout masks of step s depend on (seed, s) only: resuming replays them.
        batch
            .source
            .device()
            .seed(step_seed(self.settings.seed, batch.step));
        let logits = self.logits(&batch);
        let loss = cross_entropy(
            logits.clone(),
            batch.target_output.clone(),
            self.settings.label_smoothing,
            Some(PAD),
        );
        let mut grads = GradientsParams::from_grads(loss.backward(), self);
        if let Some(max_norm) = self.settings.grad_clip {
            clip_grad_norm(self, &mut grads, max_norm);
        }
        TrainOutput {
            grads,
            item: SequenceOutput::new(loss, logits, None, batch.target_output),
        }
    }
}

impl InferenceStep for Seq2SeqTask {
    type Input = Seq2SeqBatch;
    type Output = SequenceOutput;

    fn step(&self, batch: Seq2SeqBatch) -> SequenceOutput {
        let logits = self.logits(&batch);
        let loss = cross_entropy(logits.clone(), batch.target_output.clone(), 0.0, Some(PAD));
        SequenceOutput::new(loss, logits, None, batch.target_output)
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
        for (setting, value) in [
            ("min-len", self.min_len),
            ("batch-size", self.batch_size),
            ("steps", self.steps),
            ("eval-interval", self.eval_interval),
            ("eval-batches", self.eval_batches),
            ("warmup", self.warmup_steps),
        ] {
            if value == 0 {
                return Err(TrainError::setting(setting, "must be greater than 0"));
            }
        }
        if self.max_len < self.min_len || self.max_len > 30 {
            return Err(TrainError::setting(
                "max-len",
                format!(
                    "must be in [min-len = {}, 30], got {}",
                    self.min_len, self.max_len
                ),
            ));
        }
        if !(0.0..1.0).contains(&self.label_smoothing) {
            return Err(TrainError::setting(
                "label-smoothing",
                format!("must be in [0, 1), got {}", self.label_smoothing),
            ));
        }
        if !(self.noam_factor.is_finite() && self.noam_factor > 0.0) {
            return Err(TrainError::setting(
                "noam-factor",
                format!("must be positive, got {}", self.noam_factor),
            ));
        }
        Ok(())
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
    };
    let prepared = prepare(options, schedule)?;

    let autodiff = device.clone().autodiff();
    let model = to_training_device(
        host_init(training.seed, |host| model_config.try_init(host))?,
        device,
    );
    let task = Seq2SeqTask::new(
        model,
        StepSettings {
            label_smoothing: training.label_smoothing,
            grad_clip: training.grad_clip,
            seed: training.seed,
        },
    );
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
    );
    let valid_loader = Seq2SeqLoader::validation(
        training.task,
        training.min_len,
        training.max_len,
        training.batch_size,
        training.eval_batches,
        training.seed,
        device,
    );
    // The whole run on flex's own pool (see `crate::device::on_compute_pool`).
    let result = crate::device::on_compute_pool(device, || {
        let builder = SupervisedTraining::new(
            &options.directory,
            Arc::new(train_loader),
            Arc::new(valid_loader),
        )
        .metric_train_numeric(LossMetric::new())
        .metric_train_numeric(LearningRateMetric::new())
        .metric_valid_numeric(LossMetric::new())
        .metric_valid_numeric(AccuracyMetric::new().with_pad_token(PAD as usize));
        configure(builder, options, schedule, &prepared).launch(learner)
    });
    let (task, history) = finish(result, &prepared)?;
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
    use crate::train::tests::TempDir;
    use crate::train::{CHECKPOINT_RECORDS, checkpoint_dir, checkpoint_path, history_file};

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
        let straight = TempDir::new("s2s-straight");
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
        let crashed = TempDir::new("s2s-crashed");
        let (from, to) = (
            checkpoint_dir(straight.path()),
            checkpoint_dir(crashed.path()),
        );
        std::fs::create_dir_all(&to).unwrap();
        for name in CHECKPOINT_RECORDS {
            std::fs::copy(
                checkpoint_path(&from, name, 2),
                checkpoint_path(&to, name, 2),
            )
            .unwrap();
        }
        std::fs::copy(history_file(straight.path()), history_file(crashed.path())).unwrap();
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

    #[test]
    fn digit_tasks_are_correct_and_held_out_examples_never_train() {
        let mut rng = SplitMix64::new(1, 0);
        for _ in 0..50 {
            let e = DigitTask::Reverse.sample(&mut rng, 2, 6);
            let mut reversed = e.source.clone();
            reversed.reverse();
            assert_eq!(e.target, reversed);
            let e = DigitTask::Add.sample(&mut rng, 1, 4);
            let text = DigitTask::render(&e.source);
            let (a, b) = text.split_once('+').unwrap();
            let sum = a.parse::<u64>().unwrap() + b.parse::<u64>().unwrap();
            assert_eq!(DigitTask::render(&e.target), sum.to_string());
        }
        let loader =
            Seq2SeqLoader::training(DigitTask::Reverse, 3, 8, 32, 2, 10, 5, 0, &Device::flex());
        let test = test_examples(DigitTask::Reverse, 3, 8, 200, 5);
        assert!(test.iter().all(is_held_out));
        for step in 0..10 {
            let batch = loader.batch(step);
            let sources: Vec<i64> = batch.source.try_to_vec_as().unwrap();
            let width = batch.source.dims()[1];
            for row in sources.chunks(width) {
                let source: Vec<u32> = row
                    .iter()
                    .filter(|&&t| t != PAD as i64)
                    .map(|&t| t as u32)
                    .collect();
                let example = Example {
                    target: source.iter().rev().copied().collect(),
                    source,
                };
                assert!(!is_held_out(&example));
            }
        }
    }

    #[test]
    fn batches_pad_both_sides_and_shift_the_target() {
        let examples = vec![
            Example {
                source: vec![3, 4, 5],
                target: vec![5, 4, 3],
            },
            Example {
                source: vec![6],
                target: vec![6],
            },
        ];
        let batch = Seq2SeqBatch::new(&examples, 0, &Device::flex());
        let source: Vec<i64> = batch.source.try_to_vec_as().unwrap();
        let padding: Vec<bool> = batch.source_padding.try_to_vec_as().unwrap();
        let input: Vec<i64> = batch.target_input.try_to_vec_as().unwrap();
        let output: Vec<i64> = batch.target_output.try_to_vec_as().unwrap();
        assert_eq!(source, vec![3, 4, 5, 6, 0, 0]);
        assert_eq!(padding, vec![false, false, false, false, true, true]);
        assert_eq!(input, vec![1, 5, 4, 3, 1, 6, 0, 0]);
        assert_eq!(output, vec![5, 4, 3, 2, 6, 2, 0, 0]);
    }
}
