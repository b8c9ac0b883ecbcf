//! The latent KV cache: per token, only the normalized latent and the rotated shared
//! key; and the absorbed weights a cache keeps for the absorbed path.

use burn::tensor::{Bool, Int, Tensor};

/// `kv_b_proj` split per head and arranged for the absorbed path.
#[derive(Clone, Debug)]
pub struct AbsorbedWeights {
    /// `W_ukᵀ`: `[1, n_heads, qk_nope_head_dim, kv_lora_rank]`, maps `q_nope` to the
    /// latent space.
    pub w_uk_t: Tensor<4>,
    /// `W_uv`: `[1, n_heads, kv_lora_rank, v_head_dim]`, maps the attended latent to
    /// each head's value space.
    pub w_uv: Tensor<4>,
}

impl AbsorbedWeights {
    /// The same weights as contiguous, detached tensors (read back and uploaded once):
    /// the per-head splits are strided views of `kv_b_proj`, which a matmul may copy
    /// on every call. For inference caches; gradients do not flow through the result.
    /// The float type stays the weights' (`from_data` alone would give the device's
    /// default, f32, beside a half-precision model's f16 activations).
    pub fn materialized(self) -> Self {
        let fresh = |t: Tensor<4>| Tensor::from_data(t.to_data(), (&t.device(), t.dtype()));
        Self {
            w_uk_t: fresh(self.w_uk_t),
            w_uv: fresh(self.w_uv),
        }
    }
}

/// The latent KV cache of one [`LatentAttention`](super::LatentAttention) layer: per
/// token only the normalized latent and the rotated shared key (`kv_lora_rank +
/// qk_rope_head_dim` values; 576 for DeepSeek-V3 against 40 960 for the same heads as
/// MHA).
///
/// On the absorbed path the cache also keeps the module's absorbed weights, split once
/// on the first step: a cache belongs to one layer of one model, and
/// [`reset`](Self::reset) forgets them with the positions.
#[derive(Clone, Debug, Default)]
pub struct LatentKvCache {
    /// `[batch, 1, cached, kv_lora_rank + qk_rope_head_dim]`: `[c ‖ k_rope]`.
    entries: Option<Tensor<4>>,
    /// `[batch, cached]`, `true` for padded positions; `None` when nothing is padded.
    padding: Option<Tensor<2, Bool>>,
    /// Number of positions seen so far.
    position: usize,
    /// `kv_b_proj` split for the absorbed path.
    pub(super) absorbed: Option<AbsorbedWeights>,
}

impl LatentKvCache {
    /// An empty cache.
    pub fn new() -> Self {
        Self::default()
    }

    /// The absolute position of the next token: the RoPE offset.
    pub fn position(&self) -> usize {
        self.position
    }

    /// Number of positions stored.
    pub fn len(&self) -> usize {
        self.entries.as_ref().map_or(0, |e| e.dims()[2])
    }

    /// Whether nothing is cached.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Bytes held by the cached latents and rotary keys (not the absorbed weights).
    pub fn bytes(&self) -> usize {
        self.entries
            .as_ref()
            .map_or(0, |e| e.shape().num_elements() * e.dtype().size())
    }

    /// Bytes one token of one sequence takes: `(kv_lora_rank + qk_rope) · dtype size`;
    /// 0 while empty.
    pub fn bytes_per_token(&self) -> usize {
        self.entries
            .as_ref()
            .map_or(0, |e| e.dims()[3] * e.dtype().size())
    }

    /// The cached `[c ‖ k_rope]`, if any.
    ///
    /// # Shapes
    /// - `[batch, 1, cached, kv_lora_rank + qk_rope_head_dim]`
    pub fn entries(&self) -> Option<&Tensor<4>> {
        self.entries.as_ref()
    }

    /// Appends the new positions and returns everything to attend over.
    ///
    /// # Shapes
    /// - entries: `[batch, 1, new, kv_lora_rank + qk_rope]`
    /// - padding: `[batch, new]` (`true` = padded) or `None`
    /// - returns entries `[batch, 1, cached + new, _]` and padding `[batch, cached + new]`
    ///   if any step had one.
    pub fn append(
        &mut self,
        entries: Tensor<4>,
        padding: Option<Tensor<2, Bool>>,
    ) -> (Tensor<4>, Option<Tensor<2, Bool>>) {
        let [batch, _, new, _] = entries.dims();
        let cached = self.len();
        let device = entries.device();
        let entries = match self.entries.take() {
            Some(past) => Tensor::cat(vec![past, entries], 2),
            None => entries,
        };
        // Padding is tracked only once some step has it; earlier steps were unpadded.
        let padding = match (self.padding.take(), padding) {
            (None, None) => None,
            (past, new_padding) => {
                let none = |shape: [usize; 2]| Tensor::<2, Int>::zeros(shape, &device).bool();
                let past = past.unwrap_or_else(|| none([batch, cached]));
                let new_padding = new_padding.unwrap_or_else(|| none([batch, new]));
                Some(Tensor::cat(vec![past, new_padding], 1))
            }
        };
        self.position += new;
        self.entries = Some(entries.clone());
        self.padding = padding.clone();
        (entries, padding)
    }

    /// The absorbed weights kept for the absorbed path, once a step has split them.
    pub fn absorbed_weights(&self) -> Option<&AbsorbedWeights> {
        self.absorbed.as_ref()
    }

    /// Sets (or clears) the absorbed weights, e.g. to share one split between the caches
    /// of several sequences decoded by the same layer.
    pub fn set_absorbed_weights(&mut self, weights: Option<AbsorbedWeights>) {
        self.absorbed = weights;
    }

    /// Empties the cache (and forgets the absorbed weights).
    pub fn reset(&mut self) {
        *self = Self::default();
    }

    /// Keeps only the batch rows in `indices` (beam search reorders beams).
    ///
    /// # Shapes
    /// - indices: `[new_batch]`
    pub fn select_batch(&mut self, indices: Tensor<1, Int>) {
        self.entries = self.entries.take().map(|t| t.select(0, indices.clone()));
        self.padding = self
            .padding
            .take()
            .map(|t| t.int().select(0, indices.clone()).bool());
    }
}

#[cfg(test)]
mod tests {
    use super::super::config::tests::small_config;
    use super::*;
    use burn::tensor::{DType, Device, Distribution};

    /// The cache of the small config's attention after `seq` positions of `batch` rows.
    fn filled_cache(batch: usize, seq: usize, device: &Device) -> LatentKvCache {
        let attention = small_config().init(device);
        let mut cache = LatentKvCache::new();
        let x = Tensor::<3>::random([batch, seq, 40], Distribution::Normal(0.0, 1.0), device);
        attention.forward_cached(x, &mut cache, None);
        cache
    }

    #[test]
    fn cache_stores_only_latent_and_rotary_key() {
        let cache = filled_cache(3, 5, &Device::flex());
        // (rank 12 + rope 4) floats of 4 bytes per token.
        assert_eq!(cache.bytes_per_token(), 16 * 4);
        assert_eq!(cache.bytes(), 3 * 5 * 16 * 4);
        let footprint = small_config().cache_bytes_per_token(DType::F32, 1);
        assert_eq!(footprint.latent, cache.bytes_per_token());
        // MHA: 5 heads × (6 + 4 key + 7 value) floats.
        assert_eq!(footprint.mha, 5 * 17 * 4);
        assert_eq!(footprint.gqa, 17 * 4);
    }

    #[test]
    fn select_batch_and_reset() {
        let device = Device::flex();
        let mut cache = filled_cache(3, 2, &device);
        cache.select_batch(Tensor::from_ints([2, 0], &device));
        assert_eq!(cache.entries().unwrap().dims(), [2, 1, 2, 16]);
        cache.reset();
        assert!(cache.is_empty() && cache.position() == 0);
    }
}
