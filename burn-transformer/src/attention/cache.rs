//! Key/value caches for incremental decoding.
//!
//! A cache holds the keys and values of the positions already seen, so that a
//! decoding step projects only the new tokens. A grouped-query cache stores the
//! `n_kv_heads` heads as they are, never repeated copies: the attention core reads
//! the shared head directly.

use burn::tensor::{Bool, Tensor};

/// Keys and values of past positions for one self-attention layer.
///
/// With a sliding window `w` the cache rolls: after each step it keeps only the
/// last `w - 1` positions, which is everything a future query can still see, so
/// memory stays bounded however long the generation runs. Masks stay exact because
/// the attention core aligns queries with the end of the keys.
#[derive(Clone, Debug, Default)]
pub struct KvCache {
    /// `[batch, n_kv_heads, cached, d_qk]`
    keys: Option<Tensor<4>>,
    /// `[batch, n_kv_heads, cached, d_v]`
    values: Option<Tensor<4>>,
    /// `[batch, cached]`, `true` for padded positions; `None` when nothing is padded.
    padding: Option<Tensor<2, Bool>>,
    /// Number of positions seen so far, including those rolled out of a window.
    position: usize,
    /// Keep at most this many past positions between steps.
    keep_last: Option<usize>,
}

impl KvCache {
    /// An empty cache that keeps every position.
    pub fn new() -> Self {
        Self::default()
    }

    /// An empty cache for sliding-window attention of size `window` (positions
    /// older than the window are dropped). `None` keeps everything.
    pub fn with_window(window: Option<usize>) -> Self {
        Self {
            keep_last: window.map(|w| w.saturating_sub(1)),
            ..Self::default()
        }
    }

    /// The absolute position of the next token: the RoPE offset.
    pub fn position(&self) -> usize {
        self.position
    }

    /// Number of positions stored now (≤ [`position`](Self::position) for a rolling cache).
    pub fn len(&self) -> usize {
        self.keys.as_ref().map_or(0, |k| k.dims()[2])
    }

    /// Whether nothing is cached.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Bytes held by the cached keys and values.
    pub fn bytes(&self) -> usize {
        let size = |t: &Option<Tensor<4>>| {
            t.as_ref()
                .map_or(0, |t| t.shape().num_elements() * t.dtype().size())
        };
        size(&self.keys) + size(&self.values)
    }

    /// Appends the new positions and returns all keys, values and padding to attend over.
    ///
    /// # Shapes
    /// - keys: `[batch, n_kv_heads, new, d_qk]`, values: `[batch, n_kv_heads, new, d_v]`
    /// - padding: `[batch, new]` (`true` = padded) or `None`
    /// - returns keys `[batch, n_kv_heads, cached + new, d_qk]`, values likewise, and the
    ///   padding `[batch, cached + new]` if any step had one.
    pub fn append(
        &mut self,
        keys: Tensor<4>,
        values: Tensor<4>,
        padding: Option<Tensor<2, Bool>>,
    ) -> (Tensor<4>, Tensor<4>, Option<Tensor<2, Bool>>) {
        let [batch, _, new, _] = keys.dims();
        let cached = self.len();
        let device = keys.device();
        let keys = match self.keys.take() {
            Some(past) => Tensor::cat(vec![past, keys], 2),
            None => keys,
        };
        let values = match self.values.take() {
            Some(past) => Tensor::cat(vec![past, values], 2),
            None => values,
        };
        // Padding is tracked only once some step has it; earlier steps were unpadded.
        let padding = match (self.padding.take(), padding) {
            (None, None) => None,
            (past, new_padding) => {
                let past = past.unwrap_or_else(|| no_padding([batch, cached], &device));
                let new_padding = new_padding.unwrap_or_else(|| no_padding([batch, new], &device));
                Some(Tensor::cat(vec![past, new_padding], 1))
            }
        };
        self.position += new;

        let total = cached + new;
        let stored = |t: &Tensor<4>, keep: usize| t.clone().narrow(2, total - keep, keep);
        match self.keep_last {
            Some(keep) if total > keep => {
                self.keys = Some(stored(&keys, keep));
                self.values = Some(stored(&values, keep));
                self.padding = padding
                    .as_ref()
                    .map(|p| p.clone().narrow(1, total - keep, keep));
            }
            _ => {
                self.keys = Some(keys.clone());
                self.values = Some(values.clone());
                self.padding = padding.clone();
            }
        }
        (keys, values, padding)
    }

    /// Empties the cache.
    pub fn reset(&mut self) {
        *self = Self {
            keep_last: self.keep_last,
            ..Self::default()
        };
    }

    /// Keeps only the batch rows in `indices` (beam search reorders beams).
    ///
    /// # Shapes
    /// - indices: `[new_batch]` (Int)
    pub fn select_batch(&mut self, indices: Tensor<1, burn::tensor::Int>) {
        self.keys = self.keys.take().map(|t| t.select(0, indices.clone()));
        self.values = self.values.take().map(|t| t.select(0, indices.clone()));
        self.padding = self.padding.take().map(|t| {
            // Bool tensors have no select: go through Int.
            t.int().select(0, indices.clone()).bool()
        });
    }
}

/// An all-`false` padding mask.
fn no_padding(shape: [usize; 2], device: &burn::tensor::Device) -> Tensor<2, Bool> {
    Tensor::<2, burn::tensor::Int>::zeros(shape, device).bool()
}

/// Keys and values of a cross-attention layer: computed from the encoder output
/// once, then reused by every decoding step.
#[derive(Clone, Debug, Default)]
pub struct CrossKvCache {
    /// `[batch, n_kv_heads, seq_memory, d_qk]` and `[batch, n_kv_heads, seq_memory, d_v]`.
    pub(crate) entries: Option<(Tensor<4>, Tensor<4>)>,
}

impl CrossKvCache {
    /// An empty cache: the first decoding step fills it.
    pub fn new() -> Self {
        Self::default()
    }

    /// Whether the memory keys and values were computed.
    pub fn is_filled(&self) -> bool {
        self.entries.is_some()
    }

    /// Keeps only the batch rows in `indices` (beam search).
    pub fn select_batch(&mut self, indices: Tensor<1, burn::tensor::Int>) {
        self.entries = self
            .entries
            .take()
            .map(|(k, v)| (k.select(0, indices.clone()), v.select(0, indices)));
    }
}
