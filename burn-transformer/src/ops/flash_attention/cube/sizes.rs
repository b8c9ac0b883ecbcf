//! The runtime sizes of one launch and the rules every kernel family reads from them:
//! which keys a query row sees, which heads share a key/value head, the soft-cap, and
//! the score a hidden entry takes.
//!
//! Masking is the device transcription of [`MaskRule`](crate::ops::mask::MaskRule)
//! (bottom-right aligned causal, window, key padding); the parity grid tests the two
//! against each other. Hidden scores use [`HIDDEN_SCORE`], a large negative *finite*
//! value: WGSL has no infinity literal.

use cubecl::prelude::*;

use crate::ops::mask::HIDDEN_SCORE;

/// Score of a hidden entry (see [`HIDDEN_SCORE`]).
pub(super) const HIDDEN: f32 = HIDDEN_SCORE;
/// Visible scores are clamped above this, so that a row's max is above `HIDDEN`
/// exactly when the row sees a key.
pub(super) const SCORE_FLOOR: f32 = HIDDEN_SCORE / 10.0;

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
