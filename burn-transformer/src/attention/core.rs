//! The attention core: `softmax(q·kᵀ·scale + mask)·v`, once, for every variant.
//!
//! Multi-head, grouped-query, multi-query, cross and latent attention all end here.
//! This is the only place that chooses between the fused CubeCL kernel and the
//! reference tensor-op path, so every variant gets the kernel (and every fix) at once.
//!
//! # Masking semantics
//! Queries are aligned bottom-right with the keys: query row `i` sits at absolute
//! position `i + seq_k - seq_q`. This is what cached decoding needs (the new queries
//! are the last `seq_q` positions of the sequence) and equals the usual
//! top-left alignment when `seq_q == seq_k`.
//! - `causal`: key `j` is visible to query position `p` when `j <= p`.
//! - `window = Some(w)` with `causal`: also `j > p - w`, so a query sees
//!   `p-w+1 ..= p` (Mistral's sliding window). Without `causal` the window is
//!   symmetric: `|p - j| < w` (local attention in encoders).
//! - `key_padding`: `[batch, seq_k]`, `true` marks a padded key that nobody sees.
//!
//! A query row that sees no key at all returns zeros (never NaN).

use burn::config::Config;
use burn::tensor::{Bool, Device, Distribution, Tensor, TensorData};

use crate::cpu::{SoftmaxMask, attention_softmax};

/// Which implementation computes the attention core.
#[derive(Config, Debug, Copy, PartialEq, Eq, Hash)]
pub enum AttentionImpl {
    /// The fused flash-attention kernel where it supports the call (CubeCL devices:
    /// wgpu, cuda), the reference path elsewhere. The environment variable
    /// `BURN_TRANSFORMER_ATTENTION=reference|fused|auto` overrides `Auto` for a whole
    /// process, which is how tests and benchmarks force one path.
    Auto,
    /// Always the reference tensor-op path (materializes `seq_q × seq_k` scores).
    Reference,
    /// The fused op even on backends without the CubeCL kernel: there it runs the
    /// backend extension's portable implementation (forward saves only O and the
    /// log-sum-exp; backward recomputes). Unsupported calls still fall back to the
    /// reference path, with a log message.
    Fused,
}

// `#[derive(Default)]` with `#[default]` does not combine with `#[derive(Config)]`, which
// copies variant attributes into generated code.
#[allow(clippy::derivable_impls)]
impl Default for AttentionImpl {
    fn default() -> Self {
        Self::Auto
    }
}

impl AttentionImpl {
    /// Reads `BURN_TRANSFORMER_ATTENTION`; `None` when unset or `auto`.
    fn from_env() -> Option<Self> {
        match std::env::var("BURN_TRANSFORMER_ATTENTION") {
            Ok(value) => match value.trim().to_ascii_lowercase().as_str() {
                "reference" | "naive" => Some(Self::Reference),
                "fused" | "flash" | "kernel" => Some(Self::Fused),
                "" | "auto" => None,
                other => {
                    log::warn!(
                        "BURN_TRANSFORMER_ATTENTION={other} is not one of auto, reference, fused; using auto"
                    );
                    None
                }
            },
            Err(_) => None,
        }
    }

    /// The implementation actually asked for, after the environment override.
    pub fn resolve(self) -> Self {
        match self {
            Self::Auto => Self::from_env().unwrap_or(Self::Auto),
            other => other,
        }
    }
}

/// Options of one attention call. Build with the `with_*` methods:
///
/// ```rust
/// use burn_transformer::attention::AttentionOptions;
/// let options = AttentionOptions::new().with_causal(true).with_window(Some(128));
/// assert!(options.causal);
/// ```
#[derive(Clone, Debug, Default)]
pub struct AttentionOptions {
    /// Multiplies `q·kᵀ` before the softmax. Default: `1/sqrt(d_qk)`.
    pub scale: Option<f64>,
    /// Each query sees only keys at or before its own position. Default: false.
    pub causal: bool,
    /// Sliding window size `w` (see the module docs). Default: none. Must be > 0.
    pub window: Option<usize>,
    /// `[batch, seq_k]`, `true` for padded keys. Default: none.
    pub key_padding: Option<Tensor<2, Bool>>,
    /// Logit soft-capping `c·tanh(s/c)` (Gemma 2, Grok). Default: none.
    pub softcap: Option<f64>,
    /// Dropout probability on the attention probabilities. The caller decides whether
    /// it is training; the core applies it only on autodiff devices and then always
    /// takes the reference path (the kernel has no dropout). Default: 0.
    pub dropout: f64,
    /// Which implementation to use. Default: [`AttentionImpl::Auto`].
    pub implementation: AttentionImpl,
}

impl AttentionOptions {
    /// Options with every default.
    pub fn new() -> Self {
        Self::default()
    }

    /// Sets the scale applied to `q·kᵀ`.
    pub fn with_scale(mut self, scale: Option<f64>) -> Self {
        self.scale = scale;
        self
    }

    /// Turns causal masking on or off.
    pub fn with_causal(mut self, causal: bool) -> Self {
        self.causal = causal;
        self
    }

    /// Sets the sliding window.
    pub fn with_window(mut self, window: Option<usize>) -> Self {
        self.window = window;
        self
    }

    /// Sets the key padding mask (`[batch, seq_k]`, `true` = padded).
    pub fn with_key_padding(mut self, key_padding: Option<Tensor<2, Bool>>) -> Self {
        self.key_padding = key_padding;
        self
    }

    /// Sets the logit softcap.
    pub fn with_softcap(mut self, softcap: Option<f64>) -> Self {
        self.softcap = softcap;
        self
    }

    /// Sets the dropout probability on attention probabilities.
    pub fn with_dropout(mut self, dropout: f64) -> Self {
        self.dropout = dropout;
        self
    }

    /// Chooses the implementation.
    pub fn with_implementation(mut self, implementation: AttentionImpl) -> Self {
        self.implementation = implementation;
        self
    }

    /// The scale actually used for a head dimension `d_qk`.
    pub fn scale_for(&self, d_qk: usize) -> f64 {
        self.scale.unwrap_or_else(|| 1.0 / (d_qk as f64).sqrt())
    }
}

/// Checks the shapes of one attention call and returns
/// `(batch, n_heads, n_kv_heads, seq_q, seq_k, d_qk, d_v)`.
///
/// # Panics
/// On inconsistent shapes: these are programmer errors at this level (modules
/// check user-facing shapes before they get here).
fn check_shapes(
    q: &Tensor<4>,
    k: &Tensor<4>,
    v: &Tensor<4>,
    options: &AttentionOptions,
) -> (usize, usize, usize, usize, usize, usize, usize) {
    let [batch, n_heads, seq_q, d_qk] = q.dims();
    let [k_batch, n_kv_heads, seq_k, k_dim] = k.dims();
    let [v_batch, v_heads, v_seq, d_v] = v.dims();
    assert!(
        k_batch == batch && v_batch == batch,
        "attention: batch sizes differ (q {batch}, k {k_batch}, v {v_batch})"
    );
    assert_eq!(
        k_dim, d_qk,
        "attention: q and k head dims differ ({d_qk} vs {k_dim})"
    );
    assert!(
        v_heads == n_kv_heads && v_seq == seq_k,
        "attention: k is [_, {n_kv_heads}, {seq_k}, _] but v is [_, {v_heads}, {v_seq}, _]"
    );
    assert!(
        n_kv_heads > 0 && n_heads % n_kv_heads == 0,
        "attention: {n_heads} query heads cannot share {n_kv_heads} key/value heads"
    );
    if let Some(window) = options.window {
        assert!(window > 0, "attention: a sliding window must be at least 1");
    }
    if let Some(padding) = &options.key_padding {
        assert_eq!(
            padding.dims(),
            [batch, seq_k],
            "attention: key padding must be [batch, seq_k]"
        );
    }
    (batch, n_heads, n_kv_heads, seq_q, seq_k, d_qk, d_v)
}

/// Scaled dot-product attention with grouped key/value heads.
///
/// Query head `h` attends with key/value head `h / (n_heads / n_kv_heads)`, so one
/// function serves MHA (`n_kv_heads == n_heads`), GQA and MQA (`n_kv_heads == 1`)
/// without repeating K/V.
///
/// # Shapes
/// - q: `[batch, n_heads, seq_q, d_qk]`
/// - k: `[batch, n_kv_heads, seq_k, d_qk]`
/// - v: `[batch, n_kv_heads, seq_k, d_v]`
/// - output: `[batch, n_heads, seq_q, d_v]`
///
/// # Panics
/// If the shapes disagree (see [`AttentionOptions`] for the mask shapes).
pub fn attention(
    q: Tensor<4>,
    k: Tensor<4>,
    v: Tensor<4>,
    options: &AttentionOptions,
) -> Tensor<4> {
    check_shapes(&q, &k, &v, options);
    let dropout_active = options.dropout > 0.0 && q.device().is_autodiff();
    let implementation = options.implementation.resolve();

    let want_fused = match implementation {
        AttentionImpl::Reference => false,
        AttentionImpl::Fused => true,
        AttentionImpl::Auto => crate::device::is_cube_device(&q.device()),
    };
    if want_fused {
        if dropout_active {
            log::debug!("attention: dropout on probabilities runs on the reference path");
        } else {
            match crate::kernel::try_flash_attention(q.clone(), k.clone(), v.clone(), options) {
                Ok(output) => return output,
                Err(reason) => {
                    log::info!("attention: fused kernel not used ({reason}); reference path")
                }
            }
        }
    }
    reference_attention(q, k, v, options)
}

/// Large negative, finite: used where the reference path needs the smallest
/// finite float (f16's lowest also fits) so that fully-masked rows stay NaN-free.
const F16_LOWEST: f64 = -65504.0;

/// The reference path: plain tensor ops, differentiated by Burn's autodiff.
///
/// This is the oracle the fused kernel is tested against. It materializes the
/// `[batch, n_heads, seq_q, seq_k]` scores.
///
/// # Shapes
/// As [`attention`].
pub fn reference_attention(
    q: Tensor<4>,
    k: Tensor<4>,
    v: Tensor<4>,
    options: &AttentionOptions,
) -> Tensor<4> {
    let (batch, n_heads, n_kv_heads, seq_q, seq_k, _, d_v) = check_shapes(&q, &k, &v, options);
    let group = n_heads / n_kv_heads;
    let device = q.device();
    let probs = grouped_probabilities(q, k, options);
    let probs = if options.dropout > 0.0 && device.is_autodiff() {
        let keep = 1.0 - options.dropout;
        let bernoulli = probs.random_like(Distribution::Bernoulli(keep));
        probs * bernoulli / keep
    } else {
        probs
    };

    let probs = probs.reshape([batch, n_kv_heads, group * seq_q, seq_k]);
    probs.matmul(v).reshape([batch, n_heads, seq_q, d_v]) // [batch, n_heads, seq_q, d_v]
}

/// The attention probabilities `softmax(q·kᵀ·scale + mask)` of one call, as the
/// reference path computes them (no dropout): what attention plots show.
///
/// Row `i` of head `h` says how much query `i` reads from each key; visible entries
/// sum to 1, hidden ones are 0, and a fully-masked row is all zeros. The result
/// materializes `seq_q × seq_k` per head, so it is meant for inspection, not for
/// long sequences.
///
/// # Shapes
/// - q: `[batch, n_heads, seq_q, d_qk]`
/// - k: `[batch, n_kv_heads, seq_k, d_qk]`
/// - output: `[batch, n_heads, seq_q, seq_k]`
///
/// # Panics
/// If the shapes disagree (as [`attention`], with `k` standing in for `v`).
pub fn attention_weights(q: Tensor<4>, k: Tensor<4>, options: &AttentionOptions) -> Tensor<4> {
    let [batch, n_heads, seq_q, _] = q.dims();
    let seq_k = k.dims()[2];
    grouped_probabilities(q, k, options).reshape([batch, n_heads, seq_q, seq_k]) // [batch, n_heads, seq_q, seq_k]
}

/// Masked, scaled, soft-capped softmax of `q·kᵀ` with the query heads grouped by
/// their shared key/value head.
///
/// # Shapes
/// - q: `[batch, n_heads, seq_q, d_qk]`, k: `[batch, n_kv_heads, seq_k, d_qk]`
/// - output: `[batch, n_kv_heads, n_heads / n_kv_heads, seq_q, seq_k]`
fn grouped_probabilities(q: Tensor<4>, k: Tensor<4>, options: &AttentionOptions) -> Tensor<5> {
    let (batch, n_heads, n_kv_heads, seq_q, seq_k, d_qk, _) = check_shapes(&q, &k, &k, options);
    let group = n_heads / n_kv_heads;

    // Query heads of one group are contiguous, so grouping them turns GQA into a
    // batched matmul against the shared K/V head: no repeated K/V.
    let q = q.reshape([batch, n_kv_heads, group * seq_q, d_qk]);
    let scores = q.matmul(k.swap_dims(2, 3)); // [batch, n_kv_heads, group*seq_q, seq_k]
    // The same memory read as one head per query head: row `h·seq_q + i`.
    let scores = scores.reshape([batch, n_heads, seq_q, seq_k]);
    let mask = SoftmaxMask {
        scale: options.scale_for(d_qk),
        causal: options.causal,
        window: options.window,
        has_key_mask: options.key_padding.is_some(),
    };
    let fused = match options.softcap {
        // One pass forward and backward on flex (see `crate::cpu`).
        None => attention_softmax(scores.clone(), options.key_padding.clone(), mask),
        Some(_) => None,
    };
    let probs = fused.unwrap_or_else(|| {
        composed_softmax(scores, options.key_padding.clone(), mask, options.softcap)
    });
    probs.reshape([batch, n_kv_heads, group, seq_q, seq_k])
}

/// `softmax(softcap(scores·scale) + mask)` from tensor ops: the reference of the
/// fused CPU softmax, and the path on every other backend.
///
/// # Shapes
/// - scores: `[batch, heads, seq_q, seq_k]`
/// - key_padding: `[batch, seq_k]`, `true` for padded keys
/// - output: `[batch, heads, seq_q, seq_k]`
pub(crate) fn composed_softmax(
    scores: Tensor<4>,
    key_padding: Option<Tensor<2, Bool>>,
    mask: SoftmaxMask,
    softcap: Option<f64>,
) -> Tensor<4> {
    let scores = scores * mask.scale;
    let scores = match softcap {
        Some(cap) => (scores / cap).tanh() * cap,
        None => scores,
    };
    let hidden = build_mask(
        &scores.device(),
        scores.dims(),
        mask.causal,
        mask.window,
        key_padding,
    );
    let scores = match hidden {
        Some(hidden) => scores.mask_fill(hidden, f64::NEG_INFINITY),
        None => scores,
    };
    masked_softmax(scores)
}

/// Softmax over the last dimension that returns zeros for rows whose entries are
/// all `-inf` (fully masked), where a plain softmax returns NaN.
fn masked_softmax(scores: Tensor<4>) -> Tensor<4> {
    // Shifting by the row max does not change the softmax, so the shift is detached:
    // its gradient would be zero anyway. Clamping it to a finite value keeps
    // `-inf - max` from becoming NaN on fully-masked rows.
    let lowest = match scores.dtype() {
        burn::tensor::DType::F16 | burn::tensor::DType::BF16 => F16_LOWEST,
        _ => f32::MIN as f64,
    };
    let max = scores.clone().max_dim(3).detach().clamp_min(lowest);
    let numerator = (scores - max).exp();
    // A row that sees any key sums to at least 1 (its max contributes exp(0)), so
    // this clamp touches only fully-masked rows, whose sum is 0. The value is f16's
    // smallest positive normal, representable in every float type.
    let denominator = numerator.clone().sum_dim(3).clamp_min(6.1e-5);
    numerator / denominator
}

/// The boolean mask (`true` = hidden) for the causal/window structure and key padding,
/// expanded to the score shape; `None` when nothing is masked.
fn build_mask(
    device: &Device,
    shape: [usize; 4],
    causal: bool,
    window: Option<usize>,
    key_padding: Option<Tensor<2, Bool>>,
) -> Option<Tensor<4, Bool>> {
    let [batch, _, seq_q, seq_k] = shape;
    let structural = structural_mask(seq_q, seq_k, causal, window).map(|hidden| {
        Tensor::<2, Bool>::from_data(TensorData::new(hidden, [seq_q, seq_k]), device)
            .reshape([1, 1, seq_q, seq_k])
            .expand(shape)
    });
    let padding = key_padding.map(|padding| padding.reshape([batch, 1, 1, seq_k]).expand(shape));
    match (structural, padding) {
        (Some(a), Some(b)) => Some(a.bool_or(b)),
        (a, b) => a.or(b),
    }
}

/// Whether key `key` is hidden from query row `row` by the causal/window structure.
///
/// This is the single statement of the masking rule in the module docs; the fused
/// kernel implements the same rule and is tested against it.
pub fn is_hidden(
    row: usize,
    key: usize,
    seq_q: usize,
    seq_k: usize,
    causal: bool,
    window: Option<usize>,
) -> bool {
    // Bottom-right alignment: row `row` is at absolute position `row + seq_k - seq_q`.
    let position = row as i64 + seq_k as i64 - seq_q as i64;
    let key = key as i64;
    if causal && key > position {
        return true;
    }
    if let Some(window) = window {
        let window = window as i64;
        if position - key >= window {
            return true;
        }
        if !causal && key - position >= window {
            return true;
        }
    }
    false
}

/// Row-major `[seq_q, seq_k]` hidden flags, or `None` without causal or window masking.
pub fn structural_mask(
    seq_q: usize,
    seq_k: usize,
    causal: bool,
    window: Option<usize>,
) -> Option<Vec<bool>> {
    if !causal && window.is_none() {
        return None;
    }
    let mut hidden = Vec::with_capacity(seq_q * seq_k);
    for row in 0..seq_q {
        for key in 0..seq_k {
            hidden.push(is_hidden(row, key, seq_q, seq_k, causal, window));
        }
    }
    Some(hidden)
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
    use crate::test_utils::{assert_close, test_devices};

    /// A direct, loop-based attention on host data: the reference's reference.
    #[allow(clippy::too_many_arguments)]
    fn naive_host(
        q: &[f32],
        k: &[f32],
        v: &[f32],
        [batch, n_heads, n_kv_heads, seq_q, seq_k, d_qk, d_v]: [usize; 7],
        causal: bool,
        window: Option<usize>,
        padded: &[bool],
        scale: f32,
    ) -> Vec<f32> {
        let group = n_heads / n_kv_heads;
        let mut out = vec![0.0; batch * n_heads * seq_q * d_v];
        for b in 0..batch {
            for h in 0..n_heads {
                let kv = h / group;
                for i in 0..seq_q {
                    let visible: Vec<usize> = (0..seq_k)
                        .filter(|&j| {
                            !is_hidden(i, j, seq_q, seq_k, causal, window) && !padded[b * seq_k + j]
                        })
                        .collect();
                    if visible.is_empty() {
                        continue;
                    }
                    let logits: Vec<f32> = visible
                        .iter()
                        .map(|&j| {
                            (0..d_qk)
                                .map(|d| {
                                    q[((b * n_heads + h) * seq_q + i) * d_qk + d]
                                        * k[((b * n_kv_heads + kv) * seq_k + j) * d_qk + d]
                                })
                                .sum::<f32>()
                                * scale
                        })
                        .collect();
                    let max = logits.iter().cloned().fold(f32::NEG_INFINITY, f32::max);
                    let weights: Vec<f32> = logits.iter().map(|l| (l - max).exp()).collect();
                    let total: f32 = weights.iter().sum();
                    for (w, &j) in weights.iter().zip(&visible) {
                        for d in 0..d_v {
                            out[((b * n_heads + h) * seq_q + i) * d_v + d] +=
                                w / total * v[((b * n_kv_heads + kv) * seq_k + j) * d_v + d];
                        }
                    }
                }
            }
        }
        out
    }

    fn random(shape: [usize; 4], device: &Device) -> Tensor<4> {
        Tensor::random(shape, Distribution::Normal(0.0, 1.0), device)
    }

    #[test]
    fn reference_matches_host_loops_for_gqa_with_every_mask() {
        for device in test_devices() {
            device.seed(7);
            let dims @ [batch, n_heads, n_kv_heads, seq_q, seq_k, d_qk, d_v] =
                [2, 6, 2, 5, 9, 8, 4];
            let q = random([batch, n_heads, seq_q, d_qk], &device);
            let k = random([batch, n_kv_heads, seq_k, d_qk], &device);
            let v = random([batch, n_kv_heads, seq_k, d_v], &device);
            let lengths = [9, 6];
            let padded: Vec<bool> = lengths
                .iter()
                .flat_map(|&l| (0..seq_k).map(move |j| j >= l))
                .collect();
            let host = |t: &Tensor<4>| t.to_data().try_to_vec::<f32>().unwrap();
            for (causal, window, padding) in [
                (false, None, false),
                (true, None, false),
                (true, Some(3), false),
                (false, Some(2), false),
                (true, Some(4), true),
                (false, None, true),
            ] {
                let options = AttentionOptions::new()
                    .with_causal(causal)
                    .with_window(window)
                    .with_key_padding(
                        padding.then(|| padding_mask_from_lengths(&lengths, seq_k, &device)),
                    )
                    .with_implementation(AttentionImpl::Reference);
                let output = attention(q.clone(), k.clone(), v.clone(), &options);
                let no_padding = vec![false; batch * seq_k];
                let expected = naive_host(
                    &host(&q),
                    &host(&k),
                    &host(&v),
                    dims,
                    causal,
                    window,
                    if padding { &padded } else { &no_padding },
                    1.0 / (d_qk as f32).sqrt(),
                );
                let expected = Tensor::<4>::from_data(
                    TensorData::new(expected, [batch, n_heads, seq_q, d_v]),
                    &device,
                );
                assert_close(
                    output,
                    expected,
                    1e-5,
                    &format!("causal={causal} window={window:?} padding={padding}"),
                );
            }
        }
    }

    #[test]
    fn fully_masked_rows_are_zero_not_nan() {
        for device in test_devices() {
            let q = random([1, 2, 3, 4], &device);
            let k = random([1, 2, 3, 4], &device);
            let v = random([1, 2, 3, 4], &device);
            // Every key padded: every row is fully masked.
            let options = AttentionOptions::new()
                .with_causal(true)
                .with_key_padding(Some(padding_mask_from_lengths(&[0], 3, &device)))
                .with_implementation(AttentionImpl::Reference);
            let output = attention(q, k, v, &options);
            let values = output.to_data().try_to_vec::<f32>().unwrap();
            assert!(values.iter().all(|x| *x == 0.0), "{values:?}");
        }
    }

    #[test]
    fn masking_rule_is_bottom_right_aligned() {
        // One new query at the end of a 4-key cache sees all 4 keys.
        assert!((0..4).all(|j| !is_hidden(0, j, 1, 4, true, None)));
        // A window of 2 keeps the last two.
        let visible: Vec<usize> = (0..4)
            .filter(|&j| !is_hidden(0, j, 1, 4, true, Some(2)))
            .collect();
        assert_eq!(visible, vec![2, 3]);
        // Symmetric window without causal.
        let visible: Vec<usize> = (0..5)
            .filter(|&j| !is_hidden(2, j, 5, 5, false, Some(2)))
            .collect();
        assert_eq!(visible, vec![1, 2, 3]);
    }
}
