//! Language modelling with burn-train: a [`CausalLm`] learns to predict the next
//! token of random windows of a corpus.
//!
//! [`train_language_model`] wires the pieces into burn-train's `Learner`:
//! [`WindowLoader`]s for the batches, AdamW (weight decay on matrices only, as
//! nanoGPT and LLaMA), the [`WarmupCosine`] schedule, global-norm gradient
//! clipping, optional label smoothing, the MoE auxiliary loss when the model has
//! one, a validation (loss and perplexity) every `eval_interval` steps, atomic
//! checkpoints after each validation, and exact resumption from the newest one.

use std::sync::Arc;

use burn::config::Config;
use burn::module::Module;
use burn::optim::ModuleOptimizer;
use burn::tensor::{DType, Device, Int, Tensor};
use burn::train::metric::PerplexityMetric;
use burn::train::{InferenceStep, Learner, SequenceOutput, TrainOutput, TrainStep};

use super::data::{LmBatch, TokenSplit, WindowLoader};
use super::precision::{LossScaler, Precision, cast_parameters};
use super::progress::History;
use super::run::{RunOptions, Schedule, check_resumed_model, launch, prepare};
use super::step::{StepPart, StepSettings, adamw, require_positive, train_step, validation_output};
use super::{TrainError, WarmupCosineConfig, cross_entropy, host_init, to_training_device};
use crate::model::{CausalLm, CausalLmConfig};

/// Hyperparameters of a language-modelling run. The defaults are nanoGPT's CPU
/// recipe for character-level Shakespeare (`train_shakespeare_char.py` with
/// `--block_size=64 --batch_size=12 --max_iters=2000 --dropout=0.0`).
#[derive(Config, Debug)]
pub struct LmTrainingConfig {
    /// Windows per batch. Default: 12.
    #[config(default = 12)]
    pub batch_size: usize,
    /// Tokens per window (the context length). Default: 64.
    #[config(default = 64)]
    pub context: usize,
    /// Optimizer steps of the whole run. Default: 2000.
    #[config(default = 2000)]
    pub steps: usize,
    /// Validate (and checkpoint) every this many steps. Default: 250.
    #[config(default = 250)]
    pub eval_interval: usize,
    /// Batches per validation (fixed windows of the validation split). Default: 20.
    #[config(default = 20)]
    pub eval_batches: usize,
    /// Peak learning rate. Default: 1e-3.
    #[config(default = 1e-3)]
    pub lr: f64,
    /// Learning rate after the cosine decay. Default: `lr / 10`.
    #[config(default = "None")]
    pub min_lr: Option<f64>,
    /// Linear warm-up steps. Default: 100.
    #[config(default = 100)]
    pub warmup_steps: usize,
    /// AdamW's decoupled weight decay, on matrices and embeddings only (not on norm
    /// weights or biases). Default: 0.1.
    #[config(default = 0.1)]
    pub weight_decay: f64,
    /// AdamW's β₁. Default: 0.9.
    #[config(default = 0.9)]
    pub beta1: f32,
    /// AdamW's β₂. Default: 0.99 (nanoGPT's choice for small data).
    #[config(default = 0.99)]
    pub beta2: f32,
    /// AdamW's ε. Default: 1e-8 (PyTorch's).
    #[config(default = 1e-8)]
    pub epsilon: f32,
    /// Clip the gradient's global L2 norm to this; `None` disables. Default: 1.0.
    #[config(default = "Some(1.0)")]
    pub grad_clip: Option<f64>,
    /// Label smoothing of the training loss, in `[0, 1)`. Default: 0.
    #[config(default = 0.0)]
    pub label_smoothing: f64,
    /// Seed of the initialization, the batches and any dropout. Default: 1337.
    #[config(default = 1337)]
    pub seed: u64,
    /// Micro-batches per optimizer step (gradient accumulation): each step draws
    /// `batch_size · grad_accumulation` windows and backpropagates them
    /// `batch_size` at a time, so the update is that of the large batch with the
    /// activations of a small one. Default: 1.
    #[config(default = 1)]
    pub grad_accumulation: usize,
    /// Activation checkpointing (burn-train's `gradient_checkpointing`, Burn's balanced
    /// strategy): the results of compute-heavy operations (matrix products, fused
    /// attention) are kept, the cheap ones recomputed in the backward pass instead of
    /// stored. Default: false.
    #[config(default = false)]
    pub checkpoint_activations: bool,
    /// The floating-point type of the forward and backward passes: f32, or bf16/f16
    /// with f32 master weights and optimizer state (f16 with dynamic loss scaling).
    /// Default: f32.
    #[config(default = "Precision::F32")]
    pub precision: Precision,
}

impl LmTrainingConfig {
    /// Number of train-then-validate rounds (burn-train epochs).
    pub fn rounds(&self) -> usize {
        self.steps.div_ceil(self.eval_interval.max(1))
    }

    /// Tokens seen per step (every micro-batch).
    pub fn tokens_per_step(&self) -> usize {
        self.batch_size * self.grad_accumulation * self.context
    }

    /// Checks the settings.
    ///
    /// # Errors
    /// [`TrainError::InvalidSetting`] naming the flag.
    pub fn validate(&self) -> Result<(), TrainError> {
        require_positive(&[
            ("batch-size", self.batch_size),
            ("context", self.context),
            ("steps", self.steps),
            ("eval-interval", self.eval_interval),
            ("eval-batches", self.eval_batches),
            ("grad-accum", self.grad_accumulation),
        ])?;
        self.step_settings().validate()?;
        if !(self.weight_decay.is_finite() && self.weight_decay >= 0.0) {
            return Err(TrainError::setting(
                "weight-decay",
                format!("must be non-negative, got {}", self.weight_decay),
            ));
        }
        self.schedule().init().map(|_| ())
    }

    /// What each training step of this run needs.
    pub fn step_settings(&self) -> StepSettings {
        StepSettings {
            label_smoothing: self.label_smoothing,
            grad_clip: self.grad_clip,
            seed: self.seed,
        }
    }

    fn schedule(&self) -> WarmupCosineConfig {
        WarmupCosineConfig::new(self.lr, self.steps)
            .with_warmup_steps(self.warmup_steps)
            .with_min_lr(self.min_lr)
    }

    /// The loader of the batches every validation of a run uses (and
    /// [`mtp_validation_loss`] reads): `eval_batches` seeded windows of the split's
    /// validation tokens.
    ///
    /// # Panics
    /// If the validation tokens hold no window of `context + 1` (check with
    /// [`TokenSplit::check_context`] first).
    pub fn validation_loader(&self, split: &TokenSplit, device: &Device) -> WindowLoader {
        WindowLoader::validation(
            split.validation.clone(),
            self.batch_size,
            self.context,
            self.eval_batches,
            self.seed,
            device,
        )
    }

    /// AdamW with decoupled weight decay on every parameter except norm weights and
    /// biases (their paths contain `norm`, or end in `bias`), as nanoGPT and LLaMA.
    /// Gradient clipping is not the optimizer's: the training step clips the
    /// gradients' global norm ([`LmTrainingConfig::grad_clip`]).
    pub fn optimizer(&self) -> ModuleOptimizer {
        adamw(
            self.beta1,
            self.beta2,
            self.epsilon,
            self.weight_decay as f32,
        )
    }
}

/// A [`CausalLm`] as a burn-train model: next-token cross entropy, plus the MoE
/// auxiliary loss when the model has MoE layers.
#[derive(Module, Debug)]
pub struct LmTask {
    /// The language model.
    pub model: CausalLm,
    #[module(skip)]
    settings: StepSettings,
    #[module(skip)]
    micro_batches: usize,
    #[module(skip)]
    precision: Precision,
    #[module(skip)]
    scaler: Option<LossScaler>,
}

impl LmTask {
    /// Wraps `model` for training, one backward pass per batch.
    pub fn new(model: CausalLm, settings: StepSettings) -> Self {
        Self {
            model,
            settings,
            micro_batches: 1,
            precision: Precision::F32,
            scaler: None,
        }
    }

    /// The task training in `precision` (see [`LmTrainingConfig::precision`]).
    pub fn with_precision(mut self, precision: Precision) -> Self {
        self.precision = precision;
        self.scaler = (precision == Precision::F16).then(LossScaler::new);
        self
    }

    /// The task backpropagating each batch in `micro_batches` equal parts
    /// (gradient accumulation: [`LmTrainingConfig::grad_accumulation`]).
    pub fn with_micro_batches(mut self, micro_batches: usize) -> Self {
        self.micro_batches = micro_batches.max(1);
        self
    }

    /// The training loss of a batch: cross entropy (smoothed), plus the routing
    /// losses of MoE layers and the weighted multi-token-prediction loss
    /// ([`mtp_loss`](Self::mtp_loss)) when the model has them, and the logits.
    ///
    /// # Shapes
    /// - output: (`[1]`, `[batch, context, vocab]`)
    pub fn training_loss(&self, batch: &LmBatch) -> (Tensor<1>, Tensor<3>) {
        let low = self
            .precision
            .low()
            .map(|dtype| cast_parameters(self.model.clone(), dtype));
        let model = low.as_ref().unwrap_or(&self.model);
        let mut output = match model.mtp_depth() {
            0 => model.forward_full(batch.inputs.clone(), None),
            _ => model.forward_with_mtp(batch.inputs.clone()),
        };
        if low.is_some() {
            // The losses are computed in f32 (the softmax over the vocabulary too).
            output.logits = output.logits.cast(DType::F32);
            output.routing_loss = output.routing_loss.map(|loss| loss.cast(DType::F32));
            output.mtp_logits = output
                .mtp_logits
                .into_iter()
                .map(|logits| logits.cast(DType::F32))
                .collect();
        }
        let smoothing = self.settings.label_smoothing;
        let mut loss = cross_entropy(
            output.logits.clone(),
            batch.targets.clone(),
            smoothing,
            None,
        );
        if let Some(routing) = output.routing_loss {
            loss = loss + routing;
        }
        if let Some(mtp) = Self::mtp_loss(&output.mtp_logits, &batch.targets, smoothing) {
            loss = loss + mtp * self.model.mtp_loss_weight();
        }
        (loss, output.logits)
    }

    /// The multi-token-prediction loss before its weight: the mean over depths of
    /// each depth's cross entropy, `1/D · Σₖ CE(logitsᵏ, targets[k..])` (depth `k`
    /// predicts `k` tokens further than the next one). `None` without depths.
    ///
    /// # Shapes
    /// - mtp_logits: depth `k` (from 1) `[batch, context − k, vocab]`
    /// - targets: `[batch, context]`
    /// - output: `[1]`
    pub fn mtp_loss(
        mtp_logits: &[Tensor<3>],
        targets: &Tensor<2, Int>,
        label_smoothing: f64,
    ) -> Option<Tensor<1>> {
        let context = targets.dims()[1];
        let depths = mtp_logits.len();
        let total = mtp_logits
            .iter()
            .enumerate()
            .fold(None, |total, (index, logits)| {
                let depth = index + 1;
                let targets = targets.clone().narrow(1, depth, context - depth);
                let loss = cross_entropy(logits.clone(), targets, label_smoothing, None);
                Some(match total {
                    Some(total) => total + loss,
                    None => loss,
                })
            });
        total.map(|total: Tensor<1>| total / depths as f64)
    }
}

impl TrainStep for LmTask {
    type Input = LmBatch;
    type Output = SequenceOutput;

    fn step(&self, batch: LmBatch) -> TrainOutput<SequenceOutput> {
        let device = batch.inputs.device();
        let parts = self.micro_batches;
        let rows = batch.targets.dims()[0] / parts;
        train_step(
            self,
            &self.settings,
            &device,
            StepPart {
                step: batch.step,
                share: batch.share,
                micro_batches: parts,
                scaler: self.scaler.as_ref(),
            },
            batch.targets.clone(),
            |part| match parts {
                1 => self.training_loss(&batch),
                _ => self.training_loss(&LmBatch {
                    inputs: batch.inputs.clone().narrow(0, part * rows, rows),
                    targets: batch.targets.clone().narrow(0, part * rows, rows),
                    ..batch.clone()
                }),
            },
        )
    }
}

impl InferenceStep for LmTask {
    type Input = LmBatch;
    type Output = SequenceOutput;

    fn step(&self, batch: LmBatch) -> SequenceOutput {
        validation_output(self.model.forward(batch.inputs, None), batch.targets, None)
    }
}

/// The outcome of [`train_language_model`].
#[derive(Debug)]
pub struct LmRunResult {
    /// The trained model, on the (non-autodiff) training device, in eval mode.
    pub model: CausalLm,
    /// Every loss of the run (a resumed run's history includes the earlier part).
    pub history: History,
    /// The step the run started from (0, or the resumed checkpoint's).
    pub start_step: usize,
}

/// Trains a [`CausalLm`] of `model_config` on `split` with burn-train.
///
/// The initial parameters are drawn on the host CPU from `training.seed` and then
/// moved to `device`, so the same seed starts from the same model on every backend.
///
/// # Errors
/// [`TrainError`] for invalid settings, a split too short for the context, token ids
/// outside the model's vocabulary, a missing checkpoint when resuming, or a failure
/// reported by burn-train.
pub fn train_language_model(
    model_config: &CausalLmConfig,
    training: &LmTrainingConfig,
    split: &TokenSplit,
    device: &Device,
    options: &RunOptions,
) -> Result<LmRunResult, TrainError> {
    // Settings are checked before the (possibly long) initialization.
    training.validate()?;
    model_config.validate()?;
    let model = host_init(training.seed, |host| model_config.try_init(host))?;
    train_language_model_from(model, training, split, device, options)
}

/// Trains an already built [`CausalLm`] (for example one loaded from a checkpoint,
/// or one initialized once and trained on several backends) on `split`.
///
/// `model` may live on any device; it is moved to the autodiff version of `device`.
/// With `options.resume` the parameters come from the latest checkpoint instead.
///
/// # Errors
/// As [`train_language_model`].
pub fn train_language_model_from(
    model: CausalLm,
    training: &LmTrainingConfig,
    split: &TokenSplit,
    device: &Device,
    options: &RunOptions,
) -> Result<LmRunResult, TrainError> {
    training.validate()?;
    options.check_parallel_batch(training.batch_size)?;
    split.check_context(training.context)?;
    check_vocabulary(split, model.vocab_size())?;
    check_positions(&model, training.context)?;
    let schedule = Schedule {
        steps: training.steps,
        eval_interval: training.eval_interval,
        tokens_per_step: training.tokens_per_step(),
        checkpoint_activations: training.checkpoint_activations,
    };
    let prepared = prepare(options, schedule)?;
    let task = LmTask::new(model, training.step_settings())
        .with_micro_batches(training.grad_accumulation)
        .with_precision(training.precision);
    check_resumed_model(&task, options, &prepared)?;

    let autodiff = match training.checkpoint_activations {
        true => device.clone().autodiff().gradient_checkpointing(),
        false => device.clone().autodiff(),
    };
    let task = to_training_device(task, &autodiff);
    let learner = Learner::new(task, training.optimizer(), training.schedule().init()?);

    let train_loader = WindowLoader::training(
        split.train.clone(),
        training.batch_size * training.grad_accumulation,
        training.context,
        training.eval_interval,
        training.seed,
        prepared.resumed_epoch.unwrap_or(0),
        &autodiff,
    )
    .with_first_step(prepared.start_step)
    .with_total_steps(training.steps);
    let valid_loader = training.validation_loader(split, device);
    let (task, history) = launch(
        learner,
        Arc::new(train_loader),
        Arc::new(valid_loader),
        PerplexityMetric::new(),
        device,
        options,
        schedule,
        &prepared,
    )?;
    Ok(LmRunResult {
        model: task.model,
        history,
        start_step: prepared.start_step,
    })
}

/// The multi-token-prediction loss of `model` on the validation batches a run of
/// `training` validates on: the mean over batches of `1/D · Σₖ CEₖ` (unweighted, no
/// label smoothing; see [`LmTask::mtp_loss`]). `None` for a model without
/// multi-token prediction.
///
/// # Errors
/// [`TrainError`] for a validation split too short for the context.
pub fn mtp_validation_loss(
    model: &CausalLm,
    split: &TokenSplit,
    training: &LmTrainingConfig,
    device: &Device,
) -> Result<Option<f64>, TrainError> {
    if model.mtp_depth() == 0 {
        return Ok(None);
    }
    split.check_context(training.context)?;
    let loss = mean_over_validation(model, split, training, device, |model, batch| {
        let output = model.forward_with_mtp(batch.inputs);
        LmTask::mtp_loss(&output.mtp_logits, &batch.targets, 0.0)
            .map_or(0.0, |loss| loss.into_scalar::<f64>())
    });
    Ok(Some(loss))
}

/// The validation loss of `model` as a run of `training` measures it (the mean over
/// its validation batches of the plain cross entropy): for example a loaded model's
/// before fine-tuning.
///
/// # Errors
/// [`TrainError`] for a validation split too short for the context, or token ids
/// outside the model's vocabulary.
pub fn validation_loss(
    model: &CausalLm,
    split: &TokenSplit,
    training: &LmTrainingConfig,
    device: &Device,
) -> Result<f64, TrainError> {
    split.check_context(training.context)?;
    check_vocabulary(split, model.vocab_size())?;
    check_positions(model, training.context)?;
    Ok(mean_over_validation(
        model,
        split,
        training,
        device,
        |model, batch| {
            let logits = model.forward(batch.inputs, None);
            validation_output(logits, batch.targets, None)
                .loss
                .into_scalar::<f64>()
        },
    ))
}

/// The mean of `loss` over the validation batches a run of `training` uses, with
/// `model` (in eval mode) on `device`. The split must hold a window of the context.
fn mean_over_validation(
    model: &CausalLm,
    split: &TokenSplit,
    training: &LmTrainingConfig,
    device: &Device,
    loss: impl Fn(&CausalLm, LmBatch) -> f64,
) -> f64 {
    let model = model.clone().valid().to_device(device);
    let loader = training.validation_loader(split, device);
    let total: f64 = (0..training.eval_batches)
        .map(|index| loss(&model, loader.batch(index)))
        .sum();
    total / training.eval_batches as f64
}

/// Checks that every token id is below the model's vocabulary size.
/// A model with learned positions (GPT-2) sees at most that many tokens per window.
fn check_positions(model: &CausalLm, context: usize) -> Result<(), TrainError> {
    match model.max_positions() {
        Some(positions) if context > positions => Err(TrainError::setting(
            "context",
            format!(
                "{context} tokens exceed the model's {positions} learned positions: use a \
                 context of at most {positions}"
            ),
        )),
        _ => Ok(()),
    }
}

fn check_vocabulary(split: &TokenSplit, vocab_size: usize) -> Result<(), TrainError> {
    let max = split.max_id().unwrap_or(0);
    if max as usize >= vocab_size {
        return Err(TrainError::setting(
            "vocab-size",
            format!("the corpus has token id {max}, the model only {vocab_size} ids"),
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::io::tests::TempDir;
    use crate::test_utils::{max_abs_diff, model_test_devices};
    use crate::train::tests::interrupted_copy;
    use crate::train::{
        CharTokenizer, Tokenizer, checkpoint_dir, find_resume_point, load_module, save_module,
    };
    use burn::module::{ModuleVisitor, Param};
    use std::path::Path;

    /// A small corpus with structure to learn.
    fn corpus() -> String {
        (0..400)
            .map(|i| format!("{} little pigs, {} bags of wool.\n", i % 7, (i * 3) % 5))
            .collect()
    }

    fn tiny_model(vocab: usize) -> CausalLmConfig {
        CausalLmConfig::new(vocab, 32, 2, 4, 64, crate::position::RopeConfig::new(8))
            .with_n_kv_heads(Some(2))
            .with_norm_eps(1e-5)
            .with_tie_word_embeddings(true)
    }

    fn tiny_training(steps: usize, eval_interval: usize) -> LmTrainingConfig {
        LmTrainingConfig::new()
            .with_batch_size(4)
            .with_context(16)
            .with_steps(steps)
            .with_eval_interval(eval_interval)
            .with_eval_batches(2)
            .with_warmup_steps(2)
            .with_lr(3e-3)
            .with_label_smoothing(0.05)
    }

    fn split(text: &str) -> (CharTokenizer, TokenSplit) {
        let tokenizer = CharTokenizer::from_text(text).unwrap();
        let split = TokenSplit::new(text, &tokenizer, 0.1).unwrap();
        (tokenizer, split)
    }

    /// Every parameter's values, in visiting order.
    fn parameters<M: Module>(module: &M) -> Vec<Vec<f32>> {
        struct Collect(Vec<Vec<f32>>);
        impl ModuleVisitor for Collect {
            fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<D>>) {
                self.0.push(param.val().try_to_vec_as().unwrap());
            }
        }
        let mut collect = Collect(Vec::new());
        module.visit(&mut collect);
        collect.0
    }

    #[test]
    fn checkpoint_round_trip_is_bit_identical() {
        let dir = TempDir::with_prefix("lm-checkpoint").unwrap();
        let device = Device::flex();
        let config = tiny_model(20);
        let model = host_init(1, |host| config.try_init(host))
            .unwrap()
            .to_device(&device);
        let path = dir.path().join("model.bpk");
        save_module(model.clone(), &path).unwrap();
        let other = host_init(2, |host| config.try_init(host)).unwrap();
        assert_ne!(
            parameters(&model),
            parameters(&other),
            "different seeds differ"
        );
        let loaded = load_module(other, &path).unwrap();
        let (a, b) = (parameters(&model), parameters(&loaded));
        assert_eq!(a.len(), b.len());
        for (x, y) in a.iter().zip(&b) {
            let bits = |v: &Vec<f32>| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
            assert_eq!(bits(x), bits(y));
        }
        // A file that is not a record, or does not fit, is a clear error.
        std::fs::write(dir.path().join("junk.bpk"), b"junk").unwrap();
        let junk = load_module(model.clone(), &dir.path().join("junk.bpk")).unwrap_err();
        assert!(junk.to_string().contains("junk.bpk"), "{junk}");
        let wider = tiny_model(21).init(&device);
        let mismatch = load_module(wider, &path).unwrap_err();
        assert!(mismatch.to_string().contains("does not fit"), "{mismatch}");
    }

    #[test]
    fn tiny_model_loss_falls_on_a_repeated_batch() {
        let text = corpus();
        let (_, split) = split(&text);
        let device = Device::flex().autodiff();
        let config = tiny_model(split.train.max_id().map_or(1, |m| m as usize + 1));
        let model =
            to_training_device(host_init(3, |host| config.try_init(host)).unwrap(), &device);
        let mut task = LmTask::new(
            model,
            StepSettings {
                label_smoothing: 0.0,
                grad_clip: Some(1.0),
                seed: 3,
            },
        );
        let batch = WindowLoader::training(split.train, 4, 16, 1, 3, 0, &device).batch(0);
        let mut optimizer = adamw(0.9, 0.99, 1e-8, 0.0);
        let mut losses = Vec::new();
        for step in 0..40 {
            let output = TrainStep::step(
                &task,
                LmBatch {
                    step,
                    ..batch.clone()
                },
            );
            losses.push(output.item.loss.into_scalar::<f32>());
            task = optimizer.step(3e-3, task, output.grads);
        }
        let (first, last) = (losses[0], losses[39]);
        assert!(
            last < 0.3 * first,
            "the loss should fall on a repeated batch: {first} -> {last} ({losses:?})"
        );
    }

    #[test]
    fn moe_auxiliary_loss_reaches_the_router_gradients() {
        use crate::ffn::FeedForward;
        use crate::ffn::MoeConfig;

        let text = corpus();
        let (_, split) = split(&text);
        let vocab = split.train.max_id().map_or(1, |m| m as usize + 1);
        let device = Device::flex().autodiff();
        let batch = WindowLoader::training(split.train, 4, 16, 1, 5, 0, &device).batch(0);
        // The same model and batch with the balancing loss weighted 0 and 1: only the
        // auxiliary term differs, so a different router gradient is the aux loss's.
        let router_gradient = |coef: f64| {
            let config = tiny_model(vocab)
                .with_moe(Some(MoeConfig::mixtral(32, 16, 4, 2)))
                .with_aux_loss_coef(coef);
            let model =
                to_training_device(host_init(5, |host| config.try_init(host)).unwrap(), &device);
            let task = LmTask::new(
                model,
                StepSettings {
                    label_smoothing: 0.0,
                    grad_clip: None,
                    seed: 5,
                },
            );
            let aux = task
                .model
                .forward_full(batch.inputs.clone(), None)
                .routing_loss
                .map(|aux| aux.into_scalar::<f32>());
            let (loss, _) = task.training_loss(&batch);
            let grads = loss.backward();
            let FeedForward::Moe(moe) = &task.model.model.layers[0].mlp else {
                panic!("every layer is sparse by default");
            };
            let gradient: Vec<f32> = moe
                .gate
                .weight
                .val()
                .grad(&grads)
                .expect("the router weight has a gradient")
                .try_to_vec_as()
                .unwrap();
            (aux, gradient)
        };
        let (aux_off, without) = router_gradient(0.0);
        let (aux_on, with) = router_gradient(1.0);
        assert_eq!(aux_off, None, "a zero coefficient drops the aux loss");
        let aux_on = aux_on.expect("an MoE model with a coefficient reports its aux loss");
        assert!(aux_on > 0.0, "the balancing loss is positive: {aux_on}");
        let with = Tensor::<1>::from_floats(with.as_slice(), &device);
        let without = Tensor::<1>::from_floats(without.as_slice(), &device);
        let difference = max_abs_diff(with, without);
        assert!(
            difference > 1e-6,
            "the auxiliary loss must change the router's gradient (max difference {difference})"
        );
    }

    #[test]
    fn resume_equals_the_uninterrupted_run() {
        let text = corpus();
        let (tokenizer, split) = split(&text);
        let device = Device::flex();
        let model = tiny_model(tokenizer.vocab_size());
        let training = tiny_training(12, 4);

        let straight = TempDir::with_prefix("lm-straight").unwrap();
        let full = train_language_model(
            &model,
            &training,
            &split,
            &device,
            &RunOptions::quiet(straight.path()),
        )
        .unwrap();
        assert_eq!(full.history.train.len(), 12);
        assert_eq!(full.history.validation.len(), 3);

        // A run killed during round 3: its folder holds rounds 1 and 2's checkpoints
        // (the straight run kept the last two, 2 and 3; drop 3) and a history that
        // went further than the checkpoint.
        let crashed = TempDir::with_prefix("lm-crashed").unwrap();
        interrupted_copy(straight.path(), crashed.path());
        assert_eq!(
            find_resume_point(&checkpoint_dir(crashed.path()), None)
                .unwrap()
                .epoch,
            2
        );

        let options = RunOptions {
            resume: true,
            ..RunOptions::quiet(crashed.path())
        };
        let resumed = train_language_model(&model, &training, &split, &device, &options).unwrap();
        assert_eq!(resumed.start_step, 8);
        let losses = |history: &History| {
            history
                .train
                .iter()
                .map(|p| (p.step, p.loss, p.lr))
                .collect::<Vec<_>>()
        };
        assert_eq!(
            losses(&resumed.history),
            losses(&full.history),
            "training losses"
        );
        // history.json round-trips every float exactly (serde_json's float_roundtrip).
        assert_eq!(
            resumed.history.validation, full.history.validation,
            "validation losses and perplexities"
        );
        assert_eq!(
            parameters(&resumed.model),
            parameters(&full.model),
            "final parameters"
        );

        // Resuming a folder without checkpoints is a clear error.
        let empty = TempDir::with_prefix("lm-empty").unwrap();
        let options = RunOptions {
            resume: true,
            ..RunOptions::quiet(empty.path())
        };
        let error = train_language_model(&model, &training, &split, &device, &options).unwrap_err();
        assert!(
            error.to_string().contains("no checkpoint to resume from"),
            "{error}"
        );

        // A new run in the folder of a run is refused; with `overwrite` it removes the
        // old run (and temporaries a killed writer left) and starts over.
        let new_run = RunOptions::quiet(crashed.path());
        let error = train_language_model(&model, &training, &split, &device, &new_run).unwrap_err();
        assert!(matches!(error, TrainError::RunExists { .. }), "{error}");
        assert!(error.to_string().contains("--overwrite"), "{error}");
        let checkpoints = checkpoint_dir(crashed.path());
        let old = checkpoints.join("model-9.bpk");
        let stale = checkpoints.join(".model-3.bpk.tmp-4194999-0.bpk");
        std::fs::write(&old, b"an older run").unwrap();
        std::fs::write(&stale, b"half written").unwrap();
        let options = RunOptions {
            overwrite: true,
            ..new_run
        };
        let fresh = train_language_model(&model, &training, &split, &device, &options).unwrap();
        // From step 1 (parameters drawn anew: other test threads may draw from the
        // host generator meanwhile, so the losses are not compared).
        assert_eq!(fresh.start_step, 0);
        let steps = |history: &History| history.train.iter().map(|p| p.step).collect::<Vec<_>>();
        assert_eq!(steps(&fresh.history), steps(&full.history), "a fresh run");
        assert!(!old.exists() && !stale.exists());
    }

    /// A corpus prepared into memory-mapped shards trains exactly as its text in
    /// memory (the same stream, the same windows), and a run interrupted between two
    /// checkpoints resumes to the uninterrupted run's losses and weights: its windows
    /// are drawn from the middle of shards and across their boundaries.
    #[test]
    fn prepared_shards_train_as_text_in_memory_and_resume_to_the_same_run() {
        use crate::train::{PrepareConfig, open_shards, prepare_shards, text_files};
        let text = corpus();
        let (tokenizer, memory) = split(&text);
        let dir = TempDir::with_prefix("lm-shards").unwrap();
        std::fs::write(dir.path().join("corpus.txt"), &text).unwrap();
        let config = PrepareConfig {
            shard_tokens: 700,
            chunk_bytes: 300,
            ..PrepareConfig::new("vocab.json")
        };
        let sources = text_files(&dir.path().join("corpus.txt")).unwrap();
        let shards = dir.path().join("shards");
        let manifest = prepare_shards(&sources, &tokenizer, &shards, &config, |_| {
            std::ops::ControlFlow::Continue(())
        })
        .unwrap();
        assert!(
            manifest.shards.len() >= 10,
            "{} shards",
            manifest.shards.len()
        );
        let (_, mapped) = open_shards(&shards).unwrap();

        let device = Device::flex();
        let model = host_init(1, |host| tiny_model(tokenizer.vocab_size()).try_init(host)).unwrap();
        let training = tiny_training(12, 4);
        let run = |split: &TokenSplit, directory: &Path, resume: bool| {
            let options = RunOptions {
                resume,
                ..RunOptions::quiet(directory)
            };
            train_language_model_from(model.clone(), &training, split, &device, &options).unwrap()
        };
        let in_memory = TempDir::with_prefix("lm-memory").unwrap();
        let from_text = run(&memory, in_memory.path(), false);
        let straight = TempDir::with_prefix("lm-shards-straight").unwrap();
        let from_shards = run(&mapped, straight.path(), false);
        assert_eq!(
            train_points(&from_shards.history),
            train_points(&from_text.history)
        );
        assert_eq!(from_shards.history.validation, from_text.history.validation);

        let crashed = TempDir::with_prefix("lm-shards-crashed").unwrap();
        interrupted_copy(straight.path(), crashed.path());
        let resumed = run(&mapped, crashed.path(), true);
        assert_eq!(resumed.start_step, 8);
        assert_eq!(
            train_points(&resumed.history),
            train_points(&from_shards.history)
        );
        assert_eq!(resumed.history.validation, from_shards.history.validation);
        assert_eq!(parameters(&resumed.model), parameters(&from_shards.model));
    }

    /// (step, loss, learning rate) of every training step.
    fn train_points(history: &History) -> Vec<(usize, f64, f64)> {
        history
            .train
            .iter()
            .map(|p| (p.step, p.loss, p.lr))
            .collect()
    }

    #[test]
    fn an_extended_run_trains_on_to_its_new_end_from_its_newest_intact_checkpoint() {
        let text = corpus();
        let (tokenizer, split) = split(&text);
        let device = Device::flex();
        // A constant learning rate: a run extended from 7 to 10 steps then takes the
        // same steps as a run planned for 10.
        let training = |steps| {
            tiny_training(steps, 3)
                .with_warmup_steps(0)
                .with_min_lr(Some(3e-3))
        };
        let model = host_init(7, |host| tiny_model(tokenizer.vocab_size()).try_init(host)).unwrap();
        let run = |dir: &Path, steps, resume, run_id: &str| {
            let options = RunOptions {
                resume,
                run_id: Some(run_id.into()),
                ..RunOptions::quiet(dir)
            };
            train_language_model_from(model.clone(), &training(steps), &split, &device, &options)
        };
        let straight = TempDir::with_prefix("lm-ten").unwrap();
        let ten = run(straight.path(), 10, false, "ten").unwrap();

        let dir = TempDir::with_prefix("lm-extended").unwrap();
        // Rounds of 3, 3 and 1 steps: the last checkpoint is after step 7.
        let seven = run(dir.path(), 7, false, "seven").unwrap();
        assert_eq!(
            train_points(&seven.history),
            train_points(&ten.history)[..7]
        );
        let checkpoints = checkpoint_dir(dir.path());
        let point = find_resume_point(&checkpoints, Some("seven")).unwrap();
        assert_eq!((point.epoch, point.step), (3, Some(7)));

        // Fewer steps than the run has taken cannot resume it.
        let error = run(dir.path(), 5, true, "seven").unwrap_err().to_string();
        assert!(
            error.contains("after step 7") && error.contains("--steps 7"),
            "{error}"
        );
        // Nor can another run.
        let error = run(dir.path(), 10, true, "other").unwrap_err();
        assert!(matches!(error, TrainError::OtherRun { .. }), "{error}");

        let extended = run(dir.path(), 10, true, "seven").unwrap();
        assert_eq!(extended.start_step, 7);
        assert_eq!(train_points(&extended.history), train_points(&ten.history));
        assert_eq!(parameters(&extended.model), parameters(&ten.model));
        let point = find_resume_point(&checkpoints, Some("seven")).unwrap();
        assert_eq!((point.epoch, point.step), (4, Some(10)));

        // One byte of the newest optimizer state overwritten: resuming falls back to
        // the checkpoint before it (step 7) and trains the same steps again.
        let optim = checkpoints.join("optim-4.bpk");
        let mut bytes = std::fs::read(&optim).unwrap();
        let last = bytes.len() - 1;
        bytes[last] ^= 0x40;
        std::fs::write(&optim, bytes).unwrap();
        let point = find_resume_point(&checkpoints, Some("seven")).unwrap();
        assert_eq!(point.epoch, 3);
        assert!(
            point.warnings[0].contains("optim-4.bpk"),
            "{:?}",
            point.warnings
        );
        let again = run(dir.path(), 10, true, "seven").unwrap();
        assert_eq!(again.start_step, 7);
        assert_eq!(parameters(&again.model), parameters(&ten.model));

        // Checkpoints of an older version (no manifests) resume unverified, and a
        // truncated one among them is an error, not a panic in burn-train.
        for epoch in [3, 4] {
            let _ = std::fs::remove_file(crate::train::manifest_path(&checkpoints, epoch));
        }
        let point = find_resume_point(&checkpoints, None).unwrap();
        assert_eq!((point.epoch, point.step), (4, None));
        assert!(
            point.warnings[0].contains("not verified"),
            "{:?}",
            point.warnings
        );
        // Round 4 was the last, shortened one: the run resumes at its end, step 10.
        let finished = run(dir.path(), 10, true, "seven").unwrap();
        assert_eq!(finished.start_step, 10);
        for epoch in [3, 4] {
            let model_file = crate::train::checkpoint_path(&checkpoints, "model", epoch);
            let bytes = std::fs::read(&model_file).unwrap();
            std::fs::write(&model_file, &bytes[..bytes.len() / 3]).unwrap();
        }
        let error = find_resume_point(&checkpoints, None)
            .unwrap_err()
            .to_string();
        assert!(error.contains("no intact checkpoint"), "{error}");
        assert!(
            error.contains("model-4.bpk") && error.contains("model-3.bpk"),
            "{error}"
        );
    }

    #[test]
    fn same_seed_gives_the_same_losses_on_every_backend() {
        let text = corpus();
        let (tokenizer, split) = split(&text);
        let training = tiny_training(20, 20).with_eval_batches(1);
        // One initial model for every backend: the host generator is shared with
        // every other test thread, so separate draws could differ.
        let model = host_init(training.seed, |host| {
            tiny_model(tokenizer.vocab_size()).try_init(host)
        })
        .unwrap();
        let mut runs = Vec::new();
        for device in model_test_devices() {
            let dir = TempDir::with_prefix("lm-backends").unwrap();
            let result = train_language_model_from(
                model.clone(),
                &training,
                &split,
                &device,
                &RunOptions::quiet(dir.path()),
            )
            .unwrap();
            let losses: Vec<f64> = result.history.train.iter().map(|p| p.loss).collect();
            assert_eq!(losses.len(), 20);
            runs.push((format!("{device:?}"), losses));
        }
        let (reference_name, reference) = &runs[0];
        for (name, losses) in &runs[1..] {
            for (step, (a, b)) in reference.iter().zip(losses).enumerate() {
                assert!(
                    (a - b).abs() <= 1e-3 * a.abs(),
                    "step {}: {reference_name} {a} vs {name} {b}",
                    step + 1
                );
            }
        }
        // And the loss fell.
        assert!(reference[19] < reference[0], "{reference:?}");
    }

    /// Trains a copy of `model` with `training` in a fresh folder.
    fn train_copy(
        model: &CausalLm,
        training: &LmTrainingConfig,
        split: &TokenSplit,
        device: &Device,
    ) -> LmRunResult {
        let dir = TempDir::with_prefix("lm-run").unwrap();
        train_language_model_from(
            model.clone(),
            training,
            split,
            device,
            &RunOptions::quiet(dir.path()),
        )
        .unwrap()
    }

    /// Asserts that two runs took the same steps: training losses within `tolerance`
    /// relative, final weights within `tolerance` absolute.
    fn assert_same_training(one: &LmRunResult, two: &LmRunResult, tolerance: f64, device: &Device) {
        for (a, b) in one.history.train.iter().zip(&two.history.train) {
            assert!(
                (a.loss - b.loss).abs() <= tolerance * a.loss,
                "{device:?} step {}: {} vs {}",
                a.step,
                a.loss,
                b.loss
            );
        }
        for (a, b) in parameters(&one.model).iter().zip(parameters(&two.model)) {
            let error = a
                .iter()
                .zip(&b)
                .map(|(x, y)| (x - y).abs())
                .fold(0.0f32, f32::max);
            assert!(
                (error as f64) < tolerance,
                "{device:?}: weights differ by {error}"
            );
        }
    }

    /// Recomputing activations in the backward pass changes no loss and no weight
    /// beyond float rounding (the memory it saves is measured by the `fine_tune`
    /// benchmark, `--compare checkpointing`).
    #[test]
    fn checkpointed_activations_train_as_stored_ones() {
        let text = corpus();
        let (tokenizer, split) = split(&text);
        let stored = tiny_training(6, 6).with_eval_batches(1);
        let checkpointed = stored.clone().with_checkpoint_activations(true);
        let model = host_init(stored.seed, |host| {
            tiny_model(tokenizer.vocab_size()).try_init(host)
        })
        .unwrap();
        for device in model_test_devices() {
            let run = |training: &LmTrainingConfig| train_copy(&model, training, &split, &device);
            let (one, two) = (run(&stored), run(&checkpointed));
            assert_same_training(&one, &two, 1e-5, &device);
        }
    }

    /// Two micro-batches of 4 windows update the model as one batch of 8: the same
    /// windows, the same losses and, step after step, the same weights (to float
    /// rounding: the gradients are summed in another order).
    #[test]
    fn accumulated_micro_batches_equal_one_large_batch() {
        let text = corpus();
        let (tokenizer, split) = split(&text);
        let large = tiny_training(8, 8).with_eval_batches(1).with_batch_size(8);
        let accumulated = large.clone().with_batch_size(4).with_grad_accumulation(2);
        assert_eq!(large.tokens_per_step(), accumulated.tokens_per_step());
        let model = host_init(large.seed, |host| {
            tiny_model(tokenizer.vocab_size()).try_init(host)
        })
        .unwrap();
        for device in model_test_devices() {
            let run = |training: &LmTrainingConfig| train_copy(&model, training, &split, &device);
            let (one, two) = (run(&large), run(&accumulated));
            assert_same_training(&one, &two, 1e-4, &device);
            // Not a test that cannot fail: one micro-batch of 4 trains otherwise.
            let small = run(&large.clone().with_batch_size(4));
            let differs = one
                .history
                .train
                .iter()
                .zip(&small.history.train)
                .any(|(a, b)| (a.loss - b.loss).abs() > 1e-3);
            assert!(differs);
        }
    }

    /// Two devices sharing every step (burn-train's multi-device strategy; here the
    /// same backend twice, flex, ndarray and wgpu, the only second device a CPU
    /// machine has) train as
    /// one device with the same global batch: each takes half the rows of every batch,
    /// its loss weighted by one half, and the summed gradient is the whole batch's. The
    /// tolerance is float rounding of gradients summed in another order. Clipping is off:
    /// with it each device clips its half to half the norm, which bounds the sum but is
    /// not the one-device clip.
    #[test]
    fn two_devices_train_as_one_with_the_same_global_batch() {
        let text = corpus();
        let (tokenizer, split) = split(&text);
        let training = tiny_training(8, 4)
            .with_eval_batches(1)
            .with_grad_clip(None)
            .with_label_smoothing(0.0);
        let model = host_init(training.seed, |host| {
            tiny_model(tokenizer.vocab_size()).try_init(host)
        })
        .unwrap();
        for device in model_test_devices() {
            let one = train_copy(&model, &training, &split, &device);
            let dir = TempDir::with_prefix("lm-two-devices").unwrap();
            let options = RunOptions {
                extra_devices: vec![device.clone()],
                ..RunOptions::quiet(dir.path())
            };
            let two =
                train_language_model_from(model.clone(), &training, &split, &device, &options)
                    .unwrap();
            assert_eq!(two.history.train.len(), 8, "one history point per step");
            assert_same_training(&one, &two, 1e-4, &device);
            for (a, b) in one.history.validation.iter().zip(&two.history.validation) {
                assert!((a.loss - b.loss).abs() < 1e-4 * a.loss, "{a:?} vs {b:?}");
            }
            // Not a test that cannot fail: half the batch on one device trains otherwise.
            let half = train_copy(
                &model,
                &training.clone().with_batch_size(2),
                &split,
                &device,
            );
            assert!(parameters(&half.model) != parameters(&two.model));
            // A batch that does not split evenly is refused before training.
            let odd = training.clone().with_batch_size(3);
            let error = train_language_model_from(model.clone(), &odd, &split, &device, &options)
                .unwrap_err()
                .to_string();
            assert!(
                error.contains("do not split evenly over 2 devices"),
                "{error}"
            );
        }
    }

    /// Mixed precision: 200 steps in bf16 (flex) and f16 (wgpu, with loss scaling;
    /// f16 on flex is the same code, 2.4× slower than bf16 there, so not repeated)
    /// follow the f32 run's validation losses to within 3% (bf16 keeps 8
    /// significant bits, so per-step losses differ in the third digit and the runs
    /// drift apart slowly), while the master weights stay f32.
    #[test]
    fn mixed_precision_follows_the_f32_loss_curve() {
        let text = corpus();
        let (tokenizer, split) = split(&text);
        let training = tiny_training(200, 50).with_eval_batches(2);
        let model = host_init(training.seed, |host| {
            tiny_model(tokenizer.vocab_size()).try_init(host)
        })
        .unwrap();
        let mut runs = vec![
            (Device::flex(), Precision::Bf16),
            (Device::flex(), Precision::F16),
        ];
        #[cfg(feature = "wgpu")]
        runs.push((crate::test_utils::wgpu_device(), Precision::F16));
        for (device, precision) in runs {
            let reference = train_copy(&model, &training, &split, &device);
            let low = train_copy(
                &model,
                &training.clone().with_precision(precision),
                &split,
                &device,
            );
            let (f32_losses, low_losses): (Vec<f64>, Vec<f64>) = reference
                .history
                .validation
                .iter()
                .zip(&low.history.validation)
                .map(|(a, b)| (a.loss, b.loss))
                .unzip();
            assert_eq!(f32_losses.len(), 4);
            for (a, b) in f32_losses.iter().zip(&low_losses) {
                assert!(
                    (a - b).abs() <= 0.03 * a,
                    "{device:?} {precision:?}: {low_losses:?} vs f32 {f32_losses:?}"
                );
            }
            assert!(low_losses[3] < 0.8 * low_losses[0], "{low_losses:?}");
            // Not the f32 run itself: the passes ran in the low precision.
            assert!(f32_losses != low_losses);
            let weight = low.model.embed_tokens.weight.val();
            assert_eq!(weight.dtype(), DType::F32, "master weights stay f32");
        }
    }

    #[test]
    fn bad_settings_are_clear_errors() {
        let text = "tiny corpus\n".repeat(3);
        let (tokenizer, split) = split(&text);
        let dir = TempDir::with_prefix("lm-bad").unwrap();
        let options = RunOptions::quiet(dir.path());
        let device = Device::flex();
        let model = tiny_model(tokenizer.vocab_size());
        let long = train_language_model(
            &model,
            &tiny_training(4, 2).with_context(64),
            &split,
            &device,
            &options,
        )
        .unwrap_err()
        .to_string();
        assert!(long.contains("too few for a context of 64"), "{long}");
        let zero = train_language_model(&model, &tiny_training(0, 2), &split, &device, &options)
            .unwrap_err()
            .to_string();
        assert!(zero.contains("`steps`"), "{zero}");
        let small = train_language_model(
            &tiny_model(2),
            &tiny_training(4, 2).with_context(2),
            &split,
            &device,
            &options,
        )
        .unwrap_err()
        .to_string();
        assert!(small.contains("vocab-size"), "{small}");
        let positions = tiny_model(tokenizer.vocab_size()).with_learned_positions(Some(2));
        let short = train_language_model(
            &positions,
            &tiny_training(4, 2).with_context(3),
            &split,
            &device,
            &options,
        )
        .unwrap_err()
        .to_string();
        assert!(
            short.contains("`context`") && short.contains("2 learned positions"),
            "{short}"
        );
        let device_error = crate::device::parse_device("tpu").unwrap_err().to_string();
        assert!(
            device_error.contains("unknown device `tpu`"),
            "{device_error}"
        );
    }
}
