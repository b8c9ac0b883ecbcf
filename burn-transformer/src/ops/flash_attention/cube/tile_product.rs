//! The one matrix product of the staged kernels: `C (+)= A·B` on tiles in shared
//! memory, computed by the whole cube, with two implementations.
//!
//! - [`TileProduct::Plain`]: each unit computes `rows × cols` output elements in
//!   registers with f32 FMAs, reading both factors from shared memory. It runs on
//!   every device, lavapipe included, so the staged kernels' tiling, staging, masking
//!   and online softmax are tested here through it.
//! - [`TileProduct::TensorCores`]: each plane computes 16×16 output tiles with
//!   CubeCL's `cmma` (f16/bf16 inputs, f32 accumulation). Lavapipe offers no
//!   cooperative matrices, so only this product differs between the tested code and
//!   a GPU.
//!
//! The accumulator `C` is always f32 and row-major; it lives in shared memory
//! between products because the kernels rescale and read its rows (the online
//! softmax), which a tensor-core fragment's opaque layout does not allow.
//!
//! Every unit of the cube must call the product (it is collective), and the caller
//! synchronizes the cube before the factors or `C` change again.

use cubecl::prelude::*;

/// Which implementation computes the tile products.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum TileProduct {
    /// Unit arithmetic: each unit owns `rows × cols` output elements.
    Plain {
        /// Output rows per unit.
        rows: usize,
        /// Output columns per unit.
        cols: usize,
    },
    /// Tensor cores through `cmma`: 16×16×16 fragments, one plane per output tile.
    TensorCores,
}

impl TileProduct {
    /// Output elements `(rows, cols)` per unit of the plain product (`(1, 1)` for
    /// tensor cores, which have no unit tile).
    pub fn unit_tile(self) -> (usize, usize) {
        match self {
            Self::Plain { rows, cols } => (rows, cols),
            Self::TensorCores => (1, 1),
        }
    }
}

/// Side of the square fragments of [`TileProduct::TensorCores`].
pub const FRAGMENT: usize = 16;

/// How a factor lies in its shared-memory tile: element `(i, j)` at `i·stride + j`, or
/// at `j·stride + i` when `transposed` (a row-major tile read as its transpose).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Operand {
    /// Whether the tile holds the factor's transpose.
    pub transposed: bool,
    /// Elements between consecutive rows of the stored tile.
    pub stride: usize,
}

impl Operand {
    /// A factor stored row-major with `stride` elements per row.
    pub const fn rows(stride: usize) -> Self {
        Self {
            transposed: false,
            stride,
        }
    }

    /// A factor whose transpose is stored row-major with `stride` elements per row.
    pub const fn transposed(stride: usize) -> Self {
        Self {
            transposed: true,
            stride,
        }
    }
}

/// The shape `m × n × k` of one product and how its factors lie.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct ProductShape {
    /// Output rows.
    pub m: usize,
    /// Output columns (also `C`'s row stride).
    pub n: usize,
    /// Reduced dimension.
    pub k: usize,
    /// The left factor `A` (`m × k`).
    pub a: Operand,
    /// The right factor `B` (`k × n`).
    pub b: Operand,
    /// Whether `C` is added to (`C += A·B`) or overwritten (`C = A·B`).
    pub accumulate: bool,
}

impl ProductShape {
    /// `C (+)= A·B` with `A` `m × k` and `B` `k × n`.
    pub const fn new(
        m: usize,
        n: usize,
        k: usize,
        a: Operand,
        b: Operand,
        accumulate: bool,
    ) -> Self {
        Self {
            m,
            n,
            k,
            a,
            b,
            accumulate,
        }
    }
}

/// `C (+)= A·B` by the whole cube (see the module docs).
#[cube]
pub fn tile_product<F: Float>(
    a: &Shared<[F]>,
    b: &Shared<[F]>,
    c: &mut Shared<[f32]>,
    #[comptime] shape: ProductShape,
    #[comptime] product: TileProduct,
) {
    if comptime!(product == TileProduct::TensorCores) {
        tensor_core_product::<F>(a, b, c, shape);
    } else {
        let (rows, cols) = comptime!(product.unit_tile());
        plain_product::<F>(a, b, c, shape, rows, cols);
    }
}

/// [`TileProduct::Plain`]: unit `u` computes the output blocks `u, u + units, …`,
/// each `rows × cols`, consecutive units taking neighbouring column blocks.
#[cube]
fn plain_product<F: Float>(
    a: &Shared<[F]>,
    b: &Shared<[F]>,
    c: &mut Shared<[f32]>,
    #[comptime] shape: ProductShape,
    #[comptime] rows: usize,
    #[comptime] cols: usize,
) {
    let col_blocks = shape.n / cols;
    let blocks = (shape.m / rows) * col_blocks;
    let mut sums = Array::<f32>::new(rows * cols);
    let mut a_column = Array::<f32>::new(rows);
    let mut b_row = Array::<f32>::new(cols);
    let mut block = UNIT_POS as usize;
    while block < blocks {
        let row0 = (block / col_blocks) * rows;
        let col0 = (block % col_blocks) * cols;
        #[unroll]
        for i in 0..rows {
            #[unroll]
            for j in 0..cols {
                let mut start = 0.0f32;
                if shape.accumulate {
                    start = c[(row0 + i) * shape.n + col0 + j];
                }
                sums[i * cols + j] = start;
            }
        }
        for kk in 0..shape.k {
            #[unroll]
            for i in 0..rows {
                a_column[i] = f32::cast_from(a[operand_offset(shape.a, row0 + i, kk)]);
            }
            #[unroll]
            for j in 0..cols {
                b_row[j] = f32::cast_from(b[operand_offset(shape.b, kk, col0 + j)]);
            }
            #[unroll]
            for i in 0..rows {
                #[unroll]
                for j in 0..cols {
                    sums[i * cols + j] += a_column[i] * b_row[j];
                }
            }
        }
        #[unroll]
        for i in 0..rows {
            #[unroll]
            for j in 0..cols {
                c[(row0 + i) * shape.n + col0 + j] = sums[i * cols + j];
            }
        }
        block += CUBE_DIM as usize;
    }
}

/// Offset of element `(i, j)` of a factor laid out as `operand` says.
#[cube]
fn operand_offset(#[comptime] operand: Operand, i: usize, j: usize) -> usize {
    let mut offset = i * operand.stride + j;
    if operand.transposed {
        offset = j * operand.stride + i;
    }
    offset
}

/// The `cmma` layout of a factor tile.
fn fragment_layout(operand: Operand) -> cmma::MatrixLayout {
    if operand.transposed {
        cmma::MatrixLayout::ColMajor
    } else {
        cmma::MatrixLayout::RowMajor
    }
}

/// [`TileProduct::TensorCores`]: plane `p` computes the 16×16 output tiles
/// `p, p + planes, …`, loading its accumulator from `C`, multiplying through the
/// reduced dimension 16 at a time, and storing it back.
#[cube]
fn tensor_core_product<F: Float>(
    a: &Shared<[F]>,
    b: &Shared<[F]>,
    c: &mut Shared<[f32]>,
    #[comptime] shape: ProductShape,
) {
    let col_tiles = shape.n / FRAGMENT;
    let tiles = (shape.m / FRAGMENT) * col_tiles;
    let planes = (CUBE_DIM / PLANE_DIM) as usize;
    let a_layout = comptime!(fragment_layout(shape.a));
    let b_layout = comptime!(fragment_layout(shape.b));
    // The slices a fragment loads from: its first element to the end of the tile.
    let a_len = a.len();
    let b_len = b.len();
    let c_len = c.len();
    let mut tile = (UNIT_POS / PLANE_DIM) as usize;
    while tile < tiles {
        let row0 = (tile / col_tiles) * FRAGMENT;
        let col0 = (tile % col_tiles) * FRAGMENT;
        let c_start = row0 * shape.n + col0;
        let mut acc = unsafe {
            cmma::Matrix::<f32>::uninitialized(
                cmma::MatrixIdent::Accumulator,
                FRAGMENT,
                FRAGMENT,
                FRAGMENT,
                cmma::MatrixLayout::Undefined,
            )
        };
        if shape.accumulate {
            cmma::load_with_layout(
                &mut acc,
                &c[c_start..c_len],
                shape.n as u32,
                cmma::MatrixLayout::RowMajor,
            );
        } else {
            cmma::fill(&mut acc, 0.0f32);
        }
        let mut kk = 0usize;
        while kk < shape.k {
            let a_start = operand_offset(shape.a, row0, kk);
            let b_start = operand_offset(shape.b, kk, col0);
            let left = cmma::Matrix::<F>::from_slice(
                cmma::MatrixIdent::A,
                FRAGMENT,
                FRAGMENT,
                FRAGMENT,
                a_layout,
                &a[a_start..a_len],
                shape.a.stride as u32,
            );
            let right = cmma::Matrix::<F>::from_slice(
                cmma::MatrixIdent::B,
                FRAGMENT,
                FRAGMENT,
                FRAGMENT,
                b_layout,
                &b[b_start..b_len],
                shape.b.stride as u32,
            );
            cmma::execute::<F, F, f32, f32, cmma::Plane>(&left, &right, &acc, &acc);
            kk += FRAGMENT;
        }
        cmma::store(
            &mut c[c_start..c_len],
            &acc,
            shape.n as u32,
            cmma::MatrixLayout::RowMajor,
        );
        tile += planes;
    }
}
