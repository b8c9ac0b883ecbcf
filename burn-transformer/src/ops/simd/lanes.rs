//! Row reductions written as 16 independent lanes.
//!
//! A plain `iter().sum()` or max-fold over f32 is one sequential chain: the compiler
//! may not reorder float additions, so it cannot vectorize it. Sixteen partial results
//! combined at the end are a reordering we choose, and the lane loop vectorizes
//! (16 f32 = one AVX-512 register, two AVX2 ones).

const LANES: usize = 16;

/// `max(xs)`; `-inf` for an empty row.
#[inline(always)]
pub(crate) fn max(xs: &[f32]) -> f32 {
    let mut lanes = [f32::NEG_INFINITY; LANES];
    let chunks = xs.chunks_exact(LANES);
    let tail = chunks.remainder();
    for chunk in chunks {
        for (lane, &x) in lanes.iter_mut().zip(chunk) {
            *lane = lane.max(x);
        }
    }
    tail.iter().fold(
        lanes.iter().fold(f32::NEG_INFINITY, |m, &x| m.max(x)),
        |m, &x| m.max(x),
    )
}

/// `Σ xs`.
#[inline(always)]
pub(crate) fn sum(xs: &[f32]) -> f32 {
    let mut lanes = [0.0f32; LANES];
    let chunks = xs.chunks_exact(LANES);
    let tail = chunks.remainder();
    for chunk in chunks {
        for (lane, &x) in lanes.iter_mut().zip(chunk) {
            *lane += x;
        }
    }
    lanes.iter().sum::<f32>() + tail.iter().sum::<f32>()
}

/// `Σ a·b`.
#[inline(always)]
pub(crate) fn dot(a: &[f32], b: &[f32]) -> f32 {
    let mut lanes = [0.0f32; LANES];
    let (a_chunks, b_chunks) = (a.chunks_exact(LANES), b.chunks_exact(LANES));
    let tail: f32 = a_chunks
        .remainder()
        .iter()
        .zip(b_chunks.remainder())
        .map(|(&x, &y)| x * y)
        .sum();
    for (a, b) in a_chunks.zip(b_chunks) {
        for ((lane, &x), &y) in lanes.iter_mut().zip(a).zip(b) {
            *lane += x * y;
        }
    }
    lanes.iter().sum::<f32>() + tail
}

/// `Σ a·b·c`.
#[inline(always)]
pub(crate) fn dot3(a: &[f32], b: &[f32], c: &[f32]) -> f32 {
    let mut lanes = [0.0f32; LANES];
    let (a_chunks, b_chunks, c_chunks) = (
        a.chunks_exact(LANES),
        b.chunks_exact(LANES),
        c.chunks_exact(LANES),
    );
    let tail: f32 = a_chunks
        .remainder()
        .iter()
        .zip(b_chunks.remainder())
        .zip(c_chunks.remainder())
        .map(|((&x, &y), &z)| x * y * z)
        .sum();
    for ((a, b), c) in a_chunks.zip(b_chunks).zip(c_chunks) {
        for (((lane, &x), &y), &z) in lanes.iter_mut().zip(a).zip(b).zip(c) {
            *lane += x * y * z;
        }
    }
    lanes.iter().sum::<f32>() + tail
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reductions_match_sequential_ones() {
        for len in [0, 1, 15, 16, 17, 64, 100] {
            let a: Vec<f32> = (0..len)
                .map(|i| ((i * 37 % 11) as f32 - 5.0) * 0.25)
                .collect();
            let b: Vec<f32> = (0..len)
                .map(|i| ((i * 13 % 7) as f32 - 3.0) * 0.5)
                .collect();
            let expected_max = a.iter().fold(f32::NEG_INFINITY, |m, &x| m.max(x));
            assert_eq!(max(&a), expected_max, "max of {len}");
            let expected_sum: f64 = a.iter().map(|&x| x as f64).sum();
            assert!((sum(&a) as f64 - expected_sum).abs() < 1e-4, "sum of {len}");
            let expected_dot: f64 = a.iter().zip(&b).map(|(&x, &y)| x as f64 * y as f64).sum();
            assert!(
                (dot(&a, &b) as f64 - expected_dot).abs() < 1e-4,
                "dot of {len}"
            );
            let expected_dot3: f64 = a
                .iter()
                .zip(&b)
                .map(|(&x, &y)| x as f64 * y as f64 * x as f64)
                .sum();
            assert!(
                (dot3(&a, &b, &a) as f64 - expected_dot3).abs() < 1e-4,
                "dot3 of {len}"
            );
        }
    }
}
