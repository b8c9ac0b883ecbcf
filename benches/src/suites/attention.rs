//! Attention: the implementations of `softmax(q·kᵀ·scale + mask)·v` side by side,
//! forward and forward+backward, with peak memory.
//!
//! Implementations: `fused` (our flash-attention op: the CubeCL kernels on wgpu and
//! cuda, the tiled CPU flash attention on flex, the extension's portable tensor-op
//! implementation on ndarray),
//! `reference` (our tensor-op path, which materializes the scores) and `burn` (Burn's
//! own `burn::tensor::module::attention`) and, on cuda and flex, `torch_sdpa` (PyTorch's
//! `scaled_dot_product_attention`, run by `benches/attention_torch.py` in a child
//! process), each measured in the same run on the same shapes. Every forward cell
//! checks its output once against a peer.
//!
//! On cuda the grid is the GPU one: batch 4, 16 heads, sequences of 1024–16384 in bf16
//! (and f32 in full mode), with each kernel family of the fused op as a column of its own.

use burn::tensor::ops::AttentionModuleOptions;
use burn::tensor::{DType, Distribution, Tensor};
use burn_transformer::attention::{AttentionOptions, reference_attention};
use burn_transformer::ops::flash_attention::{FlashKernel, ScoreOptions, flash_attention};
use burn_transformer::ops::mask::MaskRule;
use serde::{Deserialize, Serialize};

use super::{Job, Mode, device_named};
use crate::measure::{PeakMemory, Runs, Timing, finish, max_abs_diff, time_runs};
use crate::record::{Record, dtype_name};

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
    /// PyTorch's `scaled_dot_product_attention`.
    TorchSdpa,
}

impl Impl {
    /// The name in records and tables.
    pub fn name(self) -> &'static str {
        match self {
            Impl::Fused => "fused",
            Impl::Reference => "reference",
            Impl::Burn => "burn",
            Impl::TorchSdpa => "torch_sdpa",
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
            // FlashAttention's kernels on CUDA, PyTorch's flash CPU kernel on the CPU.
            Impl::TorchSdpa => false,
        }
    }

    /// The peer an output is checked against.
    fn peer(self, seq: usize) -> Impl {
        match self {
            // Past 4096 the reference path's scores get large: Burn's op checks then.
            Impl::Fused if seq <= 4096 => Impl::Reference,
            Impl::Fused => Impl::Burn,
            Impl::Reference | Impl::Burn | Impl::TorchSdpa => Impl::Fused,
        }
    }

    /// `softmax(q·kᵀ/√d + mask)·v`, through the fused op's kernel family `kernel` where
    /// the implementation is ours.
    ///
    /// # Shapes
    /// - q, k, v: `[batch, heads, seq, head_dim]`; output likewise
    fn attend(
        self,
        q: Tensor<4>,
        k: Tensor<4>,
        v: Tensor<4>,
        causal: bool,
        kernel: FlashKernel,
    ) -> Result<Tensor<4>, String> {
        Ok(match self {
            Impl::Fused => {
                let scale = 1.0 / (q.dims()[3] as f64).sqrt();
                let options =
                    ScoreOptions::new(scale, None, MaskRule::new(causal, None)).with_kernel(kernel);
                flash_attention(q, k, v, None, None, &options)
                    .map_err(|reason| format!("the fused op does not take this call: {reason}"))?
            }
            Impl::TorchSdpa => return Err("PyTorch runs in a process of its own".into()),
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
    /// Element type of q, k and v.
    pub dtype: DType,
    /// The fused op's kernel family, where the grid compares them (cuda); `None` for
    /// the device's default.
    pub kernel: Option<FlashKernel>,
    /// Forward and backward (gradients of q, k and v) instead of forward only.
    pub backward: bool,
    /// Warm-up and timed runs.
    pub runs: Runs,
}

/// The shapes and element types of one backend's grid.
struct Grid {
    batch: usize,
    heads: usize,
    head_dims: &'static [usize],
    causals: &'static [bool],
    dtypes: &'static [DType],
    fwd_seqs: &'static [usize],
    bwd_seqs: &'static [usize],
}

impl Grid {
    /// The grid of `mode` on `backend`.
    fn of(mode: Mode, backend: &str) -> Self {
        match (backend, mode) {
            // The GPU grid (FlashAttention-2's): long sequences, bf16 first.
            ("cuda", Mode::Quick) => Self {
                batch: 4,
                heads: 16,
                head_dims: &[128],
                causals: &[false, true],
                dtypes: &[DType::BF16],
                fwd_seqs: &[1024, 4096, 16384],
                bwd_seqs: &[1024, 4096, 16384],
            },
            ("cuda", Mode::Full) => Self {
                batch: 4,
                heads: 16,
                head_dims: &[64, 128],
                causals: &[false, true],
                dtypes: &[DType::BF16, DType::F32],
                fwd_seqs: &[1024, 2048, 4096, 8192, 16384],
                bwd_seqs: &[1024, 2048, 4096, 8192, 16384],
            },
            (_, Mode::Quick) => Self {
                batch: 1,
                heads: 8,
                head_dims: &[64],
                causals: &[true],
                dtypes: &[DType::F32],
                fwd_seqs: &[256, 512, 1024, 2048],
                bwd_seqs: &[256, 1024],
            },
            (_, Mode::Full) => Self {
                batch: 2,
                heads: 8,
                head_dims: &[64, 128],
                causals: &[false, true],
                dtypes: &[DType::F32],
                fwd_seqs: &[256, 512, 1024, 2048, 4096, 8192],
                bwd_seqs: &[256, 512, 1024, 2048, 4096, 8192],
            },
        }
    }
}

/// The implementations measured on `backend` for inputs of `dtype`, each with its
/// kernel family: on cuda every family of the fused op that takes `dtype` (tensor
/// cores and the fragment kernels take f16/bf16, the TF32 fragment kernels f32; the
/// one-pass backward's family differs from the others in its backward only, so it
/// times forward+backward cells), elsewhere the device's default.
fn implementations(
    backend: &str,
    dtype: DType,
    backward: bool,
) -> Vec<(Impl, Option<FlashKernel>)> {
    let mut list = Vec::new();
    if backend == "cuda" {
        list.push((Impl::Fused, Some(FlashKernel::RegisterTile)));
        list.push((Impl::Fused, Some(FlashKernel::Staged)));
        if matches!(dtype, DType::BF16 | DType::F16) {
            list.push((Impl::Fused, Some(FlashKernel::StagedTensorCores)));
            list.push((Impl::Fused, Some(FlashKernel::Fragments)));
            list.push((Impl::Fused, Some(FlashKernel::WideFragments)));
            list.push((Impl::Fused, Some(FlashKernel::FragmentsOverlapped)));
            if backward {
                list.push((Impl::Fused, Some(FlashKernel::FragmentsAtomicDq)));
            }
        } else if dtype == DType::F32 {
            list.push((Impl::Fused, Some(FlashKernel::FragmentsTf32)));
        }
    } else {
        list.push((Impl::Fused, None));
    }
    list.push((Impl::Reference, None));
    list.push((Impl::Burn, None));
    // PyTorch on the same device: the GPU, or the CPU flex runs on.
    if matches!(backend, "cuda" | "flex") {
        list.push((Impl::TorchSdpa, None));
    }
    list
}

/// The grid of `mode` on `backend`.
pub fn jobs(mode: Mode, backend: &str) -> Vec<Job> {
    let grid = Grid::of(mode, backend);
    let mut cells = Vec::new();
    let mut push = |batch, heads, seq, head_dim, causal, dtype, backward| {
        for (implementation, kernel) in implementations(backend, dtype, backward) {
            cells.push(Job::Attention(Cell {
                implementation,
                backend: backend.to_string(),
                batch,
                heads,
                seq,
                head_dim,
                causal,
                dtype,
                kernel,
                backward,
                runs: mode.runs(),
            }));
        }
    };
    for &dtype in grid.dtypes {
        for &head_dim in grid.head_dims {
            for &causal in grid.causals {
                for (backward, seqs) in [(false, grid.fwd_seqs), (true, grid.bwd_seqs)] {
                    for &seq in seqs {
                        push(
                            grid.batch, grid.heads, seq, head_dim, causal, dtype, backward,
                        );
                    }
                }
            }
        }
    }
    if mode == Mode::Full && backend != "cuda" {
        // 1×8 heads, d 64, non-causal: at 2048 its naive scores (128 MiB) still fit
        // lavapipe's largest buffer, where 2×8's do not, so the forward+backward cell at
        // 2048 has peers to compare with on an emulated GPU too.
        for backward in [false, true] {
            for seq in [1024, 2048] {
                push(1, 8, seq, 64, false, DType::F32, backward);
            }
        }
    }
    cells
}

/// Floating-point operations of attention at one shape, as FlashAttention's papers
/// count them: `4·batch·heads·seq²·head_dim` for the two products of the forward, half
/// of it under a causal mask, and 3.5 times the forward for forward+backward (the
/// backward's five products cost 2.5 forwards).
pub fn flops(
    batch: usize,
    heads: usize,
    seq: usize,
    head_dim: usize,
    causal: bool,
    backward: bool,
) -> f64 {
    let forward = 4.0 * (batch * heads) as f64 * (seq as f64).powi(2) * head_dim as f64;
    let masked = if causal { forward / 2.0 } else { forward };
    if backward { 3.5 * masked } else { masked }
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
            dtype: Some(dtype_name(self.dtype).into()),
            kernel: self.kernel.map(kernel_label),
            ..Record::new("attention", self.implementation.name(), &self.backend)
        }
    }

    /// The record of this cell with the timing of `timing` and its arithmetic rate.
    fn timed_record(&self, timing: &Timing) -> Record {
        let mut record = self.record().with_timing(timing);
        let flops = flops(
            self.batch,
            self.heads,
            self.seq,
            self.head_dim,
            self.causal,
            self.backward,
        );
        record.tflops = Some(flops / (timing.median_ms * 1e-3) / 1e12);
        record
    }

    /// A progress line, naming the implementation as the report's column does (f32
    /// cells and default kernels leave both unnamed, so that `--only` patterns name the
    /// same cells as before either existed).
    pub fn describe(&self) -> String {
        format!(
            "attention {} {} {} {}×{} seq {} d {}{}{}",
            crate::report::attention_column(&self.record()),
            self.backend,
            self.pass(),
            self.batch,
            self.heads,
            self.seq,
            self.head_dim,
            if self.causal { " causal" } else { "" },
            if self.dtype == DType::F32 {
                String::new()
            } else {
                format!(" {}", dtype_name(self.dtype))
            }
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
        if self.implementation == Impl::TorchSdpa {
            return self.run_torch();
        }
        let base = device_named(&self.backend)?;
        let device = if self.backward {
            base.clone().autodiff()
        } else {
            base.clone()
        };
        let shape = [self.batch, self.heads, self.seq, self.head_dim];
        let kernel = self.kernel.unwrap_or_default();
        let mut memory = PeakMemory::start(&device);
        let draw =
            || Tensor::<4>::random(shape, Distribution::Normal(0.0, 1.0), &device).cast(self.dtype);
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
                let output = self.implementation.attend(
                    q.clone(),
                    k.clone(),
                    v.clone(),
                    self.causal,
                    kernel,
                )?;
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
        let mut record = self.timed_record(&timing);
        record.peak_bytes = peak;
        record.peak_method = Some(method.into());
        if !self.backward {
            let draw = || {
                Tensor::<4>::random(shape, Distribution::Normal(0.0, 1.0), &base).cast(self.dtype)
            };
            let (q, k, v) = (draw(), draw(), draw());
            let attend =
                |implementation: Impl, q, k, v| implementation.attend(q, k, v, self.causal, kernel);
            let output = attend(self.implementation, q.clone(), k.clone(), v.clone())?;
            let peer = self.implementation.peer(self.seq);
            if self.peer_fits_on_device(peer) {
                let expected = attend(peer, q, k, v)?;
                record.check_error = Some(max_abs_diff(output, expected));
                record.checked_against = Some(peer.name().into());
            } else {
                // Heads are independent: the first head, recomputed by the reference
                // path on the host in f32, checks the long cells whose naive peer
                // cannot allocate its scores on the device.
                let host = device_named("flex")?;
                let first_head = |tensor: Tensor<4>| {
                    Tensor::<4>::from_data(tensor.slice([0..1, 0..1]).into_data(), &host)
                        .cast(DType::F32)
                };
                let expected =
                    attend(Impl::Reference, first_head(q), first_head(k), first_head(v))?;
                record.check_error = Some(max_abs_diff(first_head(output), expected));
                record.checked_against = Some("reference on flex, first head".into());
            }
        }
        Ok(record)
    }

    /// Measures the cell with PyTorch (`benches/attention_torch.py`) in a child process,
    /// on the GPU for cuda and on the CPU for the CPU backends. The interpreter is
    /// `python3`, or `BURN_TRANSFORMER_PYTHON`.
    ///
    /// # Errors
    /// Why PyTorch could not measure it (not installed, no GPU, out of memory).
    fn run_torch(&self) -> Result<Record, String> {
        let device = match self.backend.as_str() {
            "cuda" => "cuda",
            "flex" | "ndarray" => "cpu",
            other => return Err(format!("PyTorch has no peer device for {other}")),
        };
        let request = serde_json::json!({
            "batch": self.batch,
            "heads": self.heads,
            "seq": self.seq,
            "head_dim": self.head_dim,
            "causal": self.causal,
            "backward": self.backward,
            "dtype": self.dtype,
            "device": device,
            "runs": self.runs,
        });
        let python = std::env::var("BURN_TRANSFORMER_PYTHON").unwrap_or_else(|_| "python3".into());
        let output = std::process::Command::new(&python)
            .arg("-c")
            .arg(TORCH_SCRIPT)
            .arg(request.to_string())
            .output()
            .map_err(|error| {
                format!(
                    "cannot start {python} ({error}): PyTorch's peer needs Python 3 with \
                     torch (set BURN_TRANSFORMER_PYTHON to choose the interpreter)"
                )
            })?;
        let stdout = String::from_utf8_lossy(&output.stdout);
        let line = stdout
            .lines()
            .find_map(|line| line.strip_prefix("RESULT "))
            .ok_or_else(|| {
                let stderr = String::from_utf8_lossy(&output.stderr);
                format!(
                    "{python} printed no result: {}",
                    stderr.lines().last().unwrap_or("no output")
                )
            })?;
        let result: TorchResult = serde_json::from_str(line)
            .map_err(|error| format!("PyTorch's result is malformed ({error}): {line}"))?;
        if let Some(failure) = result.failure {
            return Err(failure);
        }
        if result.samples_ms.is_empty() {
            return Err(format!("PyTorch's result has no timed run: {line}"));
        }
        let mut record = self.timed_record(&Timing::from_samples(result.samples_ms));
        record.kernel = result.kernel;
        record.peak_bytes = result.peak_bytes;
        record.peak_method = result.peak_method;
        record.check_error = result.check_error;
        record.checked_against = result.checked_against;
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

/// The PyTorch peer's program, run with `python3 -c` so that the runner finds it
/// wherever it is started from.
const TORCH_SCRIPT: &str = include_str!("../../attention_torch.py");

/// What `attention_torch.py` prints after `RESULT `.
#[derive(Debug, Deserialize)]
struct TorchResult {
    #[serde(default)]
    samples_ms: Vec<f64>,
    peak_bytes: Option<u64>,
    peak_method: Option<String>,
    kernel: Option<String>,
    check_error: Option<f64>,
    checked_against: Option<String>,
    failure: Option<String>,
}

/// A kernel family's name in records and columns: its own, with `+ldmatrix` for the
/// fragment families with their `ldmatrix` loads (the grid runs them on CUDA only,
/// where they are the default), so that a run with `BURN_TRANSFORMER_FLASH_LDMATRIX=0`
/// (element loads, `fragments`) and one without compare side by side.
fn kernel_label(kernel: FlashKernel) -> String {
    let fragments = matches!(
        kernel,
        FlashKernel::Fragments
            | FlashKernel::WideFragments
            | FlashKernel::FragmentsAtomicDq
            | FlashKernel::FragmentsOverlapped
    );
    if fragments && burn_transformer::ops::flash_attention::matrix_loads_enabled() {
        format!("{}+ldmatrix", kernel.name())
    } else {
        kernel.name().into()
    }
}

/// Largest `seq × seq` scores buffer (bytes) a naive peer may allocate on a GPU backend
/// for the output check.
const PEER_SCORES_LIMIT: u64 = 64 << 20;

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    use super::*;

    fn cells(mode: Mode, backend: &str) -> Vec<Cell> {
        jobs(mode, backend)
            .into_iter()
            .map(|job| match job {
                Job::Attention(cell) => cell,
                other => panic!("not an attention job: {other:?}"),
            })
            .collect()
    }

    #[test]
    fn the_cuda_grid_compares_every_kernel_family_with_burn_and_pytorch() {
        let quick = cells(Mode::Quick, "cuda");
        assert!(quick.iter().all(|c| (c.batch, c.heads) == (4, 16)));
        assert!(
            quick
                .iter()
                .all(|c| c.dtype == DType::BF16 && c.head_dim == 128)
        );
        let seqs: BTreeSet<usize> = quick.iter().map(|c| c.seq).collect();
        assert_eq!(seqs.into_iter().collect::<Vec<_>>(), [1024, 4096, 16384]);
        let columns: BTreeSet<String> = quick
            .iter()
            .map(|c| crate::report::attention_column(&c.record()))
            .collect();
        // The fragment kernels' columns name their loads: `ldmatrix` unless turned off.
        let loads = if burn_transformer::ops::flash_attention::matrix_loads_enabled() {
            "+ldmatrix"
        } else {
            ""
        };
        let mut expected: Vec<String> = [
            "burn",
            "fused[register]",
            "fused[staged]",
            "fused[tensor-cores]",
            "reference",
            "torch_sdpa",
        ]
        .map(String::from)
        .into();
        expected.push(format!("fused[fragments{loads}]"));
        expected.push(format!("fused[wide-fragments{loads}]"));
        expected.push(format!("fused[fragments-atomic-dq{loads}]"));
        expected.push(format!("fused[fragments-overlapped{loads}]"));
        expected.sort();
        assert_eq!(columns.into_iter().collect::<Vec<_>>(), expected);
        // f32 has no tensor-core and no 16-bit fragment column, the TF32 fragments
        // instead; every shape has both passes and both masks.
        let full = cells(Mode::Full, "cuda");
        assert!(
            full.iter()
                .any(|c| c.dtype == DType::F32 && c.head_dim == 64)
        );
        assert!(full.iter().any(|c| {
            c.dtype == DType::F32 && c.backward && c.kernel == Some(FlashKernel::FragmentsTf32)
        }));
        assert!(
            !full
                .iter()
                .any(|c| c.dtype != DType::F32 && c.kernel == Some(FlashKernel::FragmentsTf32))
        );
        assert!(!full.iter().any(|c| {
            c.dtype == DType::F32
                && matches!(
                    c.kernel,
                    Some(
                        FlashKernel::StagedTensorCores
                            | FlashKernel::Fragments
                            | FlashKernel::WideFragments
                            | FlashKernel::FragmentsAtomicDq
                            | FlashKernel::FragmentsOverlapped
                    )
                )
        }));
        // The one-pass family times forward+backward cells only.
        assert!(
            !full
                .iter()
                .any(|c| { !c.backward && c.kernel == Some(FlashKernel::FragmentsAtomicDq) })
        );
        // Beside every family's cells, the one-pass family's bf16 forward+backward cells
        // and the overlapped family's bf16 cells of both passes (2 head dims × 2 masks ×
        // 5 lengths each).
        assert_eq!(full.len(), 5 * 2 * 2 * 2 * (8 + 6) + 3 * (2 * 2 * 5));
    }

    #[test]
    fn cpu_grids_keep_their_cells_and_add_pytorch_on_flex_only() {
        for backend in ["flex", "ndarray", "wgpu"] {
            let quick = cells(Mode::Quick, backend);
            assert!(
                quick
                    .iter()
                    .all(|c| c.dtype == DType::F32 && c.kernel.is_none())
            );
            let torch = quick.iter().any(|c| c.implementation == Impl::TorchSdpa);
            assert_eq!(torch, backend == "flex", "{backend}");
            // Progress lines (and `--only` patterns) name f32 cells as before.
            assert!(quick.iter().all(|c| !c.describe().contains("f32")));
        }
    }

    #[test]
    fn flops_count_as_flash_attention_does() {
        // FlashAttention-2's forward at batch 4 × 16 heads, seq 1024, d 128: 4·64·1024²·128.
        let forward = flops(4, 16, 1024, 128, false, false);
        assert_eq!(forward, 4.0 * 64.0 * 1024.0 * 1024.0 * 128.0);
        assert_eq!(flops(4, 16, 1024, 128, true, false), forward / 2.0);
        assert_eq!(flops(4, 16, 1024, 128, false, true), 3.5 * forward);
    }
}
