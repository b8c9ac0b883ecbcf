//! The fragment kernels: FlashAttention-2 with the scores, the output and the
//! gradients in registers, as the fragments of a plane's matrix products
//! ([`fragment_product`]: tensor cores on GPUs, an emulation elsewhere).
//!
//! Forward: a cube of `planes` planes owns `16·planes` query rows of one head, and
//! each plane 16 of them. The cube stages its `Q` rows in shared memory once; per tile
//! of `block` keys, it stages `K` and `V` there, and each plane computes its rows'
//! scores `S = Q·Kᵀ` (reading its `Q` fragments from the staged rows as it goes),
//! masks them, runs the online softmax on them where they lie (the four lanes of a
//! quad hold a row between them, so a row's max is two shuffles on a GPU), and adds
//! `P·V` to its output accumulator, `P` going from the scores' registers straight into
//! the product's left factor (rescaling the accumulator first unless no row of the
//! plane has a new max). Shared memory holds only the staged tiles; nothing of `S`,
//! `P` or `O` goes through it.
//!
//! `Q` is read again per tile rather than held in registers for the whole walk (as
//! FlashAttention-2 does too): held, its fragments take `d_qk / 4` registers a lane
//! (32 at head dim 128) through every product; re-read, they cost one `ldmatrix` per
//! 16 columns per tile. When the forward took 168 registers at head dim 128, holding
//! them kept a third cube of 128 units off each SM; at 134 both would fit 3 cubes.
//!
//! Backward (after the pre-pass that writes `(LSE, D)` per query row):
//! - dQ: the forward's walk, with `dP = dO·Vᵀ` beside `S` and `dQ += dS·K`, `Q` and
//!   `dO` staged once like the forward's `Q`;
//! - dK/dV: each plane owns 16 keys and computes the transposed `Sᵀ = K·Qᵀ` and
//!   `dPᵀ = V·dOᵀ`, so that `Pᵀ` and `dSᵀ` are the left factors of `dV += Pᵀ·dO` and
//!   `dK += dSᵀ·Q` in registers (FlashAttention-2's order). Each key's gradients are
//!   summed by one plane in a fixed order: no atomics, deterministic;
//! - or, in the one-pass backward (`FragmentConfig::adds_dq`), dK/dV alone: it also
//!   stages each tile's `dS` and adds `dS·K` to f32 sums of `dQ` atomically (5 matrix
//!   products per tile instead of 7; `dQ` no longer bitwise reproducible), and
//!   [`fragment_finish_dq`] scales and casts the sums.
//!
//! With [`TileCopies::Overlapped`], each tile a kernel streams (the forward's and dQ's
//! keys, dK/dV's query rows) travels while the planes compute on the tile before
//! (FlashAttention-2's schedule; `cp.async` on CUDA), the backward's into second
//! buffers; the one-pass dK/dV copies its tiles together.
//!
//! The masks, soft-cap, sinks, flash-decoding's key splits (`partial` outputs for
//! [`staged_merge_splits`](super::staged::staged_merge_splits)) and the hidden-score
//! conventions are the other families', through the same helpers (`softmax.rs`); the
//! parity grid checks every family against the oracle. `P` and `dS` are rounded to the
//! input type before their products, as in the staged kernels.

use cubecl::prelude::*;

use super::fragment::{
    C_PAIRS, EMULATION_SCRATCH, FragmentLoads, FragmentOps, LANES, Pair, TILE_K, TILE_M, TILE_N,
    accumulate_products, c_position, fragment_lane, plane_agrees, quad_max, quad_sum,
    staged_column_products, staged_row_products, zero_fragments,
};
use super::row_stats::ROW_STATS;
use super::sizes::{
    HIDDEN, ScoreTerms, Sizes, alibi_bias, alibi_slope, block_open, key_range, kv_head_of,
    query_heads_of, row_range, seeing_positions, structurally_visible,
};
use super::softmax::{
    Exponential, finish_row, masked_score, online_max, open_probability_and_gradient, open_score,
    probability, probability_and_gradient,
};
use super::staged::{
    shared_tile, split_key_range, stage_kept_keys, stage_key_block, stage_rows, stage_rows_copying,
    wait_for_copies,
};

/// Elements that pad each row of the staged `K` and `V` tiles: 16 bytes of f16/bf16,
/// so that the 8 rows one fragment load reads from start 4 banks apart and its 32
/// lanes hit 32 different banks.
pub const ROW_PAD: usize = 8;

/// How the fragment kernels move the tiles they stream into shared memory: the forward
/// and dQ kernels their tiles of keys (`K`, `V`), dK/dV its tiles of query rows (`Q`,
/// `dO` and their `(LSE, D)`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum TileCopies {
    /// The cube copies a tile, waits, computes on it, and waits again before the next
    /// tile's copies: its planes compute nothing while a tile is on its way.
    Together,
    /// FlashAttention-2's overlap: each copy travels while the planes compute. The
    /// forward starts copying a tile's `V` before it computes the tile's scores, and
    /// the next tile's `K` before it runs the tile's softmax and `P·V`, with two waits a
    /// tile as [`Self::Together`], in the same shared tiles. dQ reads a tile's keys
    /// until its last product, so it copies the next tile's `K` (during `dP`, `dS` and
    /// `dS·K`) into a second buffer. dK/dV reads a tile's `Q` and `dO` until its last
    /// products too, and copies the whole next tile into second buffers as soon as
    /// every plane is done with the tile before, so it waits once a tile. With
    /// `asynchronous`, the copies are CUDA's `cp.async` (sm_80 and later, 16-byte
    /// vectors), which go from global to shared memory without the units' registers;
    /// without, each unit copies through its registers in the same order, which gains
    /// nothing but checks the order on runtimes without asynchronous copies.
    Overlapped {
        /// Whether the copies are `cp.async`.
        asynchronous: bool,
    },
}

impl TileCopies {
    /// Whether the copies overlap the computation.
    pub fn overlapped(self) -> bool {
        matches!(self, Self::Overlapped { .. })
    }

    /// Whether the copies are `cp.async`.
    pub fn asynchronous(self) -> bool {
        self == Self::Overlapped { asynchronous: true }
    }
}

/// Compile-time shape of one fragment launch.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct FragmentConfig {
    /// Planes per cube, each owning `16·row_tiles` rows: query rows (forward, dQ) or
    /// keys (dK/dV).
    pub planes: usize,
    /// 16-row tiles each plane owns: 1, or 2 in the wide forward (the backward kernels
    /// own one). With two, every `B` fragment a plane loads from shared memory serves
    /// two products, at the cost of twice the accumulator and score registers.
    pub row_tiles: usize,
    /// Rows per staged tile the cube walks (a multiple of 16): keys (forward, dQ) or
    /// query rows (dK/dV).
    pub block: usize,
    /// Query/key head dim (a multiple of 16).
    pub d_qk: usize,
    /// Value head dim (a multiple of 8; of 16 for the backward).
    pub d_v: usize,
    /// How the fragment products and quad reductions run.
    pub ops: FragmentOps,
    /// How lanes load their fragments of the tiles staged in shared memory.
    pub loads: FragmentLoads,
    /// Elements a unit copies at once when it stages rows (a divisor of [`ROW_PAD`];
    /// see [`stage_rows`]).
    pub staging: usize,
    /// How the scores' exponentials are taken.
    pub exponential: Exponential,
    /// How the tiles the kernel streams reach shared memory.
    pub copies: TileCopies,
    /// The dK/dV kernel only: whether it also forms each tile's share of `dQ` and adds
    /// it to an f32 buffer atomically (the one-pass backward), in place of the dQ
    /// kernel's second walk.
    pub adds_dq: bool,
    /// Whether the kernel soft-caps its scores (calls with a soft-cap; see
    /// [`cap_score`](super::sizes::cap_score)). The cap's `tanh` and derivative in
    /// every unrolled score of the masked blocks made up about half of each key loop's
    /// instructions (ptxas, sm_90) and moved the register allocation of the whole
    /// kernel, so a call without a cap, the common case, runs kernels compiled
    /// without it.
    pub softcap: bool,
    /// Whether the kernel adds ALiBi's bias to its scores (calls with ALiBi; see
    /// [`alibi_bias`]), for the same reason as [`Self::softcap`].
    pub alibi: bool,
    /// Whether the mask has chunks ([`ScoreTerms::chunk`]).
    pub chunked: bool,
}

impl FragmentConfig {
    /// The terms this kernel's scores take.
    pub fn terms(&self) -> ScoreTerms {
        ScoreTerms {
            cap: self.softcap,
            alibi: self.alibi,
            chunk: self.chunked,
        }
    }

    /// Rows a plane owns.
    pub fn plane_rows(&self) -> usize {
        TILE_M * self.row_tiles
    }

    /// Rows a cube owns.
    pub fn rows(&self) -> usize {
        self.plane_rows() * self.planes
    }

    /// Units per cube.
    pub fn units(&self) -> usize {
        LANES * self.planes
    }

    /// Elements per staged row of `Q` or `K`.
    pub fn qk_stride(&self) -> usize {
        self.d_qk + ROW_PAD
    }

    /// Elements per staged row of `V` or `dO`.
    pub fn v_stride(&self) -> usize {
        self.d_v + ROW_PAD
    }

    /// Shared f32 elements of the emulated operations.
    fn emulation(&self) -> usize {
        match self.ops {
            FragmentOps::Emulated | FragmentOps::EmulatedSplitTf32 => {
                self.planes * EMULATION_SCRATCH
            }
            FragmentOps::TensorCores | FragmentOps::SplitTf32 => 0,
        }
    }

    /// Shared-memory bytes of the forward for inputs of `elem` bytes: its `Q` rows, the
    /// key tiles and which keys are kept.
    pub fn forward_bytes(&self, elem: usize) -> usize {
        elem * (self.rows() * self.qk_stride() + self.block * (self.qk_stride() + self.v_stride()))
            + 4 * (self.block + self.emulation())
    }

    /// Shared-memory bytes of the dQ kernel: the forward's, with the rows of `dO`, and
    /// where it overlaps its copies a second tile of keys and of which are kept.
    pub fn backward_q_bytes(&self, elem: usize) -> usize {
        let second_keys = if self.copies.overlapped() {
            elem * self.block * self.qk_stride() + 4 * self.block
        } else {
            0
        };
        self.forward_bytes(elem) + elem * self.rows() * self.v_stride() + second_keys
    }

    /// Elements per staged row of the one-pass backward's `dS` tile: a query row's
    /// gradients against the cube's keys.
    pub fn ds_stride(&self) -> usize {
        self.rows() + ROW_PAD
    }

    /// Shared-memory bytes of the dK/dV kernel: its keys' rows of `K` and `V` and which
    /// are kept, and a tile of query rows' `Q`, `dO` and `(LSE, D)`, two where it
    /// overlaps its copies (and the one-pass backward's `dS` tile where it adds `dQ`).
    pub fn backward_kv_bytes(&self, elem: usize) -> usize {
        let ds = if self.adds_dq {
            self.block * self.ds_stride()
        } else {
            0
        };
        let query_buffers = if self.copies.overlapped() { 2 } else { 1 };
        let keys = elem * self.rows() * (self.qk_stride() + self.v_stride()) + 4 * self.rows();
        let queries =
            elem * self.block * (self.qk_stride() + self.v_stride()) + 4 * ROW_STATS * self.block;
        keys + query_buffers * queries + elem * ds + 4 * self.emulation()
    }
}

/// The fragment kernels' configurations for one problem on one device: the forward,
/// and the backward's dQ and dK/dV kernels where their tiles fit (else the staged
/// backward runs).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct FragmentTiling {
    /// The forward kernel.
    pub forward: FragmentConfig,
    /// The dQ and dK/dV kernels.
    pub backward: Option<(FragmentConfig, FragmentConfig)>,
}

/// A shared scratch of `len` f32 elements for the emulated operations (one element
/// where they do not run).
#[cube]
fn emulation_scratch(#[comptime] len: usize) -> Shared<[f32]> {
    shared_tile::<f32>(comptime!(len.max(1)))
}

/// Copies the `config.block` keys from `first` of key/value head `kv_head` with
/// `config.copies`: their rows of `k` into `k_tile` from element `tile_at`, and which
/// of them are kept into `kept` from `kept_at`.
#[cube]
#[allow(clippy::too_many_arguments)]
fn copy_keys<F: Float>(
    k: &Tensor<F>,
    key_mask: &Tensor<F>,
    k_tile: &mut Shared<[F]>,
    tile_at: usize,
    kept: &mut Shared<[u32]>,
    kept_at: usize,
    kv_head: usize,
    first: usize,
    batch: usize,
    sizes: &Sizes,
    #[comptime] config: FragmentConfig,
) {
    let seq_k = sizes.seq_k as usize;
    stage_rows_copying::<F>(
        k,
        k_tile,
        tile_at,
        kv_head * seq_k,
        first,
        seq_k,
        config.block,
        config.d_qk,
        comptime!(config.qk_stride()),
        config.staging,
        comptime!(Some(config.units())),
        comptime!(config.copies.asynchronous()),
    );
    stage_kept_keys::<F>(key_mask, kept, kept_at, first, batch, sizes, config.block);
}

/// The start of the key tile from `first`: with overlapped copies, waits until its
/// keys have landed and every plane is done with the last tile, then starts copying
/// its values, which travel while the planes compute the scores; otherwise copies its
/// keys, values and kept keys and waits for them.
#[cube]
#[allow(clippy::too_many_arguments)]
fn begin_key_tile<F: Float>(
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
    #[comptime] config: FragmentConfig,
) {
    if comptime!(config.copies.overlapped()) {
        wait_for_copies(comptime!(config.copies.asynchronous()));
        let seq_k = sizes.seq_k as usize;
        stage_rows_copying::<F>(
            v,
            v_tile,
            0,
            kv_head * seq_k,
            first,
            seq_k,
            config.block,
            config.d_v,
            comptime!(config.v_stride()),
            config.staging,
            comptime!(Some(config.units())),
            comptime!(config.copies.asynchronous()),
        );
    } else {
        stage_key_block::<F>(
            k,
            v,
            key_mask,
            k_tile,
            v_tile,
            kept,
            kv_head,
            first,
            batch,
            sizes,
            config.block,
            config.d_qk,
            config.d_v,
            comptime!(config.qk_stride()),
            comptime!(config.v_stride()),
            config.staging,
            comptime!(Some(config.units())),
        );
        sync_cube();
    }
}

/// With overlapped copies, once the planes are done with a tile's keys where the next
/// tile's go: waits until the tile's values have landed (and every plane is there),
/// then starts copying the keys from `next`, if any before `kv_end`, into `k_tile`
/// from `tile_at` and `kept` from `kept_at` ([`copy_keys`]).
#[cube]
#[allow(clippy::too_many_arguments)]
fn overlap_next_keys<F: Float>(
    k: &Tensor<F>,
    key_mask: &Tensor<F>,
    k_tile: &mut Shared<[F]>,
    tile_at: usize,
    kept: &mut Shared<[u32]>,
    kept_at: usize,
    kv_head: usize,
    next: i32,
    kv_end: i32,
    batch: usize,
    sizes: &Sizes,
    #[comptime] config: FragmentConfig,
) {
    wait_for_copies(comptime!(config.copies.asynchronous()));
    if next < kv_end {
        copy_keys::<F>(
            k,
            key_mask,
            k_tile,
            tile_at,
            kept,
            kept_at,
            kv_head,
            next as usize,
            batch,
            sizes,
            config,
        );
    }
}

/// Copies the dK/dV kernel's `config.block` query rows from `first` of head `head`
/// into buffer `buffer` of its query tiles with `config.copies`: their rows of `q` and
/// `grad_out`, and their `(LSE, D)` from `stats` (rows past the end repeat the last,
/// as [`stage_rows`] copies them; the kernel masks them).
#[cube]
#[allow(clippy::too_many_arguments)]
fn copy_query_rows<F: Float>(
    q: &Tensor<F>,
    grad_out: &Tensor<F>,
    stats: &Tensor<f32>,
    q_tile: &mut Shared<[F]>,
    do_tile: &mut Shared<[F]>,
    row_stats: &mut Shared<[f32]>,
    buffer: usize,
    head: usize,
    first: usize,
    seq_q: usize,
    #[comptime] config: FragmentConfig,
) {
    let bq = config.block;
    let units = comptime!(Some(config.units()));
    let asynchronous = comptime!(config.copies.asynchronous());
    let head_row = head * seq_q;
    stage_rows_copying::<F>(
        q,
        q_tile,
        buffer * comptime!(bq * config.qk_stride()),
        head_row,
        first,
        seq_q,
        bq,
        config.d_qk,
        comptime!(config.qk_stride()),
        config.staging,
        units,
        asynchronous,
    );
    // A row's two statistics as one vector where the runtime reads vectors (8 bytes: a
    // `cp.async` of its own).
    let stats_width = comptime!(if config.staging > 1 { ROW_STATS } else { 1 });
    stage_rows_copying::<f32>(
        stats,
        row_stats,
        buffer * comptime!(bq * ROW_STATS),
        head_row,
        first,
        seq_q,
        bq,
        ROW_STATS,
        ROW_STATS,
        stats_width,
        units,
        asynchronous,
    );
    stage_rows_copying::<F>(
        grad_out,
        do_tile,
        buffer * comptime!(bq * config.v_stride()),
        head_row,
        first,
        seq_q,
        bq,
        config.d_v,
        comptime!(config.v_stride()),
        config.staging,
        units,
        asynchronous,
    );
}

/// Forward: `O = softmax(q·kᵀ·scale + mask)·v` and the per-row log-sum-exp, as
/// [`staged_forward`](super::staged::staged_forward) computes them (same arguments,
/// same outputs, same key splits).
///
/// Cube `(x, y, z)`: query rows `x·16·planes ..` of head `y` (flattened
/// `batch·heads`), over the keys of split `z`, `config.block` keys a tile.
#[cube(launch_unchecked)]
#[allow(clippy::too_many_arguments)]
pub fn fragment_forward<F: Float>(
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
    #[comptime] config: FragmentConfig,
    #[define(F)] _dtype: ElemType,
) {
    let block_q = comptime!(config.rows());
    let plane_rows = comptime!(config.plane_rows());
    let row_tiles = config.row_tiles;
    let bk = config.block;
    let d_qk = config.d_qk;
    let d_v = config.d_v;
    let k_stride = comptime!(config.qk_stride());
    let v_stride = comptime!(config.v_stride());
    // Fragments along each product: Q's column chunks, score tiles, key chunks of
    // P·V, output tiles (each per row tile).
    let q_chunks = comptime!(d_qk / TILE_K);
    let score_tiles = comptime!(bk / TILE_N);
    let key_chunks = comptime!(bk / TILE_K);
    let out_tiles = comptime!(d_v / TILE_N);
    // The lane's rows: pair `p` of row tile `m` is row `m·2 + p` of these.
    let lane_rows = comptime!(row_tiles * C_PAIRS);
    let ops = config.ops;
    // Unrolled with tensor cores (constant indices keep the fragments in registers),
    // loops in the emulation (see `fragment_product`).
    let unrolled = comptime!(ops.on_plane_instructions());

    let seq_q = sizes.seq_q as usize;
    let heads = sizes.heads as usize;
    let lane = fragment_lane();
    let plane = UNIT_POS as usize / LANES;
    let head = CUBE_POS_Y as usize;
    let (batch, kv_head) = kv_head_of(head, &sizes);
    let shift = i32::cast_from(sizes.seq_k) - i32::cast_from(sizes.seq_q);
    let terms = comptime!(config.terms());
    let slope = alibi_slope(head, &sizes, terms);
    let first_row = CUBE_POS_X as usize * block_q;
    let (kv_start, kv_end) = split_key_range(first_row, block_q, split_keys, &sizes, terms);
    // Rows of one split's output: every row of every head.
    let split_row = CUBE_POS_Z as usize * CUBE_COUNT_Y as usize * seq_q;
    let plane_row = first_row + plane * plane_rows;
    // Absolute position of the plane's first query row.
    let plane_pos = i32::cast_from(plane_row) + shift;

    let mut q_tile = shared_tile::<F>(block_q * k_stride);
    let mut k_tile = shared_tile::<F>(bk * k_stride);
    let mut v_tile = shared_tile::<F>(bk * v_stride);
    let mut kept = shared_tile::<u32>(bk);
    let mut scratch = emulation_scratch(comptime!(config.emulation()));

    // The cube's Q rows, read as A fragments per key tile (the first tile's barrier
    // orders this copy before every read).
    stage_rows::<F>(
        q,
        &mut q_tile,
        head * seq_q,
        first_row,
        seq_q,
        block_q,
        d_qk,
        k_stride,
        config.staging,
        comptime!(Some(config.units())),
    );

    // The output accumulator (C fragments, one per 8 value columns and row tile) and,
    // per lane row, the running max and this lane's share of the row's sum.
    let mut acc = zero_fragments(comptime!(row_tiles * out_tiles), unrolled);
    let mut row_max = Array::<f32>::new(lane_rows);
    let mut row_sum = Array::<f32>::new(lane_rows);
    #[unroll(unrolled)]
    for i in 0..lane_rows {
        row_max[i] = f32::new(HIDDEN);
        row_sum[i] = 0.0f32;
    }

    let overlapped = comptime!(config.copies.overlapped());
    if overlapped && kv_start < kv_end {
        // The first tile's keys; each later tile's are copied during the one before.
        copy_keys::<F>(
            k,
            key_mask,
            &mut k_tile,
            0,
            &mut kept,
            0,
            kv_head,
            kv_start as usize,
            batch,
            &sizes,
            config,
        );
    }

    let mut start = kv_start;
    while start < kv_end {
        begin_key_tile::<F>(
            k,
            v,
            key_mask,
            &mut k_tile,
            &mut v_tile,
            &mut kept,
            kv_head,
            start as usize,
            batch,
            &sizes,
            config,
        );

        // S = Q·Kᵀ, one C fragment per 8 keys and row tile.
        let mut scores = staged_row_products::<F>(
            &q_tile,
            plane * plane_rows,
            &k_tile,
            0usize,
            row_tiles,
            q_chunks,
            score_tiles,
            k_stride,
            &mut scratch,
            ops,
            config.loads,
        );

        // Each row's max over the block, scaled, and in a block with masks the scores
        // themselves scaled and masked.
        let mut block_max = Array::<f32>::new(lane_rows);
        #[unroll(unrolled)]
        for i in 0..lane_rows {
            block_max[i] = f32::new(HIDDEN);
        }
        // Keys past `kv_end` belong to the next split (or are hidden anyway). An open
        // block's scores stay unscaled: with a positive scale the max of the products
        // scaled is the scaled max, and the scale joins each exponential's multiply-add
        // (FlashAttention-2's order), so a score costs a max, a multiply-add and an
        // exponential.
        let open = sizes.scale > 0.0f32
            && block_open(plane_pos, plane_rows, start, bk, kv_end, &sizes, terms);
        // The scale the probabilities still apply to the scores.
        let mut score_scale = 1.0f32;
        if open {
            score_scale = sizes.scale;
            #[unroll(unrolled)]
            for m in 0..row_tiles {
                #[unroll(unrolled)]
                for j in 0..score_tiles {
                    #[unroll(unrolled)]
                    for p in 0..C_PAIRS {
                        let pair = scores[(m * score_tiles + j) * C_PAIRS + p];
                        #[unroll]
                        for e in 0..2usize {
                            block_max[m * C_PAIRS + p] =
                                f32::max(block_max[m * C_PAIRS + p], pair.extract(e));
                        }
                    }
                }
            }
            #[unroll(unrolled)]
            for i in 0..lane_rows {
                block_max[i] = open_score(block_max[i] * sizes.scale);
            }
        } else {
            #[unroll(unrolled)]
            for m in 0..row_tiles {
                #[unroll(unrolled)]
                for j in 0..score_tiles {
                    #[unroll(unrolled)]
                    for p in 0..C_PAIRS {
                        let at = (m * score_tiles + j) * C_PAIRS + p;
                        let mut pair = scores[at];
                        #[unroll]
                        for e in 0..2 {
                            let (r, col) = c_position(lane, (2 * p + e) as u32);
                            let t = j * TILE_N + col;
                            let pos = plane_pos + (m * TILE_M + r) as i32;
                            let key = start + t as i32;
                            let visible = kept[t] != 0
                                && key < kv_end
                                && structurally_visible(pos, key, &sizes, terms);
                            let score = masked_score(
                                pair.extract(e) * sizes.scale,
                                alibi_bias(slope, pos, key, terms),
                                visible,
                                &sizes,
                                terms,
                            );
                            pair.insert(e, score);
                            block_max[m * C_PAIRS + p] =
                                f32::max(block_max[m * C_PAIRS + p], score);
                        }
                        scores[at] = pair;
                    }
                }
            }
        }
        if overlapped {
            // Every plane is done with this tile's K and which of its keys are kept:
            // the next tile's take their place while the planes run the softmax and
            // P·V.
            overlap_next_keys::<F>(
                k,
                key_mask,
                &mut k_tile,
                0,
                &mut kept,
                0,
                kv_head,
                start + bk as i32,
                kv_end,
                batch,
                &sizes,
                config,
            );
        }
        // The online softmax per row: the quad's max, the rescaling of what the lane
        // summed and accumulated so far, and P, rounded to the input type.
        let mut corrections = Array::<f32>::new(lane_rows);
        let mut maxima_kept = true;
        #[unroll(unrolled)]
        for i in 0..lane_rows {
            let max = quad_max(block_max[i], &mut scratch, ops);
            let (new_max, correction) = online_max(row_max[i], max);
            maxima_kept = maxima_kept && new_max == row_max[i];
            row_max[i] = new_max;
            row_sum[i] *= correction;
            corrections[i] = correction;
        }
        // Where no row of the plane has a new max, every factor is 1: the plane skips
        // the accumulator's rescaling (`d_v / 2` multiplies a lane per row tile), as
        // it does in most tiles once a row has seen its largest scores.
        if !plane_agrees(maxima_kept, &mut scratch, ops) {
            #[unroll(unrolled)]
            for m in 0..row_tiles {
                #[unroll(unrolled)]
                for p in 0..C_PAIRS {
                    let factor = Pair::<f32>::new(corrections[m * C_PAIRS + p]);
                    #[unroll(unrolled)]
                    for n in 0..out_tiles {
                        acc[(m * out_tiles + n) * C_PAIRS + p] *= factor;
                    }
                }
            }
        }
        let mut probabilities = Array::<Pair<F>>::new(comptime!(row_tiles * score_tiles * C_PAIRS));
        #[unroll(unrolled)]
        for m in 0..row_tiles {
            #[unroll(unrolled)]
            for p in 0..C_PAIRS {
                let i = m * C_PAIRS + p;
                let new_max = row_max[i];
                #[unroll(unrolled)]
                for j in 0..score_tiles {
                    let at = (m * score_tiles + j) * C_PAIRS + p;
                    let mut pair = scores[at];
                    #[unroll]
                    for e in 0..2usize {
                        let prob =
                            probability(pair.extract(e), score_scale, new_max, config.exponential);
                        pair.insert(e, prob);
                        row_sum[i] += prob;
                    }
                    probabilities[at] = Pair::<F>::cast_from(pair);
                }
            }
        }

        // O += P·V, 16 keys at a time.
        accumulate_products::<F>(
            &probabilities,
            &v_tile,
            0usize,
            row_tiles,
            key_chunks,
            out_tiles,
            v_stride,
            &mut acc,
            &mut scratch,
            ops,
            config.loads,
        );
        if !overlapped {
            sync_cube();
        }
        start += bk as i32;
    }

    let mut sink = f32::new(HIDDEN);
    if sizes.sinks != 0 {
        sink = sinks[head % heads];
    }
    #[unroll(unrolled)]
    for m in 0..row_tiles {
        #[unroll(unrolled)]
        for p in 0..C_PAIRS {
            let i = m * C_PAIRS + p;
            // The row's sum: the quad's shares.
            let total = quad_sum(row_sum[i], &mut scratch, ops);
            let (inverse, row_lse) = finish_row(total, row_max[i], sink, partial, &sizes);
            let (r, _) = c_position(lane, (2 * p) as u32);
            let row = plane_row + m * TILE_M + r;
            if row < seq_q {
                if lane.is_multiple_of(4) {
                    lse[split_row + head * seq_q + row] = row_lse;
                }
                #[unroll(unrolled)]
                for n in 0..out_tiles {
                    let pair = acc[(m * out_tiles + n) * C_PAIRS + p];
                    #[unroll]
                    for e in 0..2 {
                        let (_, col) = c_position(lane, (2 * p + e) as u32);
                        out[(split_row + head * seq_q + row) * d_v + n * TILE_N + col] =
                            F::cast_from(pair.extract(e) * inverse);
                    }
                }
            }
        }
    }
}

/// Backward for queries: `dQ = scale·dS·K`, walking keys like the forward, with `Q`,
/// `dO`, the scores `S = Q·Kᵀ`, `dP = dO·Vᵀ` and the accumulator `dQ` in registers;
/// `dS` passes from the registers of `dP` into the left factor of `dS·K`.
///
/// Cube `(x, y)`: query rows `x·16·planes ..` of head `y` (flattened `batch·heads`),
/// `config.block` keys a tile.
#[cube(launch_unchecked)]
#[allow(clippy::too_many_arguments)]
pub fn fragment_backward_q<F: Float>(
    q: &Tensor<F>,
    k: &Tensor<F>,
    v: &Tensor<F>,
    grad_out: &Tensor<F>,
    stats: &Tensor<f32>,
    key_mask: &Tensor<F>,
    grad_q: &mut Tensor<F>,
    sizes: Sizes,
    #[comptime] config: FragmentConfig,
    #[define(F)] _dtype: ElemType,
) {
    let block_q = comptime!(config.rows());
    let bk = config.block;
    let d_qk = config.d_qk;
    let d_v = config.d_v;
    let k_stride = comptime!(config.qk_stride());
    let v_stride = comptime!(config.v_stride());
    let q_chunks = comptime!(d_qk / TILE_K);
    let v_chunks = comptime!(d_v / TILE_K);
    let score_tiles = comptime!(bk / TILE_N);
    let key_chunks = comptime!(bk / TILE_K);
    let grad_tiles = comptime!(d_qk / TILE_N);
    let ops = config.ops;
    let unrolled = comptime!(ops.on_plane_instructions());

    let seq_q = sizes.seq_q as usize;
    let lane = fragment_lane();
    let plane = UNIT_POS as usize / LANES;
    let head = CUBE_POS_Y as usize;
    let (batch, kv_head) = kv_head_of(head, &sizes);
    let shift = i32::cast_from(sizes.seq_k) - i32::cast_from(sizes.seq_q);
    let terms = comptime!(config.terms());
    let slope = alibi_slope(head, &sizes, terms);
    let first_row = CUBE_POS_X as usize * block_q;
    let (kv_start, kv_end) = key_range(first_row, block_q, &sizes, terms);
    let plane_row = first_row + plane * TILE_M;
    let plane_pos = i32::cast_from(plane_row) + shift;

    let mut q_tile = shared_tile::<F>(block_q * k_stride);
    let mut do_tile = shared_tile::<F>(block_q * v_stride);
    // With overlapped copies the key tiles take turns in two buffers: a tile's keys
    // are read until its last product (dQ += dS·K), so the next tile's cannot be
    // copied over them while that product runs.
    let overlapped = comptime!(config.copies.overlapped());
    let key_buffers = comptime!(if overlapped { 2 } else { 1 });
    let key_tile_len = comptime!(bk * k_stride);
    let mut k_tile = shared_tile::<F>(comptime!(key_buffers * key_tile_len));
    let mut v_tile = shared_tile::<F>(bk * v_stride);
    let mut kept = shared_tile::<u32>(comptime!(key_buffers * bk));
    let mut scratch = emulation_scratch(comptime!(config.emulation()));

    // The cube's rows of Q and dO, read as A fragments per key tile (ordered before
    // the reads by the first tile's barrier).
    stage_rows::<F>(
        q,
        &mut q_tile,
        head * seq_q,
        first_row,
        seq_q,
        block_q,
        d_qk,
        k_stride,
        config.staging,
        comptime!(Some(config.units())),
    );
    stage_rows::<F>(
        grad_out,
        &mut do_tile,
        head * seq_q,
        first_row,
        seq_q,
        block_q,
        d_v,
        v_stride,
        config.staging,
        comptime!(Some(config.units())),
    );
    // (LSE, D) of the lane's two rows (pair 0's and pair 1's).
    let mut row_lse = Array::<f32>::new(C_PAIRS);
    let mut row_delta = Array::<f32>::new(C_PAIRS);
    #[unroll(unrolled)]
    for p in 0..C_PAIRS {
        let (r, _) = c_position(lane, (2 * p) as u32);
        let mut row = plane_row + r;
        if row >= seq_q {
            row = seq_q - 1;
        }
        row_lse[p] = stats[(head * seq_q + row) * ROW_STATS];
        row_delta[p] = stats[(head * seq_q + row) * ROW_STATS + 1];
    }
    let mut grad = zero_fragments(grad_tiles, unrolled);

    if overlapped && kv_start < kv_end {
        // The first tile's keys, in buffer 0; each later tile's are copied during the
        // one before, into the other buffer.
        copy_keys::<F>(
            k,
            key_mask,
            &mut k_tile,
            0,
            &mut kept,
            0,
            kv_head,
            kv_start as usize,
            batch,
            &sizes,
            config,
        );
    }

    let mut start = kv_start;
    // The buffer of this tile's keys (0 without overlapped copies).
    let mut buffer = 0usize;
    while start < kv_end {
        // `& 1` changes no value (the buffer is 0 or 1) but bounds the offset for the
        // CUDA compiler, whose loads from the buffers then take fewer address
        // instructions.
        let key_at = (buffer & 1) * key_tile_len;
        let kept_at = (buffer & 1) * bk;
        begin_key_tile::<F>(
            k,
            v,
            key_mask,
            &mut k_tile,
            &mut v_tile,
            &mut kept,
            kv_head,
            start as usize,
            batch,
            &sizes,
            config,
        );

        // S = Q·Kᵀ and dP = dO·Vᵀ, one C fragment each per 8 keys (one row tile a
        // plane: see `plan_fragments`).
        let scores = staged_row_products::<F>(
            &q_tile,
            plane * TILE_M,
            &k_tile,
            key_at,
            1usize,
            q_chunks,
            score_tiles,
            k_stride,
            &mut scratch,
            ops,
            config.loads,
        );
        if overlapped {
            // The next tile's keys go to the other buffer (every plane was done with
            // it at the last wait) while the planes compute dP, dS and dQ.
            let other = 1 - buffer;
            overlap_next_keys::<F>(
                k,
                key_mask,
                &mut k_tile,
                other * key_tile_len,
                &mut kept,
                other * bk,
                kv_head,
                start + bk as i32,
                kv_end,
                batch,
                &sizes,
                config,
            );
        }
        let grads = staged_row_products::<F>(
            &do_tile,
            plane * TILE_M,
            &v_tile,
            0usize,
            1usize,
            v_chunks,
            score_tiles,
            v_stride,
            &mut scratch,
            ops,
            config.loads,
        );
        // dS = P ∘ (dP − D) ∘ softcap', rounded to the input type.
        let mut score_grads = Array::<Pair<F>>::new(comptime!(score_tiles * C_PAIRS));
        let open = block_open(plane_pos, TILE_M, start, bk, kv_end, &sizes, terms);
        if open {
            #[unroll(unrolled)]
            for j in 0..score_tiles {
                #[unroll(unrolled)]
                for p in 0..C_PAIRS {
                    let score = scores[j * C_PAIRS + p];
                    let mut pair = grads[j * C_PAIRS + p];
                    #[unroll]
                    for e in 0..2usize {
                        let (_, ds) = open_probability_and_gradient(
                            score.extract(e) * sizes.scale,
                            pair.extract(e),
                            row_lse[p],
                            row_delta[p],
                            config.exponential,
                        );
                        pair.insert(e, ds);
                    }
                    score_grads[j * C_PAIRS + p] = Pair::<F>::cast_from(pair);
                }
            }
        } else {
            #[unroll(unrolled)]
            for j in 0..score_tiles {
                #[unroll(unrolled)]
                for p in 0..C_PAIRS {
                    let score = scores[j * C_PAIRS + p];
                    let mut pair = grads[j * C_PAIRS + p];
                    #[unroll]
                    for e in 0..2usize {
                        let (r, col) = c_position(lane, (2 * p + e) as u32);
                        let t = j * TILE_N + col;
                        let pos = plane_pos + r as i32;
                        let key = start + t as i32;
                        let visible =
                            kept[kept_at + t] != 0 && structurally_visible(pos, key, &sizes, terms);
                        let (_, ds) = probability_and_gradient(
                            score.extract(e) * sizes.scale,
                            alibi_bias(slope, pos, key, terms),
                            pair.extract(e),
                            row_lse[p],
                            row_delta[p],
                            visible,
                            &sizes,
                            terms,
                            config.exponential,
                        );
                        pair.insert(e, ds);
                    }
                    score_grads[j * C_PAIRS + p] = Pair::<F>::cast_from(pair);
                }
            }
        }
        // dQ += dS·K, 16 keys at a time (scaled at the end).
        accumulate_products::<F>(
            &score_grads,
            &k_tile,
            key_at,
            1usize,
            key_chunks,
            grad_tiles,
            k_stride,
            &mut grad,
            &mut scratch,
            ops,
            config.loads,
        );
        if overlapped {
            buffer = 1 - buffer;
        } else {
            sync_cube();
        }
        start += bk as i32;
    }

    #[unroll(unrolled)]
    for p in 0..C_PAIRS {
        let (r, _) = c_position(lane, (2 * p) as u32);
        let row = plane_row + r;
        if row < seq_q {
            #[unroll(unrolled)]
            for n in 0..grad_tiles {
                let pair = grad[n * C_PAIRS + p];
                #[unroll]
                for e in 0..2usize {
                    let (_, col) = c_position(lane, (2 * p + e) as u32);
                    grad_q[(head * seq_q + row) * d_qk + n * TILE_N + col] =
                        F::cast_from(pair.extract(e) * sizes.scale);
                }
            }
        }
    }
}

/// Backward for keys and values: `dV = Pᵀ·dO`, `dK = scale·dSᵀ·Q`. Each plane owns 16
/// keys and computes the transposed scores `Sᵀ = K·Qᵀ` and `dPᵀ = V·dOᵀ`, so that `Pᵀ`
/// and `dSᵀ` pass from their registers into the left factors of `Pᵀ·dO` and `dSᵀ·Q`
/// (FlashAttention-2's order); `dK` and `dV` stay in registers, `K` and `V` in shared
/// memory. Each key's gradient is summed by its own plane in a fixed order: no
/// atomics, deterministic. Where `config.adds_dq`, each tile's `dQ` share goes to
/// `grad_q_sum` through [`add_query_gradients`] (else `grad_q_sum` is a placeholder).
/// With overlapped copies ([`TileCopies::Overlapped`]) the next tile's query rows
/// travel into second buffers while the planes compute on this tile's.
///
/// Cube `(x, y)`: keys `x·16·planes ..` of key/value head `y` (flattened
/// `batch·kv_heads`), walking every query head of its group, `config.block` query
/// rows a tile.
#[cube(launch_unchecked)]
#[allow(clippy::too_many_arguments)]
pub fn fragment_backward_kv<F: Float, N: Size>(
    q: &Tensor<F>,
    k: &Tensor<F>,
    v: &Tensor<F>,
    grad_out: &Tensor<F>,
    stats: &Tensor<f32>,
    key_mask: &Tensor<F>,
    grad_k: &mut Tensor<F>,
    grad_v: &mut Tensor<F>,
    grad_q_sum: &mut Tensor<Atomic<Vector<f32, N>>>,
    sizes: Sizes,
    #[comptime] config: FragmentConfig,
    #[define(F)] _dtype: ElemType,
) {
    let block_k = comptime!(config.rows());
    let bq = config.block;
    let d_qk = config.d_qk;
    let d_v = config.d_v;
    let qk_stride = comptime!(config.qk_stride());
    let v_stride = comptime!(config.v_stride());
    let qk_chunks = comptime!(d_qk / TILE_K);
    let v_chunks = comptime!(d_v / TILE_K);
    let query_tiles = comptime!(bq / TILE_N);
    let query_chunks = comptime!(bq / TILE_K);
    let key_grad_tiles = comptime!(d_qk / TILE_N);
    let value_grad_tiles = comptime!(d_v / TILE_N);
    let ops = config.ops;
    let unrolled = comptime!(ops.on_plane_instructions());

    let seq_q = sizes.seq_q as usize;
    let seq_k = sizes.seq_k as usize;
    let group = sizes.group as usize;
    let lane = fragment_lane();
    let plane = UNIT_POS as usize / LANES;
    let kv_head = CUBE_POS_Y as usize;
    let (batch, first_head) = query_heads_of(kv_head, &sizes);
    let shift = i32::cast_from(sizes.seq_k) - i32::cast_from(sizes.seq_q);
    let terms = comptime!(config.terms());
    let first_key = CUBE_POS_X as usize * block_k;
    let (row_start, row_end) = row_range(first_key, block_k, &sizes, terms);
    // The plane's keys: rows `plane_key ..` of the staged tiles.
    let plane_key = plane * TILE_M;
    let plane_first_key = i32::cast_from(first_key + plane_key);

    let mut k_tile = shared_tile::<F>(block_k * qk_stride);
    let mut v_tile = shared_tile::<F>(block_k * v_stride);
    let mut kept = shared_tile::<u32>(block_k);
    // The tiles of query rows; with overlapped copies two of each, which take turns:
    // a tile's `Q` and `dO` are read until its last products (dV += Pᵀ·dO, dK += dSᵀ·Q),
    // so the next tile's cannot be copied over them while those run.
    let overlapped = comptime!(config.copies.overlapped());
    let query_buffers = comptime!(if overlapped { 2 } else { 1 });
    let q_tile_len = comptime!(bq * qk_stride);
    let do_tile_len = comptime!(bq * v_stride);
    let stats_tile_len = comptime!(bq * ROW_STATS);
    let mut q_tile = shared_tile::<F>(comptime!(query_buffers * q_tile_len));
    let mut do_tile = shared_tile::<F>(comptime!(query_buffers * do_tile_len));
    let mut row_stats = shared_tile::<f32>(comptime!(query_buffers * stats_tile_len));
    // The one-pass backward's dS, row-major by query row (one element where unused).
    let ds_stride = comptime!(config.ds_stride());
    let mut ds_tile = shared_tile::<F>(comptime!(if config.adds_dq { bq * ds_stride } else { 1 }));
    let mut scratch = emulation_scratch(comptime!(config.emulation()));

    // The cube's keys, read as A fragments per tile of query rows (ordered before the
    // reads by the first tile's barrier).
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
        block_k,
        d_qk,
        d_v,
        qk_stride,
        v_stride,
        config.staging,
        comptime!(Some(config.units())),
    );
    let mut grad_key = zero_fragments(key_grad_tiles, unrolled);
    let mut grad_value = zero_fragments(value_grad_tiles, unrolled);

    if overlapped && row_start < row_end {
        // The first tile's rows, in buffer 0; each later tile's are copied during the
        // one before, into the other buffer.
        copy_query_rows::<F>(
            q,
            grad_out,
            stats,
            &mut q_tile,
            &mut do_tile,
            &mut row_stats,
            0,
            first_head,
            row_start as usize,
            seq_q,
            config,
        );
    }

    // The buffer of this tile's rows (0 without overlapped copies).
    let mut buffer = 0usize;
    for g in 0..group {
        let head = first_head + g;
        let slope = alibi_slope(head, &sizes, terms);
        let mut start = row_start;
        while start < row_end {
            let first = start as usize;
            // `& 1`: a bounded offset, as in `fragment_backward_q`.
            let q_at = (buffer & 1) * q_tile_len;
            let do_at = (buffer & 1) * do_tile_len;
            let stats_at = (buffer & 1) * stats_tile_len;
            if overlapped {
                // This tile's rows have landed, and every plane is done with the tile
                // before, whose buffers take the next tile's rows (the next query rows
                // of this head, else the first of the next head's) while the planes
                // compute on this one.
                wait_for_copies(comptime!(config.copies.asynchronous()));
                let mut next_head = head;
                let mut next = start + bq as i32;
                if next >= row_end {
                    next_head = head + 1;
                    next = row_start;
                }
                if next_head < first_head + group {
                    copy_query_rows::<F>(
                        q,
                        grad_out,
                        stats,
                        &mut q_tile,
                        &mut do_tile,
                        &mut row_stats,
                        1 - buffer,
                        next_head,
                        next as usize,
                        seq_q,
                        config,
                    );
                }
            } else {
                copy_query_rows::<F>(
                    q,
                    grad_out,
                    stats,
                    &mut q_tile,
                    &mut do_tile,
                    &mut row_stats,
                    0,
                    head,
                    first,
                    seq_q,
                    config,
                );
                sync_cube();
            }

            // Sᵀ = K·Qᵀ and dPᵀ = V·dOᵀ, one C fragment each per 8 query rows.
            let scores = staged_row_products::<F>(
                &k_tile,
                plane_key,
                &q_tile,
                q_at,
                1usize,
                qk_chunks,
                query_tiles,
                qk_stride,
                &mut scratch,
                ops,
                config.loads,
            );
            let grads = staged_row_products::<F>(
                &v_tile,
                plane_key,
                &do_tile,
                do_at,
                1usize,
                v_chunks,
                query_tiles,
                v_stride,
                &mut scratch,
                ops,
                config.loads,
            );
            // Pᵀ and dSᵀ, rounded to the input type. The block is open when each of its
            // query rows exists and sees each of the plane's keys.
            let mut probabilities = Array::<Pair<F>>::new(comptime!(query_tiles * C_PAIRS));
            let mut score_grads = Array::<Pair<F>>::new(comptime!(query_tiles * C_PAIRS));
            let open = start + (bq as i32) <= row_end
                && block_open(
                    start + shift,
                    bq,
                    plane_first_key,
                    TILE_M,
                    i32::cast_from(seq_k),
                    &sizes,
                    terms,
                );
            if open {
                #[unroll(unrolled)]
                for j in 0..query_tiles {
                    #[unroll(unrolled)]
                    for p in 0..C_PAIRS {
                        let mut score = scores[j * C_PAIRS + p];
                        let mut pair = grads[j * C_PAIRS + p];
                        #[unroll]
                        for e in 0..2usize {
                            let (_, col) = c_position(lane, (2 * p + e) as u32);
                            let t = j * TILE_N + col;
                            let (prob, ds) = open_probability_and_gradient(
                                score.extract(e) * sizes.scale,
                                pair.extract(e),
                                row_stats[stats_at + ROW_STATS * t],
                                row_stats[stats_at + ROW_STATS * t + 1],
                                config.exponential,
                            );
                            score.insert(e, prob);
                            pair.insert(e, ds);
                        }
                        probabilities[j * C_PAIRS + p] = Pair::<F>::cast_from(score);
                        score_grads[j * C_PAIRS + p] = Pair::<F>::cast_from(pair);
                    }
                }
            } else {
                // The tile's rows that exist (its first always does).
                let rows_left = seq_q - first;
                #[unroll(unrolled)]
                for j in 0..query_tiles {
                    #[unroll(unrolled)]
                    for p in 0..C_PAIRS {
                        let mut score = scores[j * C_PAIRS + p];
                        let mut pair = grads[j * C_PAIRS + p];
                        #[unroll]
                        for e in 0..2usize {
                            let (r, col) = c_position(lane, (2 * p + e) as u32);
                            let t = j * TILE_N + col;
                            // The positions that see the row's key, a range (the same
                            // for each of its scores, which the compiler works out once).
                            let key = plane_first_key + r as i32;
                            let (first_pos, end_pos) = seeing_positions(key, &sizes, terms);
                            let pos = start + t as i32 + shift;
                            let visible = t < rows_left
                                && kept[plane_key + r] != 0
                                && pos >= first_pos
                                && pos < end_pos;
                            let (prob, ds) = probability_and_gradient(
                                score.extract(e) * sizes.scale,
                                alibi_bias(slope, pos, key, terms),
                                pair.extract(e),
                                row_stats[stats_at + ROW_STATS * t],
                                row_stats[stats_at + ROW_STATS * t + 1],
                                visible,
                                &sizes,
                                terms,
                                config.exponential,
                            );
                            score.insert(e, prob);
                            pair.insert(e, ds);
                        }
                        probabilities[j * C_PAIRS + p] = Pair::<F>::cast_from(score);
                        score_grads[j * C_PAIRS + p] = Pair::<F>::cast_from(pair);
                    }
                }
            }
            if comptime!(config.adds_dq) {
                store_transposed::<F>(
                    &score_grads,
                    &mut ds_tile,
                    plane_key,
                    query_tiles,
                    ds_stride,
                    unrolled,
                );
            }
            // dV += Pᵀ·dO and dK += dSᵀ·Q, 16 query rows at a time (dK scaled at the
            // end).
            accumulate_products::<F>(
                &probabilities,
                &do_tile,
                do_at,
                1usize,
                query_chunks,
                value_grad_tiles,
                v_stride,
                &mut grad_value,
                &mut scratch,
                ops,
                config.loads,
            );
            accumulate_products::<F>(
                &score_grads,
                &q_tile,
                q_at,
                1usize,
                query_chunks,
                key_grad_tiles,
                qk_stride,
                &mut grad_key,
                &mut scratch,
                ops,
                config.loads,
            );
            if comptime!(config.adds_dq) {
                // Every plane's dS is stored (the stores sit before the products above).
                sync_cube();
                add_query_gradients::<F, N>(
                    &ds_tile,
                    &k_tile,
                    grad_q_sum,
                    head * seq_q,
                    first,
                    seq_q,
                    plane,
                    &mut scratch,
                    config,
                );
            }
            if overlapped {
                buffer = 1 - buffer;
            } else {
                sync_cube();
            }
            start += bq as i32;
        }
    }

    #[unroll(unrolled)]
    for p in 0..C_PAIRS {
        let (r, _) = c_position(lane, (2 * p) as u32);
        let key = first_key + plane_key + r;
        if key < seq_k {
            let row = kv_head * seq_k + key;
            #[unroll(unrolled)]
            for n in 0..key_grad_tiles {
                let pair = grad_key[n * C_PAIRS + p];
                #[unroll]
                for e in 0..2usize {
                    let (_, col) = c_position(lane, (2 * p + e) as u32);
                    grad_k[row * d_qk + n * TILE_N + col] =
                        F::cast_from(pair.extract(e) * sizes.scale);
                }
            }
            #[unroll(unrolled)]
            for n in 0..value_grad_tiles {
                let pair = grad_value[n * C_PAIRS + p];
                #[unroll]
                for e in 0..2usize {
                    let (_, col) = c_position(lane, (2 * p + e) as u32);
                    grad_v[row * d_v + n * TILE_N + col] = F::cast_from(pair.extract(e));
                }
            }
        }
    }
}

/// Writes a plane's `dSᵀ` (its 16 keys × `8·tiles` query rows, as C fragments rounded
/// to `F`) into the shared `dS` tile transposed: query row `t`, key `first_key + r` at
/// `t·stride + first_key + r`, so that the tile's rows are `A` fragments of `dS·K`.
#[cube]
fn store_transposed<F: Float>(
    fragments: &Array<Pair<F>>,
    tile: &mut Shared<[F]>,
    first_key: usize,
    #[comptime] tiles: usize,
    #[comptime] stride: usize,
    #[comptime] unrolled: bool,
) {
    let lane = fragment_lane();
    #[unroll(unrolled)]
    for j in 0..tiles {
        #[unroll(unrolled)]
        for p in 0..C_PAIRS {
            let pair = fragments[j * C_PAIRS + p];
            #[unroll]
            for e in 0..2usize {
                let (r, col) = c_position(lane, (2 * p + e) as u32);
                tile[(j * TILE_N + col) * stride + first_key + r] = pair.extract(e);
            }
        }
    }
}

/// C fragments of `dQ` a plane forms per pass of the one-pass backward (32 columns):
/// few enough that the pass's accumulators fit beside the dK/dV kernel's own without
/// spilling (ptxas, sm_90, bf16: 226 registers at head dim 128, 135 at 64, where a
/// plane's share is one pass; 16 columns a pass took 855 instructions per open tile
/// there against 779, both with the library's `exp`).
const DQ_PASS_TILES: usize = 4;

/// The one-pass backward's share of `dQ` for one tile of query rows: `dS·K` over the
/// cube's keys (`ds` staged by [`store_transposed`], `keys` the staged `K`), added to
/// the f32 rows `rows_at + first ..` of `sums` (unscaled): a pair of neighbouring
/// columns per atomic add where `sums` holds pairs (`N = 2`, CUDA on sm_90: one
/// instruction, on a global address), one column per add otherwise. The tile's 16-row blocks
/// and 8-column blocks of `dQ` are spread over the planes: with as many planes as row
/// blocks or more, plane `p` takes row block `p % row_blocks` and every
/// `(planes / row_blocks)`-th column block from `p / row_blocks`; with fewer, each
/// plane takes every `planes`-th row block whole.
#[cube]
#[allow(clippy::too_many_arguments)]
fn add_query_gradients<F: Float, N: Size>(
    ds: &Shared<[F]>,
    keys: &Shared<[F]>,
    sums: &mut Tensor<Atomic<Vector<f32, N>>>,
    rows_at: usize,
    first: usize,
    seq_q: usize,
    plane: usize,
    scratch: &mut Shared<[f32]>,
    #[comptime] config: FragmentConfig,
) {
    let d_qk = config.d_qk;
    let planes = config.planes;
    let row_blocks = comptime!(config.block / TILE_M);
    let column_blocks = comptime!(d_qk / TILE_N);
    let steps = comptime!((planes / row_blocks).max(1));
    let rounds = comptime!((row_blocks / planes).max(1));
    let plane_tiles = comptime!(column_blocks.div_ceil(steps));
    let passes = comptime!(plane_tiles.div_ceil(DQ_PASS_TILES));
    let pass_tiles = comptime!(plane_tiles.div_ceil(passes));
    // Whether a plane's passes may reach past the last column block (whose adds it
    // then drops); where the blocks split evenly over the planes' first blocks
    // (`0 .. steps`) they never do, and no add is checked.
    let ragged = comptime!(
        !column_blocks.is_multiple_of(steps)
            || passes * pass_tiles != plane_tiles
            || (planes - 1) / row_blocks >= steps
    );
    let ops = config.ops;
    let unrolled = comptime!(ops.on_plane_instructions());
    let lane = fragment_lane();
    let first_tile = plane / row_blocks;
    for round in 0..rounds {
        let block = plane % row_blocks + round * planes;
        #[unroll(unrolled)]
        for pass in 0..passes {
            let pass_first = first_tile + pass * pass_tiles * steps;
            let share = staged_column_products::<F>(
                ds,
                block * TILE_M,
                comptime!(config.ds_stride()),
                keys,
                comptime!(config.qk_stride()),
                pass_first,
                steps,
                comptime!(column_blocks - 1),
                comptime!(config.rows() / TILE_K),
                pass_tiles,
                scratch,
                ops,
                config.loads,
            );
            #[unroll(unrolled)]
            for p in 0..C_PAIRS {
                let (r, _) = c_position(lane, (2 * p) as u32);
                let row = first + block * TILE_M + r;
                if row < seq_q {
                    #[unroll(unrolled)]
                    for i in 0..pass_tiles {
                        let n = pass_first + i * steps;
                        if comptime!(!ragged) || n < column_blocks {
                            let pair = share[i * C_PAIRS + p];
                            let (_, col) = c_position(lane, (2 * p) as u32);
                            let at = (rows_at + row) * d_qk + n * TILE_N + col;
                            if N::value() == 2 {
                                let mut both = Vector::<f32, N>::empty();
                                #[unroll]
                                for e in 0..2usize {
                                    both.insert(e, pair.extract(e));
                                }
                                sums[at / 2].fetch_add(both);
                            } else {
                                #[unroll]
                                for e in 0..2usize {
                                    sums[at + e].fetch_add(Vector::<f32, N>::new(pair.extract(e)));
                                }
                            }
                        }
                    }
                }
            }
        }
    }
}

/// The one-pass backward's last step: `dQ = scale · sums`, in the input type.
#[cube(launch_unchecked)]
pub fn fragment_finish_dq<F: Float>(
    sums: &Tensor<f32>,
    grad_q: &mut Tensor<F>,
    scale: f32,
    #[define(F)] _dtype: ElemType,
) {
    if ABSOLUTE_POS < grad_q.len() {
        grad_q[ABSOLUTE_POS] = F::cast_from(sums[ABSOLUTE_POS] * scale);
    }
}
