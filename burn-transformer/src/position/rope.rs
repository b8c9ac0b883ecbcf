//! Rotary position embedding (RoPE, [RoFormer](https://arxiv.org/abs/2104.09864)),
//! equal to Hugging Face transformers' rotary embedding and `apply_rotary_pos_emb`.
//!
//! Each pair of features `(a, b)` of a query or key at position `p` is rotated by the
//! angle `p · inv_freq[i]`: `(a·cos − b·sin, b·cos + a·sin)`. Since a rotation by `p`
//! then the inverse rotation by `q` depends only on `p − q`, q·k sees relative
//! positions. The scaling variants ([`RopeScaling`]) change `inv_freq` and may fold an
//! attention factor into cos and sin.
//!
//! Which features form a pair is the [`RopeLayout`]:
//! - [`RopeLayout::HalfSplit`] (LLaMA, GPT-NeoX, Mistral, Qwen): feature `i` pairs with
//!   `i + rotary_dim/2` (`rotate_half`).
//! - [`RopeLayout::Interleaved`] (GPT-J, GLM, DeepSeek, Meta's original LLaMA code):
//!   features `2i` and `2i+1` form a pair, rotated in place. transformers' DeepSeek-V3
//!   `apply_rotary_pos_emb_interleave` returns the same values de-interleaved (evens,
//!   then odds): a fixed permutation applied to q and k alike, so attention scores are
//!   identical.
//!
//! With `partial_rotary_factor < 1` only the first `rotary_dim` features rotate; the rest
//! pass through (GPT-NeoX, Phi, GLM). With `reversed` every pair turns the other way, by
//! `−p · inv_freq[i]` (nanochat's `rotate_half` is the negated one): sin changes sign.

use burn::config::Config;
use burn::module::Module;
use burn::tensor::{Device, Tensor, TensorData};

use super::rope_scaling::{RopeFrequencies, RopeScaling};
use crate::device::backend_name;
use crate::error::ConfigError;

const MODULE: &str = "RopeConfig";

/// Positions whose cos/sin rows are computed at init, at most. Beyond them (and for
/// dynamic or long-context frequencies) rows are computed per call. The cap keeps one
/// table at `8192 × rotary_dim/2 × 2` floats (4 MiB for rotary_dim 128) even for
/// checkpoints that declare 128k positions.
pub const MAX_TABLE_POSITIONS: usize = 8192;

pub use crate::ops::rotary::RopeLayout;
use crate::ops::rotary::fused_rotary;

/// Configuration of a [`Rope`].
#[derive(Config, Debug)]
pub struct RopeConfig {
    /// Size of one attention head; the last axis of the rotated tensors.
    pub head_dim: usize,
    /// Base wavelength (`rope_theta`). Default: 10000.
    #[config(default = 10000.0)]
    pub theta: f64,
    /// Context length the model was configured for: cos/sin are precomputed up to it
    /// (at most [`MAX_TABLE_POSITIONS`]); dynamic NTK scaling starts beyond it, and it
    /// stands in for a missing `original_max_position_embeddings`. Default: 2048.
    #[config(default = 2048)]
    pub max_position_embeddings: usize,
    /// Frequency scaling (`rope_type`). Default: none.
    #[config(default = "RopeScaling::Default")]
    pub scaling: RopeScaling,
    /// Fraction of `head_dim` that rotates, in (0, 1]; `rotary_dim =
    /// floor(head_dim · factor)` must be even. Default: 1.
    #[config(default = 1.0)]
    pub partial_rotary_factor: f64,
    /// Pairing of the rotated features. Default: half-split (LLaMA).
    #[config(default = "RopeLayout::HalfSplit")]
    pub layout: RopeLayout,
    /// Rotate by the negated angle (nanochat). Default: false.
    #[config(default = false)]
    pub reversed: bool,
}

impl RopeConfig {
    /// The number of rotated features, `floor(head_dim · partial_rotary_factor)` (as
    /// transformers' `int(head_dim * partial_rotary_factor)`).
    pub fn rotary_dim(&self) -> usize {
        (self.head_dim as f64 * self.partial_rotary_factor) as usize
    }

    /// Checks the configuration.
    ///
    /// # Errors
    /// - [`ConfigError::Zero`]: `head_dim` or `max_position_embeddings` is 0.
    /// - [`ConfigError::Invalid`]: `theta` not positive, `partial_rotary_factor` outside
    ///   (0, 1], or a scaling factor out of range (see [`RopeScaling`]).
    /// - [`ConfigError::Odd`]: the rotary dimension is odd (`field` is `rotary_dim`).
    pub fn validate(&self) -> Result<(), ConfigError> {
        ConfigError::check_positive(MODULE, "head_dim", self.head_dim)?;
        ConfigError::check_positive(
            MODULE,
            "max_position_embeddings",
            self.max_position_embeddings,
        )?;
        ConfigError::check_positive_real(MODULE, "theta", self.theta)?;
        let factor = self.partial_rotary_factor;
        if !(factor.is_finite() && factor > 0.0 && factor <= 1.0) {
            return Err(ConfigError::Invalid {
                module: MODULE,
                field: "partial_rotary_factor",
                reason: format!("must be in (0, 1], got {factor}"),
            });
        }
        let rotary_dim = self.rotary_dim();
        ConfigError::check_positive(MODULE, "rotary_dim", rotary_dim)?;
        if !rotary_dim.is_multiple_of(2) {
            return Err(ConfigError::Odd {
                module: MODULE,
                field: "rotary_dim",
                value: rotary_dim,
            });
        }
        self.scaling.validate(rotary_dim)
    }

    /// Validates the configuration and builds the module, precomputing cos/sin.
    ///
    /// # Errors
    /// See [`RopeConfig::validate`].
    pub fn try_init(&self, device: &Device) -> Result<Rope, ConfigError> {
        self.validate()?;
        let rotary_dim = self.rotary_dim();
        let frequencies = RopeFrequencies::new(
            &self.scaling,
            self.theta,
            rotary_dim,
            self.max_position_embeddings,
        );
        let positions = self.max_position_embeddings.min(MAX_TABLE_POSITIONS);
        let (cos, sin) = cos_sin_data(
            frequencies.base(),
            0,
            positions,
            frequencies.attention_scaling(),
            self.reversed,
        );
        Ok(Rope {
            cos: Tensor::from_data(cos, device),
            sin: Tensor::from_data(sin, device),
            head_dim: self.head_dim,
            rotary_dim,
            layout: self.layout,
            reversed: self.reversed,
            frequencies,
        })
    }
}

crate::builders::init_or_panic!(RopeConfig => Rope);

/// cos and sin rows for `positions start..end`, `[end - start, inv_freq.len()]`, times
/// the attention scaling (sin negated when `reversed`: the angle's sign). Like
/// transformers: the angle is the float32 product `float(p) · inv_freq`; cos/sin are
/// evaluated in f64 and rounded to float32.
fn cos_sin_data(
    inv_freq: &[f32],
    start: usize,
    end: usize,
    attention_scaling: f64,
    reversed: bool,
) -> (TensorData, TensorData) {
    let rows = end - start;
    let scale = attention_scaling as f32;
    let sin_scale = if reversed { -scale } else { scale };
    let mut cos = Vec::with_capacity(rows * inv_freq.len());
    let mut sin = Vec::with_capacity(rows * inv_freq.len());
    for position in start..end {
        for &frequency in inv_freq {
            let angle = (position as f32 * frequency) as f64;
            cos.push(angle.cos() as f32 * scale);
            sin.push(angle.sin() as f32 * sin_scale);
        }
    }
    let shape = [rows, inv_freq.len()];
    (TensorData::new(cos, shape), TensorData::new(sin, shape))
}

/// Rotary position embedding: rotates queries and keys by their positions.
///
/// Build it with [`RopeConfig`]. It has no parameters: the cos/sin tables are constants,
/// neither trained nor saved in checkpoints (they move with the module's device).
/// Cloning shares the tables, so layers of one model can share one `Rope`.
#[derive(Module, Debug)]
pub struct Rope {
    /// `cos(p · inv_freq) · attention_scaling`: `[table_positions, rotary_dim / 2]`.
    cos: Tensor<2>,
    /// `sin(p · inv_freq) · attention_scaling`: `[table_positions, rotary_dim / 2]`.
    sin: Tensor<2>,
    head_dim: usize,
    rotary_dim: usize,
    #[module(skip)]
    layout: RopeLayout,
    /// Whether the angles are negated ([`RopeConfig::reversed`]).
    #[module(skip)]
    reversed: bool,
    #[module(skip)]
    frequencies: RopeFrequencies,
}

impl Rope {
    /// Rotates `x` as positions `offset .. offset + seq` (the offset is the number of
    /// positions already in a KV cache).
    ///
    /// The cos/sin rows come from the table precomputed at init when the positions
    /// fall inside it; otherwise (beyond the table, dynamic NTK beyond
    /// `max_position_embeddings`, LongRoPE's long factors) they are computed for this
    /// call. Dynamic NTK and LongRoPE choose their frequencies from `offset + seq`,
    /// like transformers on a fresh module: a call reaching further uses frequencies
    /// of its own length for all its positions. (transformers keeps the largest length
    /// seen in module state; this module is stateless.)
    ///
    /// The output has the input's dtype; cos/sin are cast to it, as transformers does.
    ///
    /// # Shapes
    /// - x: `[batch, heads, seq, head_dim]`
    /// - output: `[batch, heads, seq, head_dim]`
    ///
    /// # Panics
    /// If the last axis of `x` is not `head_dim`.
    pub fn forward(&self, x: Tensor<4>, offset: usize) -> Tensor<4> {
        let [_, _, seq, head_dim] = x.dims();
        assert_eq!(
            head_dim, self.head_dim,
            "Rope: input head_dim {head_dim} differs from the configured {}",
            self.head_dim
        );
        if seq == 0 {
            return x;
        }
        let dtype = x.dtype();
        let (cos, sin) = self.cos_sin(offset, seq, &x.device());
        let (cos, sin) = (cos.cast(dtype), sin.cast(dtype));
        if let Some(rotated) = fused_rotary(x.clone(), cos.clone(), sin.clone(), self.layout) {
            return rotated;
        }
        let rotary_dim = self.rotary_dim;
        let (rotated, passed) = if rotary_dim < head_dim {
            let passed = x.clone().narrow(3, rotary_dim, head_dim - rotary_dim);
            (x.narrow(3, 0, rotary_dim), Some(passed))
        } else {
            (x, None)
        };
        let rotated = if backend_name(&rotated.device()) == "ndarray" {
            rotate_flipping_pairs(rotated, cos, sin, self.layout)
        } else {
            rotate_joining_halves(rotated, cos, sin, self.layout)
        };
        match passed {
            Some(passed) => Tensor::cat(vec![rotated, passed], 3),
            None => rotated,
        }
    }

    /// The sequence length past which this embedding rotates every position
    /// differently than before, so that keys cached while the sequence was no longer
    /// must be recomputed: LongRoPE's original context (its long factors then apply to
    /// all positions, as in a full pass). `None` for the other scalings.
    pub fn cache_rebuild_length(&self) -> Option<usize> {
        self.frequencies.cache_rebuild_length()
    }

    /// The factor transformers folds into cos and sin (YaRN's and LongRoPE's attention
    /// factor); 1 for the other scalings. q·k is scaled by its square.
    pub fn attention_scaling(&self) -> f64 {
        self.frequencies.attention_scaling()
    }

    /// The number of rotated features per head (`head_dim` unless partial).
    pub fn rotary_dim(&self) -> usize {
        self.rotary_dim
    }

    /// The configured head size.
    pub fn head_dim(&self) -> usize {
        self.head_dim
    }

    /// The pairing of the rotated features.
    pub fn layout(&self) -> RopeLayout {
        self.layout
    }

    /// The inverse frequencies (one per pair) a call uses when its positions end at
    /// `seq_len` (exclusive): they vary with it only for dynamic NTK and LongRoPE.
    pub fn inverse_frequencies(&self, seq_len: usize) -> Vec<f32> {
        self.frequencies.for_length(seq_len).into_owned()
    }

    /// cos and sin for positions `offset .. offset + seq`, `[seq, rotary_dim / 2]`, on
    /// `device`.
    fn cos_sin(&self, offset: usize, seq: usize, device: &Device) -> (Tensor<2>, Tensor<2>) {
        let end = offset + seq;
        let [table_positions, _] = self.cos.dims();
        if end <= table_positions && self.frequencies.is_base(end) {
            let cos = self.cos.clone().narrow(0, offset, seq);
            let sin = self.sin.clone().narrow(0, offset, seq);
            let (cos, sin) = if cos.device() == *device {
                (cos, sin)
            } else {
                (cos.to_device(device), sin.to_device(device))
            };
            (
                crate::device::with_checkpointing_of(cos, device),
                crate::device::with_checkpointing_of(sin, device),
            )
        } else {
            let (cos, sin) = cos_sin_data(
                &self.frequencies.for_length(end),
                offset,
                end,
                self.frequencies.attention_scaling(),
                self.reversed,
            );
            (
                Tensor::from_data(cos, device),
                Tensor::from_data(sin, device),
            )
        }
    }
}

/// The rotation from tensor ops: each half of the pairs from two views of `x`, joined
/// by one concatenation (a copy kernel on CubeCL, a block copy on flex).
///
/// # Shapes
/// - x: `[batch, heads, seq, rotary_dim]`
/// - cos, sin: `[seq, rotary_dim / 2]`
/// - output: `[batch, heads, seq, rotary_dim]`
fn rotate_joining_halves(
    x: Tensor<4>,
    cos: Tensor<2>,
    sin: Tensor<2>,
    layout: RopeLayout,
) -> Tensor<4> {
    let [batch, heads, seq, rotary_dim] = x.dims();
    let half = rotary_dim / 2;
    match layout {
        RopeLayout::HalfSplit => {
            // [1, 1, seq, rotary_dim / 2]: one angle per pair, broadcast over heads.
            let cos = cos.reshape([1, 1, seq, half]);
            let sin = sin.reshape([1, 1, seq, half]);
            let first = x.clone().narrow(3, 0, half);
            let second = x.narrow(3, half, half);
            let new_first = first.clone() * cos.clone() - second.clone() * sin.clone();
            let new_second = second * cos + first * sin;
            Tensor::cat(vec![new_first, new_second], 3)
        }
        RopeLayout::Interleaved => {
            // [batch, heads, seq, rotary_dim / 2, 2]: the last axis is one pair.
            let pairs: Tensor<5> = x.reshape([batch, heads, seq, half, 2]);
            let even = pairs.clone().narrow(4, 0, 1);
            let odd = pairs.narrow(4, 1, 1);
            // [1, 1, seq, rotary_dim / 2, 1]
            let cos: Tensor<5> = cos.reshape([1, 1, seq, half, 1]);
            let sin: Tensor<5> = sin.reshape([1, 1, seq, half, 1]);
            let new_even = even.clone() * cos.clone() - odd.clone() * sin.clone();
            let new_odd = odd * cos + even * sin;
            // [batch, heads, seq, rotary_dim]: pairs back in place.
            Tensor::cat(vec![new_even, new_odd], 4).reshape([batch, heads, seq, rotary_dim])
        }
    }
}

/// The rotation from tensor ops without a concatenation: `x·cos + flip(x)·(±sin)`,
/// where the flip swaps the two features of each pair (an axis of size 2) and the sine
/// is negated for the pair's first feature. ndarray concatenates along the last axis
/// through an element-by-element strided copy: at `[8, 16, 1024, 64]` the forward of
/// [`rotate_joining_halves`] took 16 times as long as this one. Elsewhere the joined
/// halves stay: on CubeCL the flip would be a copy kernel of its own, and flex
/// concatenates by block copies. The bits are the same: `a·c + b·(−s)` rounds as
/// `a·c − b·s`.
///
/// # Shapes
/// As [`rotate_joining_halves`].
fn rotate_flipping_pairs(
    x: Tensor<4>,
    cos: Tensor<2>,
    sin: Tensor<2>,
    layout: RopeLayout,
) -> Tensor<4> {
    let [batch, heads, seq, rotary_dim] = x.dims();
    let half = rotary_dim / 2;
    // The pair's axis and where the angle's axis goes beside it.
    let (pairs, angles, pair_axis) = match layout {
        RopeLayout::HalfSplit => ([batch, heads, seq, 2, half], [1, 1, seq, 1, half], 3),
        RopeLayout::Interleaved => ([batch, heads, seq, half, 2], [1, 1, seq, half, 1], 4),
    };
    let mut sign_shape = [1; 5];
    sign_shape[pair_axis] = 2;
    let sign = Tensor::<1>::from_floats([-1.0, 1.0], &x.device())
        .cast(x.dtype())
        .reshape(sign_shape);
    let x: Tensor<5> = x.reshape(pairs);
    let cos: Tensor<5> = cos.reshape(angles);
    let signed_sin: Tensor<5> = sin.reshape(angles) * sign;
    (x.clone() * cos + x.flip([pair_axis]) * signed_sin).reshape([batch, heads, seq, rotary_dim])
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ops::rotary::tests::naive;
    use crate::test_utils::{assert_close, model_test_devices, test_devices};

    fn random_input(seq: usize, head_dim: usize, device: &Device) -> Tensor<4> {
        Tensor::random(
            [2, 3, seq, head_dim],
            burn::tensor::Distribution::Default,
            device,
        )
    }

    #[test]
    fn offset_equals_rows_of_the_full_application() {
        let configs = [
            RopeConfig::new(16).with_max_position_embeddings(64),
            RopeConfig::new(16)
                .with_max_position_embeddings(64)
                .with_scaling(RopeScaling::yarn(4.0, 16)),
            RopeConfig::new(16)
                .with_max_position_embeddings(64)
                .with_scaling(RopeScaling::Llama3 {
                    factor: 8.0,
                    low_freq_factor: 1.0,
                    high_freq_factor: 4.0,
                    original_max_position_embeddings: Some(16),
                }),
            RopeConfig::new(20).with_partial_rotary_factor(0.4),
        ];
        for device in test_devices() {
            for config in &configs {
                for layout in [RopeLayout::HalfSplit, RopeLayout::Interleaved] {
                    let rope = config.clone().with_layout(layout).init(&device);
                    let x = random_input(11, config.head_dim, &device);
                    let full = rope.forward(x.clone(), 0);
                    for (offset, seq) in [(0, 4), (4, 1), (5, 6), (10, 1)] {
                        let part = rope.forward(x.clone().narrow(2, offset, seq), offset);
                        assert_close(
                            part,
                            full.clone().narrow(2, offset, seq),
                            1e-6,
                            &format!("{:?} {layout:?} offset {offset}", config.scaling),
                        );
                    }
                }
            }
        }
    }

    /// Every backend's rotation (flex's fused op, ndarray's flipped pairs, the joined
    /// halves on CubeCL) against the pair-by-pair rotation on the host, for both
    /// layouts and a partial rotation, forward and backward (the gradient of
    /// `Σ w·rot(x)` is `w` rotated by the opposite angles).
    #[test]
    fn every_backend_rotates_as_the_pairs_written_out() {
        let (seq, offset) = (7, 3);
        let values = |t: Tensor<4>| t.into_data().try_to_vec::<f32>().expect("f32");
        for device in model_test_devices() {
            let device = device.autodiff();
            for (head_dim, factor) in [(16, 1.0), (20, 0.4)] {
                let shape = [2, 3, seq, head_dim];
                let x = random_input(seq, head_dim, &device).require_grad();
                let weight = random_input(seq, head_dim, &device);
                for layout in [RopeLayout::HalfSplit, RopeLayout::Interleaved] {
                    let rope = RopeConfig::new(head_dim)
                        .with_partial_rotary_factor(factor)
                        .with_layout(layout)
                        .init(&device);
                    let table = |t: &Tensor<2>| {
                        t.clone()
                            .narrow(0, offset, seq)
                            .into_data()
                            .try_to_vec::<f32>()
                            .expect("f32")
                    };
                    let (cos, sin) = (table(&rope.cos), table(&rope.sin));
                    let negated: Vec<f32> = sin.iter().map(|s| -s).collect();
                    let y = rope.forward(x.clone(), offset);
                    let grads = (y.clone() * weight.clone()).sum().backward();
                    let d_x = x.grad(&grads).expect("x has a gradient");
                    let host = d_x.device();
                    let expected = |values: Vec<f32>| {
                        Tensor::<4>::from_data(TensorData::new(values, shape), &host)
                    };
                    let context = format!("{device:?} {layout:?} head_dim {head_dim}");
                    let forward = naive(&values(x.clone().inner()), shape, &cos, &sin, layout);
                    assert_close(y.inner(), expected(forward), 1e-5, &context);
                    let backward = naive(
                        &values(weight.clone().inner()),
                        shape,
                        &cos,
                        &negated,
                        layout,
                    );
                    assert_close(
                        d_x,
                        expected(backward),
                        1e-5,
                        &format!("{context} gradient"),
                    );
                }
            }
        }
    }

    #[test]
    fn positions_beyond_the_table_are_computed_on_the_fly() {
        for device in test_devices() {
            // Same frequencies; one table holds 8 positions, the other 64.
            let short = RopeConfig::new(16)
                .with_max_position_embeddings(8)
                .init(&device);
            let long = RopeConfig::new(16)
                .with_max_position_embeddings(64)
                .init(&device);
            let x = random_input(7, 16, &device);
            for offset in [5, 30] {
                assert_close(
                    short.forward(x.clone(), offset),
                    long.forward(x.clone(), offset),
                    1e-6,
                    &format!("offset {offset}"),
                );
            }
        }
    }

    #[test]
    fn position_zero_is_the_identity_and_the_tail_passes_through() {
        let device = Device::flex();
        let rope = RopeConfig::new(20)
            .with_partial_rotary_factor(0.4)
            .with_layout(RopeLayout::Interleaved)
            .init(&device);
        let x = random_input(5, 20, &device);
        let y = rope.forward(x.clone(), 0);
        assert_close(
            y.clone().narrow(2, 0, 1),
            x.clone().narrow(2, 0, 1),
            0.0,
            "position 0",
        );
        assert_close(y.narrow(3, 8, 12), x.narrow(3, 8, 12), 0.0, "pass-through");
    }

    #[test]
    fn gradients_flow_through_the_rotation() {
        // A rotation is orthogonal: the gradient of |R x|²/2 is Rᵀ R x = x. The module is
        // built without autodiff; its tables act as constants for the tracked input.
        for device in test_devices() {
            for layout in [RopeLayout::HalfSplit, RopeLayout::Interleaved] {
                let rope = RopeConfig::new(16).with_layout(layout).init(&device);
                let x = random_input(6, 16, &device.clone().autodiff()).require_grad();
                let y = rope.forward(x.clone(), 3);
                let grads = (y.clone() * y).sum().div_scalar(2.0).backward();
                let grad = x.grad(&grads).expect("x has a gradient");
                assert_close(grad, x.inner(), 1e-5, &format!("{layout:?} gradient"));
            }
        }
    }

    /// A reversed rotation is nanochat's `rotate_half` (`cat(x2, −x1)`): written out,
    /// `(a·cos + b·sin, b·cos − a·sin)` for each pair `(a, b)`, here for positions past
    /// the table too.
    #[test]
    fn a_reversed_rotation_turns_every_pair_the_other_way() {
        for device in test_devices() {
            device.seed(23);
            let config = RopeConfig::new(8).with_max_position_embeddings(4);
            let forward = config.init(&device);
            let reversed = config.with_reversed(true).init(&device);
            let x = Tensor::<4>::random(
                [1, 2, 6, 8],
                burn::tensor::Distribution::Normal(0.0, 1.0),
                &device,
            );
            let (cos, sin) = forward.cos_sin(0, 6, &device);
            let [cos, sin] = [cos, sin].map(|t| t.reshape([1, 1, 6, 4]));
            let (a, b) = (x.clone().narrow(3, 0, 4), x.clone().narrow(3, 4, 4));
            let want = Tensor::cat(
                vec![
                    a.clone() * cos.clone() + b.clone() * sin.clone(),
                    b * cos - a * sin,
                ],
                3,
            );
            assert_close(reversed.forward(x, 0), want, 1e-6, "reversed");
        }
    }

    #[test]
    fn tables_are_not_parameters() {
        let rope = RopeConfig::new(64).init(&Device::flex());
        assert_eq!(rope.num_params(), 0);
        let [positions, pairs] = rope.cos.dims();
        assert_eq!((positions, pairs), (2048, 32));
        let capped = RopeConfig::new(64)
            .with_max_position_embeddings(131072)
            .init(&Device::flex());
        assert_eq!(capped.cos.dims()[0], MAX_TABLE_POSITIONS);
    }

    #[test]
    fn invalid_configs_return_typed_errors() {
        let odd = RopeConfig::new(6).with_partial_rotary_factor(0.5);
        assert_eq!(
            odd.validate(),
            Err(ConfigError::Odd {
                module: "RopeConfig",
                field: "rotary_dim",
                value: 3
            })
        );
        assert_eq!(
            RopeConfig::new(0).validate(),
            Err(ConfigError::Zero {
                module: "RopeConfig",
                field: "head_dim"
            })
        );
        assert_eq!(
            RopeConfig::new(7).validate(),
            Err(ConfigError::Odd {
                module: "RopeConfig",
                field: "rotary_dim",
                value: 7
            })
        );
        let field = |config: RopeConfig| match config.validate() {
            Err(ConfigError::Invalid { field, .. }) => field,
            other => panic!("expected an Invalid error, got {other:?}"),
        };
        assert_eq!(field(RopeConfig::new(8).with_theta(0.0)), "theta");
        assert_eq!(field(RopeConfig::new(8).with_theta(-1.0)), "theta");
        for factor in [0.0, -0.5, 1.5, f64::NAN] {
            assert_eq!(
                field(RopeConfig::new(8).with_partial_rotary_factor(factor)),
                "partial_rotary_factor"
            );
        }
        let scaled = |scaling| RopeConfig::new(8).with_scaling(scaling);
        assert_eq!(field(scaled(RopeScaling::Linear { factor: 0.0 })), "factor");
        assert_eq!(
            field(scaled(RopeScaling::Dynamic { factor: -2.0 })),
            "factor"
        );
        assert_eq!(
            field(scaled(RopeScaling::yarn(f64::INFINITY, 16))),
            "factor"
        );
        assert_eq!(
            field(scaled(RopeScaling::Llama3 {
                factor: 8.0,
                low_freq_factor: 4.0,
                high_freq_factor: 1.0,
                original_max_position_embeddings: None,
            })),
            "high_freq_factor"
        );
        assert_eq!(
            field(scaled(RopeScaling::longrope(
                vec![1.0; 3],
                vec![1.0; 4],
                16
            ))),
            "short_factor"
        );
        assert_eq!(
            field(scaled(RopeScaling::longrope(
                vec![1.0; 4],
                vec![1.0, 0.0, 1.0, 1.0],
                16
            ))),
            "long_factor"
        );
        assert!(
            RopeConfig::new(8)
                .with_scaling(RopeScaling::yarn(4.0, 0))
                .validate()
                .is_err()
        );
        assert!(
            scaled(RopeScaling::longrope(vec![1.0; 4], vec![2.0; 4], 16))
                .validate()
                .is_ok()
        );
    }

    #[test]
    #[should_panic(expected = "RopeConfig: `rotary_dim` must be even, got 3")]
    fn init_panics_on_an_odd_rotary_dim() {
        RopeConfig::new(6)
            .with_partial_rotary_factor(0.5)
            .init(&Device::flex());
    }

    #[test]
    #[should_panic(expected = "RopeConfig: `head_dim` must be greater than 0")]
    fn init_panics_on_a_zero_head_dim() {
        RopeConfig::new(0).init(&Device::flex());
    }
}
