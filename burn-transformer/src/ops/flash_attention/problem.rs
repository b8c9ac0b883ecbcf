//! The description of one attention call apart from its data: how scores become
//! logits ([`ScoreOptions`]), the shapes ([`Problem`]), and why the fused op may not
//! take a call ([`Unsupported`]).

use burn::tensor::{Bool, DType, Shape, Tensor};
use serde::{Deserialize, Serialize};
use thiserror::Error;

use crate::ops::alibi::Alibi;
use crate::ops::mask::MaskRule;

/// The non-tensor arguments of the attention ops: how the scores `q·kᵀ` become logits
/// (scale, soft-cap), which of them are hidden (the [`MaskRule`]), and whether a key
/// padding tensor and learned sinks come with the call.
///
/// ```rust
/// use burn_transformer::ops::flash_attention::ScoreOptions;
/// use burn_transformer::ops::mask::MaskRule;
/// let options = ScoreOptions::new(0.125, None, MaskRule::new(true, Some(128)));
/// assert!(options.mask.causal && options.softcap.is_none());
/// ```
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct ScoreOptions {
    /// Multiplies `q·kᵀ` before the softmax.
    pub scale: f64,
    /// Logit soft-capping `c·tanh(s/c)` (Gemma 2, Grok), applied after the scale and
    /// before masking.
    pub softcap: Option<f64>,
    /// Which keys each query sees by position.
    pub mask: MaskRule,
    /// Whether the call's key mask tensor is a real `[batch, seq_k]` padding mask
    /// (`1` = padded). Without one the ops receive a `[1, 1]` placeholder: tensors only
    /// cross the backend-extension boundary, and a real `[1, 1]` mask exists too.
    pub has_key_mask: bool,
    /// Whether the call's sinks tensor holds real per-head sink logits (gpt-oss):
    /// one more logit per row that joins the softmax's normalization and takes no
    /// value. Without them the ops receive a `[1]` placeholder.
    pub has_sinks: bool,
    /// ALiBi's bias `slope_h · (j − p)` on the logits, added after the soft-cap (see
    /// [`crate::ops::alibi`]).
    pub alibi: Option<Alibi>,
    /// Which kernel family runs the call on CubeCL devices (other backends ignore it).
    pub kernel: FlashKernel,
    /// Lanes each row of the register tiles takes, with the GPUs' tiles, on every
    /// device where they run (see `cube::tiling`): the tests run the GPUs' split rows
    /// on CPU runtimes.
    #[cfg(test)]
    pub(crate) forced_lanes: Option<usize>,
}

/// The kernel family of the fused op on CubeCL devices (wgpu, CUDA).
///
/// Every family computes the same function (the parity grid checks each); they differ
/// in how the work meets the hardware. A family a device or problem cannot take falls
/// back to the next one down: tensor cores → staged → register tiles. In configs and
/// on command lines a family is written by its [`name`](Self::name).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(into = "&'static str", try_from = "String")]
pub enum FlashKernel {
    /// The device's default: register tiles on CPU runtimes (lavapipe, llvmpipe),
    /// where they are the fastest; on GPUs the [`Self::Fragments`] kernels for f16/bf16
    /// where the tensor cores take them, else the fastest of the staged tile sizes,
    /// timed once per shape class ([`Self::Autotune`]). The environment variable
    /// `BURN_TRANSFORMER_FLASH_KERNEL=register|staged|
    /// tensor-cores|fragments|wide-fragments|fragments-atomic-dq|fragments-tf32|
    /// fragments-overlapped|autotune` overrides it for a whole process.
    #[default]
    Auto,
    /// Each unit holds its rows in registers and streams keys from global memory
    /// (fast on CPU runtimes, where shared memory is no faster than global).
    RegisterTile,
    /// FlashAttention-2 with Q/K/V tiles staged in shared memory and tile products
    /// in unit arithmetic.
    Staged,
    /// The staged kernels with tensor-core (`cmma`) tile products for f16/bf16 inputs
    /// whose head dims are multiples of 16 (other calls take [`Self::Staged`]). Only
    /// when asked for: on an H100 it was 3–5 times slower than [`Self::Fragments`].
    StagedTensorCores,
    /// FlashAttention-2 in registers: each plane keeps the scores and the output (or
    /// the gradients) of 16 rows in registers as m16n8k16 fragments multiplied on
    /// tensor cores (`mma.sync`), for f16/bf16 inputs whose query/key head dim is a
    /// multiple of 16 up to 192 and value head dim a multiple of 8 up to 128 (16 for
    /// the backward, which otherwise runs the staged kernels). On CPU runtimes the
    /// fragment operations are emulated through shared memory (the tests' check of
    /// the kernels); other calls take [`Self::Staged`]. [`Self::Auto`]'s choice for
    /// f16/bf16 on GPUs with the instruction.
    Fragments,
    /// The [`Self::Fragments`] kernels with 32 query rows per plane (two tiles of 16)
    /// in the forward, as FlashAttention-2 lays out its warps: every fragment of `K` or
    /// `V` a plane reads from shared memory serves two products instead of one, for
    /// twice the plane's score and accumulator registers. The backward is
    /// [`Self::Fragments`]'. [`Self::Auto`] takes this forward for launches that fill
    /// the GPU several times over.
    WideFragments,
    /// The [`Self::Fragments`] kernels (the forward as [`Self::Auto`] picks it) with a
    /// one-pass backward: the dK/dV kernel also multiplies each tile's `dS` by its
    /// keys and adds that share of `dQ` to an f32 buffer with atomic adds, so the
    /// backward multiplies 5 matrices per tile instead of 7 (FlashAttention-2's
    /// order). The order of those additions varies from run to run, so `dQ` is not
    /// bitwise reproducible; the other families are. Needs atomic f32 addition on the
    /// device and a query/key head dim up to 128 (else the two-pass backward runs).
    /// Only when asked for, until GPU timings show where it wins.
    FragmentsAtomicDq,
    /// The [`Self::Fragments`] kernels for f32 inputs too: on GPUs whose tensor cores
    /// multiply TF32 (m16n8k8 `mma.sync`, NVIDIA sm_80 and later), each f32 element is
    /// split in two TF32 parts and each product made of three TF32 products
    /// (`a_lo·b_hi + a_hi·b_lo + a_hi·b_hi`), which keeps f32's accuracy (a single
    /// TF32 product keeps 10 mantissa bits, a thousandth). On CPU runtimes the same
    /// split runs emulated; f16/bf16 inputs run [`Self::Fragments`]; devices without
    /// the instruction take [`Self::Staged`]. Only when asked for: it has not been
    /// timed on a GPU.
    FragmentsTf32,
    /// The [`Self::Fragments`] kernels (the forward as [`Self::Auto`] picks it) with
    /// FlashAttention-2's overlap of copies and computation: in the forward and dQ,
    /// each tile's `V` is copied into shared memory while the planes compute its
    /// scores, and the next tile's `K` while they run the rest of the tile (dQ keeps
    /// two buffers of keys, as it reads a tile's keys until its last product); dK/dV
    /// copies the next tile of query rows (`Q`, `dO`, their statistics) into second
    /// buffers while the planes compute on this one. The backward takes it where the
    /// second buffers fit. On CUDA (sm_80 and later) the copies are `cp.async`, which
    /// bypass the units' registers; on other runtimes they are synchronous, in the
    /// same order (which checks the order and gains nothing). Only when asked for: it
    /// has not been timed on a GPU.
    FragmentsOverlapped,
    /// Times the candidates (staged tiles of 64, 32 and 16 rows and keys; register
    /// tiles on CPU runtimes, as on GPUs they spill) once per shape class on the
    /// device and keeps the fastest, as `Auto` does on GPUs for what the fragment
    /// kernels do not take; this asks for it on CPU runtimes too. Tensor cores are not
    /// among the candidates.
    Autotune,
}

impl FlashKernel {
    /// Every family, `Auto` first.
    pub const ALL: [Self; 10] = [
        Self::Auto,
        Self::RegisterTile,
        Self::Staged,
        Self::StagedTensorCores,
        Self::Fragments,
        Self::WideFragments,
        Self::FragmentsAtomicDq,
        Self::FragmentsTf32,
        Self::FragmentsOverlapped,
        Self::Autotune,
    ];

    /// The family's name: `auto`, `register`, `staged`, `tensor-cores`, `fragments`,
    /// `wide-fragments`, `fragments-atomic-dq`, `fragments-tf32`, `fragments-overlapped`
    /// or `autotune`.
    pub fn name(self) -> &'static str {
        match self {
            Self::Auto => "auto",
            Self::RegisterTile => "register",
            Self::Staged => "staged",
            Self::StagedTensorCores => "tensor-cores",
            Self::Fragments => "fragments",
            Self::WideFragments => "wide-fragments",
            Self::FragmentsAtomicDq => "fragments-atomic-dq",
            Self::FragmentsTf32 => "fragments-tf32",
            Self::FragmentsOverlapped => "fragments-overlapped",
            Self::Autotune => "autotune",
        }
    }

    /// The family named `name` (any case, surrounding blanks ignored).
    pub fn parse(name: &str) -> Option<Self> {
        let name = name.trim().to_ascii_lowercase();
        Self::ALL.into_iter().find(|kernel| kernel.name() == name)
    }

    /// Reads `BURN_TRANSFORMER_FLASH_KERNEL`; `None` when unset, empty or `auto`.
    #[cfg(feature = "cube")]
    pub(crate) fn from_env() -> Option<Self> {
        let value = std::env::var("BURN_TRANSFORMER_FLASH_KERNEL").ok()?;
        if value.trim().is_empty() {
            return None;
        }
        match Self::try_from(value) {
            Ok(Self::Auto) => None,
            Ok(kernel) => Some(kernel),
            Err(reason) => {
                log::warn!("BURN_TRANSFORMER_FLASH_KERNEL: {reason}; using auto");
                None
            }
        }
    }
}

/// Environment variable that, set to `0`, has the [`FlashKernel::Fragments`] kernels
/// load their fragments of the tiles staged in shared memory element by element
/// instead of with `ldmatrix` (CUDA, f16/bf16: one instruction per fragment, the plane
/// naming whole 8×8 matrices), which they use wherever the device has it. Element
/// loads are slower on GPUs; the variable is there to compare the two.
pub const MATRIX_LOADS_VAR: &str = "BURN_TRANSFORMER_FLASH_LDMATRIX";

/// Whether the fragment kernels may load with `ldmatrix`: unless [`MATRIX_LOADS_VAR`]
/// is `0`.
pub fn matrix_loads_enabled() -> bool {
    !std::env::var(MATRIX_LOADS_VAR).is_ok_and(|value| value.trim() == "0")
}

impl From<FlashKernel> for &'static str {
    fn from(kernel: FlashKernel) -> Self {
        kernel.name()
    }
}

impl TryFrom<String> for FlashKernel {
    type Error = String;

    fn try_from(name: String) -> Result<Self, String> {
        Self::parse(&name).ok_or_else(|| {
            let names: Vec<&str> = Self::ALL.into_iter().map(Self::name).collect();
            format!("`{name}` is not one of {}", names.join(", "))
        })
    }
}

impl ScoreOptions {
    /// Options with `scale`, an optional soft-cap and a mask rule. The entry points
    /// set `has_key_mask` from the padding tensor they are given.
    pub fn new(scale: f64, softcap: Option<f64>, mask: MaskRule) -> Self {
        Self {
            scale,
            softcap,
            mask,
            has_key_mask: false,
            has_sinks: false,
            alibi: None,
            kernel: FlashKernel::Auto,
            #[cfg(test)]
            forced_lanes: None,
        }
    }

    /// These options with the kernel family `kernel` on CubeCL devices.
    pub fn with_kernel(self, kernel: FlashKernel) -> Self {
        Self { kernel, ..self }
    }

    /// These options with (or without) ALiBi.
    pub fn with_alibi(self, alibi: Option<Alibi>) -> Self {
        Self { alibi, ..self }
    }

    /// These options for a call with (or without) attention sinks.
    pub(crate) fn with_sinks(self, has_sinks: bool) -> Self {
        Self { has_sinks, ..self }
    }

    /// These options for a call with (or without) a key padding tensor.
    pub(crate) fn with_key_mask(self, has_key_mask: bool) -> Self {
        Self {
            has_key_mask,
            ..self
        }
    }
}

/// The shape of one attention call, apart from its data.
///
/// Query head `h` reads key/value head `h / (heads / kv_heads)`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Problem {
    /// Batch size.
    pub batch: usize,
    /// Number of query heads.
    pub heads: usize,
    /// Number of key/value heads; divides `heads`.
    pub kv_heads: usize,
    /// Query sequence length.
    pub seq_q: usize,
    /// Key/value sequence length.
    pub seq_k: usize,
    /// Query/key head dimension.
    pub d_qk: usize,
    /// Value head dimension.
    pub d_v: usize,
    /// Which keys each query sees by position.
    pub mask: MaskRule,
    /// Whether a `[batch, seq_k]` key padding mask is given.
    pub has_key_mask: bool,
    /// Whether the logits take ALiBi's bias.
    pub has_alibi: bool,
}

impl Problem {
    /// Reads the problem from the tensor shapes and options of one call.
    ///
    /// # Shapes
    /// - q: `[batch, heads, seq_q, d_qk]`
    /// - k: `[batch, kv_heads, seq_k, d_qk]`
    /// - v: `[batch, kv_heads, seq_k, d_v]`
    pub fn from_shapes(q: &Shape, k: &Shape, v: &Shape, options: &ScoreOptions) -> Self {
        Self {
            batch: q[0],
            heads: q[1],
            kv_heads: k[1],
            seq_q: q[2],
            seq_k: k[2],
            d_qk: q[3],
            d_v: v[3],
            mask: options.mask,
            has_key_mask: options.has_key_mask,
            has_alibi: options.alibi.is_some(),
        }
    }

    /// Checks the shapes of one attention call and reads its problem.
    ///
    /// # Shapes
    /// - q: `[batch, heads, seq_q, d_qk]`
    /// - k: `[batch, kv_heads, seq_k, d_qk]`
    /// - v: `[batch, kv_heads, seq_k, d_v]`
    /// - key_padding: `[batch, seq_k]`
    ///
    /// # Panics
    /// On inconsistent shapes or a zero window: programmer errors at this level
    /// (modules check user-facing shapes before they get here).
    pub fn of_call(
        q: &Tensor<4>,
        k: &Tensor<4>,
        v: &Tensor<4>,
        key_padding: Option<&Tensor<2, Bool>>,
        options: &ScoreOptions,
    ) -> Self {
        let [batch, heads, _, d_qk] = q.dims();
        let [k_batch, kv_heads, seq_k, k_dim] = k.dims();
        let [v_batch, v_heads, v_seq, _] = v.dims();
        assert!(
            k_batch == batch && v_batch == batch,
            "attention: batch sizes differ (q {batch}, k {k_batch}, v {v_batch})"
        );
        assert_eq!(
            k_dim, d_qk,
            "attention: q and k head dims differ ({d_qk} vs {k_dim})"
        );
        assert!(
            v_heads == kv_heads && v_seq == seq_k,
            "attention: k is [_, {kv_heads}, {seq_k}, _] but v is [_, {v_heads}, {v_seq}, _]"
        );
        assert!(
            kv_heads > 0 && heads % kv_heads == 0,
            "attention: {heads} query heads cannot share {kv_heads} key/value heads"
        );
        assert!(
            options.mask.window != Some(0),
            "attention: a sliding window must be at least 1"
        );
        assert!(
            options.mask.chunk != Some(0),
            "attention: a chunk must be at least 1 position"
        );
        if let Some(padding) = key_padding {
            assert_eq!(
                padding.dims(),
                [batch, seq_k],
                "attention: key padding must be [batch, seq_k]"
            );
        }
        let options = options.with_key_mask(key_padding.is_some());
        Self::from_shapes(&q.shape(), &k.shape(), &v.shape(), &options)
    }

    /// Query heads per key/value head.
    pub fn group(&self) -> usize {
        self.heads / self.kv_heads
    }

    /// Whether a dimension is 0 (nothing to compute).
    pub fn is_empty(&self) -> bool {
        [
            self.batch,
            self.heads,
            self.kv_heads,
            self.seq_q,
            self.seq_k,
            self.d_qk,
            self.d_v,
        ]
        .contains(&0)
    }
}

/// Why the fused op does not take a call. The attention core then uses the
/// reference path (and logs this reason); it never returns wrong numbers.
#[derive(Clone, Debug, PartialEq, Eq, Error)]
pub enum Unsupported {
    /// Not one of the float types the kernel reads (f32, f16, bf16).
    #[error("dtype {0:?} is not f32, f16 or bf16")]
    DType(DType),
    /// The device cannot compute in this float type (bf16 on most wgpu adapters).
    #[error("the device has no arithmetic in {0:?}")]
    DeviceDType(DType),
    /// An empty dimension: nothing to launch.
    #[error("empty problem (a dimension is 0): {0:?}")]
    Empty(Problem),
    /// Head dimensions beyond what the kernels take.
    #[error("head dims d_qk={d_qk} + d_v={d_v} exceed {max}")]
    HeadDim {
        /// Query/key head dimension.
        d_qk: usize,
        /// Value head dimension.
        d_v: usize,
        /// Largest `d_qk + d_v` supported.
        max: usize,
    },
    /// More cubes than the device can launch in one dimension.
    #[error("grid of {cubes} cubes exceeds the device limit {limit}")]
    Grid {
        /// Cubes needed.
        cubes: usize,
        /// Device limit.
        limit: usize,
    },
    /// The device's backend has no implementation of the op.
    #[error("no fused attention for backend {0}")]
    Backend(&'static str),
    /// A feature of the call the kernel does not implement.
    #[error("{0}")]
    Feature(&'static str),
}
