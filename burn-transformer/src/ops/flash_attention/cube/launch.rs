//! Launching the CubeCL kernels: the forward, and the backward's three kernels
//! (a pre-pass writing `(LSE, D)` per query row with `D = rowsum(dO ∘ O)`; a key/value
//! kernel accumulating `dK, dV`, one unit per key looping over every query row of its
//! group's query heads, so no atomics; a query kernel accumulating `dQ`). Both
//! gradient kernels recompute `P = exp(S − LSE)`: no `seq_q × seq_k` buffer exists, and
//! each output element is summed by one unit in a fixed order, so the results are
//! deterministic.
//!
//! Outputs and buffers are allocated dense (`empty_device_contiguous_dtype`): the kernels index
//! rows as `row * d`, and `empty_device_dtype` lets the runtime pitch rows (CUDA pads
//! each row to the next power of two of its bytes, up to 512: d = 80 in f32 gets 128
//! floats a row), which a dense write would scramble. Inputs arrive through
//! `into_contiguous` (`dispatch.rs`), which is dense.

use burn::backend::TensorMetadata;
use burn::backend::cubecl::dtype_to_storage_type;
use burn::tensor::{DType, Shape};
use burn_cubecl::ops::numeric::{empty_device_contiguous_dtype, zeros_client};
use burn_cubecl::tensor::CubeTensor;
use cubecl::calculate_cube_count_elemwise;
use cubecl::prelude::*;

use super::super::{Problem, ScoreOptions};
use super::fragments::{self, FragmentConfig, FragmentTiling};
use super::register_tiles::{self, AttentionConfig};
use super::row_stats::{self, ROW_STATS};
use super::sizes::SizesLaunch;
use super::staged;
use super::tiling::{
    KernelTile, StagedProduct, StagedTiling, Tiling, dq_atomic_width, plan_key_splits, plan_staged,
    plan_tiling,
};

/// Units per cube of the backward pre-pass (one unit per query row, on every device).
pub(super) const PREPASS_UNITS: u32 = 256;
/// Units per cube of flash-decoding's merge (one unit per query row).
pub(super) const MERGE_UNITS: u32 = 256;

/// Counts a register-tile launch whose rows are split over lanes.
#[cfg(test)]
fn count_split_rows(tile: &KernelTile) {
    if tile.lanes > 1 {
        super::super::op::SPLIT_ROW_LAUNCHES.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    }
}

/// The compile-time configuration of the kernel of `tiling` whose tile is `tile`.
pub(super) fn config(problem: &Problem, tiling: &Tiling, tile: &KernelTile) -> AttentionConfig {
    AttentionConfig {
        units: tile.units,
        rows: tile.rows,
        block: tile.block,
        qk_vectors: problem.d_qk / tiling.vector_size,
        v_vectors: problem.d_v / tiling.vector_size,
        lanes: tile.lanes,
        lane_sum: tiling.lane_sum,
        alibi: problem.has_alibi,
        chunked: problem.mask.chunk.is_some(),
    }
}

/// The runtime sizes of a launch.
fn sizes(problem: &Problem, options: &ScoreOptions) -> SizesLaunch {
    SizesLaunch::new(
        problem.seq_q as u32,
        problem.seq_k as u32,
        problem.heads as u32,
        problem.group() as u32,
        // A window as wide as the longer sequence hides nothing its cut would not: the
        // kernels add it to positions in i32, so it goes no wider.
        problem
            .mask
            .window
            .unwrap_or(0)
            .min(problem.seq_q.max(problem.seq_k)) as u32,
        // Likewise a chunk: positions stay below the longer sequence.
        problem
            .mask
            .chunk
            .unwrap_or(1)
            .min(problem.seq_q.max(problem.seq_k).max(1)) as u32,
        options.scale as f32,
        options.softcap.unwrap_or(1.0) as f32,
        (1.0 / options.softcap.unwrap_or(1.0)) as f32,
        problem.mask.causal as u32,
        problem.mask.window.is_some() as u32,
        problem.has_key_mask as u32,
        options.softcap.is_some() as u32,
        options.has_sinks as u32,
        alibi_step(problem.heads, options) as f32,
        options.alibi.map_or(1.0, |alibi| alibi.slope_scale) as f32,
        problem.heads.next_power_of_two() as u32,
    )
}

/// ALiBi's exponent step of a launch (see [`alibi_slope`](super::sizes::alibi_slope)):
/// `max_bias / padded_heads`, exact in f32 for a whole `max_bias` up to 2²⁴ (a
/// division by a power of two); 0 without ALiBi.
fn alibi_step(heads: usize, options: &ScoreOptions) -> f64 {
    options.alibi.map_or(0.0, |alibi| {
        alibi.max_bias / heads.next_power_of_two() as f64
    })
}

/// A planned fragment kernel as one call compiles it: with the soft-cap's, ALiBi's and
/// the chunks' code only where the call has them.
fn for_call(config: FragmentConfig, options: &ScoreOptions) -> FragmentConfig {
    FragmentConfig {
        softcap: options.softcap.is_some(),
        alibi: options.alibi.is_some(),
        chunked: options.mask.chunk.is_some(),
        ..config
    }
}

/// The kernel family one call runs with, and its tiles.
#[derive(Clone, Copy, Debug)]
pub(super) enum Family {
    RegisterTile(Tiling),
    Staged(StagedTiling),
    /// The fragment kernels; a backward they do not plan runs the staged kernels.
    Fragments(FragmentTiling, StagedTiling),
}

impl Family {
    /// The width of the vectors the backward's pre-pass reads `O` and `dO` in, before
    /// this family's gradient kernels: the register tiles' width, else one element
    /// (the staged and fragment kernels read element by element, and the resource
    /// table in `variants.rs` lists their pre-pass so).
    pub(super) fn prepass_vector_size(&self) -> usize {
        match self {
            Self::RegisterTile(tiling) => tiling.vector_size,
            Self::Staged(_) | Self::Fragments(..) => 1,
        }
    }

    /// The staged family with `product` and tiles of at most `max_block` rows and keys
    /// where they fit the device, else register tiles (panicking with the reason when
    /// the problem is unsupported: the public entry points check support first and
    /// fall back instead).
    pub(super) fn staged_or_register(
        problem: &Problem,
        dtype: DType,
        product: Option<StagedProduct>,
        max_block: usize,
        properties: &cubecl::ir::DeviceProperties,
    ) -> Self {
        if let Some(tiling) =
            product.and_then(|product| plan_staged(problem, dtype, product, max_block, properties))
        {
            #[cfg(test)]
            super::super::op::STAGED_LAUNCHES.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            return Self::Staged(tiling);
        }
        Self::RegisterTile(plan_tiling(problem, properties).unwrap_or_else(|reason| {
            panic!("flash attention launched on an unsupported problem: {reason}")
        }))
    }
}

/// The tensors of one forward call: inputs, and the outputs it writes.
#[derive(Clone, Debug)]
pub(super) struct ForwardTensors {
    pub q: CubeTensor,
    pub k: CubeTensor,
    pub v: CubeTensor,
    pub key_mask: CubeTensor,
    pub sinks: CubeTensor,
    /// `[batch, heads, seq_q, d_v]`, written.
    pub output: CubeTensor,
    /// `[batch, heads, seq_q]` in f32, written.
    pub lse: CubeTensor,
}

/// The tensors of one backward call after its pre-pass ([`backward_stats`]): inputs,
/// and the gradients it writes.
#[derive(Clone, Debug)]
pub(super) struct BackwardTensors {
    pub q: CubeTensor,
    pub k: CubeTensor,
    pub v: CubeTensor,
    /// `[batch, heads, seq_q, ROW_STATS]` in f32: `(LSE, D)` per query row.
    pub stats: CubeTensor,
    pub grad_output: CubeTensor,
    pub key_mask: CubeTensor,
    /// Written, shaped as `q`.
    pub grad_q: CubeTensor,
    /// Written, shaped as `k`.
    pub grad_k: CubeTensor,
    /// Written, shaped as `v`.
    pub grad_v: CubeTensor,
}

/// Writes the forward of `problem` into `tensors.output` and `tensors.lse` with the
/// kernels of `family`.
pub(super) fn forward_with(
    family: Family,
    problem: &Problem,
    options: &ScoreOptions,
    tensors: &ForwardTensors,
) {
    let tiling = match family {
        Family::RegisterTile(tiling) => tiling,
        Family::Staged(tiling) => {
            let config = tiling.forward;
            let launch = |cube_count: CubeCount, split: SplitLaunch| {
                let t = split.tensors;
                // SAFETY: every index the kernel reads or writes is clamped to or
                // checked against the problem sizes, which match the contiguous
                // tensors (and, for partials, `splits` times the rows).
                unsafe {
                    staged::staged_forward::launch_unchecked(
                        &t.q.client,
                        cube_count,
                        CubeDim::new_1d(config.units as u32),
                        t.q.clone().into_tensor_arg(),
                        t.k.clone().into_tensor_arg(),
                        t.v.clone().into_tensor_arg(),
                        t.key_mask.clone().into_tensor_arg(),
                        t.sinks.clone().into_tensor_arg(),
                        split.output.clone().into_tensor_arg(),
                        split.lse.clone().into_tensor_arg(),
                        split.sizes,
                        split.split_keys,
                        split.partial,
                        config,
                        dtype_to_storage_type(t.q.dtype),
                    );
                }
            };
            forward_splitting(
                problem,
                options,
                tensors,
                (config.block_q, config.block_k),
                launch,
            );
            return;
        }
        Family::Fragments(tiling, _) => {
            let config = for_call(tiling.forward, options);
            #[cfg(test)]
            super::super::op::FRAGMENT_LAUNCHES.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            #[cfg(test)]
            if config.copies.overlapped() {
                super::super::op::OVERLAPPED_LAUNCHES
                    .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            }
            let launch = |cube_count: CubeCount, split: SplitLaunch| {
                let t = split.tensors;
                // SAFETY: as the staged forward's: indices are clamped to or checked
                // against the problem sizes of these contiguous tensors.
                unsafe {
                    fragments::fragment_forward::launch_unchecked(
                        &t.q.client,
                        cube_count,
                        CubeDim::new_1d(config.units() as u32),
                        t.q.clone().into_tensor_arg(),
                        t.k.clone().into_tensor_arg(),
                        t.v.clone().into_tensor_arg(),
                        t.key_mask.clone().into_tensor_arg(),
                        t.sinks.clone().into_tensor_arg(),
                        split.output.clone().into_tensor_arg(),
                        split.lse.clone().into_tensor_arg(),
                        split.sizes,
                        split.split_keys,
                        split.partial,
                        config,
                        dtype_to_storage_type(t.q.dtype),
                    );
                }
            };
            forward_splitting(
                problem,
                options,
                tensors,
                (config.rows(), config.block),
                launch,
            );
            return;
        }
    };
    let ForwardTensors {
        q,
        k,
        v,
        key_mask,
        sinks,
        output,
        lse,
    } = tensors;
    let client = q.client.clone();
    let dtype = q.dtype;
    let tile = tiling.forward;
    let config = config(problem, &tiling, &tile);
    #[cfg(test)]
    count_split_rows(&tile);
    let cube_count = CubeCount::Static(
        problem.seq_q.div_ceil(tile.cube_rows()) as u32,
        (problem.batch * problem.heads) as u32,
        1,
    );
    // SAFETY: every index the kernel reads or writes is clamped to or checked
    // against the problem sizes, which match the contiguous tensors above.
    unsafe {
        register_tiles::flash_forward::launch_unchecked(
            &client,
            cube_count,
            CubeDim::new_1d(tile.units as u32),
            tiling.vector_size,
            q.clone().into_tensor_arg(),
            k.clone().into_tensor_arg(),
            v.clone().into_tensor_arg(),
            key_mask.clone().into_tensor_arg(),
            sinks.clone().into_tensor_arg(),
            output.clone().into_tensor_arg(),
            lse.clone().into_tensor_arg(),
            sizes(problem, options),
            config,
            dtype_to_storage_type(dtype),
        );
    }
}

/// What one launch of a splitting forward (staged or fragment kernels) writes, and
/// with which sizes and split.
struct SplitLaunch<'a> {
    tensors: &'a ForwardTensors,
    /// The output, or the partial outputs of every split.
    output: &'a CubeTensor,
    /// The log-sum-exp, or the splits' partial ones.
    lse: &'a CubeTensor,
    sizes: SizesLaunch,
    split_keys: u32,
    /// 1 when each split writes its partials for the merge.
    partial: u32,
}

/// A forward of `block = (query rows, keys)` per tile that may split its keys across
/// cubes (flash-decoding, [`plan_key_splits`]): `launch` runs the kernel on a grid,
/// into the outputs of one [`SplitLaunch`]; with several splits, into partials that
/// [`staged::staged_merge_splits`] combines.
fn forward_splitting(
    problem: &Problem,
    options: &ScoreOptions,
    tensors: &ForwardTensors,
    block: (usize, usize),
    launch: impl Fn(CubeCount, SplitLaunch),
) {
    let ForwardTensors {
        q,
        sinks,
        output,
        lse,
        ..
    } = tensors;
    let client = q.client.clone();
    let dtype = q.dtype;
    let (block_q, block_k) = block;
    let (splits, split_keys) = plan_key_splits(problem, block_q, block_k, client.properties());
    let cube_count = CubeCount::Static(
        problem.seq_q.div_ceil(block_q) as u32,
        (problem.batch * problem.heads) as u32,
        splits as u32,
    );
    let split = |output, lse, partial: bool| SplitLaunch {
        tensors,
        output,
        lse,
        // Splits write partials without the sinks, which join in the merge.
        sizes: sizes(problem, &options.with_sinks(options.has_sinks && !partial)),
        split_keys: split_keys as u32,
        partial: partial as u32,
    };
    if splits == 1 {
        launch(cube_count, split(output, lse, false));
        return;
    }
    #[cfg(test)]
    super::super::op::SPLIT_LAUNCHES.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let rows = problem.batch * problem.heads * problem.seq_q;
    let partial_out = empty_device_contiguous_dtype(
        client.clone(),
        q.device.clone(),
        Shape::new([splits, rows, problem.d_v]),
        dtype,
    );
    let partial_lse = empty_device_contiguous_dtype(
        client.clone(),
        q.device.clone(),
        Shape::new([splits, rows]),
        DType::F32,
    );
    launch(cube_count, split(&partial_out, &partial_lse, true));
    let cube_dim = CubeDim::new_1d(MERGE_UNITS);
    let cube_count = calculate_cube_count_elemwise(&client, rows, cube_dim);
    // SAFETY: the kernel checks `row < rows`; the partials hold `splits` times the rows
    // of the outputs.
    unsafe {
        staged::staged_merge_splits::launch_unchecked(
            &client,
            cube_count,
            cube_dim,
            partial_out.into_tensor_arg(),
            partial_lse.into_tensor_arg(),
            sinks.clone().into_tensor_arg(),
            output.clone().into_tensor_arg(),
            lse.clone().into_tensor_arg(),
            rows as u32,
            splits as u32,
            sizes(problem, options),
            problem.d_v,
            dtype_to_storage_type(dtype),
        );
    }
}

/// The backward's pre-pass, shared by every kernel family: `(LSE, D)` per query row
/// with `D = rowsum(dO ∘ O)`, which every gradient kernel reads, with `O` and `dO`
/// read in vectors of `vector_size` elements (it divides `d_v`).
///
/// Takes the output and the log-sum-exp by value: no gradient kernel reads them, so
/// once this launch is queued their memory is free for the gradients, and the
/// backward's peak holds `q, k, v, dO` and the gradients but no `O`.
///
/// # Shapes
/// - output, grad_output: `[batch, heads, seq_q, d_v]`, contiguous
/// - lse: `[batch, heads, seq_q]` f32, contiguous
/// - returns `[batch, heads, seq_q, ROW_STATS]` f32
pub(super) fn backward_stats(
    problem: &Problem,
    output: CubeTensor,
    lse: CubeTensor,
    grad_output: &CubeTensor,
    vector_size: usize,
) -> CubeTensor {
    let client = output.client.clone();
    let rows = problem.batch * problem.heads * problem.seq_q;
    let stats = empty_device_contiguous_dtype(
        client.clone(),
        output.device.clone(),
        Shape::new([problem.batch, problem.heads, problem.seq_q, ROW_STATS]),
        DType::F32,
    );
    let cube_dim = CubeDim::new_1d(PREPASS_UNITS);
    let cube_count = calculate_cube_count_elemwise(&client, rows, cube_dim);
    let storage = dtype_to_storage_type(output.dtype);
    // SAFETY: the kernel checks `row < rows` and the tensors hold `rows` rows.
    unsafe {
        row_stats::flash_backward_stats::launch_unchecked(
            &client,
            cube_count,
            cube_dim,
            vector_size,
            output.into_tensor_arg(),
            grad_output.clone().into_tensor_arg(),
            lse.into_tensor_arg(),
            stats.clone().into_tensor_arg(),
            rows as u32,
            problem.d_v / vector_size,
            storage,
        );
    }
    stats
}

/// Writes the gradients of `problem` into `tensors.grad_q`, `grad_k` and `grad_v` with
/// the kernels of `family`.
pub(super) fn backward_with(
    family: Family,
    problem: &Problem,
    options: &ScoreOptions,
    tensors: &BackwardTensors,
) {
    let BackwardTensors {
        q,
        k,
        v,
        stats,
        grad_output,
        key_mask,
        grad_q,
        grad_k,
        grad_v,
    } = tensors;
    let problem = *problem;
    let client = q.client.clone();
    let device = q.device.clone();
    let storage = dtype_to_storage_type(q.dtype);

    let tiling = match family {
        Family::RegisterTile(tiling) => tiling,
        Family::Fragments(
            FragmentTiling {
                backward: Some((dq_config, kv_config)),
                ..
            },
            _,
        ) => {
            #[cfg(test)]
            super::super::op::FRAGMENT_BACKWARD_LAUNCHES
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            #[cfg(test)]
            if dq_config.copies.overlapped() {
                super::super::op::OVERLAPPED_DQ_LAUNCHES
                    .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            }
            #[cfg(test)]
            if kv_config.copies.overlapped() {
                super::super::op::OVERLAPPED_DKDV_LAUNCHES
                    .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            }
            let (dq_config, kv_config) =
                (for_call(dq_config, options), for_call(kv_config, options));
            // 2. dK, dV: one cube per 16·planes keys; 3. dQ: one per 16·planes rows,
            // or, in the one-pass backward, the dK/dV kernel's f32 sums made dQ.
            // The one-pass backward's f32 sums of dQ and the columns one atomic add takes
            // (a placeholder in the two-pass backward).
            let (grad_q_sum, atomic_width) = if kv_config.adds_dq {
                #[cfg(test)]
                super::super::op::ATOMIC_DQ_LAUNCHES
                    .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                let sums = zeros_client(client.clone(), device.clone(), q.shape(), DType::F32);
                (sums, dq_atomic_width(client.properties()))
            } else {
                let placeholder = empty_device_contiguous_dtype(
                    client.clone(),
                    device.clone(),
                    Shape::new([1]),
                    DType::F32,
                );
                (placeholder, 1)
            };
            let cube_count = CubeCount::Static(
                problem.seq_k.div_ceil(kv_config.rows()) as u32,
                (problem.batch * problem.kv_heads) as u32,
                1,
            );
            // SAFETY: indices are clamped to or checked against the problem sizes of
            // these contiguous tensors.
            unsafe {
                fragments::fragment_backward_kv::launch_unchecked(
                    &client,
                    cube_count,
                    CubeDim::new_1d(kv_config.units() as u32),
                    atomic_width,
                    q.clone().into_tensor_arg(),
                    k.clone().into_tensor_arg(),
                    v.clone().into_tensor_arg(),
                    grad_output.clone().into_tensor_arg(),
                    stats.clone().into_tensor_arg(),
                    key_mask.clone().into_tensor_arg(),
                    grad_k.clone().into_tensor_arg(),
                    grad_v.clone().into_tensor_arg(),
                    grad_q_sum.clone().into_tensor_arg(),
                    sizes(&problem, options),
                    kv_config,
                    storage,
                );
            }
            if kv_config.adds_dq {
                let elements = q.shape().num_elements();
                let cube_dim = CubeDim::new_1d(PREPASS_UNITS);
                // SAFETY: the kernel checks its position against `grad_q`'s length,
                // which `grad_q_sum`'s shape matches.
                unsafe {
                    fragments::fragment_finish_dq::launch_unchecked(
                        &client,
                        calculate_cube_count_elemwise(&client, elements, cube_dim),
                        cube_dim,
                        grad_q_sum.into_tensor_arg(),
                        grad_q.clone().into_tensor_arg(),
                        options.scale as f32,
                        storage,
                    );
                }
                return;
            }
            let cube_count = CubeCount::Static(
                problem.seq_q.div_ceil(dq_config.rows()) as u32,
                (problem.batch * problem.heads) as u32,
                1,
            );
            // SAFETY: as above.
            unsafe {
                fragments::fragment_backward_q::launch_unchecked(
                    &client,
                    cube_count,
                    CubeDim::new_1d(dq_config.units() as u32),
                    q.clone().into_tensor_arg(),
                    k.clone().into_tensor_arg(),
                    v.clone().into_tensor_arg(),
                    grad_output.clone().into_tensor_arg(),
                    stats.clone().into_tensor_arg(),
                    key_mask.clone().into_tensor_arg(),
                    grad_q.clone().into_tensor_arg(),
                    sizes(&problem, options),
                    dq_config,
                    storage,
                );
            }
            return;
        }
        // The fragment family without a backward of its own takes the staged one.
        Family::Staged(tiling) | Family::Fragments(_, tiling) => {
            // 2. dK, dV: one cube per block of keys; 3. dQ: one per block of rows.
            let config = tiling.backward_kv;
            let cube_count = CubeCount::Static(
                problem.seq_k.div_ceil(config.block_k) as u32,
                (problem.batch * problem.kv_heads) as u32,
                1,
            );
            // SAFETY: indices are bounded by the problem sizes of these contiguous
            // tensors.
            unsafe {
                staged::staged_backward_kv::launch_unchecked(
                    &client,
                    cube_count,
                    CubeDim::new_1d(config.units as u32),
                    q.clone().into_tensor_arg(),
                    k.clone().into_tensor_arg(),
                    v.clone().into_tensor_arg(),
                    grad_output.clone().into_tensor_arg(),
                    stats.clone().into_tensor_arg(),
                    key_mask.clone().into_tensor_arg(),
                    grad_k.clone().into_tensor_arg(),
                    grad_v.clone().into_tensor_arg(),
                    sizes(&problem, options),
                    config,
                    storage,
                );
            }
            let config = tiling.backward_q;
            let cube_count = CubeCount::Static(
                problem.seq_q.div_ceil(config.block_q) as u32,
                (problem.batch * problem.heads) as u32,
                1,
            );
            // SAFETY: as above.
            unsafe {
                staged::staged_backward_q::launch_unchecked(
                    &client,
                    cube_count,
                    CubeDim::new_1d(config.units as u32),
                    q.clone().into_tensor_arg(),
                    k.clone().into_tensor_arg(),
                    v.clone().into_tensor_arg(),
                    grad_output.clone().into_tensor_arg(),
                    stats.clone().into_tensor_arg(),
                    key_mask.clone().into_tensor_arg(),
                    grad_q.clone().into_tensor_arg(),
                    sizes(&problem, options),
                    config,
                    storage,
                );
            }
            return;
        }
    };

    // 2. dK, dV: one unit per key.
    let tile = tiling.backward_kv;
    let kv_config = config(&problem, &tiling, &tile);
    #[cfg(test)]
    count_split_rows(&tile);
    let cube_count = CubeCount::Static(
        problem.seq_k.div_ceil(tile.cube_rows()) as u32,
        (problem.batch * problem.kv_heads) as u32,
        1,
    );
    // SAFETY: indices are bounded by the problem sizes of these contiguous tensors.
    unsafe {
        register_tiles::flash_backward_kv::launch_unchecked(
            &client,
            cube_count,
            CubeDim::new_1d(tile.units as u32),
            tiling.vector_size,
            q.clone().into_tensor_arg(),
            k.clone().into_tensor_arg(),
            v.clone().into_tensor_arg(),
            grad_output.clone().into_tensor_arg(),
            stats.clone().into_tensor_arg(),
            key_mask.clone().into_tensor_arg(),
            grad_k.clone().into_tensor_arg(),
            grad_v.clone().into_tensor_arg(),
            sizes(&problem, options),
            kv_config,
            storage,
        );
    }

    // 3. dQ: one unit per query row.
    let tile = tiling.backward_q;
    let q_config = config(&problem, &tiling, &tile);
    #[cfg(test)]
    count_split_rows(&tile);
    let cube_count = CubeCount::Static(
        problem.seq_q.div_ceil(tile.cube_rows()) as u32,
        (problem.batch * problem.heads) as u32,
        1,
    );
    // SAFETY: indices are bounded by the problem sizes of these contiguous tensors.
    unsafe {
        register_tiles::flash_backward_q::launch_unchecked(
            &client,
            cube_count,
            CubeDim::new_1d(tile.units as u32),
            tiling.vector_size,
            q.clone().into_tensor_arg(),
            k.clone().into_tensor_arg(),
            v.clone().into_tensor_arg(),
            grad_output.clone().into_tensor_arg(),
            stats.clone().into_tensor_arg(),
            key_mask.clone().into_tensor_arg(),
            grad_q.clone().into_tensor_arg(),
            sizes(&problem, options),
            q_config,
            storage,
        );
    }
}
