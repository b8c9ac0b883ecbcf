//! Launching the CubeCL kernels: the forward, and the backward's three kernels
//! (a pre-pass writing `(LSE, D)` per query row with `D = rowsum(dO ∘ O)`; a key/value
//! kernel accumulating `dK, dV`, one unit per key looping over every query row of its
//! group's query heads, so no atomics; a query kernel accumulating `dQ`). Both
//! gradient kernels recompute `P = exp(S − LSE)`: no `seq_q × seq_k` buffer exists, and
//! each output element is summed by one unit in a fixed order, so the results are
//! deterministic.
//!
//! Outputs are allocated dense (`empty_device_contiguous_dtype`): the kernels index
//! rows as `row * d`, and `empty_device_dtype` lets the runtime pitch rows (CUDA pads
//! each row to the next power of two of its bytes, up to 512: d = 80 in f32 gets 128
//! floats a row), which a dense write would scramble. Inputs go through
//! `into_contiguous`, which is dense.

use burn::backend::TensorMetadata;
use burn::backend::cubecl::dtype_to_storage_type;
use burn::tensor::{DType, Shape};
use burn_cubecl::kernel::into_contiguous;
use burn_cubecl::ops::numeric::{empty_device_contiguous_dtype, zeros_client};
use burn_cubecl::tensor::CubeTensor;
use cubecl::calculate_cube_count_elemwise;
use cubecl::prelude::*;

use super::super::{FlashKernel, Problem, ScoreOptions};
use super::autotune;
use super::fragments::{self, FragmentConfig, FragmentTiling};
use super::kernels::{self, AttentionConfig, SizesLaunch};
use super::staged;
use super::tiling::{
    KernelTile, LARGEST_STAGED_BLOCK, StagedProduct, StagedTiling, Tiling, auto_forward_row_tiles,
    dq_atomic_width, fragment_row_tiles, has_fragment_mma, is_cpu_runtime, plan_fragments,
    plan_key_splits, plan_staged, plan_tiling,
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
        options.scale as f32,
        options.softcap.unwrap_or(1.0) as f32,
        (1.0 / options.softcap.unwrap_or(1.0)) as f32,
        problem.mask.causal as u32,
        problem.mask.window.is_some() as u32,
        problem.has_key_mask as u32,
        options.softcap.is_some() as u32,
        options.has_sinks as u32,
    )
}

/// A planned fragment kernel as one call compiles it: with the soft-cap's code only
/// where the call has a cap.
fn for_call(config: FragmentConfig, options: &ScoreOptions) -> FragmentConfig {
    FragmentConfig {
        softcap: options.softcap.is_some(),
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

/// How one call's family is decided.
enum Choice {
    /// By rule (the options' family, with its fallbacks).
    Fixed(Box<Family>),
    /// By timing the candidates once per shape class on the device (`autotune.rs`).
    Tuned,
}

/// Resolves the call's [`FlashKernel`] on the tensors' device: [`choose_on`] with the
/// tensors' element type and device.
fn choose(problem: &Problem, options: &ScoreOptions, tensor: &CubeTensor) -> Choice {
    let properties = tensor.client.properties();
    let choice = choose_on(problem, options.kernel, tensor.dtype, properties);
    #[cfg(test)]
    if let (Some(lanes), Choice::Fixed(family)) = (options.forced_lanes, &choice)
        && let Family::RegisterTile(_) = **family
    {
        let tiling = super::tiling::plan_split_rows(problem, properties, lanes)
            .expect("the register tiles take the problem");
        return Choice::Fixed(Box::new(Family::RegisterTile(tiling)));
    }
    choice
}

/// The family of `kernel` for `problem` in `dtype` on a device with `properties`, with
/// its fallbacks: the fragment kernels need their head dims, tiles that fit, and tensor
/// cores for the dtype on GPUs (else the staged kernels); tensor cores need f16/bf16,
/// head dims multiple of 16 and the device's fragments (else the plain product); the
/// staged tiles need the device's shared memory (else register tiles).
///
/// `Auto` takes the fragment kernels on GPUs whose tensor cores multiply the dtype's
/// m16n8k16 fragments: on an H100, in bf16 at head dim 128, they took 3–70 times less
/// time than every other family, forward and backward (docs/benchmarks.md, `cuda`);
/// their forward is the wide one for launches that fill the GPU several times over
/// ([`auto_forward_row_tiles`]).
/// Other calls on GPUs tune among the staged tiles and the register tiles; CPU runtimes
/// take register tiles, as they serve shared memory at the cost of global memory, so
/// the register tiles' reuse is what pays there (see `kernels.rs`).
fn choose_on(
    problem: &Problem,
    kernel: FlashKernel,
    dtype: DType,
    properties: &cubecl::ir::DeviceProperties,
) -> Choice {
    let requested = match kernel {
        FlashKernel::Auto => FlashKernel::from_env().unwrap_or(FlashKernel::Auto),
        chosen => chosen,
    };
    let fragments_first = matches!(
        requested,
        FlashKernel::Fragments
            | FlashKernel::WideFragments
            | FlashKernel::FragmentsAtomicDq
            | FlashKernel::FragmentsTf32
            | FlashKernel::FragmentsOverlapped
    ) || (requested == FlashKernel::Auto
        && has_fragment_mma(properties, dtype));
    if fragments_first {
        let row_tiles = match requested {
            FlashKernel::Fragments | FlashKernel::FragmentsTf32 => fragment_row_tiles(false),
            FlashKernel::WideFragments => fragment_row_tiles(true),
            _ => auto_forward_row_tiles(problem, properties),
        };
        let one_pass = requested == FlashKernel::FragmentsAtomicDq;
        let split_tf32 = requested == FlashKernel::FragmentsTf32;
        let overlap = requested == FlashKernel::FragmentsOverlapped;
        let fragments = plan_fragments(
            problem, dtype, properties, row_tiles, one_pass, split_tf32, overlap,
        );
        let staged = plan_staged(
            problem,
            dtype,
            StagedProduct::Plain,
            LARGEST_STAGED_BLOCK,
            properties,
        );
        if let (Some(fragments), Some(staged)) = (fragments, staged) {
            return Choice::Fixed(Box::new(Family::Fragments(fragments, staged)));
        }
    }
    let product = match requested {
        FlashKernel::RegisterTile => None,
        FlashKernel::Staged
        | FlashKernel::Fragments
        | FlashKernel::WideFragments
        | FlashKernel::FragmentsAtomicDq
        | FlashKernel::FragmentsTf32
        | FlashKernel::FragmentsOverlapped => Some(StagedProduct::Plain),
        FlashKernel::StagedTensorCores => Some(StagedProduct::TensorCores),
        FlashKernel::Auto if is_cpu_runtime(properties) => None,
        FlashKernel::Auto | FlashKernel::Autotune => return Choice::Tuned,
    };
    Choice::Fixed(Box::new(Family::staged_or_register(
        problem,
        dtype,
        product,
        LARGEST_STAGED_BLOCK,
        properties,
    )))
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

/// The tensors of one backward call: inputs, and the gradients it writes.
#[derive(Clone, Debug)]
pub(super) struct BackwardTensors {
    pub q: CubeTensor,
    pub k: CubeTensor,
    pub v: CubeTensor,
    pub output: CubeTensor,
    pub lse: CubeTensor,
    pub grad_output: CubeTensor,
    pub key_mask: CubeTensor,
    /// Written, shaped as `q`.
    pub grad_q: CubeTensor,
    /// Written, shaped as `k`.
    pub grad_k: CubeTensor,
    /// Written, shaped as `v`.
    pub grad_v: CubeTensor,
}

/// Runs the forward kernel: `(output, lse)`.
///
/// # Shapes
/// See [`FlashAttentionOps::flash_attention_forward`](super::super::FlashAttentionOps::flash_attention_forward).
pub(crate) fn forward(
    q: CubeTensor,
    k: CubeTensor,
    v: CubeTensor,
    key_mask: CubeTensor,
    sinks: CubeTensor,
    options: &ScoreOptions,
) -> (CubeTensor, CubeTensor) {
    #[cfg(test)]
    super::super::op::FORWARD_LAUNCHES.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    // The kernel indexes rows directly, so inputs must be dense row-major.
    let q = into_contiguous(q);
    let k = into_contiguous(k);
    let v = into_contiguous(v);
    let key_mask = into_contiguous(key_mask);
    let sinks = into_contiguous(sinks);
    let problem = Problem::from_shapes(&q.shape(), &k.shape(), &v.shape(), options);
    let client = q.client.clone();
    let dtype = q.dtype;

    // Dense outputs (see the module docs).
    let output = empty_device_contiguous_dtype(
        client.clone(),
        q.device.clone(),
        Shape::new([problem.batch, problem.heads, problem.seq_q, problem.d_v]),
        dtype,
    );
    let lse = empty_device_contiguous_dtype(
        client,
        q.device.clone(),
        Shape::new([problem.batch, problem.heads, problem.seq_q]),
        DType::F32,
    );
    let choice = choose(&problem, options, &q);
    let tensors = ForwardTensors {
        q,
        k,
        v,
        key_mask,
        sinks,
        output: output.clone(),
        lse: lse.clone(),
    };
    match choice {
        Choice::Fixed(family) => forward_with(*family, &problem, options, &tensors),
        Choice::Tuned => autotune::forward(problem, *options, tensors),
    }
    (output, lse)
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
        kernels::flash_forward::launch_unchecked(
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

/// Runs the backward kernels: `(dq, dk, dv)`.
///
/// # Shapes
/// See [`FlashAttentionOps::flash_attention_backward`](super::super::FlashAttentionOps::flash_attention_backward).
#[allow(clippy::too_many_arguments)]
pub(crate) fn backward(
    q: CubeTensor,
    k: CubeTensor,
    v: CubeTensor,
    output: CubeTensor,
    lse: CubeTensor,
    grad_output: CubeTensor,
    key_mask: CubeTensor,
    options: &ScoreOptions,
) -> (CubeTensor, CubeTensor, CubeTensor) {
    let q = into_contiguous(q);
    let k = into_contiguous(k);
    let v = into_contiguous(v);
    let output = into_contiguous(output);
    let lse = into_contiguous(lse);
    let grad_output = into_contiguous(grad_output);
    let key_mask = into_contiguous(key_mask);
    let problem = Problem::from_shapes(&q.shape(), &k.shape(), &v.shape(), options);
    // Dense buffers, as the kernels index them (see the module docs).
    let empty = |shape: Shape| {
        empty_device_contiguous_dtype(q.client.clone(), q.device.clone(), shape, q.dtype)
    };
    let (grad_q, grad_k, grad_v) = (empty(q.shape()), empty(k.shape()), empty(v.shape()));
    let choice = choose(&problem, options, &q);
    let tensors = BackwardTensors {
        q,
        k,
        v,
        output,
        lse,
        grad_output,
        key_mask,
        grad_q: grad_q.clone(),
        grad_k: grad_k.clone(),
        grad_v: grad_v.clone(),
    };
    match choice {
        Choice::Fixed(family) => backward_with(*family, &problem, options, &tensors),
        Choice::Tuned => autotune::backward(problem, *options, tensors),
    }
    (grad_q, grad_k, grad_v)
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
        output,
        lse,
        grad_output,
        key_mask,
        grad_q,
        grad_k,
        grad_v,
    } = tensors;
    let problem = *problem;
    let client = q.client.clone();
    let device = q.device.clone();
    let dtype = q.dtype;
    let storage = dtype_to_storage_type(dtype);

    let empty = |shape: Shape, dtype: DType| {
        empty_device_contiguous_dtype(client.clone(), device.clone(), shape, dtype)
    };

    // 1. (LSE, D) per query row.
    let rows = problem.batch * problem.heads * problem.seq_q;
    let stats = empty(
        Shape::new([problem.batch, problem.heads, problem.seq_q, 2]),
        DType::F32,
    );
    let cube_dim = CubeDim::new_1d(PREPASS_UNITS);
    let cube_count = calculate_cube_count_elemwise(&client, rows, cube_dim);
    // The staged kernels read every tensor element by element.
    let vector_size = match &family {
        Family::RegisterTile(tiling) => tiling.vector_size,
        Family::Staged(_) | Family::Fragments(..) => 1,
    };
    // SAFETY: the kernel checks `row < rows` and the tensors hold `rows` rows.
    unsafe {
        kernels::flash_backward_stats::launch_unchecked(
            &client,
            cube_count,
            cube_dim,
            vector_size,
            output.clone().into_tensor_arg(),
            grad_output.clone().into_tensor_arg(),
            lse.clone().into_tensor_arg(),
            stats.clone().into_tensor_arg(),
            rows as u32,
            problem.d_v / vector_size,
            storage,
        );
    }

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
                (empty(Shape::new([1]), DType::F32), 1)
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
                    stats.into_tensor_arg(),
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
                    stats.into_tensor_arg(),
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
        kernels::flash_backward_kv::launch_unchecked(
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
        kernels::flash_backward_q::launch_unchecked(
            &client,
            cube_count,
            CubeDim::new_1d(tile.units as u32),
            tiling.vector_size,
            q.clone().into_tensor_arg(),
            k.clone().into_tensor_arg(),
            v.clone().into_tensor_arg(),
            grad_output.clone().into_tensor_arg(),
            stats.into_tensor_arg(),
            key_mask.clone().into_tensor_arg(),
            grad_q.clone().into_tensor_arg(),
            sizes(&problem, options),
            q_config,
            storage,
        );
    }
}

#[cfg(test)]
mod tests {
    use super::super::variants::tests::{gpu, gpu_with_fragments, without_tf32};
    use super::*;
    use crate::ops::mask::MaskRule;

    fn problem(d_qk: usize, d_v: usize) -> Problem {
        Problem {
            batch: 2,
            heads: 4,
            kv_heads: 2,
            seq_q: 300,
            seq_k: 300,
            d_qk,
            d_v,
            mask: MaskRule::new(true, None),
            has_key_mask: false,
        }
    }

    fn is_fragments(choice: &Choice) -> bool {
        matches!(choice, Choice::Fixed(family) if matches!(**family, Family::Fragments(..)))
    }

    /// `Auto` runs the fragment kernels where the GPU's tensor cores take the inputs'
    /// type and the head dims fit them, and tunes the other families otherwise; CPU
    /// runtimes and explicit families keep their own rules.
    #[test]
    fn auto_takes_the_fragment_kernels_on_tensor_core_gpus() {
        if FlashKernel::from_env().is_some() {
            return; // BURN_TRANSFORMER_FLASH_KERNEL replaces `Auto`'s choice
        }
        let tensor_cores = gpu_with_fragments();
        for dtype in [DType::BF16, DType::F16] {
            for (d_qk, d_v) in [(64, 64), (128, 128), (192, 128)] {
                let choice =
                    choose_on(&problem(d_qk, d_v), FlashKernel::Auto, dtype, &tensor_cores);
                assert!(is_fragments(&choice), "{dtype:?} {d_qk}x{d_v}");
            }
            // MLA's absorbed 576/512 holds more than a lane's registers: tuned.
            let choice = choose_on(&problem(576, 512), FlashKernel::Auto, dtype, &tensor_cores);
            assert!(matches!(choice, Choice::Tuned));
        }
        // f32 has no half fragments, and a GPU without the instruction none at all.
        let f32 = choose_on(
            &problem(128, 128),
            FlashKernel::Auto,
            DType::F32,
            &tensor_cores,
        );
        assert!(matches!(f32, Choice::Tuned));
        let plain = choose_on(&problem(128, 128), FlashKernel::Auto, DType::BF16, &gpu());
        assert!(matches!(plain, Choice::Tuned));
        // An explicit family is kept.
        let staged = choose_on(
            &problem(128, 128),
            FlashKernel::Staged,
            DType::BF16,
            &tensor_cores,
        );
        assert!(matches!(staged, Choice::Fixed(family) if matches!(*family, Family::Staged(_))));
    }

    /// `FragmentsTf32` runs the split TF32 products for f32 on GPUs with TF32 fragments
    /// and their emulation on CPU runtimes, the 16-bit products for f16/bf16, and the
    /// staged kernels on GPUs without the instruction; nothing else takes them.
    #[test]
    fn tf32_fragments_run_only_when_asked() {
        use super::super::fragment::FragmentOps;
        let ops = |choice: Choice| match choice {
            Choice::Fixed(family) => match *family {
                Family::Fragments(tiling, _) => Some(tiling.forward.ops),
                _ => None,
            },
            Choice::Tuned => None,
        };
        let tensor_cores = gpu_with_fragments();
        let asked = |dtype, properties| {
            ops(choose_on(
                &problem(128, 128),
                FlashKernel::FragmentsTf32,
                dtype,
                properties,
            ))
        };
        assert_eq!(
            asked(DType::F32, &tensor_cores),
            Some(FragmentOps::SplitTf32)
        );
        assert_eq!(
            asked(DType::BF16, &tensor_cores),
            Some(FragmentOps::TensorCores)
        );
        let mut cpu = tensor_cores.clone();
        cpu.hardware.num_cpu_cores = Some(2);
        assert!(is_cpu_runtime(&cpu));
        cpu.features.matmul.mma.clear();
        assert_eq!(
            asked(DType::F32, &cpu),
            Some(FragmentOps::EmulatedSplitTf32)
        );
        let without = without_tf32(tensor_cores.clone());
        assert_eq!(asked(DType::F32, &without), None);
        // Neither the explicit fragment family nor `Auto` splits f32.
        assert_eq!(
            ops(choose_on(
                &problem(128, 128),
                FlashKernel::Fragments,
                DType::F32,
                &tensor_cores
            )),
            None
        );
        if FlashKernel::from_env().is_none() {
            let auto = choose_on(
                &problem(128, 128),
                FlashKernel::Auto,
                DType::F32,
                &tensor_cores,
            );
            assert!(matches!(auto, Choice::Tuned));
        }
    }

    /// `FragmentsOverlapped` overlaps the tile copies of the forward, dQ and dK/dV with
    /// their computation: with `cp.async` where the device has it and the staging
    /// copies 16-byte vectors, synchronously in the same order elsewhere; its forward is
    /// as wide as `Auto`'s. No other family overlaps.
    #[test]
    fn overlapped_copies_run_only_when_asked() {
        use super::super::fragments::TileCopies;
        let plan = |kernel, problem: &Problem, properties| match choose_on(
            problem,
            kernel,
            DType::BF16,
            properties,
        ) {
            Choice::Fixed(family) => match *family {
                Family::Fragments(tiling, _) => Some(tiling),
                _ => None,
            },
            Choice::Tuned => None,
        };
        let mut cuda = gpu_with_fragments();
        cuda.features.memory_reinterpret = true;
        cuda.features.copy_async = true;
        let mut without_async = cuda.clone();
        without_async.features.copy_async = false;
        let wgpu_like = gpu_with_fragments(); // one element a copy
        let copies = |properties| {
            let tiling = plan(
                FlashKernel::FragmentsOverlapped,
                &problem(128, 128),
                properties,
            )
            .unwrap();
            // The backward overlaps as the forward does (its second buffers fit).
            let (dq, dkdv) = tiling.backward.unwrap();
            assert_eq!(dq.copies, tiling.forward.copies);
            assert_eq!(dkdv.copies, tiling.forward.copies);
            tiling.forward.copies
        };
        assert_eq!(copies(&cuda), TileCopies::Overlapped { asynchronous: true });
        assert_eq!(
            copies(&without_async),
            TileCopies::Overlapped {
                asynchronous: false
            }
        );
        assert_eq!(
            copies(&wgpu_like),
            TileCopies::Overlapped {
                asynchronous: false
            }
        );
        for kernel in [
            FlashKernel::Fragments,
            FlashKernel::WideFragments,
            FlashKernel::FragmentsAtomicDq,
        ] {
            let tiling = plan(kernel, &problem(128, 128), &cuda).unwrap();
            let (dq, dkdv) = tiling.backward.unwrap();
            for copies in [tiling.forward.copies, dq.copies, dkdv.copies] {
                assert_eq!(copies, TileCopies::Together, "{kernel:?}");
            }
        }
        if FlashKernel::from_env().is_none() {
            let auto = plan(FlashKernel::Auto, &problem(128, 128), &cuda).unwrap();
            assert_eq!(auto.forward.copies, TileCopies::Together);
            // A launch that fills the GPU takes the wide forward, overlapped or not.
            let large = Problem {
                batch: 4,
                heads: 16,
                seq_q: 16384,
                seq_k: 16384,
                ..problem(128, 128)
            };
            let rows = |kernel| plan(kernel, &large, &cuda).unwrap().forward.row_tiles;
            assert_eq!(
                rows(FlashKernel::FragmentsOverlapped),
                rows(FlashKernel::Auto)
            );
            assert_eq!(rows(FlashKernel::FragmentsOverlapped), 2);
        }
    }

    /// `Auto`'s fragment forward is the wide one (two row tiles a plane) for launches
    /// of at least 8 wide cubes per multiprocessor at value head dim 128, the narrow one
    /// otherwise; its dQ is always narrow. An explicit family keeps its width.
    #[test]
    fn auto_takes_the_wide_forward_for_launches_that_fill_the_gpu() {
        if FlashKernel::from_env().is_some() {
            return; // BURN_TRANSFORMER_FLASH_KERNEL replaces `Auto`'s choice
        }
        let tensor_cores = gpu_with_fragments();
        // (batch, heads, seq, d_qk, d_v): 132 SMs, so the wide forward from 1056 cubes
        // of 128 rows.
        let cases = [
            ((4, 16, 4096, 128, 128), 2),
            ((4, 16, 16384, 128, 128), 2),
            ((1, 32, 4224, 192, 128), 2),
            ((4, 16, 1024, 128, 128), 1),
            ((1, 32, 4096, 128, 128), 1),
            ((4, 16, 4096, 64, 64), 1),
            ((4, 16, 1, 128, 128), 1),
        ];
        for ((batch, heads, seq, d_qk, d_v), wide) in cases {
            let problem = Problem {
                batch,
                heads,
                kv_heads: heads,
                seq_q: seq,
                seq_k: seq.max(4096),
                ..problem(d_qk, d_v)
            };
            let rows = |kernel| match choose_on(&problem, kernel, DType::BF16, &tensor_cores) {
                Choice::Fixed(family) => match *family {
                    Family::Fragments(tiling, _) => {
                        let (q, _) = tiling.backward.unwrap();
                        assert_eq!(q.row_tiles, 1);
                        tiling.forward.row_tiles
                    }
                    other => panic!("{problem:?}: {other:?}"),
                },
                Choice::Tuned => panic!("{problem:?}: tuned"),
            };
            assert_eq!(rows(FlashKernel::Auto), wide, "{problem:?}");
            assert_eq!(rows(FlashKernel::Fragments), 1, "{problem:?}");
            assert_eq!(rows(FlashKernel::WideFragments), 2, "{problem:?}");
        }
        // A runtime that does not report its multiprocessors keeps the narrow forward.
        let mut unknown = tensor_cores.clone();
        unknown.hardware.num_streaming_multiprocessors = None;
        let problem = Problem {
            batch: 4,
            heads: 16,
            kv_heads: 16,
            seq_q: 16384,
            seq_k: 16384,
            ..problem(128, 128)
        };
        assert_eq!(
            super::super::tiling::auto_forward_row_tiles(&problem, &unknown),
            1
        );
    }

    /// The fragment kernels stage rows as 16-byte vectors where the runtime reads a
    /// buffer as vectors of another width (CUDA) and element by element where it
    /// cannot (wgpu), and load their fragments with `ldmatrix` where the device has it
    /// (unless turned off), element by element elsewhere.
    #[test]
    fn fragment_staging_copies_vectors_where_the_runtime_retypes_buffers() {
        use super::super::fragment::FragmentLoads;
        use super::super::tiling::plan_fragments;
        let mut cuda = gpu_with_fragments();
        let f16 = cubecl::ir::ElemType::Float(cubecl::ir::FloatKind::F16);
        let bf16 = cubecl::ir::ElemType::Float(cubecl::ir::FloatKind::BF16);
        cuda.features.matmul.ldmatrix.extend([f16, bf16]);
        let wgpu_like = gpu_with_fragments();
        cuda.features.memory_reinterpret = true;
        for dtype in [DType::BF16, DType::F16] {
            for (d_qk, d_v) in [(64, 64), (128, 128), (192, 128)] {
                let plan =
                    plan_fragments(&problem(d_qk, d_v), dtype, &cuda, 1, false, false, false)
                        .unwrap();
                let (q, kv) = plan.backward.unwrap();
                for config in [plan.forward, q, kv] {
                    // 16 bytes of a 2-byte type.
                    assert_eq!(config.staging, 8, "{dtype:?} {d_qk}x{d_v}");
                    let loads = if crate::ops::flash_attention::matrix_loads_enabled() {
                        FragmentLoads::Matrices
                    } else {
                        FragmentLoads::Elements
                    };
                    assert_eq!(config.loads, loads, "{dtype:?} {d_qk}x{d_v}");
                }
                let plan = plan_fragments(
                    &problem(d_qk, d_v),
                    dtype,
                    &wgpu_like,
                    1,
                    false,
                    false,
                    false,
                )
                .unwrap();
                assert_eq!(plan.forward.staging, 1, "{dtype:?} {d_qk}x{d_v}");
                assert_eq!(plan.forward.loads, FragmentLoads::Elements);
            }
        }
        // Head dims that are odd multiples of 8 still take whole 16-byte vectors.
        let plan =
            plan_fragments(&problem(48, 24), DType::BF16, &cuda, 1, false, false, false).unwrap();
        assert_eq!(plan.forward.staging, 8);
    }

    /// The one-pass backward is planned where it is asked for and the device adds f32
    /// atomically: its dK/dV kernel adds dQ (and stages `dS`, within the device's
    /// shared memory); the forward and the dQ kernel's plan are the two-pass ones.
    #[test]
    fn one_pass_backward_needs_asking_and_f32_atomics() {
        use super::super::tiling::plan_fragments;
        let atomics = gpu_with_fragments();
        let mut none = atomics.clone();
        none.features.types.atomic.clear();
        for (d_qk, d_v) in [(64, 64), (128, 128), (192, 128)] {
            let problem = problem(d_qk, d_v);
            // At 192/128 the one-pass kernel would spill: the two-pass one runs.
            let takes = d_qk <= 128;
            let adds = |properties, one_pass| {
                let plan =
                    plan_fragments(&problem, DType::BF16, properties, 1, one_pass, false, false)
                        .unwrap();
                let (q, kv) = plan.backward.unwrap();
                assert!(!plan.forward.adds_dq && !q.adds_dq);
                assert!(kv.backward_kv_bytes(2) <= atomics.hardware.max_shared_memory_size);
                kv.adds_dq
            };
            assert_eq!(adds(&atomics, true), takes, "{d_qk}x{d_v}");
            assert!(!adds(&atomics, false), "{d_qk}x{d_v}");
            assert!(!adds(&none, true), "{d_qk}x{d_v}");
            let one_pass = match choose_on(
                &problem,
                FlashKernel::FragmentsAtomicDq,
                DType::BF16,
                &atomics,
            ) {
                Choice::Fixed(family) => match *family {
                    Family::Fragments(tiling, _) => tiling.backward.unwrap().1.adds_dq,
                    other => panic!("{other:?}"),
                },
                Choice::Tuned => panic!("tuned"),
            };
            assert_eq!(one_pass, takes, "{d_qk}x{d_v}");
        }
    }

    /// The fragment kernels take `ex2.approx` exponentials where the runtime compiles
    /// PTX (CUDA) and the library's `exp` elsewhere. The wide family plans two row
    /// tiles for the forward only.
    #[test]
    fn fragment_exponentials_are_ex2_on_ptx_runtimes_only() {
        use super::super::softmax::Exponential;
        use super::super::tiling::plan_fragments;
        let mut cuda = gpu_with_fragments();
        cuda.identity.fingerprint = "ptx_sm90".into();
        let other = gpu_with_fragments();
        for (d_qk, d_v) in [(64, 64), (128, 128), (192, 128)] {
            for row_tiles in [1, 2] {
                let plan = plan_fragments(
                    &problem(d_qk, d_v),
                    DType::BF16,
                    &cuda,
                    row_tiles,
                    false,
                    false,
                    false,
                )
                .unwrap();
                let (q, kv) = plan.backward.unwrap();
                assert_eq!(plan.forward.exponential, Exponential::Ex2Approx);
                assert_eq!(q.exponential, Exponential::Ex2Approx);
                assert_eq!(kv.exponential, Exponential::Ex2Approx, "{d_qk}x{d_v}");
                assert_eq!((plan.forward.row_tiles, q.row_tiles), (row_tiles, 1));
                assert_eq!(kv.row_tiles, 1);
                assert_eq!(plan.forward.rows(), 16 * row_tiles * plan.forward.planes);

                let plan = plan_fragments(
                    &problem(d_qk, d_v),
                    DType::BF16,
                    &other,
                    row_tiles,
                    false,
                    false,
                    false,
                )
                .unwrap();
                let (q, kv) = plan.backward.unwrap();
                for config in [plan.forward, q, kv] {
                    assert_eq!(config.exponential, Exponential::Library);
                }
            }
        }
    }
}
