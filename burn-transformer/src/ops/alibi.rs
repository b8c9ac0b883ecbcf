//! ALiBi (Press et al., 2022, "Train Short, Test Long"): instead of encoding positions
//! in the embeddings or rotating q and k, each head adds a linear penalty on distance to
//! its attention logits, `slope_h · (j − p)` for key `j` seen from query position `p`
//! (BLOOM, MPT, Falcon-RW). Keys far back get lower logits; heads with small slopes
//! look far, heads with large ones stay local.
//!
//! Query positions follow the masking rule's bottom-right alignment
//! ([`query_position`]), so cached decoding gives the same logits as one pass. Adding
//! a constant to a row of logits does not change its softmax, so checkpoints that
//! count key positions from the start of the sequence (BLOOM: `slope · j`) or from its
//! end (MPT: `slope · (j − seq_k + 1)`), or that leave out left padding, all give the
//! probabilities of `slope · (j − p)`, which stays at or below 0 where causal
//! attention looks.

use burn::tensor::{Device, Tensor, TensorData};
use serde::{Deserialize, Serialize};

use crate::ops::mask::query_position;

/// ALiBi's slopes, a rule of the head count: head `h` of `heads` gets
/// `slope_scale · alibi_slopes(heads, max_bias)[h]`. A plain value (not a tensor), so
/// that it travels with a call's options to every backend, each of which works the
/// slopes out itself.
///
/// ```rust
/// use burn_transformer::ops::alibi::Alibi;
/// let slopes = Alibi::new().slopes(4);
/// assert_eq!(slopes, vec![0.25, 0.0625, 0.015625, 0.00390625]);
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct Alibi {
    /// The steepest slope is `2^(−max_bias)` (see [`alibi_slopes`]): 8 in the paper,
    /// BLOOM and MPT (`alibi_bias_max`).
    pub max_bias: f64,
    /// A factor on every slope, for models trained with the bias scaled along with
    /// the logits (Falcon-RW's slopes are effectively divided by `√head_dim`). 1 in
    /// BLOOM and MPT.
    pub slope_scale: f64,
}

impl Default for Alibi {
    fn default() -> Self {
        Self {
            max_bias: 8.0,
            slope_scale: 1.0,
        }
    }
}

impl Alibi {
    /// The paper's slopes: `max_bias` 8, `slope_scale` 1.
    pub fn new() -> Self {
        Self::default()
    }

    /// These slopes with another `max_bias`.
    pub fn with_max_bias(self, max_bias: f64) -> Self {
        Self { max_bias, ..self }
    }

    /// These slopes times `slope_scale`.
    pub fn with_slope_scale(self, slope_scale: f64) -> Self {
        Self {
            slope_scale,
            ..self
        }
    }

    /// The slope of each of `heads` heads.
    pub fn slopes(&self, heads: usize) -> Vec<f64> {
        alibi_slopes(heads, self.max_bias)
            .into_iter()
            .map(|slope| slope * self.slope_scale)
            .collect()
    }

    /// The bias of one attention call: `slope_h · (j − p_i)` for query row `i` at
    /// position `p_i` (bottom-right aligned) and key `j`.
    ///
    /// # Shapes
    /// - output: `[1, heads, seq_q, seq_k]`, f32
    pub fn bias(&self, heads: usize, seq_q: usize, seq_k: usize, device: &Device) -> Tensor<4> {
        let slopes: Vec<f32> = self.slopes(heads).into_iter().map(|s| s as f32).collect();
        let slopes = Tensor::<1>::from_data(TensorData::new(slopes, [heads]), device);
        let distances = relative_positions(seq_q, seq_k, device);
        slopes.reshape([1, heads, 1, 1]) * distances.reshape([1, 1, seq_q, seq_k])
    }
}

/// The slope of each of `heads` heads: for a power of two `n`, head `h = 1 … n` gets
/// `2^(−max_bias · h / n)`, a geometric sequence from `2^(−max_bias / n)` down to
/// `2^(−max_bias)` (the paper's `max_bias` is 8). For other head counts the slopes
/// are those of the next power of two `N`: first those of the even `h` (which are
/// the slopes of `N / 2` heads), then those of the odd `h` from `h = 1`, until every
/// head has one (BLOOM's and MPT's rule, stated differently in each).
///
/// ```rust
/// use burn_transformer::ops::alibi::alibi_slopes;
/// assert_eq!(alibi_slopes(4, 8.0), vec![0.25, 0.0625, 0.015625, 0.00390625]);
/// ```
pub fn alibi_slopes(heads: usize, max_bias: f64) -> Vec<f64> {
    let padded = heads.next_power_of_two();
    let slope = |h: usize| (-max_bias * h as f64 / padded as f64).exp2();
    if padded == heads {
        return (1..=heads).map(slope).collect();
    }
    let even = (2..=padded).step_by(2);
    let odd = (1..padded).step_by(2);
    even.chain(odd).take(heads).map(slope).collect()
}

/// `j − p_i` for every query row `i` and key `j`, `[seq_q, seq_k]` (f32).
fn relative_positions(seq_q: usize, seq_k: usize, device: &Device) -> Tensor<2> {
    let values: Vec<f32> = (0..seq_q)
        .flat_map(|row| {
            let position = query_position(row, seq_q, seq_k);
            (0..seq_k).map(move |key| (key as i64 - position) as f32)
        })
        .collect();
    Tensor::from_data(TensorData::new(values, [seq_q, seq_k]), device)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_utils::test_devices;

    /// BLOOM's own statement of the slopes (transformers' `_get_alibi_slopes`): powers
    /// of `2^(−8/p)` for the largest power of two `p` below the head count, then odd
    /// powers of `2^(−8/2p)` for the remaining heads.
    fn bloom_slopes(heads: usize) -> Vec<f64> {
        let closest = 1usize << heads.ilog2();
        let base = |p: usize| 2f64.powf(-(2f64.powf(-((p as f64).log2() - 3.0))));
        let mut slopes: Vec<f64> = (1..=closest)
            .map(|k| base(closest).powi(k as i32))
            .collect();
        let remaining = heads - closest;
        slopes.extend((0..remaining).map(|k| base(2 * closest).powi(2 * k as i32 + 1)));
        slopes
    }

    #[test]
    fn slopes_are_blooms_for_every_head_count() {
        for heads in [1, 2, 3, 5, 6, 8, 12, 16, 20, 32, 40, 71] {
            let ours = alibi_slopes(heads, 8.0);
            let bloom = bloom_slopes(heads);
            assert_eq!(ours.len(), heads);
            for (h, (a, b)) in ours.iter().zip(&bloom).enumerate() {
                assert!(
                    (a - b).abs() <= 1e-12 * b,
                    "{heads} heads, head {h}: {a} vs {b}"
                );
            }
        }
    }

    /// MPT's statement (transformers' `build_mpt_alibi_tensor`): the slopes of the next
    /// power of two, odd-indexed ones first, cut to the head count.
    #[test]
    fn slopes_are_mpts_for_every_head_count_and_max_bias() {
        for heads in [3usize, 4, 6, 7, 24] {
            for max_bias in [8.0, 4.0] {
                let padded = heads.next_power_of_two();
                let all: Vec<f64> = (1..=padded)
                    .map(|h| 1.0 / 2f64.powf(h as f64 * max_bias / padded as f64))
                    .collect();
                let mpt: Vec<f64> = if padded == heads {
                    all
                } else {
                    let odd_index = all.iter().skip(1).step_by(2);
                    odd_index
                        .chain(all.iter().step_by(2))
                        .take(heads)
                        .copied()
                        .collect()
                };
                let ours = alibi_slopes(heads, max_bias);
                for (a, b) in ours.iter().zip(&mpt) {
                    assert!((a - b).abs() <= 1e-12 * b, "{heads} heads: {a} vs {b}");
                }
            }
        }
    }

    /// The bias at each entry is the slope times the key's offset from the query's
    /// position: 3 queries decoded after 2 cached keys sit at positions 2, 3 and 4.
    #[test]
    fn bias_is_slope_times_offset_from_the_query() {
        for device in test_devices() {
            // Two heads, max_bias 2: slopes 2^-1 and 2^-2, times 2.
            let alibi = Alibi::new().with_max_bias(2.0).with_slope_scale(2.0);
            let bias = alibi.bias(2, 3, 5, &device);
            assert_eq!(bias.dims(), [1, 2, 3, 5]);
            let values = bias.into_data().try_to_vec::<f32>().unwrap();
            for (h, slope) in [1.0f32, 0.5].into_iter().enumerate() {
                for row in 0..3 {
                    for key in 0..5 {
                        let expected = slope * (key as f32 - (row + 2) as f32);
                        assert_eq!(values[(h * 3 + row) * 5 + key], expected, "{h} {row} {key}");
                    }
                }
            }
        }
    }
}
