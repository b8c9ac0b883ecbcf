//! The softmax of the tiled kernels, stated once for every family: in the forward, a
//! score under the masks, a row's running max and the factor that rescales its sums,
//! a probability, and a row's end (the sink logit, the normalization and the
//! log-sum-exp); in the backward, `P` and `dS` from a score and its log-sum-exp.
//!
//! Hidden scores are [`HIDDEN`], a large negative finite value, and visible ones are
//! floored above it, so that a row's max is above `HIDDEN` exactly when the row sees
//! a key (see `sizes.rs`).
//!
//! The exponential of each score is the kernels' costliest arithmetic after the
//! products: the math library's `expf` takes about ten instructions on CUDA where the
//! hardware's base-2 exponential takes one ([`Exponential`]).

use cubecl::prelude::*;

use super::sizes::{
    HIDDEN, SCORE_FLOOR, ScoreTerms, Sizes, biased_score, cap_derivative, cap_score,
};
use crate::ops::mask::MASKED_ROW_LSE;

/// How a kernel takes the exponentials of its scores: `P` in the forward, `P` and `dS`
/// in the backward.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Exponential {
    /// The runtime's `exp` (every runtime).
    Library,
    /// `2^(x·log₂e)` through PTX's `ex2.approx.ftz.f32` (CUDA): one fused multiply-add
    /// and one special-function instruction where CUDA's `expf` takes about ten, as
    /// FlashAttention-2 computes them. Its relative error (about 2⁻²², plus the
    /// rounding of `y·log₂e`, about 5·10⁻⁶ for a row whose max is 100, one factor for
    /// the whole row) is far below the half-precision rounding of the `P` and `dS` it
    /// feeds; results below f32's normal range are flushed to zero.
    Ex2Approx,
}

/// `exp(x − y)` by `exponential`.
#[cube]
pub(super) fn exp_difference(x: f32, y: f32, #[comptime] exponential: Exponential) -> f32 {
    exp_scaled_difference(x, 1.0f32, y, exponential)
}

/// `exp(x·scale − y)` by `exponential`.
#[cube]
fn exp_scaled_difference(x: f32, scale: f32, y: f32, #[comptime] exponential: Exponential) -> f32 {
    if comptime!(exponential == Exponential::Ex2Approx) {
        // One multiply-add a score: `scale·log₂e` and `y·log₂e` are the same for a
        // whole row (`y` its max or log-sum-exp), which the compiler computes once.
        ex2_approx(fma(x, scale * LOG2_E, -(y * LOG2_E)))
    } else {
        f32::exp(x * scale - y)
    }
}

/// `log₂ e`.
const LOG2_E: f32 = std::f32::consts::LOG2_E;

/// `2^x` by PTX's `ex2.approx.ftz.f32` (CUDA only).
#[cube]
fn ex2_approx(x: f32) -> f32 {
    let out: f32;
    gpu_asm!("ex2.approx.ftz.f32 {}, {};", out(_) out, in(_) x, options(pure, nomem));
    out
}

/// A scaled score `q·k·scale` under the masks where `visible`, [`HIDDEN`] elsewhere:
/// soft-capped, then biased by `bias` (ALiBi's, see
/// [`alibi_bias`](super::sizes::alibi_bias)), each in a kernel compiled with its term
/// (`terms`), and floored.
#[cube]
pub(super) fn masked_score(
    scaled: f32,
    bias: f32,
    visible: bool,
    sizes: &Sizes,
    #[comptime] terms: ScoreTerms,
) -> f32 {
    let score = biased_score(cap_score(scaled, sizes, terms), bias, terms);
    select(visible, open_score(score), HIDDEN)
}

/// A visible (soft-capped, biased) score, floored above [`HIDDEN`]; the whole of
/// [`masked_score`] in a block where every score is visible, uncapped and unbiased
/// ([`block_open`](super::sizes::block_open)).
#[cube]
pub(super) fn open_score(score: f32) -> f32 {
    f32::max(score, SCORE_FLOOR)
}

/// One step of the online softmax: a row's new running max after a block whose max is
/// `block_max`, and the factor that rescales what the row summed under `old_max`. A
/// row that has seen no key yet keeps the factor 1 (its sums are zero).
#[cube]
pub(super) fn online_max(old_max: f32, block_max: f32) -> (f32, f32) {
    let new_max = f32::max(old_max, block_max);
    let correction = select(new_max > HIDDEN, f32::exp(old_max - new_max), 1.0f32);
    (new_max, correction)
}

/// The unnormalized probability of a score `score·scale` under the row's running max:
/// zero while the row has seen no key. `scale` is 1 for a score already scaled; a
/// kernel that leaves its scores unscaled (where no mask or cap needs them scaled)
/// passes its scale, which joins the exponential's multiply-add.
///
/// A row that has seen no key has only hidden scores, so it subtracts 0 in place of
/// its max: `exp(HIDDEN·scale)` underflows to 0 (for any scale above 10⁻²⁸; unscaled
/// scores are only ever visible ones). The choice is one per row, which the compiler
/// makes once for all of the row's scores, where selecting each result costs an
/// instruction a score.
#[cube]
pub(super) fn probability(
    score: f32,
    scale: f32,
    row_max: f32,
    #[comptime] exponential: Exponential,
) -> f32 {
    let subtracted = select(row_max > HIDDEN, row_max, 0.0f32);
    exp_scaled_difference(score, scale, subtracted, exponential)
}

/// The end of a row's online softmax: `(1/Σ, LSE)` from its sum `total` under its max
/// `max`. A head's sink logit (when `sizes.sinks` is on) joins the normalization once,
/// here, after the keys: one more step with a logit and no value (a row that saw no
/// key then gives the sink everything: output 0, LSE = sink). A row that sees nothing
/// at all gets the factor 0 and the masked-row marker, or for a split of
/// flash-decoding (`partial`) the score that gives it no weight in the merge.
#[cube]
pub(super) fn finish_row(
    total: f32,
    max: f32,
    sink: f32,
    partial: u32,
    sizes: &Sizes,
) -> (f32, f32) {
    let mut total = total;
    let mut max = max;
    let mut kept_share = 1.0f32;
    if sizes.sinks != 0 {
        let new_max = f32::max(max, sink);
        kept_share = f32::exp(max - new_max);
        total = total * kept_share + f32::exp(sink - new_max);
        max = new_max;
    }
    let mut inverse = 0.0f32;
    let mut row_lse = select(partial != 0, f32::new(HIDDEN), f32::new(MASKED_ROW_LSE));
    if total > 0.0f32 {
        inverse = kept_share / total;
        row_lse = max + f32::ln(total);
    }
    (inverse, row_lse)
}

/// One entry of the backward: `P = exp(S − LSE)` where visible (0 elsewhere) and
/// `dS = P ∘ (dP − D) ∘ softcap'`, from the scaled score `q·k·scale` and its bias, as
/// [`masked_score`] forms `S`. The bias is a constant of the inputs: it moves `P` and
/// leaves the derivative alone.
#[cube]
#[allow(clippy::too_many_arguments)]
pub(super) fn probability_and_gradient(
    scaled: f32,
    bias: f32,
    dp: f32,
    lse: f32,
    delta: f32,
    visible: bool,
    sizes: &Sizes,
    #[comptime] terms: ScoreTerms,
    #[comptime] exponential: Exponential,
) -> (f32, f32) {
    let capped = cap_score(scaled, sizes, terms);
    let score = biased_score(capped, bias, terms);
    let p = select(visible, exp_difference(score, lse, exponential), 0.0f32);
    (
        p,
        score_gradient(p, dp, delta) * cap_derivative(capped, sizes, terms),
    )
}

/// `dS = P ∘ (dP − D)` of one entry, before the soft-cap's derivative.
#[cube]
fn score_gradient(p: f32, dp: f32, delta: f32) -> f32 {
    p * (dp - delta)
}

/// [`probability_and_gradient`] of a visible, uncapped, unbiased score: the whole of
/// it in a block where every score is ([`block_open`](super::sizes::block_open)).
#[cube]
pub(super) fn open_probability_and_gradient(
    scaled: f32,
    dp: f32,
    lse: f32,
    delta: f32,
    #[comptime] exponential: Exponential,
) -> (f32, f32) {
    let p = exp_difference(scaled, lse, exponential);
    (p, score_gradient(p, dp, delta))
}
