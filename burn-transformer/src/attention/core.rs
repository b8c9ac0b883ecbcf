//! The attention core: `softmax(q·kᵀ·scale + mask)·v`, once, for every variant.
//!
//! Multi-head, grouped-query, multi-query, cross and latent attention all end here.
//! This is the only place that chooses between the fused op
//! ([`crate::ops::flash_attention`]: the CubeCL kernel on wgpu and CUDA) and the
//! reference tensor-op path, so every variant gets the kernel (and every fix) at once.
//!
//! Masking follows [`crate::ops::mask`]: queries are aligned bottom-right with the
//! keys (what cached decoding needs), `causal` hides later keys, a sliding `window`
//! hides keys `w` or more positions back (and ahead, without `causal`), `chunk`
//! hides keys outside the query's chunk of positions (Llama 4's local layers), and
//! `key_padding` (`[batch, seq_k]`, `true` = padded) hides keys from everyone. A query
//! row that sees no key at all returns zeros (never NaN).

use burn::config::Config;
use burn::tensor::{Bool, Tensor};

use crate::ops::alibi::Alibi;
use crate::ops::flash_attention::{FlashKernel, Problem, ScoreOptions, flash_attention, reference};
use crate::ops::mask::MaskRule;

/// Which implementation computes the attention core.
#[derive(Config, Debug, Copy, PartialEq, Eq, Hash)]
pub enum AttentionImpl {
    /// The fused flash-attention op where it supports the call and pays: every call on
    /// CubeCL devices (wgpu, cuda); on flex (its tiled CPU flash attention), f32 calls of
    /// more than [`DECODE_QUERIES`] query rows over at least 256 keys; the reference
    /// path elsewhere. The environment variable
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
    /// Chunk size `c`: the positions are cut into chunks of `c` from the first key,
    /// and a query sees only keys of its own chunk (see [`crate::ops::mask`]).
    /// Default: none. Must be > 0.
    pub chunk: Option<usize>,
    /// `[batch, seq_k]`, `true` for padded keys. Default: none.
    pub key_padding: Option<Tensor<2, Bool>>,
    /// Logit soft-capping `c·tanh(s/c)` (Gemma 2, Grok). Default: none.
    pub softcap: Option<f64>,
    /// Dropout probability on the attention probabilities. The caller decides whether
    /// it is training; the core applies it only on autodiff devices and then always
    /// takes the reference path (the kernel has no dropout). Default: 0.
    pub dropout: f64,
    /// Learned attention sinks (gpt-oss): one logit per query head, `[n_heads]`, that
    /// joins every row's softmax and takes no value, so a row may attend to nothing.
    /// The fused op takes them (and trains them). Default: none.
    pub sinks: Option<Tensor<1>>,
    /// ALiBi: each logit of head `h` gets `slope_h · (j − p)` for key `j` seen from
    /// query position `p`, the slopes a rule of the head count (see
    /// [`crate::ops::alibi`]). The fused op takes it on every backend. Default: none.
    pub alibi: Option<Alibi>,
    /// Which implementation to use. Default: [`AttentionImpl::Auto`].
    pub implementation: AttentionImpl,
    /// Which kernel family the fused op runs on CubeCL devices. Default:
    /// [`FlashKernel::Auto`] (register tiles on CPU runtimes, the fastest family and
    /// tile size per shape class on GPUs).
    pub flash_kernel: FlashKernel,
}

crate::builders::setters!(AttentionOptions {
    /// Sets the scale applied to `q·kᵀ`.
    with_scale => scale: Option<f64>,
    /// Turns causal masking on or off.
    with_causal => causal: bool,
    /// Sets the sliding window.
    with_window => window: Option<usize>,
    /// Sets the chunk size.
    with_chunk => chunk: Option<usize>,
    /// Sets the key padding mask (`[batch, seq_k]`, `true` = padded).
    with_key_padding => key_padding: Option<Tensor<2, Bool>>,
    /// Sets the logit softcap.
    with_softcap => softcap: Option<f64>,
    /// Sets the dropout probability on attention probabilities.
    with_dropout => dropout: f64,
    /// Sets the attention sinks (`[n_heads]` logits).
    with_sinks => sinks: Option<Tensor<1>>,
    /// Sets ALiBi.
    with_alibi => alibi: Option<Alibi>,
    /// Chooses the implementation.
    with_implementation => implementation: AttentionImpl,
    /// Chooses the fused op's kernel family on CubeCL devices.
    with_flash_kernel => flash_kernel: FlashKernel,
});

impl AttentionOptions {
    /// Options with every default.
    pub fn new() -> Self {
        Self::default()
    }

    /// The scale actually used for a head dimension `d_qk`.
    pub fn scale_for(&self, d_qk: usize) -> f64 {
        self.scale.unwrap_or_else(|| 1.0 / (d_qk as f64).sqrt())
    }

    /// How the ops turn scores into logits for a head dimension `d_qk`.
    fn score_options(&self, d_qk: usize) -> ScoreOptions {
        ScoreOptions::new(
            self.scale_for(d_qk),
            self.softcap,
            MaskRule::new(self.causal, self.window).with_chunk(self.chunk),
        )
        .with_key_mask(self.key_padding.is_some())
        .with_alibi(self.alibi)
        .with_kernel(self.flash_kernel)
    }
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
    if wants_fused_path(&q, &k, options) {
        let scores = checked_score_options(&q, &k, &v, options);
        let padding = options.key_padding.clone();
        let sinks = options.sinks.clone();
        match flash_attention(q.clone(), k.clone(), v.clone(), padding, sinks, &scores) {
            Ok(output) => return output,
            Err(reason) => log::info!("attention: fused op not used ({reason}); reference path"),
        }
    }
    reference_attention(q, k, v, options)
}

/// The ops' options of a call, after checking its shapes (see [`Problem::of_call`]).
fn checked_score_options(
    q: &Tensor<4>,
    k: &Tensor<4>,
    v: &Tensor<4>,
    options: &AttentionOptions,
) -> ScoreOptions {
    let scores = options.score_options(q.dims()[3]);
    Problem::of_call(q, k, v, options.key_padding.as_ref(), &scores);
    scores
}

/// Query rows up to which `Auto` keeps decode-shaped calls on flex on the reference
/// path: there a group's query heads are one matrix product against their shared key
/// head, which reads each key once, while the CPU flash attention streams the keys
/// once per query head (a GQA or MLA decode step reads them 8–16 times).
pub const DECODE_QUERIES: usize = 16;

/// Keys from which `Auto` takes the CPU flash attention on flex. Below, the reference
/// path's scores are small and its one-pass CPU softmax keeps up (the nanoGPT recipe at
/// context 64 takes the same time per step on both paths); from 256 keys on the flash
/// attention is faster in every causal cell of `docs/benchmarks.md` (forward 1.2× and
/// more, forward and backward 1.7× and more) and its memory grows linearly.
pub const FLEX_FLASH_MIN_KEYS: usize = 256;

/// Whether a call should take the fused op: the choice between the two paths, made
/// here and nowhere else (a call the op does not support then still falls back).
///
/// `Auto` takes the fused op on CubeCL devices (wgpu, CUDA) and, on flex, for f32
/// calls of more than [`DECODE_QUERIES`] query rows over at least
/// [`FLEX_FLASH_MIN_KEYS`] keys, and the reference path elsewhere;
/// `Fused` takes it on every backend that has it (the portable version on ndarray);
/// `Reference` never. Dropout on the probabilities during training always takes the
/// reference path: the fused op has none.
fn wants_fused_path(q: &Tensor<4>, k: &Tensor<4>, options: &AttentionOptions) -> bool {
    let device = q.device();
    let wanted = match options.implementation.resolve() {
        AttentionImpl::Reference => false,
        AttentionImpl::Fused => true,
        AttentionImpl::Auto => {
            crate::device::is_cube_device(&device)
                || (crate::ops::simd::runs_fused_on_cpu(&device, q.dtype())
                    && q.dims()[2] > DECODE_QUERIES
                    && k.dims()[2] >= FLEX_FLASH_MIN_KEYS)
        }
    };
    if wanted && options.dropout > 0.0 && device.is_autodiff() {
        log::debug!("attention: dropout on probabilities runs on the reference path");
        return false;
    }
    wanted
}

/// The reference path: plain tensor ops, differentiated by Burn's autodiff.
///
/// This is the oracle the fused kernel is tested against. It materializes the
/// `[batch, n_heads, seq_q, seq_k]` scores.
///
/// # Shapes
/// As [`attention`].
///
/// # Panics
/// As [`attention`].
pub fn reference_attention(
    q: Tensor<4>,
    k: Tensor<4>,
    v: Tensor<4>,
    options: &AttentionOptions,
) -> Tensor<4> {
    let scores = checked_score_options(&q, &k, &v, options);
    let padding = options.key_padding.clone();
    let sinks = options.sinks.as_ref();
    reference::attention(q, k, v, padding, &scores, sinks, options.dropout).0
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
    let scores = checked_score_options(&q, &k, &k, options);
    reference::probabilities(
        q,
        k,
        options.key_padding.clone(),
        &scores,
        options.sinks.as_ref(),
    )
}

/// [`attention`] on the reference path together with its probabilities (see
/// [`attention_weights`]), both from one computation, without dropout.
///
/// # Shapes
/// - as [`attention`]; the weights are `[batch, n_heads, seq_q, seq_k]`
///
/// # Panics
/// As [`attention`].
pub fn attention_with_weights(
    q: Tensor<4>,
    k: Tensor<4>,
    v: Tensor<4>,
    options: &AttentionOptions,
) -> (Tensor<4>, Tensor<4>) {
    let scores = checked_score_options(&q, &k, &v, options);
    let sinks = options.sinks.as_ref();
    reference::attention(q, k, v, options.key_padding.clone(), &scores, sinks, 0.0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ops::flash_attention::tests::{Case, Inputs, oracle};
    use crate::ops::mask::padding_mask_from_lengths;
    use crate::test_utils::{assert_close, test_devices};
    use burn::tensor::{Device, Distribution, TensorData};

    fn random(shape: [usize; 4], device: &Device) -> Tensor<4> {
        Tensor::random(shape, Distribution::Normal(0.0, 1.0), device)
    }

    /// Attention sinks against gpt-oss's eager attention in transformers
    /// (tools/make_fixtures.py): GQA with a causal window and key padding, the output
    /// and the gradients of q, k, v and the sinks, on every implementation (the
    /// CubeCL kernel on wgpu, the portable op on flex and ndarray, the reference).
    #[test]
    fn attention_sinks_match_gpt_oss_forward_and_gradients() {
        let fixture = crate::test_utils::Fixture::load("attention_sinks");
        for device in test_devices() {
            let device = device.autodiff();
            for implementation in [
                AttentionImpl::Auto,
                AttentionImpl::Fused,
                AttentionImpl::Reference,
            ] {
                let tracked = |key: &str| fixture.tensor::<4>(key, &device).require_grad();
                let (q, k, v) = (tracked("q"), tracked("k"), tracked("v"));
                let sinks = fixture.tensor::<1>("sinks", &device).require_grad();
                let options = AttentionOptions::new()
                    .with_causal(true)
                    .with_window(Some(3))
                    .with_key_padding(Some(padding_mask_from_lengths(&[7, 5], 7, &device)))
                    .with_sinks(Some(sinks.clone()))
                    .with_implementation(implementation);
                let out = attention(q.clone(), k.clone(), v.clone(), &options);
                let name = format!("{implementation:?} on {device:?}");
                assert_close(out.clone(), fixture.tensor("out", &device), 1e-5, &name);
                let grads = (out * fixture.tensor::<4>("dout", &device))
                    .sum()
                    .backward();
                for (tensor, key) in [(&q, "dq"), (&k, "dk"), (&v, "dv")] {
                    let grad = tensor.grad(&grads).expect("tracked");
                    assert_close(grad, fixture.tensor(key, &device), 1e-4, key);
                }
                let dsinks = sinks.grad(&grads).expect("tracked");
                assert_close(dsinks, fixture.tensor("dsinks", &device), 1e-4, "dsinks");
            }
        }
    }

    /// Every implementation choice gives the oracle's output, GQA with a causal
    /// window and padding.
    #[test]
    fn every_implementation_matches_the_oracle() {
        let mut case = Case::new(6, 2, 5, 9, (8, 4));
        case.batch = 2;
        case.causal = true;
        case.window = Some(4);
        case.lengths = Some(vec![9, 6]);
        let inputs = Inputs::random(&case, 7, 1.0);
        let expected = oracle(&case, &inputs)[0].clone();
        let [sq, sk, sv, so] = case.shapes();
        for device in test_devices() {
            let load = |data: &[f32], shape: [usize; 4]| {
                Tensor::<4>::from_data(TensorData::new(data.to_vec(), shape), &device)
            };
            let expected = Tensor::<4>::from_data(
                TensorData::new(expected.iter().map(|&x| x as f32).collect(), so),
                &device,
            );
            for implementation in [
                AttentionImpl::Auto,
                AttentionImpl::Reference,
                AttentionImpl::Fused,
            ] {
                let options = AttentionOptions::new()
                    .with_causal(true)
                    .with_window(Some(4))
                    .with_key_padding(Some(padding_mask_from_lengths(&[9, 6], 9, &device)))
                    .with_implementation(implementation);
                let output = attention(
                    load(&inputs.q, sq),
                    load(&inputs.k, sk),
                    load(&inputs.v, sv),
                    &options,
                );
                assert_close(
                    output,
                    expected.clone(),
                    1e-5,
                    &format!("{implementation:?}"),
                );
            }
        }
    }

    /// ALiBi against a host computation of `softmax(q·kᵀ·scale + slope·(j − i))·v` with
    /// causal masking and key padding, on every implementation choice (the fused op:
    /// the CPU flash attention on flex, the portable op on ndarray; on wgpu it
    /// declines and the reference path runs); the last two rows decoded against every
    /// key give the last rows of the whole pass; the fused op's gradients are the
    /// reference path's.
    #[test]
    fn alibi_matches_a_host_computation_whole_and_decoded() {
        let ([batch, heads, seq, dim], lengths) = ([2, 3, 5, 4], [5, 3]);
        let alibi = Alibi::new().with_slope_scale(1.5);
        let slopes = alibi.slopes(heads);
        for device in test_devices() {
            device.seed(11);
            let q = random([batch, heads, seq, dim], &device);
            let k = random([batch, heads, seq, dim], &device);
            let v = random([batch, heads, seq, dim], &device);
            let host = |t: &Tensor<4>| t.to_data().convert::<f64>().try_to_vec::<f64>().unwrap();
            let (hq, hk, hv) = (host(&q), host(&k), host(&v));
            let at = |b: usize, h: usize, i: usize, x: usize| ((b * heads + h) * seq + i) * dim + x;
            let mut expected = vec![0.0f64; batch * heads * seq * dim];
            for (b, h, i) in (0..batch)
                .flat_map(|b| (0..heads).flat_map(move |h| (0..seq).map(move |i| (b, h, i))))
            {
                let visible = 0..(i + 1).min(lengths[b]);
                let logits: Vec<f64> = visible
                    .clone()
                    .map(|j| {
                        let dot: f64 = (0..dim)
                            .map(|x| hq[at(b, h, i, x)] * hk[at(b, h, j, x)])
                            .sum();
                        dot / (dim as f64).sqrt() + slopes[h] * (j as f64 - i as f64)
                    })
                    .collect();
                let max = logits.iter().copied().fold(f64::MIN, f64::max);
                let weights: Vec<f64> = logits.iter().map(|l| (l - max).exp()).collect();
                let total: f64 = weights.iter().sum();
                for x in 0..dim {
                    let value: f64 = visible
                        .clone()
                        .zip(&weights)
                        .map(|(j, w)| w * hv[at(b, h, j, x)])
                        .sum();
                    expected[at(b, h, i, x)] = value / total;
                }
            }
            let expected = Tensor::<4>::from_data(
                TensorData::new(expected, [batch, heads, seq, dim]).convert::<f32>(),
                &device,
            );
            let padding = padding_mask_from_lengths(&lengths, seq, &device);
            for implementation in [
                AttentionImpl::Auto,
                AttentionImpl::Fused,
                AttentionImpl::Reference,
            ] {
                let options = AttentionOptions::new()
                    .with_causal(true)
                    .with_key_padding(Some(padding.clone()))
                    .with_alibi(Some(alibi))
                    .with_implementation(implementation);
                let whole = attention(q.clone(), k.clone(), v.clone(), &options);
                let name = format!("{implementation:?} on {device:?}");
                assert_close(whole.clone(), expected.clone(), 1e-5, &name);
                let last = q.clone().narrow(2, seq - 2, 2);
                let decoded = attention(last, k.clone(), v.clone(), &options);
                assert_close(decoded, whole.narrow(2, seq - 2, 2), 1e-5, &name);
            }
            let tracked = device.clone().autodiff();
            let dout = random([batch, heads, seq, dim], &tracked);
            let gradients = |implementation: AttentionImpl| {
                let load =
                    |t: &Tensor<4>| Tensor::<4>::from_data(t.to_data(), &tracked).require_grad();
                let (q, k, v) = (load(&q), load(&k), load(&v));
                let options = AttentionOptions::new()
                    .with_causal(true)
                    .with_key_padding(Some(padding_mask_from_lengths(&lengths, seq, &tracked)))
                    .with_alibi(Some(alibi))
                    .with_implementation(implementation);
                let out = attention(q.clone(), k.clone(), v.clone(), &options);
                let grads = (out * dout.clone()).sum().backward();
                [q, k, v].map(|t| t.grad(&grads).expect("tracked"))
            };
            let fused = gradients(AttentionImpl::Fused);
            let reference = gradients(AttentionImpl::Reference);
            for ((fused, reference), name) in
                fused.into_iter().zip(reference).zip(["dq", "dk", "dv"])
            {
                assert_close(fused, reference, 1e-4, &format!("{name} on {device:?}"));
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

    /// The weights come from the same computation as the output: rows sum to one over
    /// visible keys and weight the values into the reference output.
    #[test]
    fn weights_are_the_probabilities_of_the_output() {
        for device in test_devices() {
            device.seed(3);
            let q = random([2, 4, 5, 8], &device);
            let k = random([2, 2, 7, 8], &device);
            let v = random([2, 2, 7, 6], &device);
            let options = AttentionOptions::new()
                .with_causal(true)
                .with_key_padding(Some(padding_mask_from_lengths(&[7, 5], 7, &device)));
            let (output, weights) =
                attention_with_weights(q.clone(), k.clone(), v.clone(), &options);
            assert_close(
                output,
                reference_attention(q.clone(), k.clone(), v, &options),
                1e-6,
                "output",
            );
            assert_close(
                weights.clone(),
                attention_weights(q, k, &options),
                1e-6,
                "weights",
            );
            assert_close(
                weights.clone().sum_dim(3),
                Tensor::ones([2, 4, 5, 1], &device),
                1e-5,
                "row sums",
            );
            let padded = weights.narrow(0, 1, 1).narrow(3, 5, 2).abs().max();
            assert_eq!(padded.into_scalar::<f32>(), 0.0);
        }
    }

    /// On CubeCL devices `Auto` runs the kernel (unless the environment forces the
    /// reference path).
    #[cfg(feature = "wgpu")]
    #[test]
    fn auto_runs_the_kernel_on_wgpu() {
        use std::sync::atomic::Ordering;
        let device = crate::test_utils::wgpu_device();
        let launches = || crate::ops::flash_attention::op::FORWARD_LAUNCHES.load(Ordering::Relaxed);
        let before = launches();
        let q = random([1, 2, 17, 32], &device);
        let output = attention(q.clone(), q.clone(), q, &AttentionOptions::new());
        let _ = output.into_data();
        let forced = std::env::var("BURN_TRANSFORMER_ATTENTION").is_ok_and(|v| v == "reference");
        assert_eq!(launches() > before, !forced);
    }

    /// The options' kernel family reaches the launch: the staged kernels run on wgpu
    /// when asked for, and agree with the default kernels.
    #[cfg(feature = "wgpu")]
    #[test]
    fn flash_kernel_option_reaches_the_launch() {
        use crate::ops::flash_attention::FlashKernel;
        use std::sync::atomic::Ordering;
        let device = crate::test_utils::wgpu_device();
        let staged = || crate::ops::flash_attention::op::STAGED_LAUNCHES.load(Ordering::Relaxed);
        let q = random([1, 2, 17, 32], &device);
        let options = AttentionOptions::new()
            .with_causal(true)
            .with_implementation(AttentionImpl::Fused);
        let before = staged();
        let default = attention(q.clone(), q.clone(), q.clone(), &options);
        let asked = options.with_flash_kernel(FlashKernel::Staged);
        let output = attention(q.clone(), q.clone(), q, &asked);
        let error: f32 = (output - default).abs().max().into_scalar();
        assert!(error < 1e-5, "staged and default kernels differ by {error}");
        assert!(staged() > before);
    }
}
