//! A short causal convolution over time, one filter per channel (depthwise), as linear
//! attention layers apply to their projected queries, keys and values (Mamba, Gated
//! DeltaNet; HF `conv1d`, a `Conv1d` with `groups = channels` and `padding = K − 1`,
//! cut to the input's length).
//!
//! Output `t` of channel `c` is `Σ_j w[c, j] · x[t − (K − 1) + j]`: the current input and
//! the `K − 1` before it. Before the first input those are zeros, or when decoding the
//! last `K − 1` inputs of the earlier calls ([`ShortConv::forward`]'s `history`).

use burn::module::{Initializer, Module, Param};
use burn::tensor::{Device, Tensor};

/// A depthwise causal convolution of kernel `K`, without a bias.
#[derive(Module, Debug)]
pub struct ShortConv {
    /// The filters, `[channels, 1, K]` (PyTorch's `Conv1d` layout, HF `conv1d.weight`).
    pub weight: Param<Tensor<3>>,
}

impl ShortConv {
    /// Filters drawn as PyTorch draws a `Conv1d`'s: uniform in `±1/√K` (the fan-in of
    /// one filter).
    pub(crate) fn new(channels: usize, kernel: usize, device: &Device) -> Self {
        let bound = 1.0 / (kernel as f64).sqrt();
        Self {
            weight: Initializer::Uniform {
                min: -bound,
                max: bound,
            }
            .init([channels, 1, kernel], device),
        }
    }

    /// The kernel size `K`.
    pub fn kernel(&self) -> usize {
        self.weight.shape()[2]
    }

    /// Convolves `x`, continuing after `history` (zeros when `None`), and returns the
    /// output with the last `K − 1` inputs, the history of the next call.
    ///
    /// # Shapes
    /// - x: `[batch, seq, channels]`
    /// - history: `[batch, K − 1, channels]`
    /// - output: `[batch, seq, channels]` and `[batch, K − 1, channels]`
    pub fn forward(&self, x: Tensor<3>, history: Option<Tensor<3>>) -> (Tensor<3>, Tensor<3>) {
        let [batch, seq, channels] = x.dims();
        let kernel = self.kernel();
        let history = history.unwrap_or_else(|| {
            Tensor::zeros([batch, kernel - 1, channels], (&x.device(), x.dtype()))
        });
        let extended = Tensor::cat(vec![history, x], 1); // [batch, K − 1 + seq, channels]
        let weight = self.weight.val().reshape([channels, kernel]);
        let output = (0..kernel)
            .map(|tap| {
                let filter = weight.clone().narrow(1, tap, 1).reshape([1, 1, channels]);
                extended.clone().narrow(1, tap, seq) * filter
            })
            .reduce(|sum, term| sum + term)
            .expect("a kernel has at least one tap");
        let next_history = extended.narrow(1, seq, kernel - 1);
        (output, next_history)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_utils::{assert_close, test_devices};
    use burn::tensor::{Distribution, TensorData};

    /// Each output against the sum written out, over the zeros before the start.
    #[test]
    fn convolves_each_channel_over_its_past() {
        for device in test_devices() {
            let conv = ShortConv {
                weight: Param::from_tensor(Tensor::from_data(
                    TensorData::new(vec![1.0f32, 2.0, 3.0, -1.0, 0.5, 4.0], [2, 1, 3]),
                    &device,
                )),
            };
            // Channel 0: 1, 2, 3, 4; channel 1: 10, 20, 30, 40.
            let x = Tensor::<3>::from_data(
                TensorData::new(
                    vec![1.0f32, 10.0, 2.0, 20.0, 3.0, 30.0, 4.0, 40.0],
                    [1, 4, 2],
                ),
                &device,
            );
            let (output, history) = conv.forward(x, None);
            // Output t = w0·x[t−2] + w1·x[t−1] + w2·x[t].
            let expected = Tensor::<3>::from_data(
                TensorData::new(
                    vec![3.0f32, 40.0, 8.0, 85.0, 14.0, 120.0, 20.0, 155.0],
                    [1, 4, 2],
                ),
                &device,
            );
            assert_close(output, expected, 1e-5, "short convolution");
            let last_two = Tensor::<3>::from_data(
                TensorData::new(vec![3.0f32, 30.0, 4.0, 40.0], [1, 2, 2]),
                &device,
            );
            assert_close(history, last_two, 0.0, "history");
        }
    }

    /// A sequence convolved in steps, the history carried, equals one call.
    #[test]
    fn steps_with_history_equal_one_call() {
        let device = Device::flex();
        device.seed(3);
        let conv = ShortConv::new(5, 4, &device);
        let x = Tensor::<3>::random([2, 7, 5], Distribution::Normal(0.0, 1.0), &device);
        let (whole, _) = conv.forward(x.clone(), None);
        let (first, history) = conv.forward(x.clone().narrow(1, 0, 2), None);
        let (second, history) = conv.forward(x.clone().narrow(1, 2, 1), Some(history));
        let (third, _) = conv.forward(x.narrow(1, 3, 4), Some(history));
        assert_close(
            Tensor::cat(vec![first, second, third], 1),
            whole,
            1e-6,
            "steps",
        );
    }
}
