//! The multi-head latent attention module: projections, the expanded and absorbed
//! paths, and the per-head split of `kv_b_proj` the absorbed path uses.

use burn::config::Config;
use burn::module::Module;
use burn::nn::{Dropout, Linear};
use burn::tensor::{Bool, Tensor};

use super::cache::{AbsorbedWeights, LatentKvCache};
use crate::attention::{
    AttentionImpl, AttentionOptions, QueryTemperatureConfig, attention, attention_with_weights,
};
use crate::norm::RmsNorm;
use crate::position::Rope;

/// Multi-head latent attention (DeepSeek-V2/V3). Build it with
/// [`LatentAttentionConfig`](super::LatentAttentionConfig).
///
/// Field names are Hugging Face's `DeepseekV3Attention` keys, so a checkpoint's
/// `model.layers.N.self_attn.*` load by name. Exactly one query path is present:
/// `q_proj`, or `q_a_proj` + `q_a_layernorm` + `q_b_proj`.
#[derive(Module, Debug)]
pub struct LatentAttention {
    /// `[d_model] -> [n_heads · (qk_nope + qk_rope)]`, without `q_lora_rank`.
    pub q_proj: Option<Linear>,
    /// `[d_model] -> [q_lora_rank]`.
    pub q_a_proj: Option<Linear>,
    /// RMSNorm over the query latent.
    pub q_a_layernorm: Option<RmsNorm>,
    /// `[q_lora_rank] -> [n_heads · (qk_nope + qk_rope)]`.
    pub q_b_proj: Option<Linear>,
    /// `[d_model] -> [kv_lora_rank + qk_rope]`: the latent, then the shared rotary key.
    pub kv_a_proj_with_mqa: Linear,
    /// RMSNorm over the key/value latent.
    pub kv_a_layernorm: RmsNorm,
    /// `[kv_lora_rank] -> [n_heads · (qk_nope + v_head_dim)]`: per head, `k_nope` then `v`.
    pub kv_b_proj: Linear,
    /// `[n_heads · v_head_dim] -> [d_model]`.
    pub o_proj: Linear,
    /// The rotary embedding of the rope parts.
    pub rope: Rope,
    /// Dropout on attention probabilities (inactive in eval / without autodiff).
    pub dropout: Dropout,
    #[module(skip)]
    pub(super) n_heads: usize,
    #[module(skip)]
    pub(super) kv_lora_rank: usize,
    #[module(skip)]
    pub(super) qk_nope_head_dim: usize,
    #[module(skip)]
    pub(super) qk_rope_head_dim: usize,
    #[module(skip)]
    pub(super) v_head_dim: usize,
    #[module(skip)]
    pub(super) causal: bool,
    #[module(skip)]
    pub(super) scale: f64,
    #[module(skip)]
    pub(super) query_temperature: Option<QueryTemperatureConfig>,
    #[module(skip)]
    pub(super) cached_path: LatentPath,
    #[module(skip)]
    pub(super) implementation: AttentionImpl,
}

/// Which computation a cached call of [`LatentAttention`] uses.
#[derive(Config, Debug, Copy, PartialEq, Eq)]
pub enum LatentPath {
    /// Expand the cached latent into per-head keys and values (`d_qk = qk_nope +
    /// qk_rope`, `d_v = v_head_dim`). Fewer FLOPs when many queries arrive at once
    /// (prefill).
    Expanded,
    /// Fold `kv_b_proj` into the query and the output and attend over the latent as MQA
    /// (`d_qk = kv_lora_rank + qk_rope`, `d_v = kv_lora_rank`). Reads only the compact
    /// cache: the fast path for decoding.
    Absorbed,
    /// Per call, whichever of the two needs fewer multiply-adds for its shape (see
    /// [`LatentAttention::resolve_path`]): expanded for a prompt, absorbed for decoding
    /// steps over a long cache.
    Auto,
}

impl LatentAttention {
    /// Number of query heads.
    pub fn n_heads(&self) -> usize {
        self.n_heads
    }

    /// Width of the key/value latent.
    pub fn kv_lora_rank(&self) -> usize {
        self.kv_lora_rank
    }

    /// Width of the shared rotary key.
    pub fn qk_rope_head_dim(&self) -> usize {
        self.qk_rope_head_dim
    }

    /// The scale of `q·kᵀ` (including YaRN's mscale²).
    pub fn scale(&self) -> f64 {
        self.scale
    }

    /// The module with another implementation of the attention core, weights kept.
    pub fn with_implementation(mut self, implementation: AttentionImpl) -> Self {
        self.implementation = implementation;
        self
    }

    /// The path a call of `new` queries over `keys` keys (the cached ones and the new)
    /// takes on `path`: [`LatentPath::Auto`] becomes the path with fewer multiply-adds,
    /// the others stay. Per batch row, with `h` heads, latent width `r`, head widths
    /// `n` (no rope), `e` (rope), `v`, and `p` visible (query, key) pairs:
    /// - expanded: `keys·r·h·(n + v)` to expand every key, `p·h·(n + e + v)` to attend;
    /// - absorbed: `new·r·h·(n + v)` to fold `kv_b_proj` into the queries and outputs,
    ///   `p·h·(2r + e)` to attend over the latent.
    ///
    /// A prompt over an empty cache (`keys = new`) takes the expanded path, a decoding
    /// step over a cache the absorbed one; a chunk of new queries over a long cache
    /// takes the expanded path from `r·(n + v) / (2r − n − v)` queries on (171 at
    /// DeepSeek-V3's sizes).
    pub fn resolve_path(&self, path: LatentPath, new: usize, keys: usize) -> LatentPath {
        if path != LatentPath::Auto {
            return path;
        }
        let (h, r) = (self.n_heads as u128, self.kv_lora_rank as u128);
        let (n, e, v) = (
            self.qk_nope_head_dim as u128,
            self.qk_rope_head_dim as u128,
            self.v_head_dim as u128,
        );
        let (new, keys) = (new as u128, keys as u128);
        let pairs = if self.causal {
            // Query i of the new ones sees the cached keys and new keys 0..=i.
            let cached = keys.saturating_sub(new);
            new * cached + new * (new + 1) / 2
        } else {
            new * keys
        };
        let expanded = keys * r * h * (n + v) + pairs * h * (n + e + v);
        let absorbed = new * r * h * (n + v) + pairs * h * (2 * r + e);
        if expanded <= absorbed {
            LatentPath::Expanded
        } else {
            LatentPath::Absorbed
        }
    }

    /// Causal self-attention over `x`, on the expanded path (as HF's forward).
    ///
    /// # Shapes
    /// - x: `[batch, seq, d_model]`
    /// - key_padding: `[batch, seq]`, `true` for padded positions
    /// - output: `[batch, seq, d_model]`
    pub fn forward(&self, x: Tensor<3>, key_padding: Option<Tensor<2, Bool>>) -> Tensor<3> {
        self.forward_path(x, key_padding, LatentPath::Expanded)
    }

    /// Self-attention over `x` on the chosen path, without a cache. Both paths give the
    /// same values (up to float rounding). [`LatentPath::Auto`] resolves by
    /// [`resolve_path`](Self::resolve_path) with every key new: expanded unless the
    /// latent is narrower than half of `qk_nope + v_head_dim`.
    ///
    /// # Shapes
    /// As [`forward`](Self::forward).
    pub fn forward_path(
        &self,
        x: Tensor<3>,
        key_padding: Option<Tensor<2, Bool>>,
        path: LatentPath,
    ) -> Tensor<3> {
        let seq = x.dims()[1];
        let (q_nope, q_rope) = self.queries(x.clone(), 0);
        let entries = self.latent_entries(x, 0);
        let output = if self.resolve_path(path, seq, seq) == LatentPath::Absorbed {
            let weights = self.absorbed_weights();
            self.attend_absorbed(q_nope, q_rope, entries, key_padding, &weights)
        } else {
            self.attend_expanded(q_nope, q_rope, entries, key_padding)
        };
        self.merge_heads(output)
    }

    /// [`forward`](Self::forward) that also returns the attention probabilities, for
    /// inspection: both from the reference path on the expanded heads, without dropout.
    ///
    /// # Shapes
    /// - x: `[batch, seq, d_model]`
    /// - key_padding: `[batch, seq]`, `true` for padded positions
    /// - output: `[batch, seq, d_model]` and the weights `[batch, n_heads, seq, seq]`
    pub fn forward_with_weights(
        &self,
        x: Tensor<3>,
        key_padding: Option<Tensor<2, Bool>>,
    ) -> (Tensor<3>, Tensor<4>) {
        let (q_nope, q_rope) = self.queries(x.clone(), 0);
        let entries = self.latent_entries(x, 0);
        let (queries, keys, values) = self.expanded_heads(q_nope, q_rope, entries);
        let options = self.options(key_padding).with_dropout(0.0);
        let (output, weights) = attention_with_weights(queries, keys, values, &options);
        (self.merge_heads(output), weights)
    }

    /// Self-attention over the new positions `x`, attending also to everything in
    /// `cache`, which is then extended with their latents. Uses the configured
    /// [`cached_path`](super::LatentAttentionConfig::cached_path). Equals
    /// [`forward`](Self::forward) on the whole sequence, one chunk at a time.
    ///
    /// # Shapes
    /// - x: `[batch, new, d_model]`
    /// - key_padding: `[batch, new]` for the new positions, `true` = padded
    /// - output: `[batch, new, d_model]`
    pub fn forward_cached(
        &self,
        x: Tensor<3>,
        cache: &mut LatentKvCache,
        key_padding: Option<Tensor<2, Bool>>,
    ) -> Tensor<3> {
        self.forward_cached_path(x, cache, key_padding, self.cached_path)
    }

    /// [`forward_cached`](Self::forward_cached) on an explicit path.
    ///
    /// # Shapes
    /// As [`forward_cached`](Self::forward_cached).
    pub fn forward_cached_path(
        &self,
        x: Tensor<3>,
        cache: &mut LatentKvCache,
        key_padding: Option<Tensor<2, Bool>>,
        path: LatentPath,
    ) -> Tensor<3> {
        let offset = cache.position();
        let new = x.dims()[1];
        let (q_nope, q_rope) = self.queries(x.clone(), offset);
        let entries = self.latent_entries(x, offset);
        let (entries, padding) = cache.append(entries, key_padding);
        let resolved = self.resolve_path(path, new, offset + new);
        // The module does not change during a generation: split `kv_b_proj` once per
        // cache instead of once per step (a copy of the whole matrix). On the automatic
        // path the prompt is expanded and the decoding steps that follow are absorbed:
        // the prompt's call splits it, so that the steps, and copies of the cache made
        // after the prompt (one per beam, say), find it done.
        if resolved == LatentPath::Absorbed || path == LatentPath::Auto {
            cache
                .absorbed
                .get_or_insert_with(|| self.absorbed_weights().materialized());
        }
        let output = if resolved == LatentPath::Absorbed {
            let weights = cache.absorbed.clone().expect("split above");
            self.attend_absorbed(q_nope, q_rope, entries, padding, &weights)
        } else {
            self.attend_expanded(q_nope, q_rope, entries, padding)
        };
        self.merge_heads(output)
    }

    /// `kv_b_proj`'s key and value halves, per head, for the absorbed path.
    pub fn absorbed_weights(&self) -> AbsorbedWeights {
        let (rank, heads, nope, v) = (
            self.kv_lora_rank,
            self.n_heads,
            self.qk_nope_head_dim,
            self.v_head_dim,
        );
        // Burn stores Linear weights `[d_in, d_out]`: [rank, heads · (nope + v)].
        let weight = self.kv_b_proj.weight.val();
        let per_head = weight.reshape([rank, heads, nope + v]).swap_dims(0, 1); // [heads, rank, nope + v]
        let w_uk_t = per_head
            .clone()
            .narrow(2, 0, nope)
            .swap_dims(1, 2) // [heads, nope, rank]
            .unsqueeze_dim::<4>(0); // [1, heads, nope, rank]
        let w_uv = per_head.narrow(2, nope, v).unsqueeze_dim::<4>(0); // [1, heads, rank, v]
        AbsorbedWeights { w_uk_t, w_uv }
    }

    /// The queries' position-free and rotated parts, rotated from `offset` (and scaled
    /// by the query temperature: the whole query, so both parts, and every path).
    ///
    /// # Shapes
    /// - x: `[batch, seq, d_model]`
    /// - output: `[batch, n_heads, seq, qk_nope]` and `[batch, n_heads, seq, qk_rope]`
    fn queries(&self, x: Tensor<3>, offset: usize) -> (Tensor<4>, Tensor<4>) {
        let [batch, seq, _] = x.dims();
        let q = match (
            &self.q_proj,
            &self.q_a_proj,
            &self.q_a_layernorm,
            &self.q_b_proj,
        ) {
            (Some(q_proj), _, _, _) => q_proj.forward(x),
            (None, Some(a), Some(norm), Some(b)) => b.forward(norm.forward(a.forward(x))),
            _ => panic!(
                "LatentAttention: needs either q_proj or q_a_proj + q_a_layernorm + q_b_proj"
            ),
        };
        let qk = self.qk_nope_head_dim + self.qk_rope_head_dim;
        let q = q.reshape([batch, seq, self.n_heads, qk]).swap_dims(1, 2); // [batch, n_heads, seq, qk]
        let q_nope = q.clone().narrow(3, 0, self.qk_nope_head_dim);
        let q_rope = q.narrow(3, self.qk_nope_head_dim, self.qk_rope_head_dim);
        let q_rope = self.rope.forward(q_rope, offset);
        match &self.query_temperature {
            Some(temperature) => (
                temperature.scale(q_nope, offset),
                temperature.scale(q_rope, offset),
            ),
            None => (q_nope, q_rope),
        }
    }

    /// What the cache stores for the positions of `x`: the normalized latent and the
    /// rotated shared key, side by side.
    ///
    /// # Shapes
    /// - x: `[batch, seq, d_model]`
    /// - output: `[batch, 1, seq, kv_lora_rank + qk_rope]`
    fn latent_entries(&self, x: Tensor<3>, offset: usize) -> Tensor<4> {
        let [batch, seq, _] = x.dims();
        let compressed = self.kv_a_proj_with_mqa.forward(x); // [batch, seq, rank + rope]
        let latent = self
            .kv_a_layernorm
            .forward(compressed.clone().narrow(2, 0, self.kv_lora_rank))
            .reshape([batch, 1, seq, self.kv_lora_rank]); // [batch, 1, seq, rank]
        let k_rope = compressed
            .narrow(2, self.kv_lora_rank, self.qk_rope_head_dim)
            .reshape([batch, 1, seq, self.qk_rope_head_dim]); // [batch, 1, seq, rope]
        let k_rope = self.rope.forward(k_rope, offset);
        Tensor::cat(vec![latent, k_rope], 3)
    }

    /// Expanded path: per-head keys `[k_nope ‖ k_rope]` and values from the latent, then
    /// multi-head attention with `d_qk = qk_nope + qk_rope`, `d_v = v_head_dim`.
    ///
    /// # Shapes
    /// - q_nope, q_rope: `[batch, n_heads, seq_q, qk_nope | qk_rope]`
    /// - entries: `[batch, 1, seq_k, kv_lora_rank + qk_rope]`
    /// - output: `[batch, n_heads, seq_q, v_head_dim]`
    fn attend_expanded(
        &self,
        q_nope: Tensor<4>,
        q_rope: Tensor<4>,
        entries: Tensor<4>,
        key_padding: Option<Tensor<2, Bool>>,
    ) -> Tensor<4> {
        let (queries, keys, values) = self.expanded_heads(q_nope, q_rope, entries);
        attention(queries, keys, values, &self.options(key_padding))
    }

    /// The per-head queries, keys and values of the expanded path.
    ///
    /// # Shapes
    /// - q_nope, q_rope: `[batch, n_heads, seq_q, qk_nope | qk_rope]`
    /// - entries: `[batch, 1, seq_k, kv_lora_rank + qk_rope]`
    /// - output: queries `[batch, n_heads, seq_q, qk_nope + qk_rope]`, keys
    ///   `[batch, n_heads, seq_k, qk_nope + qk_rope]`, values `[batch, n_heads, seq_k, v]`
    fn expanded_heads(
        &self,
        q_nope: Tensor<4>,
        q_rope: Tensor<4>,
        entries: Tensor<4>,
    ) -> (Tensor<4>, Tensor<4>, Tensor<4>) {
        let [batch, _, seq_k, _] = entries.dims();
        let (heads, nope, v) = (self.n_heads, self.qk_nope_head_dim, self.v_head_dim);
        let latent = entries.clone().narrow(3, 0, self.kv_lora_rank).reshape([
            batch,
            seq_k,
            self.kv_lora_rank,
        ]); // [batch, seq_k, rank]
        let kv = self
            .kv_b_proj
            .forward(latent)
            .reshape([batch, seq_k, heads, nope + v])
            .swap_dims(1, 2); // [batch, heads, seq_k, nope + v]
        let k_nope = kv.clone().narrow(3, 0, nope);
        let values = kv.narrow(3, nope, v);
        let k_rope = entries
            .narrow(3, self.kv_lora_rank, self.qk_rope_head_dim)
            .expand([batch, heads, seq_k, self.qk_rope_head_dim]); // shared by every head
        let keys = Tensor::cat(vec![k_nope, k_rope], 3); // [batch, heads, seq_k, nope + rope]
        let queries = Tensor::cat(vec![q_nope, q_rope], 3); // [batch, heads, seq_q, nope + rope]
        (queries, keys, values)
    }

    /// Absorbed path: MQA over the latent with `d_qk = kv_lora_rank + qk_rope` and
    /// `d_v = kv_lora_rank`, then each head's value projection.
    ///
    /// # Shapes
    /// As [`attend_expanded`](Self::attend_expanded).
    fn attend_absorbed(
        &self,
        q_nope: Tensor<4>,
        q_rope: Tensor<4>,
        entries: Tensor<4>,
        key_padding: Option<Tensor<2, Bool>>,
        weights: &AbsorbedWeights,
    ) -> Tensor<4> {
        // q_nope·(W_uk c) = (W_ukᵀ q_nope)·c: the query moves into the latent space.
        let q_latent = q_nope.matmul(weights.w_uk_t.clone()); // [batch, heads, seq_q, rank]
        let queries = Tensor::cat(vec![q_latent, q_rope], 3); // [batch, heads, seq_q, rank + rope]
        // One key/value head shared by all query heads: keys [c ‖ k_rope], values c.
        let values = entries.clone().narrow(3, 0, self.kv_lora_rank); // [batch, 1, seq_k, rank]
        let attended = attention(queries, entries, values, &self.options(key_padding)); // [batch, heads, seq_q, rank]
        // Σ p·(W_uv c) = W_uv (Σ p·c): the value projection after the weighted sum.
        attended.matmul(weights.w_uv.clone()) // [batch, heads, seq_q, v]
    }

    /// The options of one call of the attention core.
    fn options(&self, key_padding: Option<Tensor<2, Bool>>) -> AttentionOptions {
        let dropout = if self.dropout.training.is_enabled() {
            self.dropout.prob
        } else {
            0.0
        };
        AttentionOptions::new()
            // The scale belongs to the expanded head width on both paths: an explicit
            // value keeps the absorbed path from using 1/sqrt(rank + rope).
            .with_scale(Some(self.scale))
            .with_causal(self.causal)
            .with_key_padding(key_padding)
            .with_dropout(dropout)
            .with_implementation(self.implementation)
    }

    /// `[batch, n_heads, seq, v_head_dim] -> [batch, seq, d_model]`.
    fn merge_heads(&self, x: Tensor<4>) -> Tensor<3> {
        let [batch, n_heads, seq, v] = x.dims();
        let x = x.swap_dims(1, 2).reshape([batch, seq, n_heads * v]); // [batch, seq, n_heads · v]
        self.o_proj.forward(x)
    }
}

#[cfg(test)]
mod tests {
    use super::super::config::tests::small_config;
    use super::*;
    use crate::attention::padding_mask_from_lengths;
    use crate::test_utils::{assert_close, test_devices};
    use burn::tensor::{Device, Distribution};

    #[test]
    fn cached_decoding_equals_full_forward_on_every_path() {
        for device in test_devices() {
            device.seed(11);
            let attention = small_config().init(&device);
            let x = Tensor::<3>::random([2, 9, 40], Distribution::Normal(0.0, 1.0), &device);
            let full = attention.forward(x.clone(), None);
            // Auto prefills on the expanded path and decodes on the absorbed one.
            for path in [LatentPath::Expanded, LatentPath::Absorbed, LatentPath::Auto] {
                // Prefill 4 positions, decode 3 one by one, then a chunk of 2.
                let mut cache = LatentKvCache::new();
                let mut outputs = vec![attention.forward_cached_path(
                    x.clone().narrow(1, 0, 4),
                    &mut cache,
                    None,
                    path,
                )];
                for position in 4..7 {
                    outputs.push(attention.forward_cached_path(
                        x.clone().narrow(1, position, 1),
                        &mut cache,
                        None,
                        path,
                    ));
                }
                outputs.push(attention.forward_cached_path(
                    x.clone().narrow(1, 7, 2),
                    &mut cache,
                    None,
                    path,
                ));
                assert_eq!(cache.position(), 9);
                assert_close(
                    Tensor::cat(outputs, 1),
                    full.clone(),
                    1e-5,
                    &format!("cached {path:?} vs full"),
                );
            }
        }
    }

    /// A query temperature multiplies each position's whole query (both parts) by its
    /// factor, on the expanded and absorbed paths and in cached decoding.
    #[test]
    fn a_query_temperature_scales_the_whole_query_on_every_path() {
        use crate::attention::QueryTemperatureConfig;
        use crate::test_utils::max_abs_diff;
        use burn::tensor::TensorData;
        for device in test_devices() {
            device.seed(13);
            let temperature = QueryTemperatureConfig::new(0.7, 3);
            let attention = small_config()
                .with_query_temperature(Some(temperature.clone()))
                .init(&device);
            let mut plain = attention.clone();
            plain.query_temperature = None;
            let x = Tensor::<3>::random([2, 9, 40], Distribution::Normal(0.0, 1.0), &device);

            // By hand: the unscaled queries times each position's factor.
            let (q_nope, q_rope) = plain.queries(x.clone(), 0);
            let factors: Vec<f32> = (0..9).map(|p| temperature.factor(p) as f32).collect();
            let factors = Tensor::<4>::from_data(TensorData::new(factors, [1, 1, 9, 1]), &device);
            let entries = plain.latent_entries(x.clone(), 0);
            let want = plain.merge_heads(plain.attend_expanded(
                q_nope * factors.clone(),
                q_rope * factors,
                entries,
                None,
            ));
            let full = attention.forward(x.clone(), None);
            assert_close(full.clone(), want, 1e-5, "by hand");
            assert!(max_abs_diff(full.clone(), plain.forward(x.clone(), None)) > 1e-3);

            let absorbed = attention.forward_path(x.clone(), None, LatentPath::Absorbed);
            assert_close(absorbed, full.clone(), 1e-5, "absorbed");
            let mut cache = LatentKvCache::new();
            let mut outputs =
                vec![attention.forward_cached(x.clone().narrow(1, 0, 4), &mut cache, None)];
            for position in 4..9 {
                let step = x.clone().narrow(1, position, 1);
                outputs.push(attention.forward_cached(step, &mut cache, None));
            }
            assert_close(Tensor::cat(outputs, 1), full, 1e-5, "cached");
        }
    }

    /// Auto takes the path of fewer multiply-adds: expanded for a prompt, absorbed for a
    /// decoding step, and for a chunk over a long cache expanded from
    /// `r·(n + v) / (2r − n − v)` new queries on (12·13 / 11 ≈ 14.2 here).
    #[test]
    fn auto_path_expands_prompts_and_absorbs_decoding_steps() {
        let attention = small_config().init(&Device::flex());
        let auto = |new, keys| attention.resolve_path(LatentPath::Auto, new, keys);
        assert_eq!(auto(4, 4), LatentPath::Expanded);
        assert_eq!(auto(512, 512), LatentPath::Expanded);
        assert_eq!(auto(1, 5), LatentPath::Absorbed);
        assert_eq!(auto(1, 4096), LatentPath::Absorbed);
        assert_eq!(auto(14, 1_000_000), LatentPath::Absorbed);
        assert_eq!(auto(15, 1_000_000), LatentPath::Expanded);
        // An explicit path stays.
        for path in [LatentPath::Expanded, LatentPath::Absorbed] {
            assert_eq!(attention.resolve_path(path, 1, 4096), path);
            assert_eq!(attention.resolve_path(path, 512, 512), path);
        }
        // Without the causal mask every new query sees every key.
        let bidirectional = small_config().with_causal(false).init(&Device::flex());
        assert_eq!(
            bidirectional.resolve_path(LatentPath::Auto, 15, 1_000_000),
            LatentPath::Expanded
        );
        assert_eq!(
            bidirectional.resolve_path(LatentPath::Auto, 1, 4096),
            LatentPath::Absorbed
        );
    }

    #[test]
    fn absorbed_equals_expanded_with_padding_and_without_causal_mask() {
        for device in test_devices() {
            device.seed(12);
            for causal in [true, false] {
                let attention = small_config().with_causal(causal).init(&device);
                let x = Tensor::<3>::random([2, 6, 40], Distribution::Normal(0.0, 1.0), &device);
                let padding = padding_mask_from_lengths(&[6, 4], 6, &device);
                let expanded =
                    attention.forward_path(x.clone(), Some(padding.clone()), LatentPath::Expanded);
                let absorbed = attention.forward_path(x, Some(padding), LatentPath::Absorbed);
                // Row 1 positions 4, 5 are padding queries: compare everything anyway,
                // both paths mask identically.
                assert_close(absorbed, expanded, 1e-5, &format!("causal={causal}"));
            }
        }
    }
}
