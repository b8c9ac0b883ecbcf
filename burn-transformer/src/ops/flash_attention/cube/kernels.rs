//! The CubeCL kernels of flash attention (`#[cube]` code only; tile choice and
//! launches live in `tiling.rs` and `launch.rs`).
//!
//! Layout: every tensor is contiguous and read as vectors of `N` elements along the
//! head dimension, so a row of `d` elements is `d / N` vectors. All arithmetic is in
//! f32 whatever the input type `F`.
//!
//! Work split (FlashAttention-2): a cube owns `units · rows` consecutive rows of one
//! head and each unit owns `rows` of them, held in registers:
//! - forward and dQ: the rows are query rows; the unit streams the keys (and values)
//!   that any row of the cube may see, `block` keys per unrolled step, with an online
//!   softmax;
//! - dK/dV: the rows are keys of one key/value head; the unit streams the query rows
//!   (with dO, LSE and D) of every query head of its group. Each key's gradient is
//!   summed by the one unit that owns it, in a fixed order: no atomics, deterministic.
//!
//! On GPUs a unit owns one row, and a row too wide for one unit's registers is split
//! over `lanes` neighbouring units of a plane ([`AttentionConfig::lanes`]), which sum
//! each dot product among themselves ([`lane_sum`]); CPU runtimes keep whole rows.
//!
//! Why register tiles and no shared memory: every streamed key (or query) vector a
//! unit loads is used for all `rows` rows it owns, so the loads per flop drop by
//! `rows`. On CPU runtimes (lavapipe/llvmpipe) a load whose address is not a
//! compile-time constant costs a loop over the SIMD lanes, and shared memory reads
//! cost the same as global ones, so reuse in registers is what makes the kernel
//! fast there; on GPUs all units of a cube read the same key row at the same time,
//! which the cache serves as one broadcast.
//!
//! Masking is the device transcription of [`MaskRule`](crate::ops::mask::MaskRule)
//! (bottom-right aligned causal, window, key padding); the parity grid tests the two
//! against each other. Hidden scores use [`HIDDEN_SCORE`], a large negative *finite*
//! value: WGSL has no infinity literal.

use cubecl::prelude::*;

use super::softmax::{
    Exponential, finish_row, masked_score, online_max, probability, probability_and_gradient,
};
use crate::ops::mask::HIDDEN_SCORE;

/// Score of a hidden entry (see [`HIDDEN_SCORE`]).
pub(super) const HIDDEN: f32 = HIDDEN_SCORE;
/// Visible scores are clamped above this, so that a row's max is above `HIDDEN`
/// exactly when the row sees a key.
pub(super) const SCORE_FLOOR: f32 = HIDDEN_SCORE / 10.0;

/// Compile-time shape of one launch; each distinct value compiles one kernel. The
/// masking options are runtime flags ([`Sizes`]): one compiled kernel serves every
/// combination, and a disabled option costs a uniform branch.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct AttentionConfig {
    /// Units per cube.
    pub units: usize,
    /// Rows each unit owns: query rows (forward, dQ) or keys (dK/dV).
    pub rows: usize,
    /// Streamed rows per unrolled step: keys (forward, dQ) or query rows (dK/dV).
    pub block: usize,
    /// `d_qk / N`.
    pub qk_vectors: usize,
    /// `d_v / N`.
    pub v_vectors: usize,
    /// Units that share each row, consecutive in their plane (a power of two that
    /// divides both vector counts): lane `l` of a row holds its vectors `l, l + lanes,
    /// …`, and each dot product is summed over the lanes ([`lane_sum`]). 1 on CPU
    /// runtimes; on GPUs as many as keep a unit's share of its rows in registers.
    pub lanes: usize,
    /// How the lanes of a row sum their parts (unused with one lane).
    pub lane_sum: LaneSum,
}

/// How the lanes that share a row sum a dot product's parts.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum LaneSum {
    /// Plane shuffles (devices with plane operations).
    Shuffles,
    /// Through shared memory, in the same order (any device: the tests run the split
    /// rows on CPU runtimes with it).
    SharedMemory,
}

/// The sum of `value` over the `lanes` units that share the calling unit's row
/// (consecutive units; `lanes` a power of two), on each of them: a butterfly, in which
/// each step adds the value of the lane whose index differs in one bit, so that every
/// lane adds the same two values at each step and all end with the same sum, bit for
/// bit. `scratch` (one f32 a unit) serves [`LaneSum::SharedMemory`], whose steps read
/// the partner's value from it; every unit of the cube must call this together.
#[cube]
pub(super) fn lane_sum(
    value: f32,
    scratch: &mut Shared<[f32]>,
    #[comptime] lanes: usize,
    #[comptime] how: LaneSum,
) -> f32 {
    let mut sum = value;
    let mut distance = 1u32;
    #[unroll]
    for _ in 0..comptime!(lanes.trailing_zeros() as usize) {
        if comptime!(how == LaneSum::Shuffles) {
            sum += plane_shuffle_xor(sum, distance);
        } else {
            let unit = UNIT_POS;
            scratch[unit as usize] = sum;
            sync_cube();
            sum += scratch[(unit ^ distance) as usize];
            sync_cube();
        }
        distance *= 2;
    }
    sum
}

/// The shared memory [`lane_sum`] uses in a kernel of `config`: one f32 a unit where
/// the lanes sum through it, one element otherwise.
#[cube]
fn lane_scratch(#[comptime] config: AttentionConfig) -> Shared<[f32]> {
    let len = comptime!(
        if config.lanes > 1 && config.lane_sum == LaneSum::SharedMemory {
            config.units
        } else {
            1
        }
    );
    Shared::<[f32]>::new_slice(len)
}

/// The runtime sizes of one launch.
#[derive(CubeLaunch, CubeType, Clone, Copy)]
pub struct Sizes {
    /// Query sequence length.
    pub seq_q: u32,
    /// Key sequence length.
    pub seq_k: u32,
    /// Query heads.
    pub heads: u32,
    /// Query heads per key/value head.
    pub group: u32,
    /// Sliding window size (unused without a window).
    pub window: u32,
    /// Multiplies `q·kᵀ`.
    pub scale: f32,
    /// Soft-cap `c` (unused without a softcap).
    pub cap: f32,
    /// `1 / c`: a division per score would be a slow-path call on CUDA (IEEE
    /// division), and its register saves around the call spill.
    pub cap_inverse: f32,
    /// 1 for causal masking.
    pub causal: u32,
    /// 1 with a sliding window.
    pub windowed: u32,
    /// 1 when a key padding mask is read.
    pub key_mask: u32,
    /// 1 with logit soft-capping.
    pub softcap: u32,
    /// 1 when per-head sink logits are read (forward only: the backward reads them
    /// through the log-sum-exp, which includes them).
    pub sinks: u32,
}

/// The keys that absolute query position `pos` sees by the causal and window
/// structure, `[first, end)` within `0 .. seq_k` (padding is checked apart): a key `j`
/// is seen when `j <= pos` (causal), `pos - j < window` and, without causal,
/// `j - pos < window`. Both ends grow with `pos`.
#[cube]
pub(super) fn visible_keys(pos: i32, sizes: &Sizes) -> (i32, i32) {
    let window = i32::cast_from(sizes.window);
    let mut first = 0i32;
    let mut end = i32::cast_from(sizes.seq_k);
    if sizes.causal != 0 {
        end = i32::min(end, pos + 1);
    }
    if sizes.windowed != 0 {
        first = i32::max(first, pos - window + 1);
        if sizes.causal == 0 {
            end = i32::min(end, pos + window);
        }
    }
    (first, end)
}

/// The absolute query positions that see key `key` by the same structure,
/// `[first, end)` within the rows' positions (`seq_k - seq_q .. seq_k`): the rule of
/// [`visible_keys`] read the other way. Both ends grow with `key`.
#[cube]
pub(super) fn seeing_positions(key: i32, sizes: &Sizes) -> (i32, i32) {
    let window = i32::cast_from(sizes.window);
    let mut first = i32::cast_from(sizes.seq_k) - i32::cast_from(sizes.seq_q);
    let mut end = i32::cast_from(sizes.seq_k);
    if sizes.causal != 0 {
        first = i32::max(first, key);
    }
    if sizes.windowed != 0 {
        end = i32::min(end, key + window);
        if sizes.causal == 0 {
            first = i32::max(first, key - window + 1);
        }
    }
    (first, end)
}

/// Whether key `key` (below `seq_k`) is visible from absolute query position `pos` by
/// the causal and window structure (padding is checked apart): inside `pos`'s range of
/// [`visible_keys`], which is the same for each of a row's keys, so that in unrolled
/// loops over a row's scores the compiler works it out once a row.
#[cube]
pub(super) fn structurally_visible(pos: i32, key: i32, sizes: &Sizes) -> bool {
    let (first, end) = visible_keys(pos, sizes);
    key >= first && key < end
}

/// Whether each of the `keys` keys from `key_first` is visible from each of the
/// `rows` absolute query positions from `pos_first` with no per-score work: no padding
/// mask is read, no soft-cap applies, every key lies below `key_end` (real keys of the
/// launch's range), and the causal and window structure hides none of them. Such a
/// block's scores need only the scale (FlashAttention-2 masks only the blocks on a
/// mask's edge). Each structural bound is monotone in `key − pos`, so the two corners
/// of the block decide it.
#[cube]
pub(super) fn block_open(
    pos_first: i32,
    #[comptime] rows: usize,
    key_first: i32,
    #[comptime] keys: usize,
    key_end: i32,
    sizes: &Sizes,
) -> bool {
    let pos_last = pos_first + (rows - 1) as i32;
    let key_last = key_first + (keys - 1) as i32;
    sizes.key_mask == 0
        && sizes.softcap == 0
        && key_last < key_end
        && structurally_visible(pos_first, key_last, sizes)
        && structurally_visible(pos_last, key_first, sizes)
}

/// Soft-caps a scaled score: `c·tanh(s/c)` where `sizes.softcap` asks for it, in a
/// kernel compiled `with_cap` (one compiled without it leaves every score as it is;
/// see [`FragmentConfig::softcap`](super::fragments::FragmentConfig::softcap)).
// The compile-time test stays apart from the run-time one: together they would be one
// run-time condition, and the cap's code would be emitted into every kernel.
#[allow(clippy::collapsible_if)]
#[cube]
pub(super) fn cap_score(score: f32, sizes: &Sizes, #[comptime] with_cap: bool) -> f32 {
    let mut out = score;
    if comptime!(with_cap) {
        if sizes.softcap != 0 {
            out = sizes.cap * f32::tanh(score * sizes.cap_inverse);
        }
    }
    out
}

/// Derivative of the soft-cap at a capped score `s = c·tanh(t/c)`: `1 − (s/c)²` (1
/// without a cap, as in [`cap_score`]).
#[allow(clippy::collapsible_if)]
#[cube]
pub(super) fn cap_derivative(capped: f32, sizes: &Sizes, #[comptime] with_cap: bool) -> f32 {
    let mut out = 1.0f32;
    if comptime!(with_cap) {
        if sizes.softcap != 0 {
            let ratio = capped * sizes.cap_inverse;
            out = 1.0f32 - ratio * ratio;
        }
    }
    out
}

/// The batch entry and the key/value head (flattened `batch·kv_heads`) of query head
/// `head` (flattened `batch·heads`): a group of query heads reads one key/value head,
/// which is never repeated.
#[cube]
pub(super) fn kv_head_of(head: usize, sizes: &Sizes) -> (usize, usize) {
    let heads = sizes.heads as usize;
    let group = sizes.group as usize;
    let batch = head / heads;
    (batch, batch * (heads / group) + (head % heads) / group)
}

/// The batch entry and the first of the `group` query heads (flattened `batch·heads`)
/// that read key/value head `kv_head` (flattened `batch·kv_heads`).
#[cube]
pub(super) fn query_heads_of(kv_head: usize, sizes: &Sizes) -> (usize, usize) {
    let heads = sizes.heads as usize;
    let group = sizes.group as usize;
    let kv_heads = heads / group;
    let batch = kv_head / kv_heads;
    (batch, batch * heads + (kv_head % kv_heads) * group)
}

/// Range `[start, end)` of keys that any of the `rows` query rows from `row_first`
/// (cut at `seq_q`) may see; empty when `end <= start`.
#[cube]
pub(super) fn key_range(row_first: usize, rows: usize, sizes: &Sizes) -> (i32, i32) {
    let mut row_last = row_first + rows - 1;
    if row_last >= sizes.seq_q as usize {
        row_last = sizes.seq_q as usize - 1;
    }
    let shift = i32::cast_from(sizes.seq_k) - i32::cast_from(sizes.seq_q);
    let (start, _) = visible_keys(i32::cast_from(row_first) + shift, sizes);
    let (_, end) = visible_keys(i32::cast_from(row_last) + shift, sizes);
    (start, end)
}

/// Range `[start, end)` of query rows that may see any of the `keys` keys from
/// `key_first` (cut at `seq_k`); empty when `end <= start`.
#[cube]
pub(super) fn row_range(key_first: usize, keys: usize, sizes: &Sizes) -> (i32, i32) {
    let mut key_last = key_first + keys - 1;
    if key_last >= sizes.seq_k as usize {
        key_last = sizes.seq_k as usize - 1;
    }
    let shift = i32::cast_from(sizes.seq_k) - i32::cast_from(sizes.seq_q);
    let (start, _) = seeing_positions(i32::cast_from(key_first), sizes);
    let (_, end) = seeing_positions(i32::cast_from(key_last), sizes);
    (start - shift, end - shift)
}

/// Whether the key at `key` is a real, unpadded key (`key < seq_k` and, with a
/// padding mask, not padded); reads the clamped index `key_c`.
#[cube]
pub(super) fn key_kept<F: Float>(
    key_mask: &Tensor<F>,
    key: usize,
    key_c: usize,
    batch: usize,
    sizes: &Sizes,
) -> bool {
    let seq_k = sizes.seq_k as usize;
    let mut kept = key < seq_k;
    if sizes.key_mask != 0 {
        kept = kept && f32::cast_from(key_mask[batch * seq_k + key_c]) < 0.5f32;
    }
    kept
}

/// Forward: `O = softmax(q·kᵀ·scale + mask)·v` and the per-row log-sum-exp.
///
/// Cube `(x, y)`: query rows `x·units·rows ..` of head `y` (flattened `batch·heads`).
#[cube(launch_unchecked)]
#[allow(clippy::too_many_arguments)]
pub fn flash_forward<F: Float, N: Size>(
    q: &Tensor<Vector<F, N>>,
    k: &Tensor<Vector<F, N>>,
    v: &Tensor<Vector<F, N>>,
    key_mask: &Tensor<F>,
    sinks: &Tensor<f32>,
    out: &mut Tensor<Vector<F, N>>,
    lse: &mut Tensor<f32>,
    sizes: Sizes,
    #[comptime] config: AttentionConfig,
    #[define(F)] _dtype: ElemType,
) {
    let rows = config.rows;
    let block = config.block;
    let lanes = config.lanes;
    let qk_vectors = config.qk_vectors;
    let v_vectors = config.v_vectors;
    // This lane's vectors of each row: `lane, lane + lanes, …`.
    let qk_held = comptime!(qk_vectors / lanes);
    let v_held = comptime!(v_vectors / lanes);
    let tile_rows = comptime!(config.units / lanes * rows);

    let seq_q = sizes.seq_q as usize;
    let seq_k = sizes.seq_k as usize;
    let heads = sizes.heads as usize;
    let unit = UNIT_POS_X as usize;
    let lane = unit % lanes;
    let tile = CUBE_POS_X as usize;
    let head = CUBE_POS_Y as usize; // batch * heads + h
    let (batch, kv_head) = kv_head_of(head, &sizes);
    let shift = i32::cast_from(sizes.seq_k) - i32::cast_from(sizes.seq_q);
    let mut scratch = lane_scratch(config);

    let first_row = tile * tile_rows + unit / lanes * rows;
    let (kv_start, kv_end) = key_range(tile * tile_rows, tile_rows, &sizes);

    // This unit's query rows, pre-multiplied by the scale. Rows past the end
    // compute on the last row and are not written.
    let mut q_rows = Array::<Vector<f32, N>>::new(rows * qk_held);
    let mut positions = Array::<i32>::new(rows);
    let scale = Vector::<f32, N>::new(sizes.scale);
    #[unroll]
    for r in 0..rows {
        let mut row = first_row + r;
        if row >= seq_q {
            row = seq_q - 1;
        }
        positions[r] = i32::cast_from(row) + shift;
        let base = (head * seq_q + row) * qk_vectors + lane;
        #[unroll]
        for c in 0..qk_held {
            q_rows[r * qk_held + c] = Vector::<f32, N>::cast_from(q[base + c * lanes]) * scale;
        }
    }
    let mut acc = Array::<Vector<f32, N>>::new(rows * v_held);
    let mut running_max = Array::<f32>::new(rows);
    let mut running_sum = Array::<f32>::new(rows);
    #[unroll]
    for r in 0..rows {
        running_max[r] = f32::new(HIDDEN);
        running_sum[r] = 0.0f32;
        #[unroll]
        for c in 0..v_held {
            acc[r * v_held + c] = Vector::<f32, N>::new(0.0f32);
        }
    }
    let mut scores = Array::<f32>::new(rows * block);
    let mut kept = Array::<bool>::new(block);
    let last_key = seq_k - 1;

    let mut start = kv_start;
    while start < kv_end {
        let first = start as usize;
        // Scores of this unit's rows against `block` keys.
        #[unroll]
        for t in 0..block {
            let key = first + t;
            let mut key_c = key;
            if key > last_key {
                key_c = last_key;
            }
            kept[t] = key_kept::<F>(key_mask, key, key_c, batch, &sizes);
            #[unroll]
            for r in 0..rows {
                scores[r * block + t] = 0.0f32;
            }
            let k_base = (kv_head * seq_k + key_c) * qk_vectors + lane;
            #[unroll]
            for c in 0..qk_held {
                let key_vector = Vector::<f32, N>::cast_from(k[k_base + c * lanes]);
                #[unroll]
                for r in 0..rows {
                    scores[r * block + t] += q_rows[r * qk_held + c].dot(key_vector);
                }
            }
            #[unroll]
            for r in 0..rows {
                scores[r * block + t] =
                    lane_sum(scores[r * block + t], &mut scratch, lanes, config.lane_sum);
            }
        }
        // Online softmax: probabilities of the block, rescaled running sums.
        #[unroll]
        for r in 0..rows {
            let mut block_max = f32::new(HIDDEN);
            #[unroll]
            for t in 0..block {
                let visible =
                    kept[t] && structurally_visible(positions[r], start + t as i32, &sizes);
                let score = masked_score(scores[r * block + t], visible, &sizes, true);
                scores[r * block + t] = score;
                block_max = f32::max(block_max, score);
            }
            let (new_max, correction) = online_max(running_max[r], block_max);
            let mut total = running_sum[r] * correction;
            #[unroll]
            for t in 0..block {
                let p = probability(scores[r * block + t], 1.0f32, new_max, Exponential::Library);
                scores[r * block + t] = p;
                total += p;
            }
            running_sum[r] = total;
            running_max[r] = new_max;
            let correction = Vector::<f32, N>::new(correction);
            #[unroll]
            for c in 0..v_held {
                acc[r * v_held + c] *= correction;
            }
        }
        // acc += P · V for the block.
        #[unroll]
        for t in 0..block {
            let mut key = first + t;
            if key > last_key {
                key = last_key;
            }
            let v_base = (kv_head * seq_k + key) * v_vectors + lane;
            #[unroll]
            for c in 0..v_held {
                let value = Vector::<f32, N>::cast_from(v[v_base + c * lanes]);
                #[unroll]
                for r in 0..rows {
                    acc[r * v_held + c] += value * Vector::<f32, N>::new(scores[r * block + t]);
                }
            }
        }
        start += block as i32;
    }

    // A head's sink joins every row's normalization once, after the keys.
    let mut sink = f32::new(HIDDEN);
    if sizes.sinks != 0 {
        sink = sinks[head % heads];
    }
    #[unroll]
    for r in 0..rows {
        let row = first_row + r;
        if row < seq_q {
            let out_row = head * seq_q + row;
            let (inverse, row_lse) = finish_row(running_sum[r], running_max[r], sink, 0u32, &sizes);
            let inverse = Vector::<f32, N>::new(inverse);
            #[unroll]
            for c in 0..v_held {
                out[out_row * v_vectors + c * lanes + lane] =
                    Vector::<F, N>::cast_from(acc[r * v_held + c] * inverse);
            }
            if lane == 0 {
                lse[out_row] = row_lse;
            }
        }
    }
}

/// f32 values per query row of the backward pre-pass's `stats`: `(LSE, D)`.
pub(super) const ROW_STATS: usize = 2;

/// Backward pre-pass: per query row, `stats = (LSE, D)` with `D = rowsum(dO ∘ O)`
/// in f32. Packing both in one `[rows, ROW_STATS]` tensor keeps the backward kernels within
/// 8 storage buffers (the WebGPU default limit).
#[cube(launch_unchecked)]
pub fn flash_backward_stats<F: Float, N: Size>(
    out: &Tensor<Vector<F, N>>,
    grad_out: &Tensor<Vector<F, N>>,
    lse: &Tensor<f32>,
    stats: &mut Tensor<f32>,
    rows: u32,
    #[comptime] v_vectors: usize,
    #[define(F)] _dtype: ElemType,
) {
    let row = ABSOLUTE_POS;
    if row < rows as usize {
        let mut total = 0.0f32;
        #[unroll]
        for c in 0..v_vectors {
            let o = Vector::<f32, N>::cast_from(out[row * v_vectors + c]);
            let d = Vector::<f32, N>::cast_from(grad_out[row * v_vectors + c]);
            total += o.dot(d);
        }
        stats[row * ROW_STATS] = lse[row];
        stats[row * ROW_STATS + 1] = total;
    }
}

/// Backward for keys and values: `dV = Pᵀ·dO`, `dK = scale·dSᵀ·Q`.
///
/// Cube `(x, y)`: keys `x·units·rows ..` of key/value head `y` (flattened
/// `batch·kv_heads`); it loops over every query head of the group.
#[cube(launch_unchecked)]
#[allow(clippy::too_many_arguments)]
pub fn flash_backward_kv<F: Float, N: Size>(
    q: &Tensor<Vector<F, N>>,
    k: &Tensor<Vector<F, N>>,
    v: &Tensor<Vector<F, N>>,
    grad_out: &Tensor<Vector<F, N>>,
    stats: &Tensor<f32>,
    key_mask: &Tensor<F>,
    grad_k: &mut Tensor<Vector<F, N>>,
    grad_v: &mut Tensor<Vector<F, N>>,
    sizes: Sizes,
    #[comptime] config: AttentionConfig,
    #[define(F)] _dtype: ElemType,
) {
    let rows = config.rows;
    let block = config.block;
    let lanes = config.lanes;
    let qk_vectors = config.qk_vectors;
    let v_vectors = config.v_vectors;
    // This lane's vectors of each row: `lane, lane + lanes, …`.
    let qk_held = comptime!(qk_vectors / lanes);
    let v_held = comptime!(v_vectors / lanes);
    let tile_keys = comptime!(config.units / lanes * rows);

    let seq_q = sizes.seq_q as usize;
    let seq_k = sizes.seq_k as usize;
    let group = sizes.group as usize;
    let unit = UNIT_POS_X as usize;
    let lane = unit % lanes;
    let tile = CUBE_POS_X as usize;
    let kv_head = CUBE_POS_Y as usize; // batch * kv_heads + kv head
    let (batch, first_head) = query_heads_of(kv_head, &sizes);
    let shift = i32::cast_from(sizes.seq_k) - i32::cast_from(sizes.seq_q);
    let mut scratch = lane_scratch(config);

    let first_key = tile * tile_keys + unit / lanes * rows;
    let (row_start, row_end) = row_range(tile * tile_keys, tile_keys, &sizes);

    // This unit's keys and values; padded keys and keys past the end get no
    // gradient.
    let mut k_rows = Array::<Vector<f32, N>>::new(rows * qk_held);
    let mut v_rows = Array::<Vector<f32, N>>::new(rows * v_held);
    let mut dk = Array::<Vector<f32, N>>::new(rows * qk_held);
    let mut dv = Array::<Vector<f32, N>>::new(rows * v_held);
    let mut kept = Array::<bool>::new(rows);
    let mut key_pos = Array::<i32>::new(rows);
    let scale = Vector::<f32, N>::new(sizes.scale);
    #[unroll]
    for r in 0..rows {
        let key = first_key + r;
        let mut key_c = key;
        if key >= seq_k {
            key_c = seq_k - 1;
        }
        kept[r] = key_kept::<F>(key_mask, key, key_c, batch, &sizes);
        key_pos[r] = i32::cast_from(key);
        let k_base = (kv_head * seq_k + key_c) * qk_vectors + lane;
        let v_base = (kv_head * seq_k + key_c) * v_vectors + lane;
        #[unroll]
        for c in 0..qk_held {
            k_rows[r * qk_held + c] = Vector::<f32, N>::cast_from(k[k_base + c * lanes]);
            dk[r * qk_held + c] = Vector::<f32, N>::new(0.0f32);
        }
        #[unroll]
        for c in 0..v_held {
            v_rows[r * v_held + c] = Vector::<f32, N>::cast_from(v[v_base + c * lanes]);
            dv[r * v_held + c] = Vector::<f32, N>::new(0.0f32);
        }
    }

    let mut q_block = Array::<Vector<f32, N>>::new(block * qk_held);
    let mut scores = Array::<f32>::new(rows * block);
    let mut dps = Array::<f32>::new(rows * block);
    let mut row_lse = Array::<f32>::new(block);
    let mut row_delta = Array::<f32>::new(block);
    let mut row_ok = Array::<bool>::new(block);
    let last_row = seq_q - 1;

    for g in 0..group {
        let head = first_head + g;
        let mut start = row_start;
        while start < row_end {
            let first = start as usize;
            // Scores S = q·kᵀ·scale for `block` query rows.
            #[unroll]
            for t in 0..block {
                let row = first + t;
                let mut row_c = row;
                if row > last_row {
                    row_c = last_row;
                }
                row_ok[t] = row < seq_q;
                let stat = (head * seq_q + row_c) * 2;
                row_lse[t] = stats[stat];
                row_delta[t] = stats[stat + 1];
                #[unroll]
                for r in 0..rows {
                    scores[r * block + t] = 0.0f32;
                    dps[r * block + t] = 0.0f32;
                }
                let q_base = (head * seq_q + row_c) * qk_vectors + lane;
                #[unroll]
                for c in 0..qk_held {
                    let query = Vector::<f32, N>::cast_from(q[q_base + c * lanes]);
                    q_block[t * qk_held + c] = query;
                    // The query scaled, as the forward scales its rows: the same
                    // products in the same order, so the same scores, which cancel
                    // exactly against the forward's log-sum-exp in a row's largest
                    // probability (scaled keys would round apart, and in peaked rows
                    // that would dominate dK's and dV's error).
                    let scaled = query * scale;
                    #[unroll]
                    for r in 0..rows {
                        scores[r * block + t] += scaled.dot(k_rows[r * qk_held + c]);
                    }
                }
                #[unroll]
                for r in 0..rows {
                    scores[r * block + t] =
                        lane_sum(scores[r * block + t], &mut scratch, lanes, config.lane_sum);
                }
            }
            // P = exp(S − LSE) where visible; the capped score is kept for dS.
            #[unroll]
            for t in 0..block {
                let pos = start + t as i32 + shift;
                #[unroll]
                for r in 0..rows {
                    let capped = cap_score(scores[r * block + t], &sizes, true);
                    let visible =
                        row_ok[t] && kept[r] && structurally_visible(pos, key_pos[r], &sizes);
                    scores[r * block + t] = select(visible, f32::exp(capped - row_lse[t]), 0.0f32);
                    dps[r * block + t] = cap_derivative(capped, &sizes, true);
                }
            }
            // dV += P·dO and dP = dO·vᵀ.
            #[unroll]
            for t in 0..block {
                let mut row = first + t;
                if row > last_row {
                    row = last_row;
                }
                let do_base = (head * seq_q + row) * v_vectors + lane;
                let mut dp = Array::<f32>::new(rows);
                #[unroll]
                for r in 0..rows {
                    dp[r] = 0.0f32;
                }
                #[unroll]
                for c in 0..v_held {
                    let grad = Vector::<f32, N>::cast_from(grad_out[do_base + c * lanes]);
                    #[unroll]
                    for r in 0..rows {
                        dp[r] += v_rows[r * v_held + c].dot(grad);
                        dv[r * v_held + c] += grad * Vector::<f32, N>::new(scores[r * block + t]);
                    }
                }
                // dS = P ∘ (dP − D) ∘ softcap'.
                #[unroll]
                for r in 0..rows {
                    let dp_sum = lane_sum(dp[r], &mut scratch, lanes, config.lane_sum);
                    dps[r * block + t] *= scores[r * block + t] * (dp_sum - row_delta[t]);
                }
            }
            // dK += dS·q (scaled at the end).
            #[unroll]
            for t in 0..block {
                #[unroll]
                for c in 0..qk_held {
                    let query = q_block[t * qk_held + c];
                    #[unroll]
                    for r in 0..rows {
                        dk[r * qk_held + c] += query * Vector::<f32, N>::new(dps[r * block + t]);
                    }
                }
            }
            start += block as i32;
        }
    }

    #[unroll]
    for r in 0..rows {
        let key = first_key + r;
        if key < seq_k {
            let k_base = (kv_head * seq_k + key) * qk_vectors + lane;
            let v_base = (kv_head * seq_k + key) * v_vectors + lane;
            #[unroll]
            for c in 0..qk_held {
                grad_k[k_base + c * lanes] = Vector::<F, N>::cast_from(dk[r * qk_held + c] * scale);
            }
            #[unroll]
            for c in 0..v_held {
                grad_v[v_base + c * lanes] = Vector::<F, N>::cast_from(dv[r * v_held + c]);
            }
        }
    }
}

/// Backward for queries: `dQ = scale·dS·K`, streaming keys like the forward.
///
/// Cube `(x, y)`: query rows `x·units·rows ..` of head `y` (flattened `batch·heads`).
#[cube(launch_unchecked)]
#[allow(clippy::too_many_arguments)]
pub fn flash_backward_q<F: Float, N: Size>(
    q: &Tensor<Vector<F, N>>,
    k: &Tensor<Vector<F, N>>,
    v: &Tensor<Vector<F, N>>,
    grad_out: &Tensor<Vector<F, N>>,
    stats: &Tensor<f32>,
    key_mask: &Tensor<F>,
    grad_q: &mut Tensor<Vector<F, N>>,
    sizes: Sizes,
    #[comptime] config: AttentionConfig,
    #[define(F)] _dtype: ElemType,
) {
    let rows = config.rows;
    let block = config.block;
    let lanes = config.lanes;
    let qk_vectors = config.qk_vectors;
    let v_vectors = config.v_vectors;
    // This lane's vectors of each row: `lane, lane + lanes, …`.
    let qk_held = comptime!(qk_vectors / lanes);
    let v_held = comptime!(v_vectors / lanes);
    let tile_rows = comptime!(config.units / lanes * rows);

    let seq_q = sizes.seq_q as usize;
    let seq_k = sizes.seq_k as usize;
    let unit = UNIT_POS_X as usize;
    let lane = unit % lanes;
    let tile = CUBE_POS_X as usize;
    let head = CUBE_POS_Y as usize;
    let (batch, kv_head) = kv_head_of(head, &sizes);
    let shift = i32::cast_from(sizes.seq_k) - i32::cast_from(sizes.seq_q);
    let mut scratch = lane_scratch(config);

    let first_row = tile * tile_rows + unit / lanes * rows;
    let (kv_start, kv_end) = key_range(tile * tile_rows, tile_rows, &sizes);

    let scale = Vector::<f32, N>::new(sizes.scale);
    let mut q_rows = Array::<Vector<f32, N>>::new(rows * qk_held);
    let mut do_rows = Array::<Vector<f32, N>>::new(rows * v_held);
    let mut dq = Array::<Vector<f32, N>>::new(rows * qk_held);
    let mut positions = Array::<i32>::new(rows);
    let mut row_lse = Array::<f32>::new(rows);
    let mut row_delta = Array::<f32>::new(rows);
    #[unroll]
    for r in 0..rows {
        let mut row = first_row + r;
        if row >= seq_q {
            row = seq_q - 1;
        }
        positions[r] = i32::cast_from(row) + shift;
        row_lse[r] = stats[(head * seq_q + row) * ROW_STATS];
        row_delta[r] = stats[(head * seq_q + row) * ROW_STATS + 1];
        let q_base = (head * seq_q + row) * qk_vectors + lane;
        let do_base = (head * seq_q + row) * v_vectors + lane;
        #[unroll]
        for c in 0..qk_held {
            q_rows[r * qk_held + c] = Vector::<f32, N>::cast_from(q[q_base + c * lanes]) * scale;
            dq[r * qk_held + c] = Vector::<f32, N>::new(0.0f32);
        }
        #[unroll]
        for c in 0..v_held {
            do_rows[r * v_held + c] = Vector::<f32, N>::cast_from(grad_out[do_base + c * lanes]);
        }
    }

    let mut k_block = Array::<Vector<f32, N>>::new(block * qk_held);
    let mut scores = Array::<f32>::new(rows * block);
    let mut dps = Array::<f32>::new(rows * block);
    let mut kept = Array::<bool>::new(block);
    let last_key = seq_k - 1;

    let mut start = kv_start;
    while start < kv_end {
        let first = start as usize;
        #[unroll]
        for t in 0..block {
            let key = first + t;
            let mut key_c = key;
            if key > last_key {
                key_c = last_key;
            }
            kept[t] = key_kept::<F>(key_mask, key, key_c, batch, &sizes);
            #[unroll]
            for r in 0..rows {
                scores[r * block + t] = 0.0f32;
                dps[r * block + t] = 0.0f32;
            }
            let k_base = (kv_head * seq_k + key_c) * qk_vectors + lane;
            #[unroll]
            for c in 0..qk_held {
                let key_vector = Vector::<f32, N>::cast_from(k[k_base + c * lanes]);
                k_block[t * qk_held + c] = key_vector;
                #[unroll]
                for r in 0..rows {
                    scores[r * block + t] += q_rows[r * qk_held + c].dot(key_vector);
                }
            }
            let v_base = (kv_head * seq_k + key_c) * v_vectors + lane;
            #[unroll]
            for c in 0..v_held {
                let value = Vector::<f32, N>::cast_from(v[v_base + c * lanes]);
                #[unroll]
                for r in 0..rows {
                    dps[r * block + t] += do_rows[r * v_held + c].dot(value);
                }
            }
            #[unroll]
            for r in 0..rows {
                scores[r * block + t] =
                    lane_sum(scores[r * block + t], &mut scratch, lanes, config.lane_sum);
                dps[r * block + t] =
                    lane_sum(dps[r * block + t], &mut scratch, lanes, config.lane_sum);
            }
        }
        // dS = P ∘ (dP − D) ∘ softcap', P = exp(S − LSE) where visible.
        #[unroll]
        for t in 0..block {
            #[unroll]
            for r in 0..rows {
                let visible =
                    kept[t] && structurally_visible(positions[r], start + t as i32, &sizes);
                let (_, ds) = probability_and_gradient(
                    scores[r * block + t],
                    dps[r * block + t],
                    row_lse[r],
                    row_delta[r],
                    visible,
                    &sizes,
                    true,
                    Exponential::Library,
                );
                dps[r * block + t] = ds;
            }
        }
        // dQ += dS·k (scaled at the end).
        #[unroll]
        for t in 0..block {
            #[unroll]
            for c in 0..qk_held {
                let key_vector = k_block[t * qk_held + c];
                #[unroll]
                for r in 0..rows {
                    dq[r * qk_held + c] += key_vector * Vector::<f32, N>::new(dps[r * block + t]);
                }
            }
        }
        start += block as i32;
    }

    #[unroll]
    for r in 0..rows {
        let row = first_row + r;
        if row < seq_q {
            let q_base = (head * seq_q + row) * qk_vectors + lane;
            #[unroll]
            for c in 0..qk_held {
                grad_q[q_base + c * lanes] = Vector::<F, N>::cast_from(dq[r * qk_held + c] * scale);
            }
        }
    }
}
