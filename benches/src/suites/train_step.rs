//! Training steps of the LLaMA-style [`CausalLm`](burn_transformer::model::CausalLm) at
//! two sizes: forward, loss, backward, global gradient clipping and the AdamW update,
//! exactly the step `train-lm` runs (the library's own [`LmTask`]), as tokens per second.
//!
//! On backends with the fused kernel (wgpu, cuda) each size is also measured with the
//! attention forced onto the reference path, its peer in the same run.

use burn::module::Module;
use burn::tensor::Device;
use burn::train::TrainStep;
use burn_transformer::attention::AttentionImpl;
use burn_transformer::model::{CausalLm, CausalLmConfig};
use burn_transformer::position::RopeConfig;
use burn_transformer::train::{
    LmTask, Precision, StepSettings, WindowLoader, adamw, host_init, to_training_device,
};
use serde::{Deserialize, Serialize};

use super::{Job, Mode, device_named};
use crate::measure::{Runs, Timing, finish, time_runs};
use crate::record::Record;

/// A model size of the suite.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Size {
    /// nanoGPT's CPU size: width 128, 4 layers, 4 heads (2 key/value), context 128.
    Small,
    /// Width 256, 6 layers, 8 heads of 32 (2 key/value), context 256.
    Medium,
}

impl Size {
    /// Both sizes, in report order.
    pub const ALL: [Size; 2] = [Size::Small, Size::Medium];

    /// The name in records and tables.
    pub fn name(self) -> &'static str {
        match self {
            Size::Small => "small",
            Size::Medium => "medium",
        }
    }

    fn shape(self) -> Shape {
        match self {
            Size::Small => Shape {
                vocab: 256,
                d_model: 128,
                layers: 4,
                heads: 4,
                kv_heads: 2,
                d_ff: 352,
                batch: 8,
                context: 128,
            },
            Size::Medium => Shape {
                vocab: 1024,
                d_model: 256,
                layers: 6,
                heads: 8,
                kv_heads: 2,
                d_ff: 688,
                batch: 8,
                context: 256,
            },
        }
    }

    fn config(self, implementation: AttentionImpl) -> CausalLmConfig {
        let s = self.shape();
        CausalLmConfig::new(
            s.vocab,
            s.d_model,
            s.layers,
            s.heads,
            s.d_ff,
            RopeConfig::new(s.d_model / s.heads).with_max_position_embeddings(s.context),
        )
        .with_n_kv_heads(Some(s.kv_heads))
        .with_norm_eps(1e-5)
        .with_tie_word_embeddings(true)
        .with_implementation(implementation)
    }
}

/// The model and batch of a [`Size`].
#[derive(Clone, Copy, Debug)]
struct Shape {
    vocab: usize,
    d_model: usize,
    layers: usize,
    heads: usize,
    kv_heads: usize,
    d_ff: usize,
    batch: usize,
    context: usize,
}

/// One model size with one attention path on one backend.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Case {
    /// The model size.
    pub size: Size,
    /// `auto` (the automatic choice: the fused kernel where the backend has it) or
    /// `reference` (the tensor-op attention, its peer).
    pub attention: String,
    /// The backend name.
    pub backend: String,
    /// Warm-up and timed runs.
    pub runs: Runs,
}

/// The cases of `mode` on `backend`: both sizes, and on kernel backends both paths.
pub fn jobs(mode: Mode, backend: &str) -> Vec<Job> {
    // Backends where `auto` takes the fused op: the reference path is its peer there.
    let kernel = matches!(backend, "wgpu" | "cuda" | "vulkan" | "flex");
    let paths: &[&str] = if kernel {
        &["auto", "reference"]
    } else {
        &["auto"]
    };
    let runs = mode.model_runs();
    Size::ALL
        .iter()
        .flat_map(|&size| {
            paths.iter().map(move |path| {
                Job::TrainStep(Case {
                    size,
                    attention: path.to_string(),
                    backend: backend.to_string(),
                    runs,
                })
            })
        })
        .collect()
}

impl Case {
    /// A progress line.
    pub fn describe(&self) -> String {
        format!(
            "train_step {} {} {}",
            self.size.name(),
            self.attention,
            self.backend
        )
    }

    /// The record of this case with no numbers yet.
    pub fn record(&self) -> Record {
        let s = self.size.shape();
        Record {
            batch: s.batch,
            heads: s.heads,
            kv_heads: s.kv_heads,
            seq: s.context,
            head_dim: s.d_model / s.heads,
            causal: true,
            pass: "fwd_bwd".into(),
            d_model: Some(s.d_model),
            ..Record::new("train_step", &self.attention, &self.backend)
        }
    }

    /// Times whole training steps (loss, backward, clipping, AdamW update) on fresh
    /// windows of random tokens; the clock stops after an updated weight is read back.
    ///
    /// # Errors
    /// Why the case could not be measured.
    pub fn run(&self) -> Result<Vec<Record>, String> {
        let device = device_named(&self.backend)?.autodiff();
        let implementation = match self.attention.as_str() {
            "reference" => AttentionImpl::Reference,
            _ => AttentionImpl::Auto,
        };
        let config = self.size.config(implementation);
        let Shape {
            vocab,
            batch,
            context,
            ..
        } = self.size.shape();
        let model = host_init(0, |host| config.try_init(host)).map_err(|e| e.to_string())?;
        let params = model.num_params();
        let timing = time_train_steps(
            model,
            Precision::F32,
            &device,
            vocab,
            [batch, context],
            self.runs,
            || {},
        )?;
        let mut record = self.record().with_timing(&timing);
        record.tokens_per_s = Some((batch * context) as f64 / (timing.median_ms / 1e3));
        record.params = Some(params);
        Ok(vec![record])
    }
}

/// `len` pseudo-random token ids below `vocab` (a multiplicative hash of the position
/// `offset + i`): the stream the training benchmarks train on, the same in every run;
/// another `offset` gives another stream.
pub fn random_tokens(len: usize, vocab: usize, offset: u64) -> Vec<u32> {
    (offset..offset + len as u64)
        .map(|i| ((i.wrapping_mul(2_654_435_761) >> 7) % vocab as u64) as u32)
        .collect()
}

/// Times whole training steps of `model` on the autodiff `device` (with its
/// checkpointing, if any): the loss, backward, global gradient clipping at 1 and the
/// AdamW update that `train-lm` runs, on fresh windows of a pseudo-random stream of
/// `vocab` ids, `windows = [batch, context]` a step. The clock stops after an updated weight is read back; `after_each`
/// runs after every step (to sample memory, say).
///
/// # Errors
/// Why a step could not be measured.
pub fn time_train_steps(
    model: CausalLm,
    precision: Precision,
    device: &Device,
    vocab: usize,
    windows: [usize; 2],
    runs: Runs,
    mut after_each: impl FnMut() + Send,
) -> Result<Timing, String> {
    let [batch, context] = windows;
    let mut task = Some(
        LmTask::new(
            to_training_device(model, device),
            StepSettings {
                label_smoothing: 0.0,
                grad_clip: Some(1.0),
                seed: 0,
            },
        )
        .with_precision(precision),
    );
    let mut optimizer = adamw(0.9, 0.99, 1e-8, 0.1);
    // A token stream long enough for every window of every run.
    let stream = random_tokens(batch * context * 4, vocab, 0);
    let loader = WindowLoader::training(stream.into(), batch, context, 1, 0, 0, device);
    let mut step = 0;
    // As `train-lm` runs its steps: on flex's own pool (no-op elsewhere).
    burn_transformer::device::on_compute_pool(device, || {
        time_runs(
            device,
            runs,
            || {
                step += 1;
                Ok(loader.batch(step))
            },
            |batch| {
                let current = task.take().ok_or("the model was lost in a failed step")?;
                let output = TrainStep::step(&current, batch);
                let updated = optimizer.step(1e-3, current, output.grads);
                // Reading a weight back waits for the step's queued work.
                let weight = updated.model.embed_tokens.weight.val();
                task = Some(updated);
                finish(weight)?;
                after_each();
                Ok(())
            },
        )
    })
}
