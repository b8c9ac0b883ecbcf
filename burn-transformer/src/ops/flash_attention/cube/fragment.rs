//! The one matrix product of the fragment kernels: `C += A·B` by one plane on
//! m16n8k16 fragments held in its lanes' registers, with two implementations.
//!
//! A plane of 32 lanes multiplies a 16×16 `A` by a 16×8 `B` into a 16×8 f32 `C`. Each
//! lane holds 8 elements of `A`, 4 of `B` and 4 of `C` as pairs (`Vector<_, 2>`), laid
//! out as PTX's `mma.sync.m16n8k16` takes 16-bit inputs. CubeCL states that layout once
//! (`polyfills::mma`), and every position here is read from it. With lane `l = 4g + t`:
//! - `C`: pair 0 on row `g`, pair 1 on row `g + 8`, both at columns `2t, 2t + 1`;
//! - `A`: pairs on rows `g, g + 8, g, g + 8`, at columns `2t, 2t + 1` (pairs 0, 1) and
//!   `2t + 8, 2t + 9` (pairs 2, 3);
//! - `B`: pair 0 on rows `2t, 2t + 1`, pair 1 on rows `2t + 8, 2t + 9`, column `g`.
//!
//! So the four lanes `4g .. 4g + 3` (a quad) hold whole rows of `C` between them, and
//! two neighbouring `C` tiles (columns 0–7 and 8–15) hold exactly the elements of one
//! 16×16 `A` tile: a tile of probabilities becomes the left factor of the next product
//! without leaving registers, as in FlashAttention-2.
//!
//! The kernels also reduce a row's values across its quad ([`quad_max`],
//! [`quad_sum`]) and a flag across the plane ([`plane_agrees`]). These operations have
//! two implementations ([`FragmentOps`]):
//! - [`FragmentOps::TensorCores`]: the `mma.sync` instruction, through CubeCL's
//!   manual MMA (f16/bf16 inputs, f32 accumulation), plane shuffles and a plane vote.
//! - [`FragmentOps::Emulated`]: the plane's lanes write their fragments (or values) to
//!   shared memory at their positions and each lane computes its results from there.
//!   Any device runs it, lavapipe included (in f32 too, and without plane operations,
//!   which CubeCL does not offer there), so the tests check the fragment loads, the
//!   positions and the register reuse of the kernels; on a GPU only the instruction
//!   and the shuffles differ. It synchronizes the cube twice an operation: a
//!   verification path, never a fast one.
//!
//! f32 inputs have a third product, [`FragmentOps::SplitTf32`], on tensor cores that
//! multiply TF32 (`mma.sync.m16n8k8`: a 16×8 `A`, an 8×8 `B`, one element a register).
//! The pairs above are then f32 pairs, and the `x` elements of a lane's pairs are
//! exactly its fragments of one m16n8k8 product, the `y` elements of another: in
//! m16n8k8 a lane `4g + t` holds `A` at rows `g, g + 8, g, g + 8` and columns
//! `t, t, t + 4, t + 4`, and `B` at rows `t, t + 4`, column `g`; element `e` of the
//! pairs above sits at columns (of `A`, rows of `B`) `2t + e` and `2t + e + 8`. Taking
//! column `κ` of the m16n8k8 product to be column `2(κ mod 4) + e + 8⌊κ/4⌋` of the
//! 16-column chunk, the two products over `e = 0, 1` sum the chunk's 16 columns, in the
//! same `C` layout; the order of a sum's terms is all that moves. TF32 keeps 10
//! mantissa bits, so each element is split in a high part (rounded to TF32) and the
//! rest (rounded again), and each product is three (`a_lo·b_hi + a_hi·b_lo +
//! a_hi·b_hi`, the dropped `a_lo·b_lo` below f32's rounding): f32's accuracy at three
//! times the tensor-core work. [`FragmentOps::EmulatedSplitTf32`] runs the same split
//! and the same register mapping through shared memory (each element placed where
//! CubeCL's m16n8k8 TF32 layout puts it), so the tests check both on lavapipe.
//!
//! Every unit of the cube calls an operation at the same point (the emulation
//! synchronizes the cube, and `mma.sync` and the shuffles need their whole plane).

use cubecl::cmma::MatrixIdent;
use cubecl::prelude::polyfills::mma;
use cubecl::prelude::*;

/// Lanes of a plane that share one product.
pub const LANES: usize = 32;
/// Rows of `A` and `C`.
pub const TILE_M: usize = 16;
/// Columns of `B` and `C`.
pub const TILE_N: usize = 8;
/// Columns of `A`, rows of `B`.
pub const TILE_K: usize = 16;
/// Pairs of `A` a lane holds.
pub const A_PAIRS: usize = 4;
/// Pairs of `B` a lane holds.
pub const B_PAIRS: usize = 2;
/// Pairs of `C` a lane holds (pair `p` lies on row `g + 8p`).
pub const C_PAIRS: usize = 2;
/// Elements a 32-bit register holds of the 16-bit inputs whose layout the fragments
/// follow.
const ELEMS_PER_REGISTER: usize = 2;
/// Shared f32 elements the emulation uses per plane: `A` then `B` (a quad reduction
/// uses the first [`LANES`]).
pub const EMULATION_SCRATCH: usize = TILE_M * TILE_K + TILE_K * TILE_N;

/// Two neighbouring elements of a fragment, as one 32-bit register holds two 16-bit
/// inputs.
pub type Pair<E> = Vector<E, Const<2>>;

/// How a plane's fragment operations run: the matrix product and the reductions
/// across a quad.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum FragmentOps {
    /// `mma.sync.m16n8k16` on tensor cores (f16/bf16), and plane shuffles.
    TensorCores,
    /// f32 inputs split in TF32 parts, each product six `mma.sync.m16n8k8` of TF32
    /// (two halves of the chunk, three products each; see the module docs), and
    /// plane shuffles.
    SplitTf32,
    /// The [`Self::TensorCores`] operations through shared memory, on any device (see
    /// the module docs).
    Emulated,
    /// The [`Self::SplitTf32`] operations through shared memory, on any device.
    EmulatedSplitTf32,
}

impl FragmentOps {
    /// Whether the operations run on the plane's own instructions (`mma.sync`,
    /// shuffles, votes), so that the callers unroll their loops to keep the fragments
    /// in registers; the emulations go through shared memory instead.
    pub fn on_plane_instructions(self) -> bool {
        matches!(self, Self::TensorCores | Self::SplitTf32)
    }
}

/// How the lanes of a plane load their fragments of a tile staged in shared memory.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum FragmentLoads {
    /// Each lane reads its own elements at their positions (any device).
    Elements,
    /// `ldmatrix` (CUDA, 16-bit inputs): the plane loads whole 8×8 matrices, each lane
    /// naming one 16-byte row, and the instruction hands each lane its elements;
    /// `.trans` for a factor stored across its fragment pairs (`V` in `P·V`). One
    /// instruction per `A` fragment and per two neighbouring `B` fragments, in place of
    /// eight loads each and their address arithmetic.
    Matrices,
}

/// The lane of the calling unit within its plane of [`LANES`] (units are numbered
/// plane by plane).
#[cube]
pub fn fragment_lane() -> u32 {
    UNIT_POS % LANES as u32
}

/// `(row, column)` of element `i` of `lane`'s `A` fragment.
///
/// In each fragment layout (`A`, `B`, `C`) a lane's element `i` lies at the lane's
/// first element plus lane 0's element `i`: the loads below compute the lane's part
/// once and add constants, which the device compiler folds into the load
/// instructions' offsets.
#[cube]
pub fn a_position(lane: u32, i: u32) -> (usize, usize) {
    let row = mma::row_index(lane, i, ELEMS_PER_REGISTER, MatrixIdent::A);
    let col = mma::col_index(lane, i, ELEMS_PER_REGISTER, MatrixIdent::A);
    (row as usize, col as usize)
}

/// `(row, column)` of element `i` of `lane`'s `B` fragment.
#[cube]
pub fn b_position(lane: u32, i: u32) -> (usize, usize) {
    let row = mma::row_index(lane, i, ELEMS_PER_REGISTER, MatrixIdent::B);
    let col = mma::col_index(lane, i, ELEMS_PER_REGISTER, MatrixIdent::B);
    (row as usize, col as usize)
}

/// `(row, column)` of element `i` of `lane`'s `C` fragment.
#[cube]
pub fn c_position(lane: u32, i: u32) -> (usize, usize) {
    let row = mma::row_index(lane, i, ELEMS_PER_REGISTER, MatrixIdent::Accumulator);
    let col = mma::col_index(lane, i, ELEMS_PER_REGISTER, MatrixIdent::Accumulator);
    (row as usize, col as usize)
}

/// The calling lane's `B` fragments of `tiles` (1 or 2) neighbouring 16×8 blocks at rows
/// `k0`, columns `n0`, `n0 + 8`, … of a factor stored in shared memory, `stride`
/// elements a stored row: `B(k, n)` is at `k·stride + n`, or at `n·stride + k` when
/// `transposed` (a row-major tile read as its transpose, as `Kᵀ` from a tile of keys).
/// Block `t`'s pairs are `t·B_PAIRS ..` of the result.
///
/// `tile` is the lane's view of the tile: from [`b_lane_start`] on (see there).
#[cube]
pub fn load_b<F: Float>(
    tile: &[F],
    k0: usize,
    n0: usize,
    #[comptime] stride: usize,
    #[comptime] transposed: bool,
    #[comptime] tiles: usize,
    #[comptime] loads: FragmentLoads,
) -> Array<Pair<F>> {
    if comptime!(loads == FragmentLoads::Matrices) {
        load_b_matrices::<F>(tile, k0, n0, stride, transposed, tiles)
    } else {
        let mut b = Array::<Pair<F>>::new(comptime!(tiles * B_PAIRS));
        #[unroll]
        for t in 0..tiles {
            let block = load_b_elements::<F>(tile, k0, n0 + t * TILE_N, stride, transposed);
            #[unroll]
            for p in 0..B_PAIRS {
                b[t * B_PAIRS + p] = block[p];
            }
        }
        b
    }
}

/// How many neighbouring `B` blocks of a row of `tiles` one [`load_b`] takes: 2 (one
/// `ldmatrix.x4` for two products, half the load instructions of one `.x2` each) where
/// `tiles` is even, else 1.
pub fn b_tiles_per_load(tiles: usize) -> usize {
    if tiles.is_multiple_of(2) { 2 } else { 1 }
}

/// Where `B(k, n)` lies in a tile of `stride` elements a stored row: `k·stride + n`,
/// or `n·stride + k` when the tile holds `B` transposed.
#[cube]
fn b_offset(k: usize, n: usize, #[comptime] stride: usize, #[comptime] transposed: bool) -> usize {
    if transposed {
        n * stride + k
    } else {
        k * stride + n
    }
}

/// [`load_b`], each lane reading its own elements.
#[cube]
fn load_b_elements<F: Float>(
    tile: &[F],
    k0: usize,
    n0: usize,
    #[comptime] stride: usize,
    #[comptime] transposed: bool,
) -> Array<Pair<F>> {
    let (lane_k, lane_n) = b_position(fragment_lane(), 0);
    let lane_offset = b_offset(lane_k, lane_n, stride, transposed);
    let mut b = Array::<Pair<F>>::new(B_PAIRS);
    #[unroll]
    for p in 0..B_PAIRS {
        let mut pair = Pair::<F>::empty();
        #[unroll]
        for e in 0..2 {
            let (kk, n) = b_position(0, (2 * p + e) as u32);
            let offset = b_offset(k0 + kk, n0 + n, stride, transposed);
            pair.insert(e, tile[lane_offset + offset]);
        }
        b[p] = pair;
    }
    b
}

/// The calling lane's `A` fragment of the 16×16 block at rows `m0`, columns `k0` of a
/// factor stored row-major in shared memory, `stride` elements a row.
///
/// `tile` is the lane's view of the tile: from [`a_lane_start`] on (see there).
#[cube]
pub fn load_a<F: Float>(
    tile: &[F],
    m0: usize,
    k0: usize,
    #[comptime] stride: usize,
    #[comptime] loads: FragmentLoads,
) -> Array<Pair<F>> {
    if comptime!(loads == FragmentLoads::Matrices) {
        load_a_matrices::<F>(tile, m0, k0, stride)
    } else {
        load_a_elements::<F>(tile, m0, k0, stride)
    }
}

/// [`load_a`], each lane reading its own elements.
#[cube]
fn load_a_elements<F: Float>(
    tile: &[F],
    m0: usize,
    k0: usize,
    #[comptime] stride: usize,
) -> Array<Pair<F>> {
    let (lane_m, lane_k) = a_position(fragment_lane(), 0);
    let lane_offset = lane_m * stride + lane_k;
    let mut a = Array::<Pair<F>>::new(A_PAIRS);
    #[unroll]
    for p in 0..A_PAIRS {
        let mut pair = Pair::<F>::empty();
        #[unroll]
        for e in 0..2 {
            let (m, kk) = a_position(0, (2 * p + e) as u32);
            pair.insert(e, tile[lane_offset + (m0 + m) * stride + k0 + kk]);
        }
        a[p] = pair;
    }
    a
}

/// Where the calling lane's view of a tile starts for its `B` loads: the stored row it
/// names in an `ldmatrix.x4` (see [`load_b_matrices`]; an `.x2` reads lanes 0–15's
/// rows, the same) with [`FragmentLoads::Matrices`], the tile's start with element
/// loads (which place each element themselves). Each load then reads the view at an
/// offset that is a constant once the callers' loops are unrolled, which ptxas folds
/// into the instruction; an index computed whole from the lane's part and the constant
/// is a `u32` sum that may wrap, so it cannot be split, and costs an add and a shift
/// per load.
#[cube]
pub fn b_lane_start(
    #[comptime] stride: usize,
    #[comptime] transposed: bool,
    #[comptime] loads: FragmentLoads,
) -> usize {
    let mut start = 0usize;
    if comptime!(loads == FragmentLoads::Matrices) {
        let lane = fragment_lane() as usize;
        let row = lane % 8;
        // Matrix `i` holds rows `8·(i % 2) ..` of `B` in its block `i / 2`.
        let matrix = lane / 8;
        let k = (matrix % 2) * 8;
        let n = (matrix / 2) * TILE_N;
        // The stored row: a row of `B` as is, a column of it when transposed.
        start = if transposed {
            b_offset(k, n + row, stride, true)
        } else {
            b_offset(k + row, n, stride, false)
        };
    }
    start
}

/// [`b_lane_start`] for `A` loads (an `ldmatrix.x4`, see [`load_a_matrices`]).
#[cube]
pub fn a_lane_start(#[comptime] stride: usize, #[comptime] loads: FragmentLoads) -> usize {
    let mut start = 0usize;
    if comptime!(loads == FragmentLoads::Matrices) {
        let lane = fragment_lane() as usize;
        let matrix = lane / 8;
        start = ((matrix % 2) * 8 + lane % 8) * stride + (matrix / 2) * 8;
    }
    start
}

/// [`load_b`] through one `ldmatrix`, `.x2` for one block and `.x4` for two: matrix
/// `2t` holds block `t`'s rows `k0 .. k0 + 8`, matrix `2t + 1` its rows
/// `k0 + 8 .. k0 + 16`, each 8×8 with the block's 8 columns; lanes `8i .. 8i + 8` name
/// matrix `i`'s stored rows, which `view` starts at ([`b_lane_start`]). Stored
/// transposed (`Kᵀ` from keys) a stored row is a column of `B` and the plain instruction
/// hands lane `4g + t` the pair at `B` rows `2t, 2t + 1`, column `g`; stored as is
/// (`V`), a stored row is a row of `B` and `.trans` hands it the same pair. Rows are 16
/// bytes: `stride` and the offsets are multiples of 8 elements (the tiles are 128-byte
/// aligned).
#[cube]
fn load_b_matrices<F: Float>(
    view: &[F],
    k0: usize,
    n0: usize,
    #[comptime] stride: usize,
    #[comptime] transposed: bool,
    #[comptime] tiles: usize,
) -> Array<Pair<F>> {
    let start = b_offset(k0, n0, stride, transposed);
    let definition = cmma::MmaDefinition::<F, F, f32>::new(TILE_M, TILE_N, TILE_K);
    definition.load_matrix::<F, Const<2>>(
        &view[start..start + 8],
        MatrixIdent::B,
        comptime!(tiles * B_PAIRS),
        !transposed,
    )
}

/// [`load_a`] through one `ldmatrix.x4`: matrices 0–3 hold the 8×8 blocks of the
/// 16×16 `A` at rows `m0`, `m0 + 8`, `m0`, `m0 + 8` and columns `k0`, `k0`, `k0 + 8`,
/// `k0 + 8`, in the order of the lane's pairs (see the module docs); lanes
/// `8i .. 8i + 8` name matrix `i`'s rows, which `view` starts at ([`a_lane_start`]).
#[cube]
fn load_a_matrices<F: Float>(
    view: &[F],
    m0: usize,
    k0: usize,
    #[comptime] stride: usize,
) -> Array<Pair<F>> {
    let start = m0 * stride + k0;
    let definition = cmma::MmaDefinition::<F, F, f32>::new(TILE_M, TILE_N, TILE_K);
    definition.load_matrix::<F, Const<2>>(&view[start..start + 8], MatrixIdent::A, A_PAIRS, false)
}

/// Dot products of rows, one C fragment per 8 rows of `tile`: `16·row_tiles` rows of a
/// tile staged row-major in shared memory (from row `first`, read as `A` fragments,
/// `chunks` of 16 columns) against `tiles·8` rows of another (`stride` elements a row
/// in both, read as the transposed `B`): `S = Q·Kᵀ` from a tile of keys, `dP = dO·Vᵀ`
/// from one of values, and the transposed `Sᵀ = K·Qᵀ`, `dPᵀ = V·dOᵀ` of a plane's keys.
/// Fragment `(m, j)` (row tile `m`, output tile `j`) is pairs
/// `(m·tiles + j)·2 ..` of the result. Each `A` fragment is loaded once and serves
/// every output tile, each `B` fragment once and serves every row tile: with two row
/// tiles a plane reads half the shared bytes per product. The tile starts at element
/// `tile_at` of its shared buffer (the second of two buffers, or 0).
#[cube]
#[allow(clippy::too_many_arguments)]
pub fn staged_row_products<F: Float>(
    rows: &Shared<[F]>,
    first: usize,
    tile: &Shared<[F]>,
    tile_at: usize,
    #[comptime] row_tiles: usize,
    #[comptime] chunks: usize,
    #[comptime] tiles: usize,
    #[comptime] stride: usize,
    scratch: &mut Shared<[f32]>,
    #[comptime] ops: FragmentOps,
    #[comptime] loads: FragmentLoads,
) -> Array<Pair<f32>> {
    let unrolled = comptime!(ops.on_plane_instructions());
    let mut out = zero_fragments(comptime!(row_tiles * tiles), unrolled);
    let row_view = &rows[first * stride + a_lane_start(stride, loads)..];
    let column_view = &tile[tile_at + b_lane_start(stride, true, loads)..];
    #[unroll(unrolled)]
    for c in 0..chunks {
        let mut left = Array::<Pair<F>>::new(comptime!(row_tiles * A_PAIRS));
        #[unroll(unrolled)]
        for m in 0..row_tiles {
            let a = load_a::<F>(row_view, m * TILE_M, c * TILE_K, stride, loads);
            #[unroll]
            for p in 0..A_PAIRS {
                left[m * A_PAIRS + p] = a[p];
            }
        }
        chunk_products::<F>(
            &left,
            0,
            A_PAIRS,
            column_view,
            c * TILE_K,
            row_tiles,
            tiles,
            stride,
            true,
            &mut out,
            scratch,
            ops,
            loads,
        );
    }
    out
}

/// `acc += P·T`: `P` the plane's `16·row_tiles` × `16·chunks` block as the pairs of
/// its C tiles (probabilities or their gradients) rounded to `F`, row tile `m` at pairs
/// `m·chunks·4 ..` — two neighbouring 16 × 8 C tiles, pairs `4c .. 4c + 4` of a row
/// tile, are exactly the `A` fragment of columns `16c .. 16c + 16`, the register reuse
/// of the module docs — `T` a tile staged row-major in shared memory whose rows are
/// `P`'s columns (`stride` elements a row), `acc` one C fragment per 8 columns of `T`
/// (`tiles` of them) per row tile, tile `(m, n)` at pairs `(m·tiles + n)·2 ..`:
/// `O += P·V`, `dQ += dS·K`, `dV += Pᵀ·dO`, `dK += dSᵀ·Q`. Each `B` fragment is loaded
/// once for every row tile. The callers round each pair as they make it, so that the
/// f32 value does not stay live until its product. `T` starts at element `tile_at` of
/// its shared buffer.
#[cube]
#[allow(clippy::too_many_arguments)]
pub fn accumulate_products<F: Float>(
    block: &Array<Pair<F>>,
    tile: &Shared<[F]>,
    tile_at: usize,
    #[comptime] row_tiles: usize,
    #[comptime] chunks: usize,
    #[comptime] tiles: usize,
    #[comptime] stride: usize,
    acc: &mut Array<Pair<f32>>,
    scratch: &mut Shared<[f32]>,
    #[comptime] ops: FragmentOps,
    #[comptime] loads: FragmentLoads,
) {
    let unrolled = comptime!(ops.on_plane_instructions());
    let view = &tile[tile_at + b_lane_start(stride, false, loads)..];
    #[unroll(unrolled)]
    for c in 0..chunks {
        chunk_products::<F>(
            block,
            c * A_PAIRS,
            chunks * A_PAIRS,
            view,
            c * TILE_K,
            row_tiles,
            tiles,
            stride,
            false,
            acc,
            scratch,
            ops,
            loads,
        );
    }
}

/// One 16-column chunk of `A·B` for every row tile: `out += A·B` over the `tiles`
/// blocks of 8 columns of `B` (rows `k0 ..` of the factor `view` reads, see
/// [`load_b`]), their fragments loaded two at a time where `tiles` is even. Row tile
/// `m`'s `A` fragment is pairs `a_at + m·a_row_pairs ..` of `a`; C fragment `(m, j)` is
/// pairs `(m·tiles + j)·2 ..` of `out`.
#[cube]
#[allow(clippy::too_many_arguments)]
fn chunk_products<F: Float>(
    a: &Array<Pair<F>>,
    a_at: usize,
    #[comptime] a_row_pairs: usize,
    view: &[F],
    k0: usize,
    #[comptime] row_tiles: usize,
    #[comptime] tiles: usize,
    #[comptime] stride: usize,
    #[comptime] transposed: bool,
    out: &mut Array<Pair<f32>>,
    scratch: &mut Shared<[f32]>,
    #[comptime] ops: FragmentOps,
    #[comptime] loads: FragmentLoads,
) {
    let unrolled = comptime!(ops.on_plane_instructions());
    let per_load = comptime!(b_tiles_per_load(tiles));
    #[unroll(unrolled)]
    for l in 0..comptime!(tiles / per_load) {
        let columns = load_b::<F>(
            view,
            k0,
            l * per_load * TILE_N,
            stride,
            transposed,
            per_load,
            loads,
        );
        #[unroll]
        for t in 0..per_load {
            let j = l * per_load + t;
            #[unroll(unrolled)]
            for m in 0..row_tiles {
                fragment_product::<F>(
                    a,
                    a_at + m * a_row_pairs,
                    &columns,
                    t * B_PAIRS,
                    out,
                    (m * tiles + j) * C_PAIRS,
                    scratch,
                    ops,
                );
            }
        }
    }
}

/// `A·T` for one 16-row tile of `A` staged row-major in shared memory (rows `first ..`,
/// `a_stride` elements a row, `chunks` of 16 columns) and `tiles` C fragments of
/// columns of `T` (a tile staged row-major whose rows are `A`'s columns, `t_stride`
/// elements a row): fragment `i` covers columns `8·(first_tile + i·step) ..`, taken
/// as `8·last_tile ..` past `last_tile` (the caller drops those; every lane runs the
/// same products). The one-pass backward's `dQ` share `dS·K`, its tiles spread over
/// the cube's planes by `first_tile` and `step`.
#[cube]
#[allow(clippy::too_many_arguments)]
pub fn staged_column_products<F: Float>(
    rows: &Shared<[F]>,
    first: usize,
    #[comptime] a_stride: usize,
    tile: &Shared<[F]>,
    #[comptime] t_stride: usize,
    first_tile: usize,
    #[comptime] step: usize,
    #[comptime] last_tile: usize,
    #[comptime] chunks: usize,
    #[comptime] tiles: usize,
    scratch: &mut Shared<[f32]>,
    #[comptime] ops: FragmentOps,
    #[comptime] loads: FragmentLoads,
) -> Array<Pair<f32>> {
    let unrolled = comptime!(ops.on_plane_instructions());
    let mut out = zero_fragments(tiles, unrolled);
    let row_view = &rows[first * a_stride + a_lane_start(a_stride, loads)..];
    let column_view = &tile[b_lane_start(t_stride, false, loads)..];
    #[unroll(unrolled)]
    for c in 0..chunks {
        let left = load_a::<F>(row_view, 0, c * TILE_K, a_stride, loads);
        #[unroll(unrolled)]
        for i in 0..tiles {
            let n = (first_tile + i * step).min(last_tile);
            // One block a load: a plane's blocks are `step` apart.
            let columns = load_b::<F>(
                column_view,
                c * TILE_K,
                n * TILE_N,
                t_stride,
                false,
                1usize,
                loads,
            );
            fragment_product::<F>(&left, 0, &columns, 0, &mut out, i * C_PAIRS, scratch, ops);
        }
    }
    out
}

/// `tiles` C fragments of zeros.
#[cube]
pub fn zero_fragments(#[comptime] tiles: usize, #[comptime] unrolled: bool) -> Array<Pair<f32>> {
    let mut out = Array::<Pair<f32>>::new(tiles * C_PAIRS);
    #[unroll(unrolled)]
    for i in 0..tiles * C_PAIRS {
        out[i] = Pair::<f32>::new(0.0f32);
    }
    out
}

/// `C += A·B` on the plane's fragments: `A` is pairs `a_at .. a_at + 4` of `a`, `B`
/// pairs `b_at .. b_at + 2` of `b`, `C` pairs `c_at .. c_at + 2` of `c`. `scratch` holds
/// [`EMULATION_SCRATCH`] elements per plane for the emulation (unused by tensor cores).
///
/// With tensor cores the callers' loops are unrolled, so that the offsets are
/// constants and the fragments stay in registers; the emulation runs in loops (the
/// shader compiler of CPU runtimes slows down with every barrier in the code).
#[cube]
pub fn fragment_product<F: Float>(
    a: &Array<Pair<F>>,
    a_at: usize,
    b: &Array<Pair<F>>,
    b_at: usize,
    c: &mut Array<Pair<f32>>,
    c_at: usize,
    scratch: &mut Shared<[f32]>,
    #[comptime] ops: FragmentOps,
) {
    if comptime!(ops == FragmentOps::TensorCores) {
        tensor_core_product::<F>(a, a_at, b, b_at, c, c_at);
    } else if comptime!(ops == FragmentOps::SplitTf32) {
        split_tf32_product::<F>(a, a_at, b, b_at, c, c_at);
    } else if comptime!(ops == FragmentOps::EmulatedSplitTf32) {
        emulated_split_tf32_product::<F>(a, a_at, b, b_at, c, c_at, scratch);
    } else {
        emulated_product::<F>(a, a_at, b, b_at, c, c_at, scratch);
    }
}

/// [`FragmentOps::TensorCores`]'s product: one `mma.sync`.
#[cube]
fn tensor_core_product<F: Float>(
    a: &Array<Pair<F>>,
    a_at: usize,
    b: &Array<Pair<F>>,
    b_at: usize,
    c: &mut Array<Pair<f32>>,
    c_at: usize,
) {
    let definition = cmma::MmaDefinition::<F, F, f32>::new(TILE_M, TILE_N, TILE_K);
    let mut left = Array::<Pair<F>>::new(A_PAIRS);
    #[unroll]
    for p in 0..A_PAIRS {
        left[p] = a[a_at + p];
    }
    let mut right = Array::<Pair<F>>::new(B_PAIRS);
    #[unroll]
    for p in 0..B_PAIRS {
        right[p] = b[b_at + p];
    }
    let mut sums = Array::<Pair<f32>>::new(C_PAIRS);
    #[unroll]
    for p in 0..C_PAIRS {
        sums[p] = c[c_at + p];
    }
    let out = definition.execute(&left, &right, &sums);
    #[unroll]
    for p in 0..C_PAIRS {
        c[c_at + p] = out[p];
    }
}

/// Columns of `A` (rows of `B`) of one TF32 product, m16n8k8: half a chunk of
/// [`TILE_K`] columns ([`TILE_M`] and [`TILE_N`] as in the 16-bit product). A lane
/// holds one element of `A` in it per pair of the 16-bit layout ([`A_PAIRS`]), and
/// one of `B` per pair ([`B_PAIRS`]).
const TF32_TILE_K: usize = TILE_K / 2;
/// The bits of an f32 that TF32 keeps: sign, exponent and the 10 upper mantissa bits.
const TF32_KEPT_BITS: u32 = 0xFFFF_E000;
/// One register of a TF32 fragment: a single element.
type Tf32Register = Vector<tf32, Const<1>>;

/// `x` rounded to TF32's 10 mantissa bits, to nearest with ties away from zero (as
/// `cvt.rna.tf32.f32`), still an f32: adding half of the dropped bits' unit to the
/// magnitude's bits carries into the kept ones exactly when the dropped part is at
/// least half a unit (infinities stay infinite).
#[cube]
fn round_to_tf32(x: f32) -> f32 {
    let bits = u32::reinterpret(x);
    f32::reinterpret((bits + 0x1000u32) & TF32_KEPT_BITS)
}

/// `(high, low)` TF32 parts of `x`: `high` is `x` rounded to TF32, `low` the rest
/// (exact in f32) rounded to TF32, so that `high + low` is `x` to about 21 bits.
#[cube]
fn split_tf32(x: f32) -> (f32, f32) {
    let high = round_to_tf32(x);
    (high, round_to_tf32(x - high))
}

/// What a tensor core reads of an f32 register holding a TF32 operand: its sign,
/// exponent and 10 upper mantissa bits (the lower 13 are ignored). The emulation reads
/// its operands so, so that a split whose parts were not TF32 values would lose their
/// lower bits there as on a GPU.
#[cube]
fn tf32_operand(x: f32) -> f32 {
    f32::reinterpret(u32::reinterpret(x) & TF32_KEPT_BITS)
}

/// `x` as a `T` (the macro cannot name `tf32::cast_from` itself).
#[cube]
fn cast_to<T: Float>(x: f32) -> T {
    T::cast_from(x)
}

/// The bits of `x` as a `T` (the macro cannot name `tf32::reinterpret` itself).
#[cube]
fn bits_as<T: CubePrimitive>(x: f32) -> T {
    T::reinterpret(x)
}

/// The TF32 registers of one m16n8k8 factor: element `e` of `count` pairs of
/// `pairs` from `at`, each split in its high and low parts (the two arrays).
///
/// Both parts are TF32 values already, whose conversion (`cvt.rna.tf32.f32`, a
/// compare and a predicated add an element on sm_90) changes none of the bits a
/// tensor core reads. The high part goes as its bits: 11–15% fewer instructions in
/// the kernels' key loops (ptxas 12.9, sm_90). The low part keeps the conversion:
/// without either, the loops took 34–37% fewer, but ptxas gave the dK/dV kernel at
/// head dim 64 128 registers and 4 bytes of spill for a fourth cube per SM.
#[cube]
fn split_operands<F: Float>(
    pairs: &Array<Pair<F>>,
    at: usize,
    #[comptime] count: usize,
    #[comptime] e: usize,
) -> (Array<Tf32Register>, Array<Tf32Register>) {
    let mut high = Array::<Tf32Register>::new(count);
    let mut low = Array::<Tf32Register>::new(count);
    #[unroll]
    for p in 0..count {
        let (h, l) = split_tf32(f32::cast_from(pairs[at + p].extract(e)));
        high[p] = Tf32Register::new(bits_as::<tf32>(h));
        low[p] = Tf32Register::new(cast_to::<tf32>(l));
    }
    (high, low)
}

/// [`FragmentOps::SplitTf32`]'s product (f32 inputs): for each element `e` of the
/// pairs, the `e` elements form one m16n8k8 product (see the module docs), which
/// three `mma.sync` of TF32 parts make, the small terms first.
#[cube]
fn split_tf32_product<F: Float>(
    a: &Array<Pair<F>>,
    a_at: usize,
    b: &Array<Pair<F>>,
    b_at: usize,
    c: &mut Array<Pair<f32>>,
    c_at: usize,
) {
    let definition = cmma::MmaDefinition::<tf32, tf32, f32>::new(TILE_M, TILE_N, TF32_TILE_K);
    let mut sums = Array::<Pair<f32>>::new(C_PAIRS);
    #[unroll]
    for p in 0..C_PAIRS {
        sums[p] = c[c_at + p];
    }
    #[unroll]
    for e in 0..2usize {
        let (a_high, a_low) = split_operands::<F>(a, a_at, A_PAIRS, e);
        let (b_high, b_low) = split_operands::<F>(b, b_at, B_PAIRS, e);
        sums = definition.execute(&a_low, &b_high, &sums);
        sums = definition.execute(&a_high, &b_low, &sums);
        sums = definition.execute(&a_high, &b_high, &sums);
    }
    #[unroll]
    for p in 0..C_PAIRS {
        c[c_at + p] = sums[p];
    }
}

/// [`FragmentOps::EmulatedSplitTf32`]'s product: [`split_tf32_product`] with each
/// m16n8k8 product's `A` and `B` gathered in shared memory where the TF32 layout
/// places the lane's registers, and the three products summed in f32.
#[cube]
fn emulated_split_tf32_product<F: Float>(
    a: &Array<Pair<F>>,
    a_at: usize,
    b: &Array<Pair<F>>,
    b_at: usize,
    c: &mut Array<Pair<f32>>,
    c_at: usize,
    scratch: &mut Shared<[f32]>,
) {
    let lane = fragment_lane();
    let base = (UNIT_POS as usize / LANES) * EMULATION_SCRATCH;
    let b_base = base + TILE_M * TF32_TILE_K;
    // A loop, not unrolled: the shader compilers of CPU runtimes slow down with every
    // barrier in the code.
    for e in 0..2usize {
        #[unroll]
        for p in 0..A_PAIRS {
            let row = mma::row_index(lane, p as u32, 1usize, MatrixIdent::A) as usize;
            let col = mma::col_index(lane, p as u32, 1usize, MatrixIdent::A) as usize;
            scratch[base + row * TF32_TILE_K + col] =
                f32::cast_from(a[a_at + p].extract_dynamic(e));
        }
        #[unroll]
        for p in 0..B_PAIRS {
            let row = mma::row_index(lane, p as u32, 1usize, MatrixIdent::B) as usize;
            let col = mma::col_index(lane, p as u32, 1usize, MatrixIdent::B) as usize;
            scratch[b_base + row * TILE_N + col] = f32::cast_from(b[b_at + p].extract_dynamic(e));
        }
        sync_cube();
        #[unroll]
        for p in 0..C_PAIRS {
            let mut pair = c[c_at + p];
            #[unroll]
            for i in 0..2 {
                let (row, col) = c_position(lane, (2 * p + i) as u32);
                let mut low_high = 0.0f32;
                let mut high_low = 0.0f32;
                let mut high_high = 0.0f32;
                for kk in 0..TF32_TILE_K {
                    let (a_high, a_low) = split_tf32(scratch[base + row * TF32_TILE_K + kk]);
                    let (b_high, b_low) = split_tf32(scratch[b_base + kk * TILE_N + col]);
                    let (a_high, a_low) = (tf32_operand(a_high), tf32_operand(a_low));
                    let (b_high, b_low) = (tf32_operand(b_high), tf32_operand(b_low));
                    low_high += a_low * b_high;
                    high_low += a_high * b_low;
                    high_high += a_high * b_high;
                }
                pair.insert(i, ((pair.extract(i) + low_high) + high_low) + high_high);
            }
            c[c_at + p] = pair;
        }
        sync_cube();
    }
}

/// [`FragmentOps::Emulated`]'s product: the plane's `A` and `B` gathered in shared
/// memory by position, then each lane's four sums in f32.
#[cube]
fn emulated_product<F: Float>(
    a: &Array<Pair<F>>,
    a_at: usize,
    b: &Array<Pair<F>>,
    b_at: usize,
    c: &mut Array<Pair<f32>>,
    c_at: usize,
    scratch: &mut Shared<[f32]>,
) {
    let lane = fragment_lane();
    let base = (UNIT_POS as usize / LANES) * EMULATION_SCRATCH;
    let b_base = base + TILE_M * TILE_K;
    #[unroll]
    for p in 0..A_PAIRS {
        let pair = a[a_at + p];
        #[unroll]
        for e in 0..2 {
            let (row, col) = a_position(lane, (2 * p + e) as u32);
            scratch[base + row * TILE_K + col] = f32::cast_from(pair.extract(e));
        }
    }
    #[unroll]
    for p in 0..B_PAIRS {
        let pair = b[b_at + p];
        #[unroll]
        for e in 0..2 {
            let (row, col) = b_position(lane, (2 * p + e) as u32);
            scratch[b_base + row * TILE_N + col] = f32::cast_from(pair.extract(e));
        }
    }
    sync_cube();
    #[unroll]
    for p in 0..C_PAIRS {
        let mut pair = c[c_at + p];
        #[unroll]
        for e in 0..2 {
            let (row, col) = c_position(lane, (2 * p + e) as u32);
            let mut sum = pair.extract(e);
            for kk in 0..TILE_K {
                sum += scratch[base + row * TILE_K + kk] * scratch[b_base + kk * TILE_N + col];
            }
            pair.insert(e, sum);
        }
        c[c_at + p] = pair;
    }
    sync_cube();
}

/// The max of `value` over the calling lane's quad (the four lanes that hold one row
/// of a `C` fragment between them), on every lane of the quad.
#[cube]
pub fn quad_max(value: f32, scratch: &mut Shared<[f32]>, #[comptime] ops: FragmentOps) -> f32 {
    if comptime!(ops.on_plane_instructions()) {
        let pairs = f32::max(value, plane_shuffle_xor(value, 1));
        f32::max(pairs, plane_shuffle_xor(pairs, 2))
    } else {
        let (a, b, c, d) = emulated_quad(value, scratch);
        f32::max(f32::max(a, b), f32::max(c, d))
    }
}

/// The sum of `value` over the calling lane's quad, on every lane of the quad, added
/// in the same order by both implementations: `(l0 + l1) + (l2 + l3)`.
#[cube]
pub fn quad_sum(value: f32, scratch: &mut Shared<[f32]>, #[comptime] ops: FragmentOps) -> f32 {
    if comptime!(ops.on_plane_instructions()) {
        let pairs = value + plane_shuffle_xor(value, 1);
        pairs + plane_shuffle_xor(pairs, 2)
    } else {
        let (a, b, c, d) = emulated_quad(value, scratch);
        (a + b) + (c + d)
    }
}

/// Whether `value` holds on every lane of the calling plane, on every lane.
#[cube]
pub fn plane_agrees(
    value: bool,
    scratch: &mut Shared<[f32]>,
    #[comptime] ops: FragmentOps,
) -> bool {
    let mut all = true;
    if comptime!(ops.on_plane_instructions()) {
        all = plane_all(value);
    } else {
        let base = (UNIT_POS as usize / LANES) * EMULATION_SCRATCH;
        scratch[base + fragment_lane() as usize] = f32::cast_from(u32::cast_from(value));
        sync_cube();
        for lane in 0..LANES {
            all = all && scratch[base + lane] != 0.0f32;
        }
        sync_cube();
    }
    all
}

/// The values of the calling lane's quad, in lane order, through shared memory.
#[cube]
fn emulated_quad(value: f32, scratch: &mut Shared<[f32]>) -> (f32, f32, f32, f32) {
    let lane = fragment_lane() as usize;
    let base = (UNIT_POS as usize / LANES) * EMULATION_SCRATCH;
    scratch[base + lane] = value;
    sync_cube();
    let first = base + lane - lane % 4;
    let values = (
        scratch[first],
        scratch[first + 1],
        scratch[first + 2],
        scratch[first + 3],
    );
    sync_cube();
    values
}
