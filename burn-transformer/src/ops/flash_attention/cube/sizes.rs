//! The runtime sizes of one launch and the rules every kernel family reads from them:
//! which keys a query row sees, which heads share a key/value head, the soft-cap,
//! ALiBi's bias, and the score a hidden entry takes.
//!
//! Masking is the device transcription of [`MaskRule`](crate::ops::mask::MaskRule)
//! (bottom-right aligned causal, window, chunks, key padding); the parity grid tests the two
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
    /// Chunk size (read by kernels compiled with [`ScoreTerms::chunk`]).
    pub chunk: u32,
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
    /// ALiBi's exponent step, `max_bias / padded_heads` (see [`alibi_slope`]).
    pub alibi_step: f32,
    /// ALiBi's factor on every slope.
    pub alibi_scale: f32,
    /// The power of two at or above the head count, whose slopes ALiBi hands out.
    pub alibi_padded_heads: u32,
}

/// What a kernel compiles into its scores beyond `q·k·scale` and the causal, window
/// and padding masks; each distinct value compiles a kernel of its own, so that a call
/// without a term runs code without it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct ScoreTerms {
    /// The soft-cap's code, applied where `sizes.softcap` asks for it.
    pub cap: bool,
    /// ALiBi's bias on every score ([`alibi_bias`]).
    pub alibi: bool,
    /// The chunks' bounds in the mask ([`visible_keys`]): a division per position,
    /// whose code raised the registers of most kernels (ptxas, sm_90: the fragment
    /// kernels' dQ from 96 to 126 at head dim 64), so calls without chunks run kernels
    /// compiled without it.
    pub chunk: bool,
}

/// The keys that absolute query position `pos` sees by the causal, window and chunk
/// structure, `[first, end)` within `0 .. seq_k` (padding is checked apart): a key `j`
/// is seen when `j <= pos` (causal), `pos - j < window` and, without causal,
/// `j - pos < window`, and `⌊j / chunk⌋ = ⌊pos / chunk⌋`. Both ends grow with `pos`.
#[cube]
pub(super) fn visible_keys(pos: i32, sizes: &Sizes, #[comptime] terms: ScoreTerms) -> (i32, i32) {
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
    if comptime!(terms.chunk) {
        if pos < 0 {
            // A position before the keys is in a chunk of its own.
            end = i32::min(end, 0);
        } else {
            let start = chunk_start(pos, sizes);
            first = i32::max(first, start);
            end = i32::min(end, start + i32::cast_from(sizes.chunk));
        }
    }
    (first, end)
}

/// The first position of the chunk holding position `pos >= 0`.
#[cube]
fn chunk_start(pos: i32, sizes: &Sizes) -> i32 {
    let chunk = i32::cast_from(sizes.chunk);
    pos / chunk * chunk
}

/// The absolute query positions that see key `key` by the same structure,
/// `[first, end)` within the rows' positions (`seq_k - seq_q .. seq_k`): the rule of
/// [`visible_keys`] read the other way. Both ends grow with `key`.
#[cube]
pub(super) fn seeing_positions(
    key: i32,
    sizes: &Sizes,
    #[comptime] terms: ScoreTerms,
) -> (i32, i32) {
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
    if comptime!(terms.chunk) {
        let start = chunk_start(key, sizes);
        first = i32::max(first, start);
        end = i32::min(end, start + i32::cast_from(sizes.chunk));
    }
    (first, end)
}

/// Whether key `key` (below `seq_k`) is visible from absolute query position `pos` by
/// the causal, window and chunk structure (padding is checked apart): inside `pos`'s range of
/// [`visible_keys`], which is the same for each of a row's keys, so that in unrolled
/// loops over a row's scores the compiler works it out once a row.
#[cube]
pub(super) fn structurally_visible(
    pos: i32,
    key: i32,
    sizes: &Sizes,
    #[comptime] terms: ScoreTerms,
) -> bool {
    let (first, end) = visible_keys(pos, sizes, terms);
    key >= first && key < end
}

/// Whether each of the `keys` keys from `key_first` is visible from each of the
/// `rows` absolute query positions from `pos_first` with no per-score work: no padding
/// mask is read, no soft-cap applies, every key lies below `key_end` (real keys of the
/// launch's range), and the causal, window and chunk structure hides none of them. Such a
/// block's scores need only the scale (FlashAttention-2 masks only the blocks on a
/// mask's edge). Both ends of [`visible_keys`] grow with the position, so the two
/// corners of the block decide it. A kernel compiled with ALiBi (`terms`) has no open block:
/// the bias is work on every score.
#[cube]
pub(super) fn block_open(
    pos_first: i32,
    #[comptime] rows: usize,
    key_first: i32,
    #[comptime] keys: usize,
    key_end: i32,
    sizes: &Sizes,
    #[comptime] terms: ScoreTerms,
) -> bool {
    let mut open = false;
    if comptime!(!terms.alibi) {
        let pos_last = pos_first + (rows - 1) as i32;
        let key_last = key_first + (keys - 1) as i32;
        open = sizes.key_mask == 0
            && sizes.softcap == 0
            && key_last < key_end
            && structurally_visible(pos_first, key_last, sizes, terms)
            && structurally_visible(pos_last, key_first, sizes, terms);
    }
    open
}

/// Soft-caps a scaled score: `c·tanh(s/c)` where `sizes.softcap` asks for it, in a
/// kernel compiled with [`ScoreTerms::cap`] (one compiled without it leaves every
/// score as it is; see [`FragmentConfig::softcap`](super::fragments::FragmentConfig::softcap)).
// The compile-time test stays apart from the run-time one: together they would be one
// run-time condition, and the cap's code would be emitted into every kernel.
#[allow(clippy::collapsible_if)]
#[cube]
pub(super) fn cap_score(score: f32, sizes: &Sizes, #[comptime] terms: ScoreTerms) -> f32 {
    let mut out = score;
    if comptime!(terms.cap) {
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
pub(super) fn cap_derivative(capped: f32, sizes: &Sizes, #[comptime] terms: ScoreTerms) -> f32 {
    let mut out = 1.0f32;
    if comptime!(terms.cap) {
        if sizes.softcap != 0 {
            let ratio = capped * sizes.cap_inverse;
            out = 1.0f32 - ratio * ratio;
        }
    }
    out
}

/// ALiBi's slope of query head `head` (flattened `batch·heads`), in a kernel compiled
/// with [`ScoreTerms::alibi`] (0 otherwise): the rule of
/// [`alibi_slopes`](crate::ops::alibi::alibi_slopes) worked out on the device, since a
/// tensor of slopes would take a ninth storage buffer. Head `h` of a power-of-two count
/// takes exponent `h + 1`; other counts take the next power of two's even exponents
/// first, then its odd ones. The slope is `scale · 2^−(step·exponent)`; its whole
/// powers of two are exact products, so that the usual slopes (a whole `step·exponent`,
/// every head count up to 8 with `max_bias` 8) equal the host's bit for bit, and only
/// a fractional power goes through `exp`.
#[cube]
pub(super) fn alibi_slope(head: usize, sizes: &Sizes, #[comptime] terms: ScoreTerms) -> f32 {
    let mut slope = 0.0f32;
    if comptime!(terms.alibi) {
        let h = head as u32 % sizes.heads;
        let padded = sizes.alibi_padded_heads;
        let half = padded / 2;
        let mut exponent = h + 1;
        if padded != sizes.heads {
            exponent = select(h < half, 2 * (h + 1), 2 * (h - half) + 1);
        }
        let power = sizes.alibi_step * f32::cast_from(exponent);
        let whole = f32::floor(power);
        let mut halvings = u32::cast_from(whole);
        let mut value = sizes.alibi_scale;
        if power > whole {
            value *= f32::exp(-(power - whole) * LN_2);
        }
        while halvings > 0 {
            value *= 0.5f32;
            halvings -= 1;
        }
        slope = value;
    }
    slope
}

/// `ln 2`.
const LN_2: f32 = std::f32::consts::LN_2;

/// ALiBi's bias of key `key` seen from absolute query position `pos`, `slope·(key −
/// pos)` (the positions of [`visible_keys`]), in a kernel compiled with
/// [`ScoreTerms::alibi`] (0 otherwise).
#[cube]
pub(super) fn alibi_bias(slope: f32, pos: i32, key: i32, #[comptime] terms: ScoreTerms) -> f32 {
    let mut bias = 0.0f32;
    if comptime!(terms.alibi) {
        bias = slope * f32::cast_from(key - pos);
    }
    bias
}

/// A soft-capped score with its bias added, in the reference's order (the cap, then
/// the bias), in a kernel compiled with [`ScoreTerms::alibi`]; the capped score itself
/// otherwise, with no instruction spent.
#[cube]
pub(super) fn biased_score(capped: f32, bias: f32, #[comptime] terms: ScoreTerms) -> f32 {
    let mut out = capped;
    if comptime!(terms.alibi) {
        out += bias;
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
pub(super) fn key_range(
    row_first: usize,
    rows: usize,
    sizes: &Sizes,
    #[comptime] terms: ScoreTerms,
) -> (i32, i32) {
    let mut row_last = row_first + rows - 1;
    if row_last >= sizes.seq_q as usize {
        row_last = sizes.seq_q as usize - 1;
    }
    let shift = i32::cast_from(sizes.seq_k) - i32::cast_from(sizes.seq_q);
    let (start, _) = visible_keys(i32::cast_from(row_first) + shift, sizes, terms);
    let (_, end) = visible_keys(i32::cast_from(row_last) + shift, sizes, terms);
    (start, end)
}

/// Range `[start, end)` of query rows that may see any of the `keys` keys from
/// `key_first` (cut at `seq_k`); empty when `end <= start`.
#[cube]
pub(super) fn row_range(
    key_first: usize,
    keys: usize,
    sizes: &Sizes,
    #[comptime] terms: ScoreTerms,
) -> (i32, i32) {
    let mut key_last = key_first + keys - 1;
    if key_last >= sizes.seq_k as usize {
        key_last = sizes.seq_k as usize - 1;
    }
    let shift = i32::cast_from(sizes.seq_k) - i32::cast_from(sizes.seq_q);
    let (start, _) = seeing_positions(i32::cast_from(key_first), sizes, terms);
    let (_, end) = seeing_positions(i32::cast_from(key_last), sizes, terms);
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
