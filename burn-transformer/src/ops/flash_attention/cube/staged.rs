//! The staged kernels: FlashAttention-2 for GPUs, with tiles of Q, K and V staged in
//! shared memory and every matrix product a [`tile_product`] (tensor cores or unit
//! arithmetic, chosen at compile time).
//!
//! Work split:
//! - forward and dQ: a cube owns `block_q` query rows of one head and walks the keys
//!   any of them may see, `block_k` at a time: `S = Q·Kᵀ`, the online softmax on the
//!   rows of `S` (one unit per row), then `O += P·V` (or `dQ += dS·K`);
//! - dK/dV: a cube owns `block_k` keys of one key/value head and walks the query rows
//!   of every query head of its group that may see them, `block_q` at a time. Each key's
//!   gradient is summed by its own cube in a fixed order: no atomics, deterministic.
//!
//! The masks, soft-cap, sinks and the hidden-score conventions are those of the
//! register-tile kernels (`register_tiles.rs`), whose helpers these kernels call, so both
//! families compute the same function; the parity grid checks each against the
//! oracle. `P` and `dS` are rounded to the input type before their products, as in
//! FlashAttention-2 (a no-op for f32), so the tensor-core product sees the same
//! factors as the plain one.

use cubecl::prelude::barrier::copy_async;
use cubecl::prelude::*;

use super::row_stats::ROW_STATS;
use super::sizes::{
    HIDDEN, ScoreTerms, Sizes, alibi_bias, alibi_slope, key_kept, key_range, kv_head_of,
    query_heads_of, row_range, structurally_visible,
};
use super::softmax::{
    Exponential, finish_row, masked_score, online_max, probability, probability_and_gradient,
};
use super::tile_product::{Operand, ProductShape, TileProduct, tile_product};
use crate::ops::mask::MASKED_ROW_LSE;

/// Byte alignment of every shared tile: tensor-core fragments load from 32-byte
/// aligned addresses, and 128 keeps tiles on separate cache lines.
const TILE_ALIGN: usize = 128;

/// Compile-time shape of one staged launch.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct StagedConfig {
    /// Units per cube.
    pub units: usize,
    /// Query rows per tile.
    pub block_q: usize,
    /// Keys per tile.
    pub block_k: usize,
    /// Query/key head dim.
    pub d_qk: usize,
    /// Value head dim.
    pub d_v: usize,
    /// How the tile products are computed.
    pub product: TileProduct,
    /// Elements a unit copies at once when it stages rows (see [`stage_rows`]).
    pub staging: usize,
    /// Whether the scores take ALiBi's bias.
    pub alibi: bool,
    /// Whether the mask has chunks ([`ScoreTerms::chunk`]).
    pub chunked: bool,
}

impl StagedConfig {
    /// The terms this kernel's scores take: the soft-cap's code always (a runtime
    /// flag, as in the register tiles), ALiBi's where compiled in.
    pub fn terms(&self) -> ScoreTerms {
        ScoreTerms {
            cap: true,
            alibi: self.alibi,
            chunk: self.chunked,
        }
    }

    /// Shared-memory bytes of the forward kernel for inputs of `elem` bytes.
    pub fn forward_bytes(&self, elem: usize) -> usize {
        let (bq, bk) = (self.block_q, self.block_k);
        elem * (bq * self.d_qk + bk * self.d_qk + bk * self.d_v + bq * bk)
            + 4 * (bq * bk + bq * self.d_v + 3 * bq + bk)
    }

    /// Shared-memory bytes of the dQ kernel.
    pub fn backward_q_bytes(&self, elem: usize) -> usize {
        let (bq, bk) = (self.block_q, self.block_k);
        elem * (bq * self.d_qk + bq * self.d_v + bk * self.d_qk + bk * self.d_v + bq * bk)
            + 4 * (2 * bq * bk + bq * self.d_qk + 2 * bq + bk)
    }

    /// Shared-memory bytes of the dK/dV kernel.
    pub fn backward_kv_bytes(&self, elem: usize) -> usize {
        let (bq, bk) = (self.block_q, self.block_k);
        elem * (bk * self.d_qk + bk * self.d_v + bq * self.d_qk + bq * self.d_v + 2 * bq * bk)
            + 4 * (2 * bq * bk + bk * self.d_qk + bk * self.d_v + 3 * bq + bk)
    }
}

/// A new shared tile of `len` elements.
#[cube]
pub(super) fn shared_tile<E: CubePrimitive>(#[comptime] len: usize) -> Shared<[E]> {
    Shared::<[E]>::new_aligned_slice(len, TILE_ALIGN)
}

/// Copies rows `first .. first + rows` of one head (`head_row = head · seq`) of a
/// contiguous `[.., seq, d]` tensor into `tile`, row-major with `stride ≥ d` elements
/// a row; rows past `seq` repeat the last row (their results are masked or never
/// written). Each unit moves `width` elements at a time (`width` divides `d` and
/// `stride`): one wide load and store per vector of up to 16 bytes instead of one per
/// element, where `width > 1`. `units` is the cube's units where a unit may keep its
/// row and column of the tile in registers (the fragment kernels; see
/// [`stage_row_vectors`]), `None` where it may not: in the staged kernels, whose f32
/// tiles ptxas fits in 64 registers, that spilled 4–16 bytes at head dims 64–128.
#[cube]
#[allow(clippy::too_many_arguments)]
pub(super) fn stage_rows<F: Float>(
    source: &Tensor<F>,
    tile: &mut Shared<[F]>,
    head_row: usize,
    first: usize,
    seq: usize,
    #[comptime] rows: usize,
    #[comptime] d: usize,
    #[comptime] stride: usize,
    #[comptime] width: usize,
    #[comptime] units: Option<usize>,
) {
    stage_rows_copying::<F>(
        source, tile, 0, head_row, first, seq, rows, d, stride, width, units, false,
    );
}

/// [`stage_rows`] into the rows of `tile` from element `tile_at` (a multiple of
/// `width`: the second of two buffers, or 0), with each vector's copy `asynchronous` or
/// not: asynchronous copies (`cp.async`, CUDA sm_80 and later; vectors of 4, 8 or 16
/// bytes) land in `tile` some time after this returns, without passing through the
/// unit's registers, and [`wait_for_copies`] waits for them.
#[cube]
#[allow(clippy::too_many_arguments)]
pub(super) fn stage_rows_copying<F: Float>(
    source: &Tensor<F>,
    tile: &mut Shared<[F]>,
    tile_at: usize,
    head_row: usize,
    first: usize,
    seq: usize,
    #[comptime] rows: usize,
    #[comptime] d: usize,
    #[comptime] stride: usize,
    #[comptime] width: usize,
    #[comptime] units: Option<usize>,
    #[comptime] asynchronous: bool,
) {
    if comptime!(width == 8) {
        stage_row_vectors::<F, Const<8>>(
            source,
            tile,
            tile_at,
            head_row,
            first,
            seq,
            rows,
            d,
            stride,
            units,
            asynchronous,
        );
    } else if comptime!(width == 4) {
        stage_row_vectors::<F, Const<4>>(
            source,
            tile,
            tile_at,
            head_row,
            first,
            seq,
            rows,
            d,
            stride,
            units,
            asynchronous,
        );
    } else if comptime!(width == 2) {
        stage_row_vectors::<F, Const<2>>(
            source,
            tile,
            tile_at,
            head_row,
            first,
            seq,
            rows,
            d,
            stride,
            units,
            asynchronous,
        );
    } else {
        stage_row_vectors::<F, Const<1>>(
            source,
            tile,
            tile_at,
            head_row,
            first,
            seq,
            rows,
            d,
            stride,
            units,
            asynchronous,
        );
    }
}

/// Waits until this unit's asynchronous copies ([`stage_rows_copying`]) have landed,
/// then for every unit of the cube (`sync_cube`), so that each sees every unit's
/// copies, synchronous or not, and none writes a tile another may still read.
#[cube]
pub(super) fn wait_for_copies(#[comptime] asynchronous: bool) {
    if comptime!(asynchronous) {
        gpu_asm!("cp.async.wait_all;");
    }
    sync_cube();
}

/// Copies vector `from` of `source` into vector `to` of `tile`: through the unit's
/// registers, or `asynchronous` (see [`stage_rows_copying`]).
#[cube]
fn copy_vector<F: Float, N: Size>(
    source: &[Vector<F, N>],
    tile: &mut [Vector<F, N>],
    from: usize,
    to: usize,
    #[comptime] asynchronous: bool,
) {
    if comptime!(asynchronous) {
        let width = N::value();
        copy_async(
            &source[from..from + 1],
            &mut tile[to..to + 1],
            comptime!(width as u32),
        );
    } else {
        tile[to] = source[from];
    }
}

/// [`stage_rows`] with vectors of `N` elements: the tensor and the tile are read as
/// slices of vectors, which for `N > 1` needs a runtime that reinterprets memory
/// (CUDA, HIP); `N = 1` keeps their own element type.
///
/// Where `units` is given and divides the tile's vectors into whole passes, each a
/// whole number of rows or of units per row (every fragment kernel at head dims that
/// are multiples of 16 on CUDA), a unit works out its row and column once and steps
/// through the passes at constant offsets, a row past the end costing one `min`: on
/// CUDA about 150 instructions fewer per key tile of the fragment forward at head dim
/// 128 than dividing each vector's index by the row's length. Otherwise the units
/// stride through the tile's vectors (one each at most where `units` covers them).
#[cube]
#[allow(clippy::too_many_arguments)]
fn stage_row_vectors<F: Float, N: Size>(
    source: &Tensor<F>,
    tile: &mut Shared<[F]>,
    tile_at: usize,
    head_row: usize,
    first: usize,
    seq: usize,
    #[comptime] rows: usize,
    #[comptime] d: usize,
    #[comptime] stride: usize,
    #[comptime] units: Option<usize>,
    #[comptime] asynchronous: bool,
) {
    let width = N::value();
    let row_vectors = comptime!(d / width);
    let tile_vector_at = tile_at / width;
    let tile_stride = comptime!(stride / width);
    let vectors = comptime!(rows * row_vectors);
    let source = source.as_slice().as_vectorized().with_vector_size::<N>();
    let tile = tile
        .inner_mut()
        .as_vectorized_mut()
        .with_vector_size_mut::<N>();
    // Whether each unit copies one vector at most (a tile of few short rows, such as
    // the backward's statistics).
    let at_most_one = comptime!(units.is_some_and(|units| vectors <= units));
    // Without `units`, one unit a pass: never a whole number of rows.
    let units = comptime!(units.unwrap_or(vectors + 1));
    let passes = comptime!(vectors / units);
    let whole_passes = comptime!(vectors.is_multiple_of(units));
    if comptime!(whole_passes && units.is_multiple_of(row_vectors)) {
        // A pass copies `units / row_vectors` whole rows; a unit keeps its column.
        let rows_per_pass = comptime!(units / row_vectors);
        let (unit, last) = (UNIT_POS as usize, seq - 1);
        let first_row = unit / row_vectors;
        let col = unit % row_vectors;
        for pass in 0..passes {
            let r = first_row + pass * rows_per_pass;
            let row = (first + r).min(last);
            copy_vector::<F, N>(
                source,
                tile,
                (head_row + row) * row_vectors + col,
                tile_vector_at + r * tile_stride + col,
                asynchronous,
            );
        }
    } else if comptime!(whole_passes && row_vectors.is_multiple_of(units)) {
        // A row takes `row_vectors / units` passes; a unit steps through its columns.
        let passes_per_row = comptime!(row_vectors / units);
        let (unit, last) = (UNIT_POS as usize, seq - 1);
        for pass in 0..passes {
            let r = pass / passes_per_row;
            let col = unit + (pass % passes_per_row) * units;
            let row = (first + r).min(last);
            copy_vector::<F, N>(
                source,
                tile,
                (head_row + row) * row_vectors + col,
                tile_vector_at + r * tile_stride + col,
                asynchronous,
            );
        }
    } else {
        let mut e = UNIT_POS as usize;
        while e < vectors {
            let r = e / row_vectors;
            let mut row = first + r;
            if row >= seq {
                row = seq - 1;
            }
            let col = e - r * row_vectors;
            copy_vector::<F, N>(
                source,
                tile,
                (head_row + row) * row_vectors + col,
                tile_vector_at + r * tile_stride + col,
                asynchronous,
            );
            if comptime!(at_most_one) {
                // Else the compiler unrolls the loop into several guarded copies, of
                // which only the first can run.
                break;
            }
            e += CUBE_DIM as usize;
        }
    }
}

/// Stages the `block` keys from `first` of key/value head `kv_head`: their rows of `k`
/// and `v` (`k_stride` and `v_stride` elements a row in the tiles) and whether each is
/// kept (see [`stage_kept_keys`]).
#[cube]
#[allow(clippy::too_many_arguments)]
pub(super) fn stage_key_block<F: Float>(
    k: &Tensor<F>,
    v: &Tensor<F>,
    key_mask: &Tensor<F>,
    k_tile: &mut Shared<[F]>,
    v_tile: &mut Shared<[F]>,
    kept: &mut Shared<[u32]>,
    kv_head: usize,
    first: usize,
    batch: usize,
    sizes: &Sizes,
    #[comptime] block: usize,
    #[comptime] d_qk: usize,
    #[comptime] d_v: usize,
    #[comptime] k_stride: usize,
    #[comptime] v_stride: usize,
    #[comptime] width: usize,
    #[comptime] units: Option<usize>,
) {
    let seq_k = sizes.seq_k as usize;
    let head_row = kv_head * seq_k;
    stage_rows::<F>(
        k, k_tile, head_row, first, seq_k, block, d_qk, k_stride, width, units,
    );
    stage_rows::<F>(
        v, v_tile, head_row, first, seq_k, block, d_v, v_stride, width, units,
    );
    stage_kept_keys::<F>(key_mask, kept, 0, first, batch, sizes, block);
}

/// Whether index `e` of a pass through `len` elements, `units` at a time (`e = unit +
/// pass · units`), is one of them: always when the units divide `len`, so that such
/// loops run a fixed number of unguarded passes.
#[cube]
fn pass_in_range(e: usize, #[comptime] len: usize, #[comptime] units: usize) -> bool {
    let mut inside = true;
    if comptime!(!len.is_multiple_of(units)) {
        inside = e < len;
    }
    inside
}

/// Sets every element of `tile` to zero, with the cube's `units`.
#[cube]
fn zero_tile(tile: &mut Shared<[f32]>, #[comptime] len: usize, #[comptime] units: usize) {
    for pass in 0..comptime!(len.div_ceil(units)) {
        let e = UNIT_POS as usize + pass * units;
        if pass_in_range(e, len, units) {
            tile[e] = 0.0f32;
        }
    }
}

/// Stores `1` for each of the `block` keys from `first` that is real and unpadded, at
/// `kept_at ..` of `kept`.
#[cube]
pub(super) fn stage_kept_keys<F: Float>(
    key_mask: &Tensor<F>,
    kept: &mut Shared<[u32]>,
    kept_at: usize,
    first: usize,
    batch: usize,
    sizes: &Sizes,
    #[comptime] block: usize,
) {
    let last_key = sizes.seq_k as usize - 1;
    let mut t = UNIT_POS as usize;
    while t < block {
        let key = first + t;
        let mut key_c = key;
        if key > last_key {
            key_c = last_key;
        }
        kept[kept_at + t] = u32::cast_from(key_kept::<F>(key_mask, key, key_c, batch, sizes));
        t += CUBE_DIM as usize;
    }
}

/// `S = Q·Kᵀ` (unscaled) for one `block_q × block_k` tile.
#[cube]
fn tile_scores<F: Float>(
    q_tile: &Shared<[F]>,
    k_tile: &Shared<[F]>,
    scores: &mut Shared<[f32]>,
    #[comptime] config: StagedConfig,
) {
    let shape = comptime!(ProductShape::new(
        config.block_q,
        config.block_k,
        config.d_qk,
        Operand::rows(config.d_qk),
        Operand::transposed(config.d_qk),
        false
    ));
    tile_product::<F>(q_tile, k_tile, scores, shape, config.product);
}

/// `dP = dO·Vᵀ` for one `block_q × block_k` tile.
#[cube]
fn tile_output_gradient_scores<F: Float>(
    do_tile: &Shared<[F]>,
    v_tile: &Shared<[F]>,
    dp: &mut Shared<[f32]>,
    #[comptime] config: StagedConfig,
) {
    let shape = comptime!(ProductShape::new(
        config.block_q,
        config.block_k,
        config.d_v,
        Operand::rows(config.d_v),
        Operand::transposed(config.d_v),
        false
    ));
    tile_product::<F>(do_tile, v_tile, dp, shape, config.product);
}

/// The keys `[start, end)` that the `rows` query rows from `first_row` may see, cut to
/// the share of key split `CUBE_POS_Z` (flash-decoding: split `z` takes the keys from
/// `z·split_keys`; one split covers every key).
#[cube]
pub(super) fn split_key_range(
    first_row: usize,
    rows: usize,
    split_keys: u32,
    sizes: &Sizes,
    #[comptime] terms: ScoreTerms,
) -> (i32, i32) {
    let (mut start, mut end) = key_range(first_row, rows, sizes, terms);
    let split_first = i32::cast_from(CUBE_POS_Z as usize * split_keys as usize);
    let split_end = split_first + i32::cast_from(split_keys);
    if split_first > start {
        start = split_first;
    }
    if split_end < end {
        end = split_end;
    }
    (start, end)
}

/// Forward: `O = softmax(q·kᵀ·scale + mask)·v` and the per-row log-sum-exp.
///
/// Cube `(x, y, z)`: query rows `x·block_q ..` of head `y` (flattened `batch·heads`),
/// over the keys `z·split_keys ..` of split `z` (flash-decoding; `split_keys ≥ seq_k`
/// and one split otherwise). With `partial = 1` each split writes its own normalized
/// output and log-sum-exp (`HIDDEN` for a split that sees no key) at offset
/// `z · batch·heads·seq_q` rows, for [`staged_merge_splits`] to combine; sinks then join
/// in the merge.
#[cube(launch_unchecked)]
#[allow(clippy::too_many_arguments)]
pub fn staged_forward<F: Float>(
    q: &Tensor<F>,
    k: &Tensor<F>,
    v: &Tensor<F>,
    key_mask: &Tensor<F>,
    sinks: &Tensor<f32>,
    out: &mut Tensor<F>,
    lse: &mut Tensor<f32>,
    sizes: Sizes,
    split_keys: u32,
    partial: u32,
    #[comptime] config: StagedConfig,
    #[define(F)] _dtype: ElemType,
) {
    let bq = config.block_q;
    let bk = config.block_k;
    let d_qk = config.d_qk;
    let d_v = config.d_v;
    let seq_q = sizes.seq_q as usize;
    let heads = sizes.heads as usize;
    let unit = UNIT_POS as usize;
    let units = config.units;
    let head = CUBE_POS_Y as usize;
    let (batch, kv_head) = kv_head_of(head, &sizes);
    let shift = i32::cast_from(sizes.seq_k) - i32::cast_from(sizes.seq_q);
    let terms = comptime!(config.terms());
    let slope = alibi_slope(head, &sizes, terms);
    let first_row = CUBE_POS_X as usize * bq;
    let (kv_start, kv_end) = split_key_range(first_row, bq, split_keys, &sizes, terms);
    // Rows of one split's output: every row of every head.
    let split_row = CUBE_POS_Z as usize * CUBE_COUNT_Y as usize * seq_q;

    let mut q_tile = shared_tile::<F>(bq * d_qk);
    let mut k_tile = shared_tile::<F>(bk * d_qk);
    let mut v_tile = shared_tile::<F>(bk * d_v);
    let mut scores = shared_tile::<f32>(bq * bk);
    let mut probs = shared_tile::<F>(bq * bk);
    let mut acc = shared_tile::<f32>(bq * d_v);
    let mut row_max = shared_tile::<f32>(bq);
    let mut row_sum = shared_tile::<f32>(bq);
    let mut row_scale = shared_tile::<f32>(bq);
    let mut kept = shared_tile::<u32>(bk);

    stage_rows::<F>(
        q,
        &mut q_tile,
        head * seq_q,
        first_row,
        seq_q,
        bq,
        d_qk,
        d_qk,
        config.staging,
        comptime!(None),
    );
    zero_tile(&mut acc, bq * d_v, units);
    for pass in 0..comptime!((bq).div_ceil(units)) {
        let r = unit + pass * units;
        if pass_in_range(r, bq, units) {
            row_max[r] = f32::new(HIDDEN);
            row_sum[r] = 0.0f32;
        }
    }

    let mut start = kv_start;
    while start < kv_end {
        let first = start as usize;
        stage_key_block::<F>(
            k,
            v,
            key_mask,
            &mut k_tile,
            &mut v_tile,
            &mut kept,
            kv_head,
            first,
            batch,
            &sizes,
            bk,
            d_qk,
            d_v,
            d_qk,
            d_v,
            config.staging,
            comptime!(None),
        );
        sync_cube();
        // S = Q·Kᵀ
        tile_scores::<F>(&q_tile, &k_tile, &mut scores, config);
        sync_cube();
        // Online softmax, one unit per row: P for the block, the row's running max
        // and sum, and its accumulator rescaled to the new max.
        for pass in 0..comptime!((bq).div_ceil(units)) {
            let r = unit + pass * units;
            if pass_in_range(r, bq, units) {
                let pos = i32::cast_from(first_row + r) + shift;
                let mut block_max = f32::new(HIDDEN);
                for t in 0..bk {
                    // Keys past `kv_end` belong to the next split (or are hidden anyway).
                    let key = start + t as i32;
                    let visible = kept[t] != 0
                        && key < kv_end
                        && structurally_visible(pos, key, &sizes, terms);
                    let bias = alibi_bias(slope, pos, key, terms);
                    let score = masked_score(
                        scores[r * bk + t] * sizes.scale,
                        bias,
                        visible,
                        &sizes,
                        terms,
                    );
                    scores[r * bk + t] = score;
                    block_max = f32::max(block_max, score);
                }
                let (new_max, correction) = online_max(row_max[r], block_max);
                let mut total = row_sum[r] * correction;
                for t in 0..bk {
                    let p = probability(scores[r * bk + t], 1.0f32, new_max, Exponential::Library);
                    probs[r * bk + t] = F::cast_from(p);
                    total += p;
                }
                row_sum[r] = total;
                row_max[r] = new_max;
                for c in 0..d_v {
                    acc[r * d_v + c] *= correction;
                }
            }
        }
        sync_cube();
        // O += P·V
        tile_product::<F>(
            &probs,
            &v_tile,
            &mut acc,
            comptime!(ProductShape::new(
                bq,
                d_v,
                bk,
                Operand::rows(bk),
                Operand::rows(d_v),
                true
            )),
            config.product,
        );
        sync_cube();
        start += bk as i32;
    }

    // A head's sink joins every row's normalization once, after the keys (see the
    // register-tile forward).
    let mut sink = f32::new(HIDDEN);
    if sizes.sinks != 0 {
        sink = sinks[head % heads];
    }
    for pass in 0..comptime!((bq).div_ceil(units)) {
        let r = unit + pass * units;
        if pass_in_range(r, bq, units) {
            let (inverse, row_lse) = finish_row(row_sum[r], row_max[r], sink, partial, &sizes);
            row_scale[r] = inverse;
            let row = first_row + r;
            if row < seq_q {
                lse[split_row + head * seq_q + row] = row_lse;
            }
        }
    }
    sync_cube();
    for pass in 0..comptime!((bq * d_v).div_ceil(units)) {
        let e = unit + pass * units;
        if pass_in_range(e, bq * d_v, units) {
            let r = e / d_v;
            let row = first_row + r;
            if row < seq_q {
                out[(split_row + head * seq_q + row) * d_v + e - r * d_v] =
                    F::cast_from(acc[e] * row_scale[r]);
            }
        }
    }
}

/// Flash-decoding's merge: the output and log-sum-exp of each row from its splits'
/// (`[splits, rows, d_v]` and `[splits, rows]`, as [`staged_forward`] writes them with
/// `partial = 1`), each split weighted by `exp(LSE_split − LSE)`; a head's sink joins
/// here, once.
///
/// One unit per row.
#[cube(launch_unchecked)]
#[allow(clippy::too_many_arguments)]
pub fn staged_merge_splits<F: Float>(
    partial_out: &Tensor<F>,
    partial_lse: &Tensor<f32>,
    sinks: &Tensor<f32>,
    out: &mut Tensor<F>,
    lse: &mut Tensor<f32>,
    rows: u32,
    splits: u32,
    sizes: Sizes,
    #[comptime] d_v: usize,
    #[define(F)] _dtype: ElemType,
) {
    let row = ABSOLUTE_POS;
    let rows = rows as usize;
    if row < rows {
        let splits = splits as usize;
        let mut max = f32::new(HIDDEN);
        for s in 0..splits {
            max = f32::max(max, partial_lse[s * rows + row]);
        }
        let mut sink = f32::new(HIDDEN);
        if sizes.sinks != 0 {
            let head = row / sizes.seq_q as usize;
            sink = sinks[head % sizes.heads as usize];
            max = f32::max(max, sink);
        }
        let live = max > HIDDEN;
        let mut total = 0.0f32;
        for s in 0..splits {
            let split_lse = partial_lse[s * rows + row];
            total += select(
                live && split_lse > HIDDEN,
                f32::exp(split_lse - max),
                0.0f32,
            );
        }
        if sizes.sinks != 0 {
            total += f32::exp(sink - max);
        }
        let mut row_lse = f32::new(MASKED_ROW_LSE);
        let mut inverse = 0.0f32;
        if total > 0.0f32 {
            row_lse = max + f32::ln(total);
            inverse = 1.0f32 / total;
        }
        lse[row] = row_lse;
        for c in 0..d_v {
            let mut sum = 0.0f32;
            for s in 0..splits {
                let split_lse = partial_lse[s * rows + row];
                let weight = select(
                    live && split_lse > HIDDEN,
                    f32::exp(split_lse - max),
                    0.0f32,
                );
                sum += weight * f32::cast_from(partial_out[(s * rows + row) * d_v + c]);
            }
            out[row * d_v + c] = F::cast_from(sum * inverse);
        }
    }
}

/// Stages `(LSE, D)` of the `block` query rows from `first` of head `head`, and
/// whether each row exists.
#[cube]
#[allow(clippy::too_many_arguments)]
fn stage_row_stats(
    stats: &Tensor<f32>,
    row_lse: &mut Shared<[f32]>,
    row_delta: &mut Shared<[f32]>,
    row_ok: &mut Shared<[u32]>,
    head: usize,
    first: usize,
    seq_q: usize,
    #[comptime] block: usize,
    #[comptime] units: usize,
) {
    for pass in 0..comptime!(block.div_ceil(units)) {
        let t = UNIT_POS as usize + pass * units;
        if pass_in_range(t, block, units) {
            let row = first + t;
            let mut row_c = row;
            if row >= seq_q {
                row_c = seq_q - 1;
            }
            row_lse[t] = stats[(head * seq_q + row_c) * ROW_STATS];
            row_delta[t] = stats[(head * seq_q + row_c) * ROW_STATS + 1];
            row_ok[t] = u32::cast_from(row < seq_q);
        }
    }
}

/// Backward for queries: `dQ = scale·dS·K`, walking keys like the forward.
///
/// Cube `(x, y)`: query rows `x·block_q ..` of head `y` (flattened `batch·heads`).
#[cube(launch_unchecked)]
#[allow(clippy::too_many_arguments)]
pub fn staged_backward_q<F: Float>(
    q: &Tensor<F>,
    k: &Tensor<F>,
    v: &Tensor<F>,
    grad_out: &Tensor<F>,
    stats: &Tensor<f32>,
    key_mask: &Tensor<F>,
    grad_q: &mut Tensor<F>,
    sizes: Sizes,
    #[comptime] config: StagedConfig,
    #[define(F)] _dtype: ElemType,
) {
    let bq = config.block_q;
    let bk = config.block_k;
    let d_qk = config.d_qk;
    let d_v = config.d_v;
    let seq_q = sizes.seq_q as usize;
    let unit = UNIT_POS as usize;
    let units = config.units;
    let head = CUBE_POS_Y as usize;
    let (batch, kv_head) = kv_head_of(head, &sizes);
    let shift = i32::cast_from(sizes.seq_k) - i32::cast_from(sizes.seq_q);
    let terms = comptime!(config.terms());
    let slope = alibi_slope(head, &sizes, terms);
    let first_row = CUBE_POS_X as usize * bq;
    let (kv_start, kv_end) = key_range(first_row, bq, &sizes, terms);

    let mut q_tile = shared_tile::<F>(bq * d_qk);
    let mut do_tile = shared_tile::<F>(bq * d_v);
    let mut k_tile = shared_tile::<F>(bk * d_qk);
    let mut v_tile = shared_tile::<F>(bk * d_v);
    let mut scores = shared_tile::<f32>(bq * bk);
    let mut dp = shared_tile::<f32>(bq * bk);
    let mut ds = shared_tile::<F>(bq * bk);
    let mut dq = shared_tile::<f32>(bq * d_qk);
    let mut row_lse = shared_tile::<f32>(bq);
    let mut row_delta = shared_tile::<f32>(bq);
    let mut row_ok = shared_tile::<u32>(bq);
    let mut kept = shared_tile::<u32>(bk);

    stage_rows::<F>(
        q,
        &mut q_tile,
        head * seq_q,
        first_row,
        seq_q,
        bq,
        d_qk,
        d_qk,
        config.staging,
        comptime!(None),
    );
    stage_rows::<F>(
        grad_out,
        &mut do_tile,
        head * seq_q,
        first_row,
        seq_q,
        bq,
        d_v,
        d_v,
        config.staging,
        comptime!(None),
    );
    stage_row_stats(
        stats,
        &mut row_lse,
        &mut row_delta,
        &mut row_ok,
        head,
        first_row,
        seq_q,
        bq,
        units,
    );
    zero_tile(&mut dq, bq * d_qk, units);

    let mut start = kv_start;
    while start < kv_end {
        let first = start as usize;
        stage_key_block::<F>(
            k,
            v,
            key_mask,
            &mut k_tile,
            &mut v_tile,
            &mut kept,
            kv_head,
            first,
            batch,
            &sizes,
            bk,
            d_qk,
            d_v,
            d_qk,
            d_v,
            config.staging,
            comptime!(None),
        );
        sync_cube();
        // S = Q·Kᵀ and dP = dO·Vᵀ
        tile_scores::<F>(&q_tile, &k_tile, &mut scores, config);
        tile_output_gradient_scores::<F>(&do_tile, &v_tile, &mut dp, config);
        sync_cube();
        // dS = P ∘ (dP − D) ∘ softcap', P = exp(S − LSE) where visible.
        for pass in 0..comptime!((bq * bk).div_ceil(units)) {
            let e = unit + pass * units;
            if pass_in_range(e, bq * bk, units) {
                let t = e / bk;
                let j = e - t * bk;
                let pos = i32::cast_from(first_row + t) + shift;
                let key = start + j as i32;
                let visible = kept[j] != 0 && structurally_visible(pos, key, &sizes, terms);
                let (_, ds_value) = probability_and_gradient(
                    scores[e] * sizes.scale,
                    alibi_bias(slope, pos, key, terms),
                    dp[e],
                    row_lse[t],
                    row_delta[t],
                    visible,
                    &sizes,
                    terms,
                    Exponential::Library,
                );
                ds[e] = F::cast_from(ds_value);
            }
        }
        sync_cube();
        // dQ += dS·K (scaled at the end)
        tile_product::<F>(
            &ds,
            &k_tile,
            &mut dq,
            comptime!(ProductShape::new(
                bq,
                d_qk,
                bk,
                Operand::rows(bk),
                Operand::rows(d_qk),
                true
            )),
            config.product,
        );
        sync_cube();
        start += bk as i32;
    }

    for pass in 0..comptime!((bq * d_qk).div_ceil(units)) {
        let e = unit + pass * units;
        if pass_in_range(e, bq * d_qk, units) {
            let r = e / d_qk;
            let row = first_row + r;
            if row < seq_q && row_ok[r] != 0 {
                grad_q[(head * seq_q + row) * d_qk + e - r * d_qk] =
                    F::cast_from(dq[e] * sizes.scale);
            }
        }
    }
}

/// Backward for keys and values: `dV = Pᵀ·dO`, `dK = scale·dSᵀ·Q`.
///
/// Cube `(x, y)`: keys `x·block_k ..` of key/value head `y` (flattened
/// `batch·kv_heads`); it walks every query head of the group.
#[cube(launch_unchecked)]
#[allow(clippy::too_many_arguments)]
pub fn staged_backward_kv<F: Float>(
    q: &Tensor<F>,
    k: &Tensor<F>,
    v: &Tensor<F>,
    grad_out: &Tensor<F>,
    stats: &Tensor<f32>,
    key_mask: &Tensor<F>,
    grad_k: &mut Tensor<F>,
    grad_v: &mut Tensor<F>,
    sizes: Sizes,
    #[comptime] config: StagedConfig,
    #[define(F)] _dtype: ElemType,
) {
    let bq = config.block_q;
    let bk = config.block_k;
    let d_qk = config.d_qk;
    let d_v = config.d_v;
    let seq_q = sizes.seq_q as usize;
    let seq_k = sizes.seq_k as usize;
    let group = sizes.group as usize;
    let unit = UNIT_POS as usize;
    let units = config.units;
    let kv_head = CUBE_POS_Y as usize;
    let (batch, first_head) = query_heads_of(kv_head, &sizes);
    let shift = i32::cast_from(sizes.seq_k) - i32::cast_from(sizes.seq_q);
    let terms = comptime!(config.terms());
    let first_key = CUBE_POS_X as usize * bk;
    let (row_start, row_end) = row_range(first_key, bk, &sizes, terms);

    let mut k_tile = shared_tile::<F>(bk * d_qk);
    let mut v_tile = shared_tile::<F>(bk * d_v);
    let mut q_tile = shared_tile::<F>(bq * d_qk);
    let mut do_tile = shared_tile::<F>(bq * d_v);
    let mut scores = shared_tile::<f32>(bq * bk);
    let mut dp = shared_tile::<f32>(bq * bk);
    let mut probs = shared_tile::<F>(bq * bk);
    let mut ds = shared_tile::<F>(bq * bk);
    let mut dk = shared_tile::<f32>(bk * d_qk);
    let mut dv = shared_tile::<f32>(bk * d_v);
    let mut row_lse = shared_tile::<f32>(bq);
    let mut row_delta = shared_tile::<f32>(bq);
    let mut row_ok = shared_tile::<u32>(bq);
    let mut kept = shared_tile::<u32>(bk);

    stage_key_block::<F>(
        k,
        v,
        key_mask,
        &mut k_tile,
        &mut v_tile,
        &mut kept,
        kv_head,
        first_key,
        batch,
        &sizes,
        bk,
        d_qk,
        d_v,
        d_qk,
        d_v,
        config.staging,
        comptime!(None),
    );
    zero_tile(&mut dk, bk * d_qk, units);
    zero_tile(&mut dv, bk * d_v, units);

    for g in 0..group {
        let head = first_head + g;
        let slope = alibi_slope(head, &sizes, terms);
        let mut start = row_start;
        while start < row_end {
            let first = start as usize;
            stage_rows::<F>(
                q,
                &mut q_tile,
                head * seq_q,
                first,
                seq_q,
                bq,
                d_qk,
                d_qk,
                config.staging,
                comptime!(None),
            );
            stage_rows::<F>(
                grad_out,
                &mut do_tile,
                head * seq_q,
                first,
                seq_q,
                bq,
                d_v,
                d_v,
                config.staging,
                comptime!(None),
            );
            stage_row_stats(
                stats,
                &mut row_lse,
                &mut row_delta,
                &mut row_ok,
                head,
                first,
                seq_q,
                bq,
                units,
            );
            sync_cube();
            // S = Q·Kᵀ and dP = dO·Vᵀ for `block_q` query rows.
            tile_scores::<F>(&q_tile, &k_tile, &mut scores, config);
            tile_output_gradient_scores::<F>(&do_tile, &v_tile, &mut dp, config);
            sync_cube();
            // P = exp(S − LSE) where visible; dS = P ∘ (dP − D) ∘ softcap'.
            for pass in 0..comptime!((bq * bk).div_ceil(units)) {
                let e = unit + pass * units;
                if pass_in_range(e, bq * bk, units) {
                    let t = e / bk;
                    let j = e - t * bk;
                    let pos = start + t as i32 + shift;
                    let key = i32::cast_from(first_key + j);
                    let visible = row_ok[t] != 0
                        && kept[j] != 0
                        && structurally_visible(pos, key, &sizes, terms);
                    let (p, ds_value) = probability_and_gradient(
                        scores[e] * sizes.scale,
                        alibi_bias(slope, pos, key, terms),
                        dp[e],
                        row_lse[t],
                        row_delta[t],
                        visible,
                        &sizes,
                        terms,
                        Exponential::Library,
                    );
                    probs[e] = F::cast_from(p);
                    ds[e] = F::cast_from(ds_value);
                }
            }
            sync_cube();
            // dV += Pᵀ·dO and dK += dSᵀ·Q (scaled at the end).
            tile_product::<F>(
                &probs,
                &do_tile,
                &mut dv,
                comptime!(ProductShape::new(
                    bk,
                    d_v,
                    bq,
                    Operand::transposed(bk),
                    Operand::rows(d_v),
                    true
                )),
                config.product,
            );
            tile_product::<F>(
                &ds,
                &q_tile,
                &mut dk,
                comptime!(ProductShape::new(
                    bk,
                    d_qk,
                    bq,
                    Operand::transposed(bk),
                    Operand::rows(d_qk),
                    true
                )),
                config.product,
            );
            sync_cube();
            start += bq as i32;
        }
    }

    for pass in 0..comptime!((bk * d_qk).div_ceil(units)) {
        let e = unit + pass * units;
        if pass_in_range(e, bk * d_qk, units) {
            let r = e / d_qk;
            let key = first_key + r;
            if key < seq_k {
                grad_k[(kv_head * seq_k + key) * d_qk + e - r * d_qk] =
                    F::cast_from(dk[e] * sizes.scale);
            }
        }
    }
    for pass in 0..comptime!((bk * d_v).div_ceil(units)) {
        let e = unit + pass * units;
        if pass_in_range(e, bk * d_v, units) {
            let r = e / d_v;
            let key = first_key + r;
            if key < seq_k {
                grad_v[(kv_head * seq_k + key) * d_v + e - r * d_v] = F::cast_from(dv[e]);
            }
        }
    }
}
