//! What one optimizer step of every task shares: the per-step random state, the
//! backward pass, global-norm gradient clipping and the AdamW optimizer.

use burn::module::{Module, ParamGroup};
use burn::optim::{AdamWConfig, GradientsAccumulator, GradientsParams, ModuleOptimizer};
use burn::tensor::{Device, Int, Tensor};
use burn::train::{SequenceOutput, TrainOutput};

use super::clip::{grad_norm, scale_grads};
use super::data::SplitMix64;
use super::precision::LossScaler;
use super::{TrainError, clip_grad_norm, cross_entropy};

/// What a training step needs besides the model.
#[derive(Debug, Clone, Copy)]
pub struct StepSettings {
    /// Label smoothing of the training loss.
    pub label_smoothing: f64,
    /// Global gradient-norm clip.
    pub grad_clip: Option<f64>,
    /// Seed of the per-step random state (dropout).
    pub seed: u64,
}

impl StepSettings {
    /// Checks the settings.
    ///
    /// # Errors
    /// [`TrainError::InvalidSetting`] for a label smoothing outside `[0, 1)` or a
    /// gradient clip that is not positive.
    pub fn validate(&self) -> Result<(), TrainError> {
        if !(0.0..1.0).contains(&self.label_smoothing) {
            return Err(TrainError::setting(
                "label-smoothing",
                format!("must be in [0, 1), got {}", self.label_smoothing),
            ));
        }
        if let Some(clip) = self.grad_clip
            && !(clip.is_finite() && clip > 0.0)
        {
            return Err(TrainError::setting(
                "grad-clip",
                format!("must be positive, got {clip}"),
            ));
        }
        Ok(())
    }
}

/// Checks that every count of `settings` (named as the command-line flags name them)
/// is positive.
///
/// # Errors
/// [`TrainError::InvalidSetting`] naming the first that is 0.
pub(crate) fn require_positive(settings: &[(&'static str, usize)]) -> Result<(), TrainError> {
    match settings.iter().find(|(_, value)| *value == 0) {
        Some((setting, _)) => Err(TrainError::setting(setting, "must be greater than 0")),
        None => Ok(()),
    }
}

/// The seed of step `step`'s random state: a hash of the run's seed and the step,
/// so consecutive steps get unrelated streams.
pub(crate) fn step_seed(seed: u64, step: usize) -> u64 {
    SplitMix64::new(seed, step as u64).next_u64()
}

/// Which step a batch is for and how its gradient is formed.
#[derive(Debug, Clone, Copy)]
pub(crate) struct StepPart<'a> {
    /// The global step.
    pub step: usize,
    /// The fraction of the step's batch this batch is (see [`train_step`]).
    pub share: f64,
    /// Micro-batches the batch is backpropagated in.
    pub micro_batches: usize,
    /// The dynamic loss scale of f16 training.
    pub scaler: Option<&'a LossScaler>,
}

/// One training step of `module`: seeds `device`'s generator from
/// `(settings.seed, step)`, so the dropout masks of step `s` depend on nothing else
/// and a resumed run replays them; runs `forward` (the loss and the logits) on each of
/// `micro_batches` parts of the batch, backpropagating each part's loss divided by
/// their number as soon as it is computed (so only one part's activations are alive)
/// and summing the gradients: the mean loss of equal parts is the whole batch's, so
/// the update is the whole batch's. Then clips the summed gradients' global norm.
///
/// `share` is the fraction of the step's batch this one is (`1/n` on each of `n`
/// devices sharing the step, whose gradients burn-train then sums): the loss is
/// backpropagated with that weight, so the summed gradient is the whole batch's, and
/// each part is clipped to its share of the norm (their sum then stays within it).
///
/// With a `scaler` (f16 training), the loss is multiplied by its scale before the
/// backward pass and the gradients divided by it after; a step whose gradients are not
/// finite hands the optimizer no gradient (it is skipped) and the scale is lowered.
///
/// # Shapes
/// - `forward(part)` returns the part's loss `[1]` and logits `[batch / micro_batches,
///   seq, vocab]`
/// - targets: `[batch, seq]`
pub(crate) fn train_step<M: Module>(
    module: &M,
    settings: &StepSettings,
    device: &Device,
    part: StepPart<'_>,
    targets: Tensor<2, Int>,
    mut forward: impl FnMut(usize) -> (Tensor<1>, Tensor<3>),
) -> TrainOutput<SequenceOutput> {
    let StepPart {
        step,
        share,
        micro_batches,
        scaler,
    } = part;
    device.seed(step_seed(settings.seed, step));
    let loss_scale = scaler.map_or(1.0, LossScaler::scale);
    let share = share * loss_scale;
    let weighted = |loss: &Tensor<1>, weight: f64| match weight == 1.0 {
        true => loss.clone(),
        false => loss.clone() * weight,
    };
    let (mut grads, loss, logits, targets) = if micro_batches <= 1 {
        let (loss, logits) = forward(0);
        (
            GradientsParams::from_grads(weighted(&loss, share).backward(), module),
            loss,
            logits,
            targets,
        )
    } else {
        let mut accumulator = GradientsAccumulator::<M>::new();
        let mut total: Option<Tensor<1>> = None;
        let mut last_logits = None;
        for part in 0..micro_batches {
            let (loss, logits) = forward(part);
            let grads = weighted(&loss, share / micro_batches as f64).backward();
            accumulator.accumulate(module, GradientsParams::from_grads(grads, module));
            let loss = loss.detach();
            total = Some(match total {
                Some(total) => total + loss,
                None => loss,
            });
            last_logits = Some(logits.detach());
        }
        let loss = total.expect("at least one part") / micro_batches as f64;
        // The metrics read the loss; the logits are the last part's.
        let parts = targets.dims()[0] / micro_batches;
        let last = targets
            .clone()
            .narrow(0, parts * (micro_batches - 1), parts);
        (
            accumulator.grads(),
            loss,
            last_logits.expect("at least one part"),
            last,
        )
    };
    if let Some(scaler) = scaler {
        let finite =
            grad_norm(module, &grads).is_none_or(|norm| norm.into_scalar::<f64>().is_finite());
        scaler.update(finite);
        match finite {
            true => scale_grads(module, &mut grads, 1.0 / loss_scale),
            false => grads = GradientsParams::new(),
        }
    }
    if let Some(max_norm) = settings.grad_clip {
        clip_grad_norm(module, &mut grads, max_norm * share / loss_scale);
    }
    TrainOutput {
        grads,
        item: SequenceOutput::new(loss, logits, None, targets),
    }
}

/// What validation reports for a batch: the plain cross entropy (no label smoothing,
/// no auxiliary loss) of `logits` against `targets`, `pad_token` left out.
///
/// # Shapes
/// - logits: `[batch, seq, vocab]`, targets: `[batch, seq]`
pub(crate) fn validation_output(
    logits: Tensor<3>,
    targets: Tensor<2, Int>,
    pad_token: Option<u32>,
) -> SequenceOutput {
    let loss = cross_entropy(logits.clone(), targets.clone(), 0.0, pad_token);
    SequenceOutput::new(loss, logits, None, targets)
}

/// AdamW with decoupled weight decay on every parameter except norm weights and
/// biases (their paths contain `norm`, or end in `bias`), as nanoGPT and LLaMA.
/// Gradient clipping is not the optimizer's: [`clip_grad_norm`] clips the global
/// norm in the training step.
pub fn adamw(beta1: f32, beta2: f32, epsilon: f32, weight_decay: f32) -> ModuleOptimizer {
    let decayed = AdamWConfig::new()
        .with_beta_1(beta1)
        .with_beta_2(beta2)
        .with_epsilon(epsilon)
        .with_weight_decay(weight_decay);
    let optimizer = decayed.init();
    if weight_decay == 0.0 {
        return optimizer;
    }
    // Groups match by path, not by parameter id: ids are restored from a checkpoint,
    // paths are stable, so a resumed run puts each parameter in the same group.
    match ParamGroup::from_any_regexes(vec![r"norm", r"(^|\.)bias$"]) {
        Ok(undecayed) => {
            optimizer.with_group(undecayed, decayed.with_weight_decay(0.0).build(), None)
        }
        Err(_) => optimizer,
    }
}
