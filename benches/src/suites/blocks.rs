//! Building blocks: RMSNorm, RoPE and SwiGLU, ours beside Burn's own module of the
//! same math (`burn::nn::RmsNorm`, `burn::nn::RotaryEncoding`, `burn::nn::SwiGlu` plus
//! the down projection), forward and forward+backward.

use burn::tensor::{Device, Distribution, Tensor};
use burn_transformer::ffn::SwiGluConfig;
use burn_transformer::norm::RmsNormConfig;
use burn_transformer::position::RopeConfig;
use serde::{Deserialize, Serialize};

use super::{Job, Mode, device_named};
use crate::measure::{Runs, finish, time_runs};
use crate::record::Record;

/// A building block.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Block {
    /// RMSNorm over `d_model`.
    RmsNorm,
    /// Rotary embedding of `[batch, heads, seq, head_dim]`.
    Rope,
    /// The gated feed-forward `down(silu(gate(x)) ⊙ up(x))`.
    SwiGlu,
}

impl Block {
    /// Every block, in report order.
    pub const ALL: [Block; 3] = [Block::RmsNorm, Block::Rope, Block::SwiGlu];

    /// The bench name in records.
    pub fn name(self) -> &'static str {
        match self {
            Block::RmsNorm => "rms_norm",
            Block::Rope => "rope",
            Block::SwiGlu => "swiglu",
        }
    }
}

/// One block on one backend: ours and Burn's, forward and forward+backward.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Case {
    /// The block.
    pub block: Block,
    /// The backend name.
    pub backend: String,
    /// Batch size.
    pub batch: usize,
    /// Tokens per sequence.
    pub seq: usize,
    /// Model width (RMSNorm, SwiGLU).
    pub d_model: usize,
    /// SwiGLU hidden width.
    pub d_ff: usize,
    /// Heads (RoPE).
    pub heads: usize,
    /// Head width (RoPE).
    pub head_dim: usize,
    /// Warm-up and timed runs.
    pub runs: Runs,
}

/// The blocks of `mode` on `backend`.
pub fn jobs(mode: Mode, backend: &str) -> Vec<Job> {
    // LLaMA proportions: d_ff ≈ 8/3·d_model rounded to a multiple of 16, 64-wide heads.
    let (batch, seq, d_model, d_ff) = match mode {
        Mode::Quick => (4, 256, 512, 1376),
        Mode::Full => (8, 1024, 1024, 2752),
    };
    Block::ALL
        .into_iter()
        .map(|block| {
            Job::Blocks(Case {
                block,
                backend: backend.to_string(),
                batch,
                seq,
                d_model,
                d_ff,
                heads: d_model / 64,
                head_dim: 64,
                runs: mode.runs(),
            })
        })
        .collect()
}

impl Case {
    /// A progress line.
    pub fn describe(&self) -> String {
        format!(
            "{} {} tokens {}x{} d {}",
            self.block.name(),
            self.backend,
            self.batch,
            self.seq,
            self.d_model
        )
    }

    /// The four records of this case with no numbers yet.
    pub fn records(&self) -> Vec<Record> {
        let mut records = Vec::new();
        for backward in [false, true] {
            for implementation in ["ours", "burn"] {
                records.push(self.record(implementation, backward));
            }
        }
        records
    }

    fn record(&self, implementation: &str, backward: bool) -> Record {
        let rope = self.block == Block::Rope;
        Record {
            batch: self.batch,
            heads: if rope { self.heads } else { 0 },
            kv_heads: if rope { self.heads } else { 0 },
            seq: self.seq,
            head_dim: if rope { self.head_dim } else { self.d_model },
            pass: if backward { "fwd_bwd" } else { "fwd" }.into(),
            d_model: Some(self.d_model),
            ..Record::new(self.block.name(), implementation, &self.backend)
        }
    }

    /// Measures ours and Burn's, forward and forward+backward.
    ///
    /// # Errors
    /// Why the case could not be measured.
    pub fn run(&self) -> Result<Vec<Record>, String> {
        let base = device_named(&self.backend)?;
        let mut records = Vec::new();
        for backward in [false, true] {
            let device = if backward {
                base.clone().autodiff()
            } else {
                base.clone()
            };
            for implementation in ["ours", "burn"] {
                let ours = implementation == "ours";
                let tokens = (self.batch * self.seq) as f64;
                let timing = match self.block {
                    Block::RmsNorm => {
                        let shape = [self.batch, self.seq, self.d_model];
                        if ours {
                            let norm = RmsNormConfig::new(self.d_model).init(&device);
                            measure(&device, self.runs, shape, backward, |x| norm.forward(x))
                        } else {
                            let norm = burn::nn::RmsNormConfig::new(self.d_model).init(&device);
                            measure(&device, self.runs, shape, backward, |x| norm.forward(x))
                        }
                    }
                    Block::Rope => {
                        let shape = [self.batch, self.heads, self.seq, self.head_dim];
                        if ours {
                            let rope = RopeConfig::new(self.head_dim)
                                .with_max_position_embeddings(self.seq)
                                .init(&device);
                            measure(&device, self.runs, shape, backward, |x| rope.forward(x, 0))
                        } else {
                            let rope = burn::nn::RotaryEncodingConfig::new(self.seq, self.head_dim)
                                .init(&device);
                            measure(&device, self.runs, shape, backward, |x| rope.forward(x))
                        }
                    }
                    Block::SwiGlu => {
                        let shape = [self.batch, self.seq, self.d_model];
                        if ours {
                            let ffn = SwiGluConfig::new(self.d_model, self.d_ff).init(&device);
                            measure(&device, self.runs, shape, backward, |x| ffn.forward(x))
                        } else {
                            let gate =
                                burn::nn::SwiGluConfig::new(self.d_model, self.d_ff).init(&device);
                            let down = burn::nn::LinearConfig::new(self.d_ff, self.d_model)
                                .with_bias(false)
                                .init(&device);
                            measure(&device, self.runs, shape, backward, |x| {
                                down.forward(gate.forward(x))
                            })
                        }
                    }
                }?;
                let mut record = self.record(implementation, backward).with_timing(&timing);
                record.tokens_per_s = Some(tokens / (timing.median_ms / 1e3));
                records.push(record);
            }
        }
        Ok(records)
    }
}

/// Times `forward` on fresh normal inputs of `shape`; with `backward`, also the
/// gradient of the input (and of the module's parameters).
fn measure<const D: usize>(
    device: &Device,
    runs: Runs,
    shape: [usize; D],
    backward: bool,
    forward: impl Fn(Tensor<D>) -> Tensor<D>,
) -> Result<crate::measure::Timing, String> {
    time_runs(
        device,
        runs,
        || {
            let x = Tensor::<D>::random(shape, Distribution::Normal(0.0, 1.0), device);
            let grad = Tensor::<D>::random(shape, Distribution::Normal(0.0, 1.0), device);
            Ok(if backward {
                (x.require_grad(), grad)
            } else {
                (x, grad)
            })
        },
        |(x, grad)| {
            let output = forward(x.clone());
            if backward {
                let grads = (output * grad).sum().backward();
                finish(x.grad(&grads).ok_or("no input gradient")?)?;
            } else {
                finish(output)?;
            }
            Ok(())
        },
    )
}
