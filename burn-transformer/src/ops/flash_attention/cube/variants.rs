//! Every kernel the CubeCL launches compile for a device, as CubeCL kernel definitions
//! (the IR a runtime's compiler turns into device code), built from the device's
//! properties alone.
//!
//! What a kernel costs on a GPU — registers, spills, shared memory, and with them how
//! many cubes share a multiprocessor — is decided by the device compiler, which a
//! runtime only runs at the first launch. [`kernel_variants`] builds the kernels the
//! launches in `launch.rs` would build, with the tiles `tiling.rs` picks, so that a
//! tool can compile them ahead of time with the runtime's own compiler and read those
//! costs from the device toolchain, on a machine without the device
//! (`benches/src/bin/kernel_source.rs`, `tools/kernel_resources.py`).

use std::fmt;
use std::sync::Arc;

use burn::backend::cubecl::dtype_to_storage_type;
use burn::tensor::DType;
use cubecl::prelude::*;
use cubecl::{CompilationError, define_kernel};

use super::super::{Problem, Unsupported};
use super::fragment::FragmentOps;
use super::fragments::{self, FragmentConfig, FragmentTiling};
use super::launch::{MERGE_UNITS, PREPASS_UNITS, config};
use super::register_tiles;
use super::row_stats;
use super::sizes::SizesCompilationArg;
use super::staged;
use super::tile_product::TileProduct;
use super::tiling::{
    KernelTile, LARGEST_STAGED_BLOCK, STAGED_BLOCK_LIMITS, StagedProduct, StagedTiling, Tiling,
    dq_atomic_width, fragment_row_tiles, plan_fragments, plan_staged, plan_tiling,
};
use crate::ops::mask::MaskRule;

/// Sequence length (queries and keys) the variants are planned for: long enough that
/// every tile kernel gets its full cube, as in training and prefill (short sequences,
/// decoding above all, get smaller cubes). The fragment kernels are built as calls
/// without a soft-cap run them (see [`FragmentConfig::softcap`]).
pub const VARIANT_SEQ_LEN: usize = 4096;

/// Head dims `(d_qk, d_v)` of the variants: the common head sizes, and MLA's
/// (192/128 in training and prefill, 576/512 in the absorbed decode).
pub const VARIANT_HEAD_DIMS: [(usize, usize); 6] = [
    (64, 64),
    (128, 128),
    (192, 192),
    (256, 256),
    (192, 128),
    (576, 512),
];

/// Input types of the variants: the float types the kernels read.
pub const VARIANT_DTYPES: [DType; 3] = [DType::F32, DType::F16, DType::BF16];

/// One kernel of the fused op.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum AttentionKernel {
    /// The forward: output and log-sum-exp.
    Forward,
    /// Flash-decoding's merge of the forward's key splits (staged families).
    DecodeMerge,
    /// The backward's pre-pass: `(LSE, D)` per query row.
    BackwardPrepass,
    /// The backward's query kernel: `dQ`.
    BackwardDq,
    /// The backward's key/value kernel: `dK` and `dV`.
    BackwardDkDv,
}

impl AttentionKernel {
    /// Whether the kernel forms attention scores (the pre-pass and the merge do not,
    /// so ALiBi leaves them alone).
    pub fn has_scores(self) -> bool {
        !matches!(self, Self::BackwardPrepass | Self::DecodeMerge)
    }

    /// The kernel's name in tools' output: `forward`, `decode_merge`,
    /// `backward_prepass`, `backward_dq`, `backward_dkdv`.
    pub fn name(self) -> &'static str {
        match self {
            Self::Forward => "forward",
            Self::DecodeMerge => "decode_merge",
            Self::BackwardPrepass => "backward_prepass",
            Self::BackwardDq => "backward_dq",
            Self::BackwardDkDv => "backward_dkdv",
        }
    }
}

impl fmt::Display for AttentionKernel {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A family of kernels implementing the fused op: each has its own forward and
/// backward kernels, and a device may take one family or another.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum KernelFamily {
    /// Each unit holds its rows in registers and streams the keys (or queries) from
    /// global memory; no shared memory (see `register_tiles.rs`).
    RegisterTile,
    /// FlashAttention-2 with tiles staged in shared memory, tile products in unit
    /// arithmetic (see `staged.rs`).
    Staged,
    /// The staged kernels with tensor-core tile products (f16/bf16 only).
    StagedTensorCores,
    /// The fragment kernels with tensor-core products (f16/bf16 only, see
    /// `fragments.rs`): forward, dQ and dK/dV; their pre-pass and flash-decoding's merge
    /// are the staged family's.
    Fragments,
    /// The fragment forward with 32 query rows per plane (f16/bf16 only); its backward
    /// kernels are [`Self::Fragments`]'.
    WideFragments,
    /// The one-pass fragment backward's dK/dV kernel, which also adds `dQ` atomically
    /// (f16/bf16 only); its forward is [`Self::Fragments`]' or [`Self::WideFragments`]'.
    FragmentsAtomicDq,
    /// The fragment kernels for f32 inputs, each product three TF32 products of split
    /// elements (f32 only, see `fragment.rs`).
    FragmentsTf32,
    /// The fragment forward, narrow and wide, and the dQ and dK/dV kernels, with the
    /// copies of the tiles they stream overlapped with their computation (`cp.async`
    /// where the device has it; f16/bf16 only).
    FragmentsOverlapped,
}

impl KernelFamily {
    /// Every family, in the order tools list them.
    pub const ALL: [KernelFamily; 8] = [
        KernelFamily::RegisterTile,
        KernelFamily::Staged,
        KernelFamily::StagedTensorCores,
        KernelFamily::Fragments,
        KernelFamily::WideFragments,
        KernelFamily::FragmentsAtomicDq,
        KernelFamily::FragmentsTf32,
        KernelFamily::FragmentsOverlapped,
    ];

    /// The family's name in tools' output (`register_tile`, `staged`,
    /// `staged_tensor_cores`, `fragments`, `wide_fragments`, `fragments_atomic_dq`,
    /// `fragments_tf32`, `fragments_overlapped`).
    pub fn name(self) -> &'static str {
        match self {
            Self::RegisterTile => "register_tile",
            Self::Staged => "staged",
            Self::StagedTensorCores => "staged_tensor_cores",
            Self::Fragments => "fragments",
            Self::WideFragments => "wide_fragments",
            Self::FragmentsAtomicDq => "fragments_atomic_dq",
            Self::FragmentsTf32 => "fragments_tf32",
            Self::FragmentsOverlapped => "fragments_overlapped",
        }
    }
}

impl fmt::Display for KernelFamily {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// One compiled kernel: which kernel of which family, for which input type and head
/// dims, with its launch shape; [`define`](Self::define) gives its definition.
///
/// The definition is built on demand: each one owns its own IR, which a compiler
/// consumes, so a tool holds one at a time rather than all of them.
pub struct KernelVariant {
    /// Which kernel of the op.
    pub kernel: AttentionKernel,
    /// Which family of kernels.
    pub family: KernelFamily,
    /// Input (and output) type; the kernels compute in f32 whatever it is.
    pub dtype: DType,
    /// Query/key head dim.
    pub d_qk: usize,
    /// Value head dim.
    pub d_v: usize,
    /// Units per cube (threads per block on CUDA), as launched.
    pub units_per_cube: u32,
    /// Elements per vector along the head dims.
    pub vector_size: usize,
    /// The tile kernels' tile: rows each unit owns and streamed rows per unrolled step
    /// (register tiles), or query rows and keys per shared tile (staged); `None` for
    /// the pre-pass, which has no tile.
    pub tile: Option<(usize, usize)>,
    /// Units that share each row: the register tiles' rows split over a plane's
    /// lanes on GPUs (see `cube/register_tiles.rs`); 1 for every other kernel.
    pub lanes: usize,
    /// Whether ALiBi's bias is compiled into the scores (the kernels of calls with
    /// ALiBi that [have scores](AttentionKernel::has_scores)).
    pub alibi: bool,
    source: Box<dyn CubeKernel>,
}

impl KernelVariant {
    /// The kernel's definition, as a runtime defines it before compiling it. Its
    /// `settings.kernel_name` is the entry point of the compiled code.
    ///
    /// # Errors
    /// The expansion's panic, as a [`CompilationError`], if the kernel's code panics
    /// for this configuration.
    pub fn define(&self) -> Result<KernelDefinition, CompilationError> {
        define_kernel(self.source.as_ref())
    }
}

impl fmt::Debug for KernelVariant {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("KernelVariant")
            .field("kernel", &self.kernel)
            .field("family", &self.family)
            .field("dtype", &self.dtype)
            .field("d_qk", &self.d_qk)
            .field("d_v", &self.d_v)
            .field("units_per_cube", &self.units_per_cube)
            .field("vector_size", &self.vector_size)
            .field("tile", &self.tile)
            .field("lanes", &self.lanes)
            .field("alibi", &self.alibi)
            .finish_non_exhaustive()
    }
}

/// The problem the variants of head dims `d_qk`, `d_v` are planned for: one head of
/// [`VARIANT_SEQ_LEN`] queries and keys (the masks are runtime flags and change no
/// compiled kernel).
fn variant_problem(d_qk: usize, d_v: usize) -> Problem {
    Problem {
        batch: 1,
        heads: 1,
        kv_heads: 1,
        seq_q: VARIANT_SEQ_LEN,
        seq_k: VARIANT_SEQ_LEN,
        d_qk,
        d_v,
        mask: MaskRule::new(true, None),
        has_key_mask: false,
        has_alibi: false,
    }
}

/// Every kernel a device with `properties` would compile for the fused op, for each
/// family, dtype of [`VARIANT_DTYPES`] and head dims of [`VARIANT_HEAD_DIMS`], with the
/// tiles `tiling.rs` picks at [`VARIANT_SEQ_LEN`] (the masking options are runtime
/// flags: they change no compiled kernel), as calls without ALiBi compile them, or
/// with it (`alibi`: its bias compiled into every score). A staged family appears for the problems
/// whose tiles fit the device's shared memory, the tensor-core family for the dtypes
/// and head dims its fragments take. `target` is the runtime's target
/// properties (its matrix-multiply register layouts).
///
/// # Errors
/// The [`Unsupported`] reason when the device cannot take one of the problems.
pub fn kernel_variants(
    properties: &DeviceProperties,
    target: &TargetProperties,
    alibi: bool,
) -> Result<Vec<KernelVariant>, Unsupported> {
    let properties = Arc::new(properties.clone());
    let target = Arc::new(target.clone());
    let mut variants = Vec::new();
    for family in KernelFamily::ALL {
        for dtype in VARIANT_DTYPES {
            for (d_qk, d_v) in VARIANT_HEAD_DIMS {
                let problem = Problem {
                    has_alibi: alibi,
                    ..variant_problem(d_qk, d_v)
                };
                let tiling = plan_tiling(&problem, &properties)?;
                let build = Build {
                    problem: &problem,
                    tiling: &tiling,
                    dtype,
                    properties: &properties,
                    target: &target,
                };
                match family {
                    KernelFamily::RegisterTile => variants.extend(register_tile(&build)),
                    KernelFamily::Fragments
                    | KernelFamily::WideFragments
                    | KernelFamily::FragmentsAtomicDq
                    | KernelFamily::FragmentsTf32 => {
                        let row_tiles = fragment_row_tiles(family == KernelFamily::WideFragments);
                        let one_pass = family == KernelFamily::FragmentsAtomicDq;
                        let split_tf32 = family == KernelFamily::FragmentsTf32;
                        // Only where the launches take it: tensor cores for the dtype
                        // (the TF32 family's own for f32 alone).
                        let products = if split_tf32 {
                            FragmentOps::SplitTf32
                        } else {
                            FragmentOps::TensorCores
                        };
                        let tiling = plan_fragments(
                            &problem,
                            dtype,
                            &properties,
                            row_tiles,
                            one_pass,
                            split_tf32,
                            false,
                        )
                        .filter(|tiling| tiling.forward.ops == products)
                        .map(|tiling| compiled_with_alibi(tiling, alibi));
                        variants.extend(
                            tiling
                                .into_iter()
                                .flat_map(|t| fragment_kernels(&build, family, &t)),
                        );
                    }
                    KernelFamily::FragmentsOverlapped => {
                        // The forward, narrow and wide, and the backward, where tensor
                        // cores take them.
                        for wide in [false, true] {
                            let tiling = plan_fragments(
                                &problem,
                                dtype,
                                &properties,
                                fragment_row_tiles(wide),
                                false,
                                false,
                                true,
                            )
                            .filter(|tiling| tiling.forward.ops == FragmentOps::TensorCores)
                            .map(|tiling| compiled_with_alibi(tiling, alibi));
                            variants.extend(
                                tiling
                                    .into_iter()
                                    .flat_map(|t| fragment_kernels(&build, family, &t)),
                            );
                        }
                    }
                    KernelFamily::Staged | KernelFamily::StagedTensorCores => {
                        let product = match family {
                            KernelFamily::Staged => StagedProduct::Plain,
                            _ => StagedProduct::TensorCores,
                        };
                        // The plain family's tiles are autotuning candidates: every
                        // distinct tiling under the limits is a kernel of its own.
                        let limits: &[usize] = match family {
                            KernelFamily::Staged => &STAGED_BLOCK_LIMITS,
                            _ => &[LARGEST_STAGED_BLOCK],
                        };
                        // Each kernel once per tile (tilings of two limits may share
                        // some kernels' tiles; the untiled ones are shared by all).
                        let mut built: Vec<(AttentionKernel, Option<(usize, usize)>)> = Vec::new();
                        for &limit in limits {
                            let staged_tiling =
                                plan_staged(&problem, dtype, product, limit, &properties);
                            // The tensor-core family only where its product applies.
                            let applies = staged_tiling.is_some_and(|t| {
                                (t.forward.product == TileProduct::TensorCores)
                                    == (family == KernelFamily::StagedTensorCores)
                            });
                            let Some(staged_tiling) = staged_tiling.filter(|_| applies) else {
                                continue;
                            };
                            for variant in staged_kernels(&build, family, &staged_tiling) {
                                let id = (variant.kernel, variant.tile);
                                if !built.contains(&id) {
                                    built.push(id);
                                    variants.push(variant);
                                }
                            }
                        }
                    }
                }
            }
        }
    }
    Ok(variants)
}

/// A fragment tiling as calls with ALiBi (or without) compile it: the fragment
/// configurations carry the call's score terms (see `launch::for_call`).
fn compiled_with_alibi(tiling: FragmentTiling, alibi: bool) -> FragmentTiling {
    let with = |config: FragmentConfig| FragmentConfig { alibi, ..config };
    FragmentTiling {
        forward: with(tiling.forward),
        backward: tiling.backward.map(|(dq, dkdv)| (with(dq), with(dkdv))),
    }
}

/// What every kernel of one problem is built from.
struct Build<'a> {
    problem: &'a Problem,
    tiling: &'a Tiling,
    dtype: DType,
    properties: &'a Arc<DeviceProperties>,
    target: &'a Arc<TargetProperties>,
}

impl Build<'_> {
    /// A variant of this problem; `tile` is `None` for kernels without one.
    fn variant(
        &self,
        family: KernelFamily,
        kernel: AttentionKernel,
        units: u32,
        tile: Option<&KernelTile>,
        source: Box<dyn CubeKernel>,
    ) -> KernelVariant {
        KernelVariant {
            kernel,
            family,
            dtype: self.dtype,
            d_qk: self.problem.d_qk,
            d_v: self.problem.d_v,
            units_per_cube: units,
            vector_size: self.tiling.vector_size,
            tile: tile.map(|tile| (tile.rows, tile.block)),
            lanes: tile.map_or(1, |tile| tile.lanes),
            alibi: self.problem.has_alibi && kernel.has_scores(),
            source,
        }
    }

    /// Settings of a launch with `units` units per cube, as `launch_unchecked` makes
    /// them (the kernels index with 32-bit addresses).
    fn settings(&self, units: u32) -> KernelSettings {
        KernelSettings::new(
            CubeDim::new_1d(units).into(),
            ExecutionMode::Unchecked,
            AddressType::U32,
        )
    }
}

/// The compilation argument of a dense tensor argument (a buffer of its own, not
/// aliasing another argument).
fn tensor() -> TensorCompilationArg {
    TensorCompilationArg {
        meta: TensorMetaCompilationArg { len: (), rank: () },
        buffer: BufferCompilationArg { inplace: None },
    }
}

/// The compilation argument of the runtime sizes: scalars, so nothing of their values
/// reaches the compiled code.
fn sizes() -> SizesCompilationArg {
    SizesCompilationArg {
        seq_q: (),
        seq_k: (),
        heads: (),
        group: (),
        window: (),
        chunk: (),
        scale: (),
        cap: (),
        cap_inverse: (),
        causal: (),
        windowed: (),
        key_mask: (),
        softcap: (),
        sinks: (),
        alibi_step: (),
        alibi_scale: (),
        alibi_padded_heads: (),
    }
}

/// The four kernels of the register-tile family, built as `launch.rs` launches them.
fn register_tile(build: &Build<'_>) -> [KernelVariant; 4] {
    let problem = build.problem;
    let tiling = build.tiling;
    let vector_size = tiling.vector_size;
    let elem = dtype_to_storage_type(build.dtype);
    let properties = || build.properties.clone();
    let target = || build.target.clone();

    let tile = &tiling.forward;
    let units = tile.units as u32;
    let forward = register_tiles::flash_forward::FlashForward::new(
        build.settings(units),
        properties(),
        target(),
        tensor(),
        tensor(),
        tensor(),
        tensor(),
        tensor(),
        tensor(),
        tensor(),
        sizes(),
        vector_size,
        config(problem, tiling, tile),
        elem,
    );
    let forward = build.variant(
        KernelFamily::RegisterTile,
        AttentionKernel::Forward,
        units,
        Some(tile),
        Box::new(forward),
    );

    let prepass = row_stats::flash_backward_stats::FlashBackwardStats::new(
        build.settings(PREPASS_UNITS),
        properties(),
        target(),
        tensor(),
        tensor(),
        tensor(),
        tensor(),
        (),
        vector_size,
        problem.d_v / vector_size,
        elem,
    );
    let prepass = build.variant(
        KernelFamily::RegisterTile,
        AttentionKernel::BackwardPrepass,
        PREPASS_UNITS,
        None,
        Box::new(prepass),
    );

    let tile = &tiling.backward_q;
    let units = tile.units as u32;
    let dq = register_tiles::flash_backward_q::FlashBackwardQ::new(
        build.settings(units),
        properties(),
        target(),
        tensor(),
        tensor(),
        tensor(),
        tensor(),
        tensor(),
        tensor(),
        tensor(),
        sizes(),
        vector_size,
        config(problem, tiling, tile),
        elem,
    );
    let dq = build.variant(
        KernelFamily::RegisterTile,
        AttentionKernel::BackwardDq,
        units,
        Some(tile),
        Box::new(dq),
    );

    let tile = &tiling.backward_kv;
    let units = tile.units as u32;
    let dkdv = register_tiles::flash_backward_kv::FlashBackwardKv::new(
        build.settings(units),
        properties(),
        target(),
        tensor(),
        tensor(),
        tensor(),
        tensor(),
        tensor(),
        tensor(),
        tensor(),
        tensor(),
        sizes(),
        vector_size,
        config(problem, tiling, tile),
        elem,
    );
    let dkdv = build.variant(
        KernelFamily::RegisterTile,
        AttentionKernel::BackwardDkDv,
        units,
        Some(tile),
        Box::new(dkdv),
    );

    [forward, prepass, dq, dkdv]
}

/// The fragment kernels of `family`, built as `launch.rs` launches them: the forward,
/// and for [`KernelFamily::Fragments`] dQ and dK/dV where the tiling plans them (the
/// wide family shares them); for [`KernelFamily::FragmentsAtomicDq`] its dK/dV kernel
/// alone (its forward is the others', its last step an element-wise cast). Their
/// pre-pass and flash-decoding's merge are the staged family's.
fn fragment_kernels(
    build: &Build<'_>,
    family: KernelFamily,
    tiling: &FragmentTiling,
) -> Vec<KernelVariant> {
    let elem = dtype_to_storage_type(build.dtype);
    let properties = || build.properties.clone();
    let target = || build.target.clone();
    let variant = |kernel, config: &FragmentConfig, source: Box<dyn CubeKernel>| KernelVariant {
        kernel,
        family,
        dtype: build.dtype,
        d_qk: build.problem.d_qk,
        d_v: build.problem.d_v,
        units_per_cube: config.units() as u32,
        vector_size: 1,
        tile: Some((config.rows(), config.block)),
        lanes: 1,
        alibi: config.alibi,
        source,
    };

    let config = tiling.forward;
    let forward = fragments::fragment_forward::FragmentForward::new(
        build.settings(config.units() as u32),
        properties(),
        target(),
        tensor(),
        tensor(),
        tensor(),
        tensor(),
        tensor(),
        tensor(),
        tensor(),
        sizes(),
        (),
        (),
        config,
        elem,
    );
    let mut kernels = Vec::new();
    if family != KernelFamily::FragmentsAtomicDq {
        kernels.push(variant(
            AttentionKernel::Forward,
            &config,
            Box::new(forward),
        ));
    }
    if family == KernelFamily::WideFragments {
        return kernels;
    }
    // The overlapped family's backward once (from the narrow plan: the backward does
    // not depend on the forward's width), where its copies overlap.
    let overlapped_backward = tiling.forward.row_tiles == 1
        && tiling
            .backward
            .is_some_and(|(dq, dkdv)| dq.copies.overlapped() && dkdv.copies.overlapped());
    if family == KernelFamily::FragmentsOverlapped && !overlapped_backward {
        return kernels;
    }
    if let Some((dq_config, kv_config)) = tiling.backward {
        // The one-pass family's own kernel only where its tiling takes it.
        if family == KernelFamily::FragmentsAtomicDq && !kv_config.adds_dq {
            return kernels;
        }
        let dq = fragments::fragment_backward_q::FragmentBackwardQ::new(
            build.settings(dq_config.units() as u32),
            properties(),
            target(),
            tensor(),
            tensor(),
            tensor(),
            tensor(),
            tensor(),
            tensor(),
            tensor(),
            sizes(),
            dq_config,
            elem,
        );
        if !kv_config.adds_dq {
            kernels.push(variant(
                AttentionKernel::BackwardDq,
                &dq_config,
                Box::new(dq),
            ));
        }
        let dkdv = fragments::fragment_backward_kv::FragmentBackwardKv::new(
            build.settings(kv_config.units() as u32),
            properties(),
            target(),
            tensor(),
            tensor(),
            tensor(),
            tensor(),
            tensor(),
            tensor(),
            tensor(),
            tensor(),
            tensor(),
            sizes(),
            if kv_config.adds_dq {
                dq_atomic_width(build.properties)
            } else {
                1
            },
            kv_config,
            elem,
        );
        kernels.push(variant(
            AttentionKernel::BackwardDkDv,
            &kv_config,
            Box::new(dkdv),
        ));
    }
    kernels
}

/// The staged kernels of `family` (forward, flash-decoding's merge, pre-pass, dQ,
/// dK/dV), built as `launch.rs`
/// launches them: every tensor read element by element.
fn staged_kernels(
    build: &Build<'_>,
    family: KernelFamily,
    tiling: &StagedTiling,
) -> [KernelVariant; 5] {
    let problem = build.problem;
    let elem = dtype_to_storage_type(build.dtype);
    let properties = || build.properties.clone();
    let target = || build.target.clone();
    let variant = |kernel, units, tile, source: Box<dyn CubeKernel>| KernelVariant {
        kernel,
        family,
        dtype: build.dtype,
        d_qk: problem.d_qk,
        d_v: problem.d_v,
        units_per_cube: units,
        vector_size: 1,
        tile,
        lanes: 1,
        alibi: problem.has_alibi && kernel.has_scores(),
        source,
    };

    let config = tiling.forward;
    let forward = staged::staged_forward::StagedForward::new(
        build.settings(config.units as u32),
        properties(),
        target(),
        tensor(),
        tensor(),
        tensor(),
        tensor(),
        tensor(),
        tensor(),
        tensor(),
        sizes(),
        (),
        (),
        config,
        elem,
    );
    let forward = variant(
        AttentionKernel::Forward,
        config.units as u32,
        Some((config.block_q, config.block_k)),
        Box::new(forward),
    );

    let merge = staged::staged_merge_splits::StagedMergeSplits::new(
        build.settings(MERGE_UNITS),
        properties(),
        target(),
        tensor(),
        tensor(),
        tensor(),
        tensor(),
        tensor(),
        (),
        (),
        sizes(),
        problem.d_v,
        elem,
    );
    let merge = variant(
        AttentionKernel::DecodeMerge,
        MERGE_UNITS,
        None,
        Box::new(merge),
    );

    let prepass = row_stats::flash_backward_stats::FlashBackwardStats::new(
        build.settings(PREPASS_UNITS),
        properties(),
        target(),
        tensor(),
        tensor(),
        tensor(),
        tensor(),
        (),
        1,
        problem.d_v,
        elem,
    );
    let prepass = variant(
        AttentionKernel::BackwardPrepass,
        PREPASS_UNITS,
        None,
        Box::new(prepass),
    );

    let config = tiling.backward_q;
    let dq = staged::staged_backward_q::StagedBackwardQ::new(
        build.settings(config.units as u32),
        properties(),
        target(),
        tensor(),
        tensor(),
        tensor(),
        tensor(),
        tensor(),
        tensor(),
        tensor(),
        sizes(),
        config,
        elem,
    );
    let dq = variant(
        AttentionKernel::BackwardDq,
        config.units as u32,
        Some((config.block_q, config.block_k)),
        Box::new(dq),
    );

    let config = tiling.backward_kv;
    let dkdv = staged::staged_backward_kv::StagedBackwardKv::new(
        build.settings(config.units as u32),
        properties(),
        target(),
        tensor(),
        tensor(),
        tensor(),
        tensor(),
        tensor(),
        tensor(),
        tensor(),
        tensor(),
        sizes(),
        config,
        elem,
    );
    let dkdv = variant(
        AttentionKernel::BackwardDkDv,
        config.units as u32,
        Some((config.block_q, config.block_k)),
        Box::new(dkdv),
    );

    [forward, merge, prepass, dq, dkdv]
}

#[cfg(test)]
pub(super) mod tests {
    use super::super::fragments::TileCopies;
    use super::*;
    use cubecl::ir::{
        DeviceIdentity, ElemType, FloatKind, HardwareProperties, MemoryDeviceProperties,
        VectorSize, features::MmaConfig,
    };
    use cubecl::profile::TimingMethod;

    /// A GPU as a CUDA runtime describes one: 1024 units per cube, warps of 32.
    pub(in super::super) fn gpu() -> DeviceProperties {
        let hardware = HardwareProperties {
            load_width: 128,
            vector_register_count: None,
            plane_size_min: 32,
            plane_size_max: 32,
            max_bindings: 1024,
            max_shared_memory_size: 227 * 1024,
            max_cube_count: (i32::MAX as u32, 65535, 65535),
            max_units_per_cube: 1024,
            max_cube_dim: (1024, 1024, 64),
            num_streaming_multiprocessors: Some(132),
            num_tensor_cores: None,
            min_tensor_cores_dim: None,
            num_cpu_cores: None,
            last_level_cache_size: None,
            max_vector_size: VectorSize::MAX,
            cube_mma_reserved_shared_memory: 0,
        };
        DeviceProperties::new(
            Default::default(),
            MemoryDeviceProperties::new(1 << 30, 512),
            hardware,
            TimingMethod::Device,
            DeviceIdentity {
                name: "test GPU".to_string(),
                fingerprint: "test".to_string(),
                physical: None,
            },
        )
    }

    #[test]
    fn every_kernel_dtype_and_head_dim_has_a_variant() {
        let variants = kernel_variants(&gpu(), &TargetProperties::default(), false).unwrap();
        let kernels = [
            AttentionKernel::Forward,
            AttentionKernel::BackwardPrepass,
            AttentionKernel::BackwardDq,
            AttentionKernel::BackwardDkDv,
        ];
        // Register tiles and the plain staged kernels everywhere (227 KiB of shared
        // memory holds even MLA's tiles), the staged ones at each tile size autotuning
        // compares; tensor cores for f16/bf16 (every head dim
        // here is a multiple of 16) once the device has fragments: this one has none.
        for family in [KernelFamily::RegisterTile, KernelFamily::Staged] {
            for kernel in kernels {
                for dtype in VARIANT_DTYPES {
                    for (d_qk, d_v) in VARIANT_HEAD_DIMS {
                        let found: Vec<&KernelVariant> = variants
                            .iter()
                            .filter(|v| {
                                v.family == family
                                    && v.kernel == kernel
                                    && v.dtype == dtype
                                    && v.d_qk == d_qk
                                    && v.d_v == d_v
                            })
                            .collect();
                        let what = format!("{family} {kernel} {dtype:?} {d_qk}x{d_v}");
                        let tiled = kernel != AttentionKernel::BackwardPrepass;
                        if family == KernelFamily::Staged && tiled {
                            // Autotuning's candidates: distinct tiles, down to 16 × 16.
                            let tiles: Vec<_> = found.iter().map(|v| v.tile).collect();
                            let distinct: std::collections::BTreeSet<_> = tiles.iter().collect();
                            assert_eq!(distinct.len(), tiles.len(), "{what}: {tiles:?}");
                            assert!(
                                (1..=STAGED_BLOCK_LIMITS.len()).contains(&tiles.len()),
                                "{what}: {tiles:?}"
                            );
                            assert!(
                                tiles.iter().any(|t| t.is_some_and(|(r, b)| r.max(b) <= 16)),
                                "{what}: {tiles:?}"
                            );
                        } else {
                            assert_eq!(found.len(), 1, "{what}");
                        }
                    }
                }
            }
        }
        // Flash-decoding's merge belongs to the staged family only.
        let merges = variants
            .iter()
            .filter(|v| v.kernel == AttentionKernel::DecodeMerge);
        assert!(merges.clone().all(|v| v.family == KernelFamily::Staged));
        assert_eq!(
            merges.count(),
            VARIANT_DTYPES.len() * VARIANT_HEAD_DIMS.len()
        );
        assert!(
            variants
                .iter()
                .all(|v| v.family != KernelFamily::StagedTensorCores)
        );
        // On a GPU the register-tile kernels keep one row per unit (see `tiling.rs`),
        // and the staged ones take the largest tiles at long sequences.
        for variant in variants.iter().filter(|v| v.tile.is_some()) {
            let (rows, block) = variant.tile.unwrap();
            match variant.family {
                KernelFamily::RegisterTile => assert_eq!(rows, 1),
                _ => assert!(rows >= 16 && block >= 16, "{variant:?}"),
            }
        }
    }

    #[test]
    fn tensor_core_variants_need_fragments_and_half_types() {
        let mut properties = gpu();
        let (f16, bf16, f32) = (
            ElemType::Float(FloatKind::F16),
            ElemType::Float(FloatKind::BF16),
            ElemType::Float(FloatKind::F32),
        );
        for half in [f16, bf16] {
            properties.features.matmul.cmma.insert(MmaConfig {
                a_type: half,
                b_type: half,
                cd_type: f32,
                m: 16,
                n: 16,
                k: 16,
            });
        }
        let variants = kernel_variants(&properties, &TargetProperties::default(), false).unwrap();
        let tensor_cores: Vec<_> = variants
            .iter()
            .filter(|v| v.family == KernelFamily::StagedTensorCores)
            .collect();
        // f16 and bf16, every head dim pair, five kernels each.
        assert_eq!(tensor_cores.len(), 2 * VARIANT_HEAD_DIMS.len() * 5);
        assert!(tensor_cores.iter().all(|v| v.dtype != DType::F32));
        for variant in tensor_cores {
            variant.define().unwrap();
        }
    }

    /// [`gpu`] with plane operations, m16n8k16 manual MMA of f16 and bf16 into f32 and
    /// m16n8k8 of TF32, as CUDA describes an sm_80+ GPU.
    pub(in super::super) fn gpu_with_fragments() -> DeviceProperties {
        let mut properties = gpu();
        properties
            .features
            .plane
            .insert(cubecl::ir::features::Plane::Ops);
        let f32 = ElemType::Float(FloatKind::F32);
        for half in [FloatKind::F16, FloatKind::BF16] {
            properties.features.matmul.mma.insert(MmaConfig {
                a_type: ElemType::Float(half),
                b_type: ElemType::Float(half),
                cd_type: f32,
                m: 16,
                n: 8,
                k: 16,
            });
        }
        // TF32 m16n8k8, as CUDA registers it for sm_80 and later.
        let tf32 = ElemType::Float(FloatKind::TF32);
        properties.features.matmul.mma.insert(MmaConfig {
            a_type: tf32,
            b_type: tf32,
            cd_type: f32,
            m: 16,
            n: 8,
            k: 8,
        });
        // As CUDA registers it (the one-pass backward's dQ).
        properties.register_atomic_type_usage(
            cubecl::ir::Type::atomic(f32),
            cubecl::ir::features::AtomicUsage::Add,
        );
        properties
    }

    /// `properties` without m16n8k8 TF32 manual MMA (the 16-bit products kept).
    pub(in super::super) fn without_tf32(mut properties: DeviceProperties) -> DeviceProperties {
        let tf32 = ElemType::Float(FloatKind::TF32);
        properties.features.matmul.mma.retain(|m| m.a_type != tf32);
        properties
    }

    /// The fragment kernels' tensor-core variants: f16 and bf16 at the head dims their
    /// registers take, on a device with m16n8k16 manual MMA; each expands (its
    /// definition is what CUDA compiles). None without the instruction or in f32.
    #[test]
    fn fragment_variants_need_mma_and_half_types() {
        let plain = kernel_variants(&gpu(), &TargetProperties::default(), false).unwrap();
        assert!(plain.iter().all(|v| v.family != KernelFamily::Fragments));

        let variants =
            kernel_variants(&gpu_with_fragments(), &TargetProperties::default(), false).unwrap();
        let fragments: Vec<_> = variants
            .iter()
            .filter(|v| v.family == KernelFamily::Fragments)
            .collect();
        // Forward, dQ and dK/dV at each head dim pair the fragments take.
        let head_dims = [(64, 64), (128, 128), (192, 128)];
        assert_eq!(fragments.len(), 2 * head_dims.len() * 3, "{fragments:#?}");
        for variant in fragments {
            assert_ne!(variant.dtype, DType::F32);
            assert!(head_dims.contains(&(variant.d_qk, variant.d_v)));
            // 64 query rows (keys for dK/dV) by 64 keys in the forward, 32 streamed
            // rows in the backward, on a GPU's shared memory.
            let (tile, name) = match variant.kernel {
                AttentionKernel::Forward => ((64, 64), "fragment_forward"),
                AttentionKernel::BackwardDq => ((64, 32), "fragment_backward_q"),
                AttentionKernel::BackwardDkDv => ((64, 32), "fragment_backward_kv"),
                other => panic!("{other} is not a fragment kernel"),
            };
            assert_eq!(variant.tile, Some(tile), "{variant:?}");
            let definition = variant.define().unwrap();
            assert!(
                definition.settings.kernel_name.starts_with(name),
                "{}",
                definition.settings.kernel_name
            );
        }
    }

    /// The TF32 fragment variants: f32 alone (f16/bf16 are the fragment family's), at
    /// the head dims their tiles take on a device with m16n8k8 TF32 manual MMA, with
    /// the split products; each expands. None without the instruction.
    #[test]
    fn tf32_fragment_variants_need_the_instruction_and_f32() {
        let plain = kernel_variants(
            &without_tf32(gpu_with_fragments()),
            &TargetProperties::default(),
            false,
        )
        .unwrap();
        assert!(
            plain
                .iter()
                .all(|v| v.family != KernelFamily::FragmentsTf32)
        );

        let properties = gpu_with_fragments();
        let variants = kernel_variants(&properties, &TargetProperties::default(), false).unwrap();
        let tf32: Vec<_> = variants
            .iter()
            .filter(|v| v.family == KernelFamily::FragmentsTf32)
            .collect();
        let head_dims = [(64, 64), (128, 128), (192, 128)];
        assert!(!tf32.is_empty());
        for variant in &tf32 {
            assert_eq!(variant.dtype, DType::F32);
            assert!(
                head_dims.contains(&(variant.d_qk, variant.d_v)),
                "{variant:?}"
            );
            variant.define().unwrap();
        }
        // Forward, dQ and dK/dV wherever f32's twice larger tiles fit, and the split
        // products in each plan.
        for (d_qk, d_v) in head_dims {
            let plan = plan_fragments(
                &variant_problem(d_qk, d_v),
                DType::F32,
                &properties,
                1,
                false,
                true,
                false,
            )
            .unwrap();
            assert_eq!(plan.forward.ops, FragmentOps::SplitTf32);
            let kernels = 1 + 2 * plan.backward.is_some() as usize;
            let found = tf32
                .iter()
                .filter(|v| (v.d_qk, v.d_v) == (d_qk, d_v))
                .count();
            assert_eq!(found, kernels, "{d_qk}x{d_v}");
        }
        // f16/bf16 asked for the split still plan the 16-bit products.
        let plan = plan_fragments(
            &variant_problem(64, 64),
            DType::BF16,
            &properties,
            1,
            false,
            true,
            false,
        )
        .unwrap();
        assert_eq!(plan.forward.ops, FragmentOps::TensorCores);
    }

    /// The overlapped family: the fragment forward, narrow and wide, and the dQ and
    /// dK/dV kernels, in f16 and bf16 wherever tensor cores take them, each with
    /// `cp.async` copies on a device that has them (the backward where its second
    /// buffers fit); each expands.
    #[test]
    fn overlapped_fragment_variants_are_forwards_and_backward_with_asynchronous_copies() {
        let mut properties = gpu_with_fragments();
        properties.features.memory_reinterpret = true;
        properties.features.copy_async = true;
        let variants = kernel_variants(&properties, &TargetProperties::default(), false).unwrap();
        let overlapped: Vec<_> = variants
            .iter()
            .filter(|v| v.family == KernelFamily::FragmentsOverlapped)
            .collect();
        let asynchronous = TileCopies::Overlapped { asynchronous: true };
        for dtype in [DType::F16, DType::BF16] {
            for (d_qk, d_v) in VARIANT_HEAD_DIMS {
                let problem = variant_problem(d_qk, d_v);
                let plans: Vec<_> = [false, true]
                    .into_iter()
                    .filter_map(|wide| {
                        plan_fragments(
                            &problem,
                            dtype,
                            &properties,
                            fragment_row_tiles(wide),
                            false,
                            false,
                            true,
                        )
                    })
                    .collect();
                for plan in &plans {
                    assert_eq!(plan.forward.copies, asynchronous);
                }
                let backward = plans
                    .first()
                    .and_then(|plan| plan.backward)
                    .filter(|(dq, dkdv)| dq.copies == asynchronous && dkdv.copies == asynchronous);
                let found: Vec<_> = overlapped
                    .iter()
                    .filter(|v| (v.dtype, v.d_qk, v.d_v) == (dtype, d_qk, d_v))
                    .collect();
                let forwards = found
                    .iter()
                    .filter(|v| v.kernel == AttentionKernel::Forward)
                    .count();
                let count = |kernel| found.iter().filter(|v| v.kernel == kernel).count();
                let backward = backward.is_some() as usize;
                assert_eq!(forwards, plans.len(), "{dtype:?} {d_qk}x{d_v}");
                assert_eq!(
                    count(AttentionKernel::BackwardDq),
                    backward,
                    "{dtype:?} {d_qk}x{d_v}"
                );
                assert_eq!(
                    count(AttentionKernel::BackwardDkDv),
                    backward,
                    "{dtype:?} {d_qk}x{d_v}"
                );
                assert_eq!(
                    found.len(),
                    forwards + 2 * backward,
                    "{dtype:?} {d_qk}x{d_v}"
                );
                for variant in found {
                    variant.define().unwrap();
                }
            }
        }
        // The H100's shared memory holds the backward's second buffers at the head dims
        // of today's models.
        for kernel in [AttentionKernel::BackwardDq, AttentionKernel::BackwardDkDv] {
            assert!(
                overlapped
                    .iter()
                    .any(|v| v.kernel == kernel && v.d_qk == 128)
            );
        }
        assert!(overlapped.iter().all(|v| v.dtype != DType::F32));
        assert!(!overlapped.is_empty());
    }

    /// The fragment kernels with `ldmatrix` loads (`FragmentLoads::Matrices`, CUDA's
    /// default) expand at every head dim and half type the family takes, as CUDA
    /// would compile them.
    #[test]
    fn fragment_kernels_expand_with_matrix_loads() {
        use super::super::fragment::FragmentLoads;
        let properties = Arc::new(gpu_with_fragments());
        let target = Arc::new(TargetProperties::default());
        let families = [
            (KernelFamily::Fragments, 1),
            (KernelFamily::WideFragments, 2),
            (KernelFamily::FragmentsAtomicDq, 1),
        ];
        for ((family, row_tiles), dtype) in families
            .into_iter()
            .flat_map(|f| [DType::BF16, DType::F16].map(|dtype| (f, dtype)))
        {
            for (d_qk, d_v) in [(64, 64), (128, 128), (192, 128)] {
                let problem = variant_problem(d_qk, d_v);
                let tiling = plan_tiling(&problem, &properties).unwrap();
                let build = Build {
                    problem: &problem,
                    tiling: &tiling,
                    dtype,
                    properties: &properties,
                    target: &target,
                };
                let one_pass = family == KernelFamily::FragmentsAtomicDq;
                let mut fragments = plan_fragments(
                    &problem,
                    dtype,
                    &properties,
                    row_tiles,
                    one_pass,
                    false,
                    false,
                )
                .unwrap();
                fragments.forward.loads = FragmentLoads::Matrices;
                if let Some((q, kv)) = fragments.backward.as_mut() {
                    q.loads = FragmentLoads::Matrices;
                    kv.loads = FragmentLoads::Matrices;
                }
                let variants = fragment_kernels(&build, family, &fragments);
                // The wide family shares the backward kernels, the one-pass family the
                // forward (and has no kernel of its own at 192/128).
                let expected = match family {
                    KernelFamily::Fragments => 3,
                    KernelFamily::FragmentsAtomicDq if d_qk > 128 => 0,
                    _ => 1,
                };
                assert_eq!(variants.len(), expected, "{family} {dtype:?} {d_qk}x{d_v}");
                for variant in variants {
                    variant.define().unwrap();
                }
            }
        }
    }

    /// The kernels of calls with ALiBi, built for a GPU with tensor cores (the
    /// fragment kernels' tensor-core products and `ex2.approx` exponentials, which
    /// lavapipe never compiles): the same kernels as without it, each expanding with
    /// the bias, for every family at the common head dims.
    #[test]
    fn alibi_variants_expand_for_a_tensor_core_gpu() {
        let properties = gpu_with_fragments();
        let target = TargetProperties::default();
        let key = |v: &KernelVariant| (v.kernel, v.family, v.dtype, v.d_qk, v.d_v, v.tile);
        let plain: Vec<_> = kernel_variants(&properties, &target, false)
            .unwrap()
            .iter()
            .map(key)
            .collect();
        let with_alibi = kernel_variants(&properties, &target, true).unwrap();
        assert_eq!(with_alibi.iter().map(key).collect::<Vec<_>>(), plain);
        let mut expanded = std::collections::HashSet::new();
        for variant in &with_alibi {
            assert_eq!(variant.alibi, variant.kernel.has_scores(), "{variant:?}");
        }
        for variant in with_alibi
            .iter()
            .filter(|v| v.alibi && v.d_qk <= 128 && v.d_qk == v.d_v)
        {
            variant.define().unwrap();
            expanded.insert(variant.family);
        }
        // Every family this device builds, the tensor-core ones among them.
        let families: std::collections::HashSet<_> = with_alibi.iter().map(|v| v.family).collect();
        assert_eq!(expanded, families);
        assert!(expanded.contains(&KernelFamily::Fragments) && expanded.len() >= 6);
    }

    #[test]
    fn definitions_carry_the_launch_shape() {
        let variants = kernel_variants(&gpu(), &TargetProperties::default(), false).unwrap();
        for variant in variants
            .iter()
            .filter(|v| v.dtype == DType::F32 && v.d_qk == 64 && v.d_v == 64)
        {
            let definition = variant.define().unwrap();
            assert_eq!(definition.settings.cube_dim.x, variant.units_per_cube);
            let base = match (variant.family, variant.kernel) {
                (_, AttentionKernel::BackwardPrepass) => "flash_backward_stats",
                (_, AttentionKernel::DecodeMerge) => "staged_merge_splits",
                (KernelFamily::RegisterTile, AttentionKernel::Forward) => "flash_forward",
                (KernelFamily::RegisterTile, AttentionKernel::BackwardDq) => "flash_backward_q",
                (KernelFamily::RegisterTile, AttentionKernel::BackwardDkDv) => "flash_backward_kv",
                (
                    KernelFamily::Fragments
                    | KernelFamily::WideFragments
                    | KernelFamily::FragmentsAtomicDq
                    | KernelFamily::FragmentsTf32,
                    kernel,
                ) => match kernel {
                    AttentionKernel::Forward => "fragment_forward",
                    AttentionKernel::BackwardDq => "fragment_backward_q",
                    _ => "fragment_backward_kv",
                },
                (_, AttentionKernel::Forward) => "staged_forward",
                (_, AttentionKernel::BackwardDq) => "staged_backward_q",
                (_, AttentionKernel::BackwardDkDv) => "staged_backward_kv",
            };
            assert!(
                definition.settings.kernel_name.starts_with(base),
                "{}",
                definition.settings.kernel_name
            );
        }
    }
}
