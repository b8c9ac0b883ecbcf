//! Training on burn-train: language modelling on any text, and sequence-to-sequence
//! tasks, with the same code on every backend.
//!
//! ```text
//! corpus ─► Tokenizer ─► TokenSplit (train | validation) ─► WindowLoader (seeded windows)
//!   (or corpus ─► prepare_shards ─► memory-mapped shards ─► open_shards ─► TokenSplit)
//!   ─► LmTask (CausalLm + cross entropy [+ MoE aux loss]) ─► burn-train Learner
//! DigitTask ─► Seq2SeqLoader (seeded batches) ─► Seq2SeqTask (Transformer) ─► Learner
//!        AdamW · WarmupCosine / Noam · global-norm clipping · label smoothing
//!   ─► progress lines and a History · atomic checkpoints with verified manifests
//!      (exact resumption, runs extended past their planned end)
//! ```
//!
//! Everything random about a run (initial parameters, windows, dropout) is derived
//! from one seed and the step number, never from a generator that keeps state, so a
//! run resumed from its checkpoint takes the same steps as one that never stopped.

mod checkpoint;
mod checkpointer;
mod clip;
mod data;
mod error;
mod json_file;
mod lm;
mod loss;
mod manifest;
mod precision;
mod progress;
mod record_layout;
mod run;
mod schedule;
mod seq2seq;
mod step;

pub use checkpoint::{CHECKPOINT_RECORDS, checkpoint_path, load_module, save_module};
pub use clip::clip_grad_norm;
pub use data::digits;
pub use data::{
    ByteTokenizer, CharTokenizer, Corpus, DigitTask, Example, LmBatch, PrepareConfig,
    PrepareCursor, PrepareProgress, SHARDS_MANIFEST, Seq2SeqBatch, Seq2SeqLoader, ShardFile,
    ShardManifest, SourceFile, TokenSplit, Tokenizer, Tokens, WindowLoader, check_prepare_folder,
    is_prepared, open_shards, prepare_shards, test_examples, text_files,
};
pub use error::TrainError;
pub use lm::{
    LmRunResult, LmTask, LmTrainingConfig, mtp_validation_loss, train_language_model,
    train_language_model_from, validation_loss,
};
pub use loss::cross_entropy;
pub use manifest::{CheckpointManifest, FileDigest, ResumePoint, find_resume_point, manifest_path};
pub use precision::Precision;
pub use progress::{History, TrainPoint, ValidationPoint};
pub use run::{RunOptions, checkpoint_dir, clear_run, history_file, holds_run, new_run_id};
pub use schedule::{WarmupCosine, WarmupCosineConfig, noam};
pub use seq2seq::{
    Seq2SeqEvaluation, Seq2SeqRunResult, Seq2SeqTask, Seq2SeqTrainingConfig, evaluate_exact_match,
    train_seq2seq,
};
pub use step::{StepSettings, adamw};

use burn::tensor::Device;

/// The CPU device parameters are drawn on: the same seed gives the same initial
/// model whatever device trains it.
fn host_device() -> Option<Device> {
    #[cfg(feature = "flex")]
    return Some(Device::flex());
    #[cfg(all(not(feature = "flex"), feature = "ndarray"))]
    #[allow(deprecated)] // ndarray is deprecated upstream; we keep supporting it.
    return Some(Device::ndarray());
    #[allow(unreachable_code)]
    None
}

/// Builds a module with `init` on the host CPU seeded with `seed` (or on the
/// default device when no CPU backend is compiled in). Move it to the training
/// device with [`to_training_device`] (or `to_device` for inference) afterwards.
///
/// # Errors
/// The error of `init`.
pub fn host_init<M: burn::module::Module, E>(
    seed: u64,
    init: impl FnOnce(&Device) -> Result<M, E>,
) -> Result<M, TrainError>
where
    TrainError: From<E>,
{
    // The device's generator is shared by every thread: hold it from seeding until
    // the last parameter is drawn, so concurrent runs (parallel tests, programs that
    // build several models) cannot interleave their draws.
    static HOST_GENERATOR: std::sync::Mutex<()> = std::sync::Mutex::new(());
    let _drawing = HOST_GENERATOR
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner());
    let host = host_device().unwrap_or_default();
    host.seed(seed);
    let module = init(&host)?;
    // Draw lazily initialized parameters now, in a fixed order, while the seed is ours.
    module.visit(&mut Materialize);
    Ok(module)
}

/// Moves a module built by [`host_init`] to the autodiff version of `device`, ready
/// to train.
///
/// Parameters drawn on a plain (non-autodiff) device only remember that they are
/// trainable; `train()` turns that into tracked tensors once they are on an autodiff
/// device. Without it the loss would have no graph to differentiate.
///
/// On a device with gradient checkpointing (`device.autodiff().gradient_checkpointing()`)
/// the parameters take its strategy: a tensor keeps the strategy it was made with when
/// it moves, and operations refuse to mix strategies.
pub fn to_training_device<M: burn::module::Module>(module: M, device: &Device) -> M {
    let autodiff = if device.is_autodiff() {
        device.clone()
    } else {
        device.clone().autodiff()
    };
    let module = module.to_device(&autodiff).train();
    match autodiff.gradient_checkpointing_strategy() {
        Some(strategy) if strategy != burn::tensor::GradientCheckpointingStrategy::Disabled => {
            module.map(&mut WithCheckpointing(strategy))
        }
        _ => module,
    }
}

/// Gives every float parameter a gradient-checkpointing strategy.
struct WithCheckpointing(burn::tensor::GradientCheckpointingStrategy);

impl burn::module::ModuleMapper for WithCheckpointing {
    fn map_float<const D: usize>(
        &mut self,
        param: burn::module::Param<burn::tensor::Tensor<D>>,
    ) -> burn::module::Param<burn::tensor::Tensor<D>> {
        let strategy = self.0;
        param.map(|tensor| tensor.with_gradient_checkpointing_strategy(strategy))
    }
}

/// Reads every parameter once, which initializes lazy ones.
struct Materialize;

impl burn::module::ModuleVisitor for Materialize {
    fn visit_float<const D: usize>(
        &mut self,
        param: &burn::module::Param<burn::tensor::Tensor<D>>,
    ) {
        let _ = param.val();
    }
}

#[cfg(test)]
pub(crate) mod tests {
    /// Parameters and the model's constants (RoPE tables) take the strategy of a
    /// checkpointing device, so a forward and backward run there (operations refuse
    /// operands of different strategies).
    #[test]
    fn a_checkpointing_device_gives_its_strategy_to_parameters_and_constants() {
        use burn::tensor::{Device, GradientCheckpointingStrategy, Int, Tensor};
        let device = Device::flex();
        let model = crate::model::CausalLmConfig::tiny().init(&device);
        let checkpointing = device.autodiff().gradient_checkpointing();
        let model = super::to_training_device(model, &checkpointing);
        let weight = model.embed_tokens.weight.val();
        assert_eq!(
            weight.gradient_checkpointing_strategy(),
            Some(GradientCheckpointingStrategy::Balanced)
        );
        let tokens = Tensor::<2, Int>::from_data([[1, 2, 3, 4, 5]], &checkpointing);
        let grads = model.forward(tokens, None).square().mean().backward();
        assert!(model.embed_tokens.weight.val().grad(&grads).is_some());
    }

    use std::path::Path;

    /// Makes `crashed` the folder of a run like `straight` killed during its third
    /// round: round 2's checkpoints (and manifest) and a history that went further.
    pub fn interrupted_copy(straight: &Path, crashed: &Path) {
        let (from, to) = (
            super::checkpoint_dir(straight),
            super::checkpoint_dir(crashed),
        );
        std::fs::create_dir_all(&to).unwrap();
        for name in super::CHECKPOINT_RECORDS {
            std::fs::copy(
                super::checkpoint_path(&from, name, 2),
                super::checkpoint_path(&to, name, 2),
            )
            .unwrap();
        }
        std::fs::copy(super::manifest_path(&from, 2), super::manifest_path(&to, 2)).unwrap();
        std::fs::copy(super::history_file(straight), super::history_file(crashed)).unwrap();
    }
}
