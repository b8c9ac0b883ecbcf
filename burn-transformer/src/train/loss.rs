//! The token-level cross-entropy loss, with optional label smoothing (Szegedy et al.
//! 2016, as used by "Attention Is All You Need") and padding positions left out.

use burn::tensor::activation::log_softmax;
use burn::tensor::{Int, Tensor};

/// Mean cross entropy of `logits` against `targets`.
///
/// With label smoothing `ε`, the target distribution is `(1 - ε)·one_hot + ε/V`
/// (PyTorch's `label_smoothing`), so the loss per token is
/// `(1 - ε)·nll + ε·mean_v(-log p_v)`. Positions whose target is `pad_token` count
/// for nothing; the mean is over the other positions.
///
/// # Shapes
/// - logits: `[batch, seq, vocab]`
/// - targets: `[batch, seq]`
/// - output: `[1]`
pub fn cross_entropy(
    logits: Tensor<3>,
    targets: Tensor<2, Int>,
    label_smoothing: f64,
    pad_token: Option<u32>,
) -> Tensor<1> {
    let [batch, seq, vocab] = logits.dims();
    let log_probs = log_softmax(logits.reshape([batch * seq, vocab]), 1); // [tokens, vocab]
    let targets = targets.reshape([batch * seq, 1]); // [tokens, 1]
    let nll = -log_probs.clone().gather(1, targets.clone()); // [tokens, 1]
    let per_token = if label_smoothing > 0.0 {
        let uniform = -log_probs.mean_dim(1); // [tokens, 1]
        nll * (1.0 - label_smoothing) + uniform * label_smoothing
    } else {
        nll
    };
    match pad_token {
        None => per_token.mean(),
        Some(pad) => {
            let keep = targets.not_equal_elem(pad as i64).float(); // [tokens, 1]
            // At least one counted token keeps an all-padding batch finite.
            let count = keep.clone().sum().clamp_min(1.0);
            (per_token * keep).sum() / count
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_utils::test_devices;
    use burn::tensor::TensorData;

    /// The loss computed by hand, in f64.
    fn naive(logits: &[f32], vocab: usize, targets: &[i64], eps: f64, pad: Option<i64>) -> f64 {
        let mut total = 0.0;
        let mut count = 0.0;
        for (row, &target) in logits.chunks(vocab).zip(targets) {
            if Some(target) == pad {
                continue;
            }
            let max = row.iter().fold(f64::MIN, |m, &x| m.max(x as f64));
            let lse = row
                .iter()
                .map(|&x| (x as f64 - max).exp())
                .sum::<f64>()
                .ln()
                + max;
            let log_p: Vec<f64> = row.iter().map(|&x| x as f64 - lse).collect();
            let nll = -log_p[target as usize];
            let uniform = -log_p.iter().sum::<f64>() / vocab as f64;
            total += (1.0 - eps) * nll + eps * uniform;
            count += 1.0;
        }
        total / count
    }

    #[test]
    fn matches_the_naive_loss_with_smoothing_and_padding() {
        let (batch, seq, vocab) = (2, 3, 5);
        let logits: Vec<f32> = (0..batch * seq * vocab)
            .map(|i| ((i * 37 % 11) as f32 - 5.0) * 0.3)
            .collect();
        let targets: Vec<i64> = vec![1, 4, 0, 2, 0, 3];
        for device in test_devices() {
            let logits_t = Tensor::<3>::from_data(
                TensorData::new(logits.clone(), [batch, seq, vocab]),
                &device,
            );
            let targets_t = Tensor::<2, Int>::from_data(
                TensorData::new(targets.clone(), [batch, seq]),
                &device,
            );
            for (eps, pad) in [(0.0, None), (0.1, None), (0.1, Some(0u32)), (0.0, Some(3))] {
                let loss: f32 =
                    cross_entropy(logits_t.clone(), targets_t.clone(), eps, pad).into_scalar();
                let expected = naive(&logits, vocab, &targets, eps, pad.map(|p| p as i64));
                assert!(
                    (loss as f64 - expected).abs() < 1e-5,
                    "eps {eps} pad {pad:?}: {loss} vs {expected}"
                );
            }
        }
    }
}
