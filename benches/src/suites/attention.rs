//! Attention: the implementations of `softmax(q·kᵀ·scale + mask)·v` side by side,
//! forward and forward+backward, with peak memory.
//!
//! Implementations: `fused` (our flash-attention op: the CubeCL kernels on wgpu and
//! cuda, the tiled CPU flash attention on flex, the extension's portable tensor-op
//! implementation on ndarray),
//! `reference` (our tensor-op path, which materializes the scores) and `burn` (Burn's
//! own `burn::tensor::module::attention`), each measured in the same run on the same
//! shapes. Every forward cell checks its output once against a peer.

use burn::tensor::ops::AttentionModuleOptions;
use burn::tensor::{Distribution, Tensor};
use burn_transformer::attention::{AttentionOptions, reference_attention};
use burn_transformer::ops::flash_attention::{ScoreOptions, flash_attention};
use burn_transformer::ops::mask::MaskRule;
use serde::{Deserialize, Serialize};

use super::{Job, Mode, device_named};
use crate::measure::{PeakMemory, Runs, finish, max_abs_diff, time_runs};
use crate::record::Record;

/// An implementation of the attention core.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Impl {
    /// Our fused flash-attention op.
    Fused,
    /// Our reference tensor-op path.
    Reference,
    /// `burn::tensor::module::attention`.
    Burn,
}

impl Impl {
    /// Every implementation, in report order.
    pub const ALL: [Impl; 3] = [Impl::Fused, Impl::Reference, Impl::Burn];

    /// The name in records and tables.
    pub fn name(self) -> &'static str {
        match self {
            Impl::Fused => "fused",
            Impl::Reference => "reference",
            Impl::Burn => "burn",
        }
    }

    /// Whether this implementation materializes the `seq × seq` scores on `backend`.
    fn is_naive(self, backend: &str) -> bool {
        match self {
            // The portable implementation (ndarray) materializes scores too.
            Impl::Fused => !matches!(backend, "wgpu" | "cuda" | "flex"),
            Impl::Reference => true,
            // Burn's own op falls back to a score-materializing path where it has no
            // fused kernel; count it as naive for the memory budget.
            Impl::Burn => true,
        }
    }

    /// The peer an output is checked against.
    fn peer(self, seq: usize) -> Impl {
        match self {
            // Past 4096 the reference path's scores get large: Burn's op checks then.
            Impl::Fused if seq <= 4096 => Impl::Reference,
            Impl::Fused => Impl::Burn,
            Impl::Reference | Impl::Burn => Impl::Fused,
        }
    }

    /// `softmax(q·kᵀ/√d + mask)·v`.
    ///
    /// # Shapes
    /// - q, k, v: `[batch, heads, seq, head_dim]`; output likewise
    fn attend(
        self,
        q: Tensor<4>,
        k: Tensor<4>,
        v: Tensor<4>,
        causal: bool,
    ) -> Result<Tensor<4>, String> {
        Ok(match self {
            Impl::Fused => {
                let scale = 1.0 / (q.dims()[3] as f64).sqrt();
                let options = ScoreOptions::new(scale, None, MaskRule::new(causal, None));
                flash_attention(q, k, v, None, None, &options)
                    .map_err(|reason| format!("the fused op does not take this call: {reason}"))?
            }
            Impl::Reference => {
                reference_attention(q, k, v, &AttentionOptions::new().with_causal(causal))
            }
            Impl::Burn => burn::tensor::module::attention(
                q,
                k,
                v,
                None,
                None,
                AttentionModuleOptions {
                    scale: None,
                    softcap: None,
                    is_causal: causal,
                },
            ),
        })
    }
}

/// One cell of the grid: an implementation on a backend at one shape and pass.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Cell {
    /// The implementation.
    pub implementation: Impl,
    /// The backend name.
    pub backend: String,
    /// Batch size.
    pub batch: usize,
    /// Heads (query and key/value: Burn's op has no grouped heads).
    pub heads: usize,
    /// Sequence length of queries and keys.
    pub seq: usize,
    /// Head width.
    pub head_dim: usize,
    /// Causal masking.
    pub causal: bool,
    /// Forward and backward (gradients of q, k and v) instead of forward only.
    pub backward: bool,
    /// Warm-up and timed runs.
    pub runs: Runs,
}

/// The grid of `mode` on `backend`.
pub fn jobs(mode: Mode, backend: &str) -> Vec<Job> {
    // (batch, heads, head dims, causal flags, forward seqs, forward+backward seqs)
    let (batch, heads, dims, causals, fwd_seqs, bwd_seqs): (
        _,
        _,
        &[usize],
        &[bool],
        &[usize],
        &[usize],
    ) = match mode {
        Mode::Quick => (1, 8, &[64], &[true], &[256, 512, 1024, 2048], &[256, 1024]),
        Mode::Full => (
            2,
            8,
            &[64, 128],
            &[false, true],
            &[256, 512, 1024, 2048, 4096, 8192],
            &[256, 512, 1024, 2048, 4096, 8192],
        ),
    };
    let mut cells = Vec::new();
    let mut push = |batch, heads, seq, head_dim, causal, backward| {
        for implementation in Impl::ALL {
            cells.push(Job::Attention(Cell {
                implementation,
                backend: backend.to_string(),
                batch,
                heads,
                seq,
                head_dim,
                causal,
                backward,
                runs: mode.runs(),
            }));
        }
    };
    for &head_dim in dims {
        for &causal in causals {
            for (backward, seqs) in [(false, fwd_seqs), (true, bwd_seqs)] {
                for &seq in seqs {
                    push(batch, heads, seq, head_dim, causal, backward);
                }
            }
        }
    }
    if mode == Mode::Full {
        // 1×8 heads, d 64, non-causal: at 2048 its naive scores (128 MiB) still fit
        // lavapipe's largest buffer, where 2×8's do not, so the forward+backward cell at
        // 2048 has peers to compare with on an emulated GPU too.
        for backward in [false, true] {
            for seq in [1024, 2048] {
                push(1, 8, seq, 64, false, backward);
            }
        }
    }
    cells
}

impl Cell {
    /// `fwd` or `fwd_bwd`.
    pub fn pass(&self) -> &'static str {
        if self.backward { "fwd_bwd" } else { "fwd" }
    }

    /// The record of this cell with no numbers yet.
    pub fn record(&self) -> Record {
        Record {
            batch: self.batch,
            heads: self.heads,
            kv_heads: self.heads,
            seq: self.seq,
            head_dim: self.head_dim,
            causal: self.causal,
            pass: self.pass().into(),
            ..Record::new("attention", self.implementation.name(), &self.backend)
        }
    }

    /// A progress line.
    pub fn describe(&self) -> String {
        format!(
            "attention {} {} {} {}×{} seq {} d {}{}",
            self.implementation.name(),
            self.backend,
            self.pass(),
            self.batch,
            self.heads,
            self.seq,
            self.head_dim,
            if self.causal { " causal" } else { "" }
        )
    }

    /// Bytes of the `seq × seq` f32 scores a naive path holds (three such tensors
    /// live at once in its backward).
    pub fn naive_scores_bytes(&self) -> u64 {
        let factor = if self.backward { 3 } else { 1 };
        (self.batch * self.heads * self.seq * self.seq * 4 * factor) as u64
    }

    /// Why not to run this cell within `memory_budget` bytes, if so.
    pub fn skip_reason(&self, memory_budget: u64) -> Option<String> {
        let needed = self.naive_scores_bytes();
        (self.implementation.is_naive(&self.backend) && needed > memory_budget).then(|| {
            format!(
                "skipped: the naive path needs ~{} MiB for scores (budget {} MiB)",
                needed >> 20,
                memory_budget >> 20
            )
        })
    }

    /// Measures the cell in this process.
    ///
    /// # Errors
    /// Why it could not be measured.
    pub fn run(&self) -> Result<Record, String> {
        let base = device_named(&self.backend)?;
        let device = if self.backward {
            base.clone().autodiff()
        } else {
            base.clone()
        };
        let shape = [self.batch, self.heads, self.seq, self.head_dim];
        let mut memory = PeakMemory::start(&device);
        let draw = || Tensor::<4>::random(shape, Distribution::Normal(0.0, 1.0), &device);
        let timing = time_runs(
            &device,
            self.runs,
            || {
                let (q, k, v, grad) = (draw(), draw(), draw(), draw());
                Ok(if self.backward {
                    (q.require_grad(), k.require_grad(), v.require_grad(), grad)
                } else {
                    (q, k, v, grad)
                })
            },
            |(q, k, v, grad)| {
                let output =
                    self.implementation
                        .attend(q.clone(), k.clone(), v.clone(), self.causal)?;
                if self.backward {
                    let grads = (output * grad).sum().backward();
                    for input in [&q, &k, &v] {
                        finish(input.grad(&grads).ok_or("no gradient")?)?;
                    }
                } else {
                    finish(output)?;
                }
                memory.sample();
                Ok(())
            },
        )?;
        // Peak memory is read before the check below, whose peer may materialize
        // scores this implementation never holds.
        let (peak, method) = memory.peak();
        let mut record = self.record().with_timing(&timing);
        record.peak_bytes = peak;
        record.peak_method = Some(method.into());
        if !self.backward {
            let draw = || Tensor::<4>::random(shape, Distribution::Normal(0.0, 1.0), &base);
            let (q, k, v) = (draw(), draw(), draw());
            let output =
                self.implementation
                    .attend(q.clone(), k.clone(), v.clone(), self.causal)?;
            let peer = self.implementation.peer(self.seq);
            if self.peer_fits_on_device(peer) {
                let expected = peer.attend(q, k, v, self.causal)?;
                record.check_error = Some(max_abs_diff(output, expected));
                record.checked_against = Some(peer.name().into());
            } else {
                // Heads are independent: the first head, recomputed by the reference
                // path on the host, checks the long cells whose naive peer cannot
                // allocate its scores on the device.
                let host = device_named("flex")?;
                let first_head = |tensor: Tensor<4>| {
                    Tensor::<4>::from_data(tensor.slice([0..1, 0..1]).into_data(), &host)
                };
                let expected = Impl::Reference.attend(
                    first_head(q),
                    first_head(k),
                    first_head(v),
                    self.causal,
                )?;
                record.check_error = Some(max_abs_diff(first_head(output), expected));
                record.checked_against = Some("reference on flex, first head".into());
            }
        }
        Ok(record)
    }

    /// Whether `peer` can check this cell's output on the cell's own device: a naive
    /// peer on a GPU backend needs its `seq × seq` scores in one buffer, and adapters
    /// cap a buffer (lavapipe refused 256 MiB).
    fn peer_fits_on_device(&self, peer: Impl) -> bool {
        let scores = (self.batch * self.heads * self.seq * self.seq * 4) as u64;
        !(matches!(self.backend.as_str(), "wgpu" | "cuda")
            && peer.is_naive(&self.backend)
            && scores > PEER_SCORES_LIMIT)
    }
}

/// Largest `seq × seq` scores buffer (bytes) a naive peer may allocate on a GPU backend
/// for the output check.
const PEER_SCORES_LIMIT: u64 = 64 << 20;
