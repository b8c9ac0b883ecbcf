//! A branch-free `exp` for f32 that the compiler vectorizes.
//!
//! `f32::exp` calls the C library one element at a time; in the fused loops that
//! would cost more than all the other arithmetic. This is the classic Cody–Waite
//! reduction `x = n·ln 2 + r`, `|r| ≤ ln 2 / 2`, with Cephes' degree-6 polynomial for
//! `exp(r)` and `2ⁿ` built from the exponent bits: about 1 ulp from the exact value
//! on the whole range (tested against `f64::exp` below).

/// `exp(x)`; inputs are clamped to `[-87.3, 88.0]` (results in the normal f32 range).
#[inline(always)]
pub(crate) fn exp(x: f32) -> f32 {
    const LOG2_E: f32 = std::f32::consts::LOG2_E;
    // ln 2 split in a part exact in f32 and the rest (Cody and Waite).
    const LN2_HI: f32 = 0.693_359_4;
    const LN2_LO: f32 = -2.121_944_4e-4;
    // Adding 1.5·2²³ rounds to the nearest integer and leaves it in the low bits.
    const ROUNDER: f32 = 12_582_912.0;
    let x = x.clamp(-87.3, 88.0);
    let shifted = x * LOG2_E + ROUNDER;
    let n = shifted - ROUNDER;
    let r = x - n * LN2_HI - n * LN2_LO;
    let poly = ((((1.987_569_1e-4 * r + 1.398_199_9e-3) * r + 8.333_452e-3) * r + 4.166_579_6e-2)
        * r
        + 1.666_666_5e-1)
        * r
        + 0.5;
    let exp_r = poly * r * r + r + 1.0;
    // `shifted`'s low bits hold n (two's complement); 2ⁿ has exponent field n + 127.
    let n_bits = shifted.to_bits().wrapping_sub(ROUNDER.to_bits());
    let scale = f32::from_bits(n_bits.wrapping_add(127) << 23);
    exp_r * scale
}

/// The logistic function `1 / (1 + exp(-x))`.
#[inline(always)]
pub(crate) fn sigmoid(x: f32) -> f32 {
    1.0 / (1.0 + exp(-x))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exp_is_within_two_ulp_of_the_exact_value() {
        let mut worst = 0.0f64;
        let mut x = -87.0f32;
        while x < 88.0 {
            let exact = (x as f64).exp();
            let relative = ((exp(x) as f64 - exact) / exact).abs();
            worst = worst.max(relative);
            x += 0.001_37;
        }
        // f32's epsilon is 1.19e-7: two ulp.
        assert!(worst < 2.4e-7, "largest relative error {worst:e}");
    }

    #[test]
    fn exp_saturates_instead_of_overflowing() {
        assert!(exp(1e4).is_finite() && exp(1e4) > 1e38);
        assert!(exp(-1e4) >= 0.0 && exp(-1e4) < 1e-37);
        assert_eq!(exp(0.0), 1.0);
        assert!(sigmoid(1e4) == 1.0 && sigmoid(-1e4) < 1e-37);
        assert!(exp(f32::NAN).is_nan());
    }
}
