//! Tile sizes of the CubeCL kernels for one problem on one device, and the checks
//! that a device can run them.

use burn::backend::Backend;
use burn::tensor::DType;
use burn_cubecl::{CubeBackend, CubeDevice};

use super::super::{Problem, Unsupported};
use super::fragment::{FragmentLoads, FragmentOps, LANES, TILE_K, TILE_M, TILE_N};
use super::fragments::{FragmentConfig, FragmentTiling, ROW_PAD, TileCopies};
use super::register_tiles::LaneSum;
use super::softmax::Exponential;
use super::staged::StagedConfig;
use super::tile_product::{FRAGMENT, TileProduct};

/// Units per cube we aim for on GPUs.
const TARGET_UNITS: usize = 64;
/// Units per cube on CPU runtimes: one SIMD batch of lavapipe (8 lanes of 32 bits).
/// A CPU runtime runs a cube's batches one after another on one thread, and the
/// register tiles share nothing between units, so a larger cube buys nothing: it only
/// pads short sequences with idle units (which compute on the last row) and widens a
/// causal cube's key range. On lavapipe 8 units took 0.4–0.7× the forward time of 64
/// at seq 256 and 0.6–0.85× causal at 512–4096, and 1.00–1.03× where 64 fill their
/// cubes (docs/benchmarks.md, "Units per cube on lavapipe").
const CPU_UNITS: usize = 8;
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
/// The same bound on GPUs, per lane of a row (one row a unit keeps register pressure
/// low): with a lane's share of at most [`GPU_HELD_FLOATS`], blocks of 4 streamed rows
/// (of 8, the dQ and dK/dV kernels took 255 registers and spilled).
const GPU_UNROLL_BUDGET: usize = 64;
/// f32 values of its rows (query, output and gradient rows, or key, value and their
/// gradients) a unit of the register tiles holds on a GPU: rows wider than this are
/// split over several lanes of a plane (at most [`MAX_LANES`]), so that each unit's
/// share stays in registers beside the streamed rows (255 a thread on NVIDIA GPUs;
/// one unit holding a whole row spilled from head dim 64 on, see
/// docs/flash-attention.md).
const GPU_HELD_FLOATS: usize = 64;
/// Most lanes that share a row: one plane of NVIDIA's 32.
const MAX_LANES: usize = 32;

/// The tiles of one kernel: units per cube, rows per unit, streamed rows per step.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) struct KernelTile {
    /// Units per cube.
    pub units: usize,
    /// Rows each unit owns (query rows, or keys for dK/dV).
    pub rows: usize,
    /// Streamed rows per unrolled step (keys, or query rows for dK/dV).
    pub block: usize,
    /// Units that share each row (see [`AttentionConfig::lanes`]).
    pub lanes: usize,
}

impl KernelTile {
    /// Rows a cube owns.
    pub(crate) fn cube_rows(&self) -> usize {
        self.units / self.lanes * self.rows
    }
}

/// Tile sizes of one problem on one device, computed from the problem and the
/// device (CPU runtime or GPU, units per cube).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) struct Tiling {
    /// Elements per vector along the head dims (divides `d_qk` and `d_v`).
    pub vector_size: usize,
    /// The forward kernel.
    pub forward: KernelTile,
    /// The dQ kernel.
    pub backward_q: KernelTile,
    /// The dK/dV kernel.
    pub backward_kv: KernelTile,
    /// How the lanes of a split row sum their parts.
    pub lane_sum: LaneSum,
}

/// Picks rows per unit and block for a kernel whose every (row, streamed row) pair
/// costs `ops` vector operations, split over `lanes` units a row, then the units per
/// cube for `owned` rows: with CPU runtimes' tiles where `cpu`, GPUs' otherwise.
fn kernel_tile(ops: usize, owned: usize, cpu: bool, max_units: usize, lanes: usize) -> KernelTile {
    let (max_rows, budget) = if cpu {
        (CPU_ROWS, CPU_UNROLL_BUDGET)
    } else {
        (1, GPU_UNROLL_BUDGET)
    };
    let ops = ops / lanes;
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
    // Few distinct unit counts keep the number of compiled kernels small. Split rows
    // take whole planes: a shuffle reads every lane of its plane.
    let needed = owned.div_ceil(rows);
    let counts: &[usize] = if cpu {
        &[1, CPU_UNITS]
    } else {
        &[1, 8, TARGET_UNITS]
    };
    let largest = counts[counts.len() - 1];
    let units = counts
        .iter()
        .copied()
        .find(|&units| units >= needed && (lanes == 1 || units == largest))
        .unwrap_or(largest)
        .min(max_units);
    // Whole groups of lanes (`lanes` divides the planes it shuffles within).
    let units = (units - units % lanes).max(lanes);
    KernelTile {
        units,
        rows,
        block,
        lanes,
    }
}

/// Lanes for a row of `floats` f32 values, `qk` query/key and `v` value vectors: the
/// fewest (a power of two dividing both counts, at most `max_lanes`) that bring a
/// unit's share within [`GPU_HELD_FLOATS`], or the most that divide them.
fn row_lanes(floats: usize, qk: usize, v: usize, max_lanes: usize) -> usize {
    let mut lanes = 1;
    while floats / lanes > GPU_HELD_FLOATS
        && lanes * 2 <= max_lanes
        && qk.is_multiple_of(lanes * 2)
        && v.is_multiple_of(lanes * 2)
    {
        lanes *= 2;
    }
    lanes
}

/// The most lanes a row of the register tiles may take on a device, how they sum,
/// and whether a row takes exactly that many (`forced`, the tests'): on GPUs whose
/// planes shuffle, one plane's worth (at most [`MAX_LANES`] and the cube's units);
/// elsewhere one.
fn lane_limits(
    properties: &cubecl::ir::DeviceProperties,
    cpu: bool,
    max_units: usize,
    forced: Option<usize>,
) -> (usize, LaneSum, bool) {
    let shuffles = properties
        .features
        .plane
        .contains(cubecl::ir::features::Plane::Ops)
        && !cpu;
    if let Some(lanes) = forced {
        let how = if shuffles {
            LaneSum::Shuffles
        } else {
            LaneSum::SharedMemory
        };
        return (lanes, how, true);
    }
    let lanes = if shuffles {
        (properties.hardware.plane_size_min as usize)
            .min(MAX_LANES)
            .min(max_units)
    } else {
        1
    };
    (lanes, LaneSum::Shuffles, false)
}

/// Whether the device is a CPU runtime (llvmpipe/lavapipe, SwiftShader, CubeCL's
/// CPU runtime), where loads are costly and registers plentiful.
pub(crate) fn is_cpu_runtime(properties: &cubecl::ir::DeviceProperties) -> bool {
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
pub(crate) fn plan_tiling(
    problem: &Problem,
    properties: &cubecl::ir::DeviceProperties,
) -> Result<Tiling, Unsupported> {
    plan_tiling_with(problem, properties, None)
}

/// [`plan_tiling`] with the GPUs' tiles and each row split over exactly `lanes` lanes
/// (or as many as divide the head dims' vectors), on any device: through shared
/// memory where it has no plane shuffles (the tests run the GPUs' split rows on CPU
/// runtimes with it).
#[cfg(test)]
pub(crate) fn plan_split_rows(
    problem: &Problem,
    properties: &cubecl::ir::DeviceProperties,
    lanes: usize,
) -> Result<Tiling, Unsupported> {
    plan_tiling_with(problem, properties, Some(lanes))
}

/// [`plan_tiling`], with `forced_lanes` lanes a row where given.
fn plan_tiling_with(
    problem: &Problem,
    properties: &cubecl::ir::DeviceProperties,
    forced_lanes: Option<usize>,
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
    let cpu = is_cpu_runtime(properties);
    let (max_lanes, lane_sum, exact) = lane_limits(properties, cpu, max_units, forced_lanes);
    // Forced lanes take the GPUs' tiles on every device.
    let cpu_tiles = cpu && !exact;
    let qk = problem.d_qk / vector_size;
    let v = problem.d_v / vector_size;
    let lanes =
        |floats: usize| row_lanes(if exact { usize::MAX } else { floats }, qk, v, max_lanes);
    let tile = |held: usize, owned: usize| {
        kernel_tile(held, owned, cpu_tiles, max_units, lanes(held * vector_size))
    };
    let mut tiling = Tiling {
        vector_size,
        forward: tile(qk + v, problem.seq_q),
        backward_q: tile(2 * qk + v, problem.seq_q),
        backward_kv: tile(2 * (qk + v), problem.seq_k),
        lane_sum,
    };
    // Tuning hook: `units,rows,block` for all three kernels (each keeps its lanes).
    if let Ok(text) = std::env::var("BURN_TRANSFORMER_FLASH_TILE") {
        let values: Vec<usize> = text
            .split(',')
            .filter_map(|v| v.trim().parse().ok())
            .collect();
        if let [units, rows, block] = values[..] {
            for tile in [
                &mut tiling.forward,
                &mut tiling.backward_q,
                &mut tiling.backward_kv,
            ] {
                tile.units = units.clamp(1, max_units).next_multiple_of(tile.lanes);
                tile.rows = rows.max(1);
                tile.block = block.max(1);
            }
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
pub(crate) fn check_cube(
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

/// Units per cube of the staged kernels: four planes of 32 on GPUs.
const STAGED_UNITS: usize = 128;
/// `(block_q, block_k)` of the staged kernels, largest first: a kernel takes the first
/// whose shared tiles fit the device. GPUs (100+ KiB per cube) take the first ones; the
/// tiles of 8 serve devices with 32 KiB (lavapipe), where tensor cores do not exist.
const STAGED_BLOCKS: [(usize, usize); 7] = [
    (64, 64),
    (64, 32),
    (32, 32),
    (32, 16),
    (16, 16),
    (16, 8),
    (8, 8),
];

/// The largest rows or keys of a staged tile.
pub(crate) const LARGEST_STAGED_BLOCK: usize = STAGED_BLOCKS[0].0;

/// The tile limits autotuning compares (each a candidate of its own): the largest
/// tiles reuse each load most, smaller ones leave room for more cubes per
/// multiprocessor (shared memory sets the staged kernels' occupancy).
pub(crate) const STAGED_BLOCK_LIMITS: [usize; 3] = [LARGEST_STAGED_BLOCK, 32, 16];

/// How the staged kernels' tile products run.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) enum StagedProduct {
    /// Unit arithmetic, on every device.
    Plain,
    /// Tensor cores (`cmma`), for f16/bf16 on devices with 16×16×16 fragments.
    TensorCores,
}

/// The staged kernels' configurations for one problem on one device.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) struct StagedTiling {
    /// The forward kernel.
    pub forward: StagedConfig,
    /// The dQ kernel.
    pub backward_q: StagedConfig,
    /// The dK/dV kernel.
    pub backward_kv: StagedConfig,
}

/// Whether `products` (a device's cmma or manual MMA list) multiply `m × n × k`
/// fragments of `dtype` (f16 or bf16) into f32.
fn multiplies_half_fragments(
    products: &std::collections::BTreeSet<cubecl::ir::features::MmaConfig>,
    dtype: DType,
    (m, n, k): (usize, usize, usize),
) -> bool {
    let Some(elem) = half_elem(dtype) else {
        return false;
    };
    let f32 = cubecl::ir::ElemType::Float(cubecl::ir::FloatKind::F32);
    products.iter().any(|c| {
        c.a_type == elem
            && c.b_type == elem
            && c.cd_type == f32
            && (c.m, c.n, c.k) == (m as u32, n as u32, k as u32)
    })
}

/// CubeCL's element type of a 16-bit float `dtype` (`None` for the others).
fn half_elem(dtype: DType) -> Option<cubecl::ir::ElemType> {
    match dtype {
        DType::F16 => Some(cubecl::ir::ElemType::Float(cubecl::ir::FloatKind::F16)),
        DType::BF16 => Some(cubecl::ir::ElemType::Float(cubecl::ir::FloatKind::BF16)),
        _ => None,
    }
}

/// How the fragment kernels with `ops` load fragments of `dtype` from shared memory:
/// `ldmatrix` where the products run on tensor cores and the device has the
/// instruction for `dtype`, unless [`MATRIX_LOADS_VAR`](super::super::MATRIX_LOADS_VAR)
/// turns it off; element by element otherwise.
fn fragment_loads(
    properties: &cubecl::ir::DeviceProperties,
    dtype: DType,
    ops: FragmentOps,
) -> FragmentLoads {
    let enabled = super::super::matrix_loads_enabled();
    let available =
        half_elem(dtype).is_some_and(|elem| properties.features.matmul.ldmatrix.contains(&elem));
    if enabled && available && ops == FragmentOps::TensorCores {
        FragmentLoads::Matrices
    } else {
        FragmentLoads::Elements
    }
}

/// How the fragment kernels with `ops` take their scores' exponentials: PTX's
/// `ex2.approx` where the runtime compiles PTX (CUDA) and the products run on tensor
/// cores (the inputs are then f16/bf16, whose rounding of `P` and `dS` dwarfs its
/// error), the runtime's `exp` elsewhere.
fn fragment_exponential(
    properties: &cubecl::ir::DeviceProperties,
    ops: FragmentOps,
) -> Exponential {
    let ptx = properties.identity.fingerprint.starts_with("ptx_");
    if ptx && ops == FragmentOps::TensorCores {
        Exponential::Ex2Approx
    } else {
        Exponential::Library
    }
}

/// Whether the device multiplies 16×16×16 fragments of `dtype` into f32.
fn has_tensor_cores(properties: &cubecl::ir::DeviceProperties, dtype: DType) -> bool {
    let side = FRAGMENT;
    multiplies_half_fragments(&properties.features.matmul.cmma, dtype, (side, side, side))
}

/// Chooses the staged kernels' tiles for `problem` in `dtype` on a device with
/// `properties`: the largest of at most `max_block` rows and keys that fit, with the
/// tile product `product` where the device and head dims allow it (the plain product
/// otherwise); `None` when the tiles of some kernel do not fit
/// the device's shared memory (large head dims on small devices) or the grid is too
/// large.
pub(crate) fn plan_staged(
    problem: &Problem,
    dtype: DType,
    product: StagedProduct,
    max_block: usize,
    properties: &cubecl::ir::DeviceProperties,
) -> Option<StagedTiling> {
    let hardware = &properties.hardware;
    let elem = dtype.size();
    let shared = hardware.max_shared_memory_size;
    let tensor_cores = product == StagedProduct::TensorCores
        && has_tensor_cores(properties, dtype)
        && hardware.plane_size_min == 32
        && problem.d_qk.is_multiple_of(FRAGMENT)
        && problem.d_v.is_multiple_of(FRAGMENT);
    let units = STAGED_UNITS
        .min(hardware.max_units_per_cube as usize)
        .min(hardware.max_cube_dim.0 as usize);
    if tensor_cores && !units.is_multiple_of(32) {
        return None;
    }
    // Four output columns per unit where the head dims allow it.
    let cols = [4, 2, 1]
        .into_iter()
        .find(|&n| problem.d_qk.is_multiple_of(n) && problem.d_v.is_multiple_of(n))
        .unwrap_or(1);
    let tile_product = if tensor_cores {
        TileProduct::TensorCores
    } else {
        TileProduct::Plain { rows: 4, cols }
    };
    // Short sequences (decoding) take the smallest tile along them.
    let fits_q = |block: usize| block <= problem.seq_q.next_power_of_two().max(16);
    let fits_k = |block: usize| block <= problem.seq_k.next_power_of_two().max(16);
    let pick = |bytes: &dyn Fn(&StagedConfig) -> usize, short_q: bool| {
        STAGED_BLOCKS
            .into_iter()
            .filter(|&(block_q, block_k)| block_q.max(block_k) <= max_block)
            .filter(|&(block_q, block_k)| {
                // Fragments are 16 × 16.
                let fragments = block_q.min(block_k) >= FRAGMENT;
                if tensor_cores && !fragments {
                    return false;
                }
                if short_q {
                    fits_q(block_q)
                } else {
                    fits_k(block_k)
                }
            })
            .map(|(block_q, block_k)| StagedConfig {
                units,
                block_q,
                block_k,
                d_qk: problem.d_qk,
                d_v: problem.d_v,
                product: tile_product,
                // Element by element: with vector copies ptxas spills in some of the
                // smaller-tile f32 kernels (it caps them at 64 registers).
                staging: 1,
                alibi: problem.has_alibi,
                chunked: problem.mask.chunk.is_some(),
            })
            .find(|config| bytes(config) <= shared)
    };
    let tiling = StagedTiling {
        forward: pick(&|c| c.forward_bytes(elem), true)?,
        backward_q: pick(&|c| c.backward_q_bytes(elem), true)?,
        backward_kv: pick(&|c| c.backward_kv_bytes(elem), false)?,
    };
    let max_x = hardware.max_cube_count.0 as usize;
    let max_y = hardware.max_cube_count.1 as usize;
    let grid_fits = problem.seq_q.div_ceil(tiling.forward.block_q) <= max_x
        && problem.seq_q.div_ceil(tiling.backward_q.block_q) <= max_x
        && problem.seq_k.div_ceil(tiling.backward_kv.block_k) <= max_x
        && problem.batch * problem.heads <= max_y;
    grid_fits.then_some(tiling)
}

/// Elements a unit of the fragment kernels copies at once when it stages rows of
/// `elem`-byte inputs into shared memory: on runtimes that can read a buffer as
/// vectors of another width (CubeCL's `memory_reinterpret`: CUDA, HIP), the widest
/// vector the device reads in one load (16 bytes on CUDA) that divides both head dims
/// and `pad` (the elements that pad each staged row), so that every vector starts a
/// whole number of vectors into its row; one element elsewhere (wgpu's shaders cannot
/// retype a buffer).
fn staging_width(
    problem: &Problem,
    elem: usize,
    pad: usize,
    properties: &cubecl::ir::DeviceProperties,
) -> usize {
    if !properties.features.memory_reinterpret {
        return 1;
    }
    properties
        .io_optimized_vector_sizes(elem)
        .find(|&n| {
            problem.d_qk.is_multiple_of(n) && problem.d_v.is_multiple_of(n) && pad.is_multiple_of(n)
        })
        .unwrap_or(1)
}

/// Whether the staged kernels take `problem` in `dtype` on `device`, and the device's
/// shared memory per cube (tests: which calls of a grid the staged family serves).
#[cfg(test)]
pub(crate) fn staged_fits(
    device: &burn::tensor::Device,
    dtype: DType,
    problem: &Problem,
) -> (bool, usize) {
    use burn::backend::DispatchDevice;
    let inner = device.clone().inner();
    match inner.as_dispatch() {
        DispatchDevice::Cube(cube) => {
            let client = cube.client();
            let properties = client.properties();
            (
                plan_staged(
                    problem,
                    dtype,
                    StagedProduct::Plain,
                    LARGEST_STAGED_BLOCK,
                    properties,
                )
                .is_some(),
                properties.hardware.max_shared_memory_size,
            )
        }
        #[allow(unreachable_patterns)]
        _ => (false, 0),
    }
}

/// Planes per cube of the fragment kernels (16 query rows each, or keys for dK/dV),
/// most first: a launch takes the most whose tiles fit (4 on GPUs).
const FRAGMENT_PLANE_COUNTS: [usize; 3] = [4, 2, 1];
/// Keys per staged tile of the fragment forward, largest first: a launch takes the
/// first whose tiles fit the device's shared memory (64 on GPUs; lavapipe's 32 KiB
/// take smaller ones at the larger head dims).
const FRAGMENT_BLOCKS: [usize; 3] = [64, 32, 16];
/// Rows per streamed tile of the fragment backward (keys for dQ, query rows for
/// dK/dV): 32 keeps its two score tiles (`S` and `dP`) at 16 registers each beside
/// the gradients' accumulators.
const FRAGMENT_BACKWARD_BLOCKS: [usize; 2] = [32, 16];
/// [`FRAGMENT_BACKWARD_BLOCKS`] of the split TF32 products (and their emulation, so
/// that the tests run the GPU's tiles): f32's fragments take twice the registers of
/// 16-bit ones, and with 32 streamed rows dQ spilled 8 bytes at head dim 64 and dK/dV
/// 16–28 at 128 (ptxas, sm_90); 16 rows halve the score tiles.
const SPLIT_TF32_BACKWARD_BLOCKS: [usize; 1] = [16];
/// 16-row tiles each plane of the forward kernel owns: one, or two for the wide family
/// ([`FlashKernel::WideFragments`](super::super::FlashKernel)).
pub(crate) fn fragment_row_tiles(wide: bool) -> usize {
    if wide { 2 } else { 1 }
}

/// [`FRAGMENT_BLOCKS`] with two row tiles a plane, whose score tiles take twice the
/// registers per key: 32 keys keep a plane's scores, probabilities and accumulators
/// within 255 registers without spilling at head dim 128 (ptxas, sm_90).
const WIDE_FRAGMENT_BLOCKS: [usize; 2] = [32, 16];

/// Cubes per multiprocessor from which `Auto` takes the wide forward, and the value
/// head dim it takes it at. A wide cube owns 128 query rows and fits 2 to an SM (236
/// registers at head dim 128) against the narrow one's 64 rows and 3 cubes, so the
/// wide forward reuses each loaded `K`/`V` fragment twice but leaves more of a short
/// launch's last wave idle. On an H100 (bf16, head dim 128, batch 4 × 16 heads) it
/// took 0.82–0.99× the narrow forward's time at seq 4096 and 16384 (8 and 31 waves of
/// wide cubes) but 1.12× at causal 1024 (2 waves). At head dim 64 both kernels fit
/// more cubes and the wide one is untimed, so the narrow forward stays.
const WIDE_FORWARD_MIN_CUBES_PER_PROCESSOR: usize = 8;
const WIDE_FORWARD_D_V: usize = 128;

/// Row tiles of the forward `Auto` runs for `problem` on a GPU with `properties` (see
/// [`WIDE_FORWARD_MIN_CUBES_PER_PROCESSOR`]): two for launches of at least that many
/// wide cubes per multiprocessor at value head dim 128, one otherwise (and where the
/// runtime does not report its multiprocessors). Calls with ALiBi keep the narrow
/// forward: the bias on every score takes the wide one past 255 registers at head dim
/// 128 (68 bytes of spills under ptxas, sm_90, bf16), where the narrow one takes 137
/// without spilling (docs/benchmarks/kernel_resources_alibi.jsonl).
pub(crate) fn auto_forward_row_tiles(
    problem: &Problem,
    properties: &cubecl::ir::DeviceProperties,
) -> usize {
    let wide = fragment_row_tiles(true);
    let Some(processors) = properties.hardware.num_streaming_multiprocessors else {
        return 1;
    };
    let wide_rows = TILE_M * wide * FRAGMENT_PLANE_COUNTS[0];
    let cubes = problem.seq_q.div_ceil(wide_rows) * problem.batch * problem.heads;
    if problem.d_v == WIDE_FORWARD_D_V
        && !problem.has_alibi
        && cubes >= WIDE_FORWARD_MIN_CUBES_PER_PROCESSOR * processors as usize
    {
        wide
    } else {
        1
    }
}

/// Largest query/key and value head dims of the fragment kernels: a lane holds
/// `d_v / 2` registers of the output (of dQ, `d_qk / 2`; of dK/dV, both) beside its
/// scores, which beyond these would not fit 255 registers without spilling.
const FRAGMENT_MAX_D_QK: usize = 192;
const FRAGMENT_MAX_D_V: usize = 128;

/// Whether the device adds values of type `ty` (f32, or vectors of them) to global
/// memory atomically.
fn adds_atomically(properties: &cubecl::ir::DeviceProperties, ty: cubecl::ir::Type) -> bool {
    use cubecl::ir::{Type, features::AtomicUsage};
    properties
        .atomic_type_usage(Type::atomic(ty))
        .contains(AtomicUsage::Add)
}

/// The f32 type the one-pass fragment backward adds `dQ` with.
fn f32_type() -> cubecl::ir::Type {
    cubecl::ir::Type::new(cubecl::ir::ElemType::Float(cubecl::ir::FloatKind::F32))
}

/// Whether the device adds f32 values to global memory atomically (the one-pass
/// fragment backward's `dQ`).
pub(crate) fn adds_f32_atomically(properties: &cubecl::ir::DeviceProperties) -> bool {
    adds_atomically(properties, f32_type())
}

/// Columns of `dQ` one atomic add of the one-pass fragment backward takes: 2 where the
/// device adds pairs of f32 atomically (CUDA on sm_90: one `atom.add.v2.f32`, which
/// also needs no check of the address's space, where a single f32 `atom` on a generic
/// address takes one), else 1.
pub(crate) fn dq_atomic_width(properties: &cubecl::ir::DeviceProperties) -> usize {
    if adds_atomically(properties, f32_type().with_vector_size(2)) {
        2
    } else {
        1
    }
}

/// Largest query/key head dim of the one-pass fragment backward: its dK/dV kernel
/// holds `dK` and `dV` beside each pass of `dQ`, and at 192/128 ptxas (sm_90) spilled
/// 4–12 bytes whatever the pass's width, so that shape keeps the two-pass backward.
const ONE_PASS_MAX_D_QK: usize = 128;

/// Storage buffers the fragment dK/dV kernel binds: [`MAX_BUFFERS`] and the one-pass
/// backward's f32 `dQ` sums (a placeholder in the two-pass one).
const FRAGMENT_BUFFERS: u32 = MAX_BUFFERS + 1;

/// Whether the device multiplies m16n8k16 fragments of `dtype` into f32 with
/// `mma.sync`-style manual MMA and shuffles values within planes of 32 lanes.
pub(crate) fn has_fragment_mma(properties: &cubecl::ir::DeviceProperties, dtype: DType) -> bool {
    has_fragment_planes(properties)
        && multiplies_half_fragments(
            &properties.features.matmul.mma,
            dtype,
            (TILE_M, TILE_N, TILE_K),
        )
}

/// Whether the device multiplies m16n8k8 TF32 fragments into f32 with manual MMA (the
/// products of [`FragmentOps::SplitTf32`]) and shuffles values within planes of 32
/// lanes.
pub(crate) fn has_tf32_fragment_mma(properties: &cubecl::ir::DeviceProperties) -> bool {
    let tf32 = cubecl::ir::ElemType::Float(cubecl::ir::FloatKind::TF32);
    let f32 = cubecl::ir::ElemType::Float(cubecl::ir::FloatKind::F32);
    has_fragment_planes(properties)
        && properties.features.matmul.mma.iter().any(|c| {
            c.a_type == tf32
                && c.b_type == tf32
                && c.cd_type == f32
                && (c.m, c.n, c.k) == (TILE_M as u32, TILE_N as u32, (TILE_K / 2) as u32)
        })
}

/// Whether the device's planes are the fragments' 32 lanes, with shuffles and votes.
fn has_fragment_planes(properties: &cubecl::ir::DeviceProperties) -> bool {
    let hardware = &properties.hardware;
    hardware.plane_size_min == LANES as u32
        && hardware.plane_size_max == LANES as u32
        && properties
            .features
            .plane
            .contains(cubecl::ir::features::Plane::Ops)
}

/// The fragment kernels' configurations for `problem` in `dtype` on a device with
/// `properties`: tensor-core products where the device has them for `dtype`, the
/// emulated ones on CPU runtimes (where the tests run them), and `None` elsewhere (f32
/// on GPUs unless `split_tf32`), for head dims the fragments do not tile, and for a
/// forward whose tiles do not fit the device. The backward is planned where its tiles
/// fit too (and the value head dim is a multiple of 16).
///
/// With `split_tf32`, f32 inputs take products of TF32 parts
/// ([`FragmentOps::SplitTf32`]) where the device multiplies TF32 fragments, and their
/// emulation on CPU runtimes; other dtypes are planned as without it.
///
/// Each plane of the forward owns `row_tiles` (1 or 2) tiles of 16 query rows; the
/// dQ kernel's planes own one (on an H100, bf16, head dim 128, two took 1.06–1.74× its
/// time: the twice larger accumulators left 2 cubes an SM), the dK/dV kernel's one
/// tile of 16 keys. With `one_pass`, the dK/dV kernel also adds `dQ` (where the device
/// adds f32 atomically, the query/key head dim is at most [`ONE_PASS_MAX_D_QK`] and
/// the larger tiles fit; else the two-pass backward). With `overlap`, the kernels
/// overlap the copies of the tiles they stream with their computation
/// ([`tile_copies`]; not the one-pass dK/dV), dQ and dK/dV with tiles that leave room
/// for their second buffers.
pub(crate) fn plan_fragments(
    problem: &Problem,
    dtype: DType,
    properties: &cubecl::ir::DeviceProperties,
    row_tiles: usize,
    one_pass: bool,
    split_tf32: bool,
    overlap: bool,
) -> Option<FragmentTiling> {
    let hardware = &properties.hardware;
    let tiles = problem.d_qk.is_multiple_of(TILE_K)
        && problem.d_v.is_multiple_of(TILE_N)
        && problem.d_qk <= FRAGMENT_MAX_D_QK
        && problem.d_v <= FRAGMENT_MAX_D_V;
    if !tiles || hardware.max_bindings < FRAGMENT_BUFFERS {
        return None;
    }
    let split = split_tf32 && dtype == DType::F32;
    let ops = if split && has_tf32_fragment_mma(properties) {
        FragmentOps::SplitTf32
    } else if !split && has_fragment_mma(properties, dtype) {
        FragmentOps::TensorCores
    } else if is_cpu_runtime(properties) && split {
        FragmentOps::EmulatedSplitTf32
    } else if is_cpu_runtime(properties) {
        FragmentOps::Emulated
    } else {
        return None;
    };
    let max_units = (hardware.max_units_per_cube as usize).min(hardware.max_cube_dim.0 as usize);
    let elem = dtype.size();
    let shared = hardware.max_shared_memory_size;
    let staging = staging_width(problem, elem, ROW_PAD, properties);
    let loads = fragment_loads(properties, dtype, ops);
    let exponential = fragment_exponential(properties, ops);
    // Every kernel's (the dQ and dK/dV tiles then leave room for their second
    // buffers) but the one-pass dK/dV's, which copies its tiles together.
    let copies = tile_copies(overlap, dtype, staging, properties);
    let config = |planes: usize, row_tiles: usize, block: usize| FragmentConfig {
        planes,
        row_tiles,
        block,
        d_qk: problem.d_qk,
        d_v: problem.d_v,
        ops,
        loads,
        staging,
        exponential,
        copies,
        adds_dq: false,
        // Set per call at launch (`launch::for_call`).
        softcap: false,
        alibi: false,
        chunked: false,
    };
    // The first of `blocks` (rows a tile streams) with `planes` planes whose tiles fit,
    // no longer than the streamed sequence (a decode step's keys, say) needs.
    let pick = |planes: usize,
                row_tiles: usize,
                blocks: &[usize],
                seq: usize,
                bytes: &dyn Fn(&FragmentConfig) -> usize| {
        blocks
            .iter()
            .map(|&block| config(planes, row_tiles, block))
            .filter(|c| c.block <= seq.next_power_of_two().max(TILE_K))
            .filter(|c| c.units() <= max_units)
            .find(|c| bytes(c) <= shared)
    };
    // Each kernel stages the rows its cube owns beside the tiles it streams: fewer
    // planes (rows or keys per cube) where the most do not fit (lavapipe's 32 KiB at the
    // larger head dims).
    let fewer_planes = |row_tiles: usize,
                        blocks: &[usize],
                        seq: usize,
                        bytes: &dyn Fn(&FragmentConfig) -> usize| {
        FRAGMENT_PLANE_COUNTS
            .into_iter()
            .find_map(|planes| pick(planes, row_tiles, blocks, seq, bytes))
    };
    let forward_blocks: &[usize] = if row_tiles == 1 {
        &FRAGMENT_BLOCKS
    } else {
        &WIDE_FRAGMENT_BLOCKS
    };
    let forward = fewer_planes(row_tiles, forward_blocks, problem.seq_k, &|c| {
        c.forward_bytes(elem)
    })?;
    let backward_blocks: &[usize] = match ops {
        FragmentOps::SplitTf32 | FragmentOps::EmulatedSplitTf32 => &SPLIT_TF32_BACKWARD_BLOCKS,
        FragmentOps::TensorCores | FragmentOps::Emulated => &FRAGMENT_BACKWARD_BLOCKS,
    };
    let backward_q = fewer_planes(1, backward_blocks, problem.seq_k, &|c| {
        c.backward_q_bytes(elem)
    });
    let kv_bytes = |c: &FragmentConfig| c.backward_kv_bytes(elem);
    let adding_dq = |c: FragmentConfig| FragmentConfig {
        adds_dq: true,
        copies: TileCopies::Together,
        ..c
    };
    let one_pass_bytes = |c: &FragmentConfig| adding_dq(*c).backward_kv_bytes(elem);
    let one_pass_kv =
        (one_pass && adds_f32_atomically(properties) && problem.d_qk <= ONE_PASS_MAX_D_QK)
            .then(|| fewer_planes(1, backward_blocks, problem.seq_q, &one_pass_bytes))
            .flatten()
            .map(adding_dq);
    let backward_kv =
        one_pass_kv.or_else(|| fewer_planes(1, backward_blocks, problem.seq_q, &kv_bytes));
    let backward = backward_q
        .zip(backward_kv)
        .filter(|_| problem.d_v.is_multiple_of(TILE_K));
    let max_x = hardware.max_cube_count.0 as usize;
    let mut grids = vec![problem.seq_q.div_ceil(forward.rows())];
    if let Some((dq, dkdv)) = backward {
        grids.push(problem.seq_q.div_ceil(dq.rows()));
        grids.push(problem.seq_k.div_ceil(dkdv.rows()));
    }
    let grid_fits = grids.iter().all(|&cubes| cubes <= max_x)
        && problem.batch * problem.heads <= hardware.max_cube_count.1 as usize;
    grid_fits.then_some(FragmentTiling { forward, backward })
}

/// Bytes a `cp.async` copies at once, the most it moves: every vector of an
/// asynchronous staging copy is this wide.
const ASYNC_COPY_BYTES: usize = 16;

/// How the fragment kernels planned with `overlap` copy the tiles they stream:
/// [`TileCopies::Overlapped`] when asked, asynchronously (`cp.async`) where the device
/// has the instruction and the staging copies 16-byte vectors of `dtype`, synchronously
/// in the same order elsewhere (lavapipe, where the tests check that order).
fn tile_copies(
    overlap: bool,
    dtype: DType,
    staging: usize,
    properties: &cubecl::ir::DeviceProperties,
) -> TileCopies {
    if !overlap {
        return TileCopies::Together;
    }
    let asynchronous = properties.features.copy_async && staging * dtype.size() == ASYNC_COPY_BYTES;
    TileCopies::Overlapped { asynchronous }
}

/// Query rows up to which the staged forward splits the keys across cubes
/// (flash-decoding).
const SPLIT_MAX_QUERIES: usize = 16;
/// Key tiles a split walks at least, so that the merge stays cheap against the splits.
const SPLIT_MIN_TILES: usize = 4;
/// Cubes a launch aims for per multiprocessor (or per device where the runtime does
/// not report multiprocessors, as wgpu does not).
const SPLIT_CUBES_PER_PROCESSOR: usize = 2;
const SPLIT_PROCESSORS_UNKNOWN: usize = 16;

/// Flash-decoding for a forward of `block_q` query rows and `block_k` keys per tile
/// (staged or fragment kernels): `(splits, keys per split)`. A short query sequence
/// (`seq_q ≤ 16`, decoding) over a long cache launches too few cubes to fill a GPU
/// (one per head); splitting the keys across cubes, each writing its partial output
/// and log-sum-exp for a merge, fills it. `(1, seq_k)` when no split pays.
pub(crate) fn plan_key_splits(
    problem: &Problem,
    block_q: usize,
    block_k: usize,
    properties: &cubecl::ir::DeviceProperties,
) -> (usize, usize) {
    let unsplit = (1, problem.seq_k);
    if problem.seq_q > SPLIT_MAX_QUERIES {
        return unsplit;
    }
    let processors = properties
        .hardware
        .num_streaming_multiprocessors
        .map_or(SPLIT_PROCESSORS_UNKNOWN, |n| n as usize);
    let cubes = problem.seq_q.div_ceil(block_q) * problem.batch * problem.heads;
    let wanted = (processors * SPLIT_CUBES_PER_PROCESSOR).div_ceil(cubes);
    let most = problem.seq_k / (SPLIT_MIN_TILES * block_k);
    let splits = wanted
        .min(most)
        .min(properties.hardware.max_cube_count.2 as usize);
    if splits < 2 {
        return unsplit;
    }
    // Whole key tiles per split; the last split may be shorter.
    let split_keys = problem.seq_k.div_ceil(splits).next_multiple_of(block_k);
    (problem.seq_k.div_ceil(split_keys), split_keys)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Vector operations per (row, key) pair of the forward at head dim 64 (16 query
    /// and 16 value vectors of 4).
    const OPS_D64: usize = 32;

    #[test]
    fn cpu_runtimes_take_one_simd_batch_of_units() {
        // Single rows (decoding) take one unit; anything longer cubes of 8 units, so
        // that a short sequence is not padded up to 64.
        for (owned, units) in [(1, 1), (8, 1), (9, 8), (256, 8), (1000, 8), (8192, 8)] {
            let tile = kernel_tile(OPS_D64, owned, true, 256, 1);
            assert_eq!(tile.units, units, "{owned} rows");
        }
        let tile = kernel_tile(OPS_D64, 256, true, 256, 1);
        assert_eq!((tile.rows, tile.cube_rows()), (CPU_ROWS, 64));
    }

    #[test]
    fn gpus_fill_cubes_of_64_units_from_64_rows() {
        for (owned, units) in [(1, 1), (8, 8), (9, 64), (256, 64)] {
            let tile = kernel_tile(OPS_D64, owned, false, 1024, 1);
            assert_eq!((tile.rows, tile.units), (1, units), "{owned} rows");
        }
        // Split rows take whole planes of 64 units, even for one row.
        let tile = kernel_tile(OPS_D64, 1, false, 1024, 4);
        assert_eq!((tile.units, tile.cube_rows()), (64, 16));
    }
}
