//! Launching the fused forward on CubeCL devices: support checks, tile choice,
//! allocation and cube counts.

use burn::backend::cubecl::dtype_to_storage_type;
use burn::backend::{Backend, TensorMetadata};
use burn::tensor::{DType, Shape};
use burn_cubecl::kernel::into_contiguous;
use burn_cubecl::ops::numeric::empty_device_contiguous_dtype;
use burn_cubecl::tensor::CubeTensor;
use burn_cubecl::{CubeBackend, CubeDevice};
use cubecl::prelude::*;

use super::kernel::{self, AttentionConfig, SizesLaunch};
use super::{FlashOptions, Problem, Unsupported};

/// Units per cube we aim for.
const TARGET_UNITS: usize = 64;
/// Storage buffers the largest kernel (dK/dV) binds: q, k, v, dO, stats, mask, dK, dV.
const MAX_BUFFERS: u32 = 8;
/// Largest `d_qk + d_v` the kernels take: beyond it the per-unit register tiles
/// (and unrolled code) grow past what any device handles well.
const MAX_HEAD_DIMS: usize = 2048;
/// Vector operations per unrolled step (`rows × block × vectors per pair`) on CPU
/// runtimes: more reuse per load, bounded so the shader compiles in reasonable time.
const CPU_UNROLL_BUDGET: usize = 512;
/// Rows per unit on CPU runtimes.
const CPU_ROWS: usize = 8;
/// The same bound on GPUs, where one row per unit keeps register pressure low.
const GPU_UNROLL_BUDGET: usize = 256;

/// The tiles of one kernel: units per cube, rows per unit, streamed rows per step.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct KernelTile {
    /// Units per cube.
    pub units: usize,
    /// Rows each unit owns (query rows, or keys for dK/dV).
    pub rows: usize,
    /// Streamed rows per unrolled step (keys, or query rows for dK/dV).
    pub block: usize,
}

impl KernelTile {
    /// Rows a cube owns.
    pub fn cube_rows(&self) -> usize {
        self.units * self.rows
    }
}

/// Tile sizes of one problem on one device, computed from the problem and the
/// device (CPU runtime or GPU, units per cube).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Tiling {
    /// Elements per vector along the head dims (divides `d_qk` and `d_v`).
    pub vector_size: usize,
    /// The forward kernel.
    pub forward: KernelTile,
    /// The dQ kernel.
    pub backward_q: KernelTile,
    /// The dK/dV kernel.
    pub backward_kv: KernelTile,
}

/// Picks rows per unit and block for a kernel whose every (row, streamed row) pair
/// costs `ops` vector operations, then the units per cube for `owned` rows.
fn kernel_tile(
    ops: usize,
    owned: usize,
    max_rows: usize,
    budget: usize,
    max_units: usize,
) -> KernelTile {
    let mut rows = max_rows;
    let mut block = 8;
    // Shrink the block first (rows are what buy reuse), then the rows.
    while rows * block * ops > budget && block > 1 {
        block /= 2;
    }
    while rows * block * ops > budget && rows > 1 {
        rows /= 2;
    }
    // A short sequence (decoding) needs neither many rows per unit nor idle units.
    while rows > 1 && rows >= owned * 2 {
        rows /= 2;
    }
    // Few distinct unit counts keep the number of compiled kernels small.
    let needed = owned.div_ceil(rows);
    let units = [1, 8, TARGET_UNITS]
        .into_iter()
        .find(|&units| units >= needed)
        .unwrap_or(TARGET_UNITS)
        .min(max_units);
    KernelTile { units, rows, block }
}

/// Whether the device is a CPU runtime (llvmpipe/lavapipe, SwiftShader, CubeCL's
/// CPU runtime), where loads are costly and registers plentiful.
pub fn is_cpu_device(properties: &cubecl::ir::DeviceProperties) -> bool {
    let name = properties.identity.name.to_ascii_lowercase();
    properties.hardware.num_cpu_cores.is_some()
        || ["llvmpipe", "lavapipe", "swiftshader"]
            .iter()
            .any(|cpu| name.contains(cpu))
}

/// Chooses tile sizes for `problem` on a device with `properties`.
///
/// # Errors
/// [`Unsupported::HeadDim`] for head dims beyond the kernels' range,
/// [`Unsupported::Grid`] when the problem needs more cubes than the device launches.
pub fn plan_tiling(
    problem: &Problem,
    properties: &cubecl::ir::DeviceProperties,
) -> Result<Tiling, Unsupported> {
    let hardware = &properties.hardware;
    if problem.d_qk + problem.d_v > MAX_HEAD_DIMS {
        return Err(Unsupported::HeadDim {
            d_qk: problem.d_qk,
            d_v: problem.d_v,
            max: MAX_HEAD_DIMS,
        });
    }
    let vector_size = [4, 2, 1]
        .into_iter()
        .find(|&n| {
            n <= hardware.max_vector_size.max(1)
                && problem.d_qk.is_multiple_of(n)
                && problem.d_v.is_multiple_of(n)
        })
        .unwrap_or(1);
    let max_units = (hardware.max_units_per_cube as usize)
        .min(hardware.max_cube_dim.0 as usize)
        .max(1);
    let (max_rows, budget) = if is_cpu_device(properties) {
        (CPU_ROWS, CPU_UNROLL_BUDGET)
    } else {
        (1, GPU_UNROLL_BUDGET)
    };
    let qk = problem.d_qk / vector_size;
    let v = problem.d_v / vector_size;
    let mut tiling = Tiling {
        vector_size,
        forward: kernel_tile(qk + v, problem.seq_q, max_rows, budget, max_units),
        backward_q: kernel_tile(2 * qk + v, problem.seq_q, max_rows, budget, max_units),
        backward_kv: kernel_tile(2 * (qk + v), problem.seq_k, max_rows, budget, max_units),
    };
    // Tuning hook: `units,rows,block` for all three kernels.
    if let Ok(text) = std::env::var("BURN_TRANSFORMER_FLASH_TILE") {
        let values: Vec<usize> = text
            .split(',')
            .filter_map(|v| v.trim().parse().ok())
            .collect();
        if let [units, rows, block] = values[..] {
            let tile = KernelTile {
                units: units.clamp(1, max_units),
                rows: rows.max(1),
                block: block.max(1),
            };
            tiling.forward = tile;
            tiling.backward_q = tile;
            tiling.backward_kv = tile;
        }
    }

    let max_x = hardware.max_cube_count.0 as usize;
    let max_y = hardware.max_cube_count.1 as usize;
    for (cubes, limit) in [
        (problem.seq_q.div_ceil(tiling.forward.cube_rows()), max_x),
        (problem.seq_q.div_ceil(tiling.backward_q.cube_rows()), max_x),
        (
            problem.seq_k.div_ceil(tiling.backward_kv.cube_rows()),
            max_x,
        ),
        (problem.batch * problem.heads, max_y),
    ] {
        if cubes > limit {
            return Err(Unsupported::Grid { cubes, limit });
        }
    }
    Ok(tiling)
}

/// Checks a CubeCL device for the fused op: dtype, storage buffers, tiling.
pub(super) fn check_cube(
    device: &CubeDevice,
    dtype: DType,
    problem: &Problem,
) -> Result<(), Unsupported> {
    if !<CubeBackend as Backend>::supports_dtype(device, dtype) {
        return Err(Unsupported::DeviceDType(dtype));
    }
    let client = device.client();
    let properties = client.properties();
    if properties.hardware.max_bindings < MAX_BUFFERS {
        return Err(Unsupported::Feature(
            "the device binds fewer than 8 storage buffers per kernel",
        ));
    }
    plan_tiling(problem, properties).map(|_| ())
}

/// The compile-time configuration of one kernel.
pub(super) fn config(problem: &Problem, vector_size: usize, tile: &KernelTile) -> AttentionConfig {
    AttentionConfig {
        units: tile.units,
        rows: tile.rows,
        block: tile.block,
        qk_vectors: problem.d_qk / vector_size,
        v_vectors: problem.d_v / vector_size,
    }
}

/// The runtime sizes of a launch.
pub(super) fn sizes(problem: &Problem, options: &FlashOptions) -> SizesLaunch {
    SizesLaunch::new(
        problem.seq_q as u32,
        problem.seq_k as u32,
        problem.heads as u32,
        problem.group() as u32,
        problem.window.unwrap_or(0).min(u32::MAX as usize) as u32,
        options.scale as f32,
        options.softcap.unwrap_or(1.0) as f32,
        problem.causal as u32,
        problem.window.is_some() as u32,
        problem.has_key_mask as u32,
        options.softcap.is_some() as u32,
    )
}

/// Plans a launch, panicking with the reason when the problem is unsupported (the
/// public entry points check support first and fall back instead).
pub(super) fn plan_or_panic(problem: &Problem, tensor: &CubeTensor) -> Tiling {
    plan_tiling(problem, tensor.client.properties()).unwrap_or_else(|reason| {
        panic!("flash attention launched on an unsupported problem: {reason}")
    })
}

/// Runs the forward kernel: `(output, lse)`.
///
/// # Shapes
/// See [`super::FlashAttentionOps::flash_attention_forward`].
pub(super) fn forward(
    q: CubeTensor,
    k: CubeTensor,
    v: CubeTensor,
    key_mask: CubeTensor,
    options: &FlashOptions,
) -> (CubeTensor, CubeTensor) {
    // The kernel indexes rows directly, so inputs must be dense row-major.
    let q = into_contiguous(q);
    let k = into_contiguous(k);
    let v = into_contiguous(v);
    let key_mask = into_contiguous(key_mask);
    let problem = Problem::from_shapes(&q.shape(), &k.shape(), &v.shape(), options);
    let tiling = plan_or_panic(&problem, &q);
    let client = q.client.clone();
    let dtype = q.dtype;

    // Dense outputs: the kernels index rows as `row * d`. `empty_device_dtype` lets the
    // runtime pitch rows (CUDA pads each row to the next power of two of its bytes, up
    // to 512: d = 80 in f32 gets 128 floats a row), and a dense write into a pitched
    // tensor scrambles it. Inputs go through `into_contiguous`, which is dense.
    let output = empty_device_contiguous_dtype(
        client.clone(),
        q.device.clone(),
        Shape::new([problem.batch, problem.heads, problem.seq_q, problem.d_v]),
        dtype,
    );
    let lse = empty_device_contiguous_dtype(
        client.clone(),
        q.device.clone(),
        Shape::new([problem.batch, problem.heads, problem.seq_q]),
        DType::F32,
    );
    let tile = tiling.forward;
    let config = config(&problem, tiling.vector_size, &tile);
    let cube_count = CubeCount::Static(
        problem.seq_q.div_ceil(tile.cube_rows()) as u32,
        (problem.batch * problem.heads) as u32,
        1,
    );
    // SAFETY: every index the kernel reads or writes is clamped to or checked
    // against the problem sizes, which match the contiguous tensors above.
    unsafe {
        kernel::flash_forward::launch_unchecked(
            &client,
            cube_count,
            CubeDim::new_1d(tile.units as u32),
            tiling.vector_size,
            q.into_tensor_arg(),
            k.into_tensor_arg(),
            v.into_tensor_arg(),
            key_mask.into_tensor_arg(),
            output.clone().into_tensor_arg(),
            lse.clone().into_tensor_arg(),
            sizes(&problem, options),
            config,
            dtype_to_storage_type(dtype),
        );
    }
    (output, lse)
}
