//! The register-tile kernels of flash attention (`#[cube]` code only; tile choice and
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

use cubecl::prelude::*;

use super::row_stats::ROW_STATS;
use super::sizes::{
    HIDDEN, ScoreTerms, Sizes, alibi_bias, alibi_slope, biased_score, cap_derivative, cap_score,
    key_kept, key_range, kv_head_of, query_heads_of, row_range, structurally_visible,
};
use super::softmax::{
    Exponential, finish_row, masked_score, online_max, probability, probability_and_gradient,
};

/// Compile-time shape of one launch; each distinct value compiles one kernel. The
/// masking options are runtime flags ([`Sizes`]): one compiled kernel serves every
/// combination, and a disabled option costs a uniform branch. ALiBi, a term in every
/// score, is compiled in only for the calls that have it ([`Self::alibi`]).
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
    /// Whether the scores take ALiBi's bias.
    pub alibi: bool,
    /// Whether the mask has chunks ([`ScoreTerms::chunk`]).
    pub chunked: bool,
}

impl AttentionConfig {
    /// The terms this kernel's scores take: the soft-cap's code always (a runtime
    /// flag), ALiBi's where compiled in.
    pub fn terms(&self) -> ScoreTerms {
        ScoreTerms {
            cap: true,
            alibi: self.alibi,
            chunk: self.chunked,
        }
    }
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
    let terms = comptime!(config.terms());
    let slope = alibi_slope(head, &sizes, terms);

    let first_row = tile * tile_rows + unit / lanes * rows;
    let (kv_start, kv_end) = key_range(tile * tile_rows, tile_rows, &sizes, terms);

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
                let key = start + t as i32;
                let visible = kept[t] && structurally_visible(positions[r], key, &sizes, terms);
                let bias = alibi_bias(slope, positions[r], key, terms);
                let score = masked_score(scores[r * block + t], bias, visible, &sizes, terms);
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
    let terms = comptime!(config.terms());

    let first_key = tile * tile_keys + unit / lanes * rows;
    let (row_start, row_end) = row_range(tile * tile_keys, tile_keys, &sizes, terms);

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
        let slope = alibi_slope(head, &sizes, terms);
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
                    let capped = cap_score(scores[r * block + t], &sizes, terms);
                    let bias = alibi_bias(slope, pos, key_pos[r], terms);
                    let score = biased_score(capped, bias, terms);
                    let visible = row_ok[t]
                        && kept[r]
                        && structurally_visible(pos, key_pos[r], &sizes, terms);
                    scores[r * block + t] = select(visible, f32::exp(score - row_lse[t]), 0.0f32);
                    dps[r * block + t] = cap_derivative(capped, &sizes, terms);
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
    let terms = comptime!(config.terms());
    let slope = alibi_slope(head, &sizes, terms);

    let first_row = tile * tile_rows + unit / lanes * rows;
    let (kv_start, kv_end) = key_range(tile * tile_rows, tile_rows, &sizes, terms);

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
                let key = start + t as i32;
                let visible = kept[t] && structurally_visible(positions[r], key, &sizes, terms);
                let (_, ds) = probability_and_gradient(
                    scores[r * block + t],
                    alibi_bias(slope, positions[r], key, terms),
                    dps[r * block + t],
                    row_lse[r],
                    row_delta[r],
                    visible,
                    &sizes,
                    terms,
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
