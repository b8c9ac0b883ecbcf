//! Soft-capping: `cap · tanh(x / cap)`, which bounds values to `(-cap, cap)` smoothly
//! and leaves small ones nearly unchanged (Gemma-2's attention and final logits, Grok).

use burn::tensor::Tensor;

/// `cap · tanh(x / cap)`, elementwise.
///
/// # Shapes
/// - x: any
/// - output: as `x`
pub fn soft_cap<const D: usize>(x: Tensor<D>, cap: f64) -> Tensor<D> {
    (x / cap).tanh() * cap
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_utils::test_devices;

    #[test]
    fn bounds_large_values_and_keeps_small_ones() {
        for device in test_devices() {
            let x = Tensor::<1>::from_floats([-1000.0, -3.0, 0.0, 0.01, 3.0, 1000.0], &device);
            let capped: Vec<f32> = soft_cap(x, 5.0).try_to_vec_as().unwrap();
            for (value, expected) in capped.iter().zip([
                -5.0,
                5.0 * (-0.6f32).tanh(),
                0.0,
                5.0 * (0.002f32).tanh(),
                5.0 * (0.6f32).tanh(),
                5.0,
            ]) {
                assert!((value - expected).abs() < 1e-5, "{value} vs {expected}");
            }
        }
    }
}
