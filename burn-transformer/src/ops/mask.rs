//! The masking rule of attention, stated once: which keys a query sees.
//!
//! Queries are aligned bottom-right with the keys: query row `i` of `seq_q` sits at
//! absolute position `p = i + seq_k - seq_q`. This is what cached decoding needs (the
//! new queries are the last `seq_q` positions of the sequence) and equals the usual
//! top-left alignment when `seq_q == seq_k`.
//! - `causal`: key `j` is visible to position `p` when `j <= p`.
//! - `window = Some(w)` with `causal`: also `j > p - w`, so a query sees
//!   `p-w+1 ..= p` (Mistral's sliding window). Without `causal` the window is
//!   symmetric: `|p - j| < w` (local attention in encoders).
//! - `chunk = Some(c)`: the sequence is cut into chunks of `c` positions from position
//!   0, and a query sees only keys of its own chunk, `⌊j / c⌋ = ⌊p / c⌋` (Llama 4's
//!   chunked local attention with `causal`; block-diagonal attention without). Unlike
//!   a window, what a query sees depends on where the chunk starts, so positions count
//!   from the first key of the call: a chunked cache keeps every key (see
//!   [`KvCache`](crate::attention::KvCache)).
//! - key padding, `[batch, seq_k]`: `true` marks a padded key that nobody sees.
//!
//! Under these rules the keys a query sees always form one contiguous range
//! ([`MaskRule::visible_keys`]), minus padded keys. A query row that sees no key at all
//! returns zeros (never NaN), and its log-sum-exp is [`MASKED_ROW_LSE`].
//!
//! Every attention path reads this rule: the reference path through
//! [`MaskRule::hidden_flags`], the fused CPU softmax through
//! [`MaskRule::visible_keys`], and the CubeCL kernels through a `#[cube]` transcription
//! (device code cannot call host functions) that the parity grid tests against it.

use std::ops::Range;

use burn::tensor::{Bool, DType, Device, Tensor, TensorData};

/// The absolute position of query row `row` when `seq_q` queries meet `seq_k` keys:
/// aligned bottom-right, row `row` sits at `row + seq_k - seq_q` (negative when there
/// are more queries than keys).
pub fn query_position(row: usize, seq_q: usize, seq_k: usize) -> i64 {
    row as i64 + seq_k as i64 - seq_q as i64
}

/// Which keys each query sees by position: the causal mask, the sliding window and the
/// chunks. Key padding is per batch entry and travels as a tensor beside it.
///
/// ```rust
/// use burn_transformer::ops::mask::MaskRule;
/// // One new query after three cached keys, sliding window of 2: it sees keys 2 and 3.
/// let rule = MaskRule::new(true, Some(2));
/// assert_eq!(rule.visible_keys(0, 1, 4), 2..4);
/// ```
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct MaskRule {
    /// Each query sees only keys at or before its own position.
    pub causal: bool,
    /// Sliding window size `w` (see the module docs); at least 1.
    pub window: Option<usize>,
    /// Chunk size `c` (see the module docs); at least 1.
    pub chunk: Option<usize>,
}

impl MaskRule {
    /// A rule with the given causal flag and window.
    pub fn new(causal: bool, window: Option<usize>) -> Self {
        Self {
            causal,
            window,
            chunk: None,
        }
    }

    /// The rule with chunks of `chunk` positions (`None`: no chunks).
    pub fn with_chunk(self, chunk: Option<usize>) -> Self {
        Self { chunk, ..self }
    }

    /// Whether the rule hides anything by position (causal, windowed or chunked).
    pub fn is_positional(&self) -> bool {
        self.causal || self.window.is_some() || self.chunk.is_some()
    }

    /// The keys `lo..hi` that query row `row` sees (padding aside); empty when it sees
    /// none.
    pub fn visible_keys(&self, row: usize, seq_q: usize, seq_k: usize) -> Range<usize> {
        let position = query_position(row, seq_q, seq_k);
        let mut lo = 0i64;
        let mut hi = seq_k as i64;
        if self.causal {
            hi = hi.min(position + 1);
        }
        if let Some(window) = self.window {
            let window = window as i64;
            lo = lo.max(position - window + 1);
            if !self.causal {
                hi = hi.min(position + window);
            }
        }
        if let Some(chunk) = self.chunk {
            let start = position.div_euclid(chunk as i64) * chunk as i64;
            lo = lo.max(start);
            hi = hi.min(start + chunk as i64);
        }
        let lo = lo.clamp(0, seq_k as i64) as usize;
        let hi = hi.clamp(0, seq_k as i64) as usize;
        lo..hi.max(lo)
    }

    /// Whether key `key` is hidden from query row `row` by position.
    pub fn is_hidden(&self, row: usize, key: usize, seq_q: usize, seq_k: usize) -> bool {
        !self.visible_keys(row, seq_q, seq_k).contains(&key)
    }

    /// Row-major `[seq_q, seq_k]` hidden flags, or `None` when nothing is hidden by
    /// position.
    pub fn hidden_flags(&self, seq_q: usize, seq_k: usize) -> Option<Vec<bool>> {
        if !self.is_positional() {
            return None;
        }
        let mut hidden = Vec::with_capacity(seq_q * seq_k);
        for row in 0..seq_q {
            let visible = self.visible_keys(row, seq_q, seq_k);
            hidden.extend((0..seq_k).map(|key| !visible.contains(&key)));
        }
        Some(hidden)
    }
}

/// Log-sum-exp of a query row that sees no key.
///
/// Large and finite: `exp(s - LSE)` is exactly 0 for every finite score, so the
/// backward gives zero gradients for such rows instead of NaN.
pub const MASKED_ROW_LSE: f32 = 1.0e30;

/// Score of a hidden key where an infinity cannot be written (WGSL has no infinity
/// literal): `exp(HIDDEN_SCORE - m)` is 0 for every visible row maximum `m`. Paths
/// built from tensor ops fill hidden scores with `-inf` instead, and clamp the row
/// maximum to [`lowest_finite`] so that a fully hidden row stays NaN-free.
pub const HIDDEN_SCORE: f32 = -1.0e30;

/// The most negative finite value of a float type: the floor of a row maximum on the
/// tensor-op paths (f16's and bf16's arithmetic is clamped to f16's range, which both
/// represent).
pub fn lowest_finite(dtype: DType) -> f64 {
    match dtype {
        DType::F16 | DType::BF16 => -65504.0,
        _ => f32::MIN as f64,
    }
}

/// A key padding mask (`true` = padded) from per-sequence key lengths: keys at
/// positions `>= lengths[b]` are padding (right padding).
///
/// # Shapes
/// - output: `[lengths.len(), seq_k]`
pub fn padding_mask_from_lengths(
    lengths: &[usize],
    seq_k: usize,
    device: &Device,
) -> Tensor<2, Bool> {
    let hidden: Vec<bool> = lengths
        .iter()
        .flat_map(|&length| (0..seq_k).map(move |key| key >= length))
        .collect();
    Tensor::from_data(TensorData::new(hidden, [lengths.len(), seq_k]), device)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The rule as its definition reads, pair by pair.
    fn hidden_by_definition(
        rule: MaskRule,
        row: usize,
        key: usize,
        seq_q: usize,
        seq_k: usize,
    ) -> bool {
        let position = row as i64 + seq_k as i64 - seq_q as i64;
        let key = key as i64;
        let causal_hides = rule.causal && key > position;
        let window_hides = rule.window.is_some_and(|w| {
            let w = w as i64;
            position - key >= w || (!rule.causal && key - position >= w)
        });
        let chunk_hides = rule
            .chunk
            .is_some_and(|c| key.div_euclid(c as i64) != position.div_euclid(c as i64));
        causal_hides || window_hides || chunk_hides
    }

    #[test]
    fn visible_range_equals_the_definition() {
        for (seq_q, seq_k) in [(5, 9), (9, 5), (1, 4), (7, 7), (3, 1)] {
            for causal in [false, true] {
                for window in [None, Some(1), Some(2), Some(3), Some(20)] {
                    for chunk in [None, Some(1), Some(3), Some(4), Some(20)] {
                        let rule = MaskRule::new(causal, window).with_chunk(chunk);
                        let flags = rule.hidden_flags(seq_q, seq_k);
                        for row in 0..seq_q {
                            for key in 0..seq_k {
                                let expected = hidden_by_definition(rule, row, key, seq_q, seq_k);
                                assert_eq!(rule.is_hidden(row, key, seq_q, seq_k), expected);
                                if let Some(flags) = &flags {
                                    assert_eq!(flags[row * seq_k + key], expected);
                                }
                            }
                        }
                        let positional = causal || window.is_some() || chunk.is_some();
                        assert_eq!(flags.is_none(), !positional);
                    }
                }
            }
        }
    }

    #[test]
    fn queries_are_aligned_bottom_right() {
        // One new query at the end of a 4-key cache sees all 4 keys.
        assert_eq!(MaskRule::new(true, None).visible_keys(0, 1, 4), 0..4);
        // A window of 2 keeps the last two.
        assert_eq!(MaskRule::new(true, Some(2)).visible_keys(0, 1, 4), 2..4);
        // Symmetric window without causal.
        assert_eq!(MaskRule::new(false, Some(2)).visible_keys(2, 5, 5), 1..4);
        // Chunks of 4 from position 0: position 5 sees 4 and 5; position 4 only itself.
        let chunked = MaskRule::new(true, None).with_chunk(Some(4));
        assert_eq!(chunked.visible_keys(5, 6, 6), 4..6);
        assert_eq!(chunked.visible_keys(0, 1, 5), 4..5);
        assert_eq!(chunked.visible_keys(3, 6, 6), 0..4);
        // More queries than keys: the first rows see nothing.
        assert!(MaskRule::new(true, None).visible_keys(0, 5, 3).is_empty());
    }

    #[test]
    fn padding_from_lengths_marks_the_tail() {
        let device = Device::flex();
        let mask = padding_mask_from_lengths(&[3, 0], 4, &device);
        let values: Vec<bool> = mask.into_data().try_to_vec().unwrap();
        assert_eq!(values, [false, false, false, true, true, true, true, true]);
    }
}
