//! The gated delta rule (Yang, Kautz & Hatamizadeh, 2024, "Gated Delta Networks"): a
//! linear attention whose state per head, a `[d_k, d_v]` matrix `S`, is decayed, then
//! corrected toward each new value (the delta rule), then read by the query:
//!
//! ```text
//! S ← exp(g_t) · S
//! S ← S + β_t · k_t · (v_t − Sᵀ k_t)ᵀ
//! o_t = Sᵀ q_t
//! ```
//!
//! One step per position is a sequential loop of small products. This op computes the
//! same outputs chunk by chunk (the UT transform of the DeltaNet papers, as
//! flash-linear-attention and transformers' `torch_chunk_gated_delta_rule` do): within a
//! chunk every position's correction is found at once by inverting a unit lower
//! triangular matrix, so a chunk costs a few matrix products and only the state crosses
//! from one chunk to the next. Memory is O(seq · chunk), not O(seq²).

use burn::tensor::{Bool, Tensor};

/// Positions per chunk (flash-linear-attention's and transformers' 64): larger chunks
/// make fewer sequential steps and larger triangular products.
pub const DELTA_RULE_CHUNK: usize = 64;

/// The gated delta rule over `seq` positions, from `state`.
///
/// The queries and keys come as the layer uses them (transformers' Gated DeltaNet
/// L2-normalizes both and scales the queries by `d_k^-½` first).
///
/// # Shapes
/// - queries, keys: `[batch, heads, seq, d_k]`
/// - values: `[batch, heads, seq, d_v]`
/// - log_decay: `[batch, heads, seq]`, `g_t ≤ 0` (the state is multiplied by `exp(g_t)`)
/// - beta: `[batch, heads, seq]`, the strength of each correction (in `(0, 1)` for the
///   sigmoid that layers use)
/// - state: `[batch, heads, d_k, d_v]` (zeros before the first position)
/// - output: `[batch, heads, seq, d_v]`, and the state after the last position
pub fn gated_delta_rule(
    queries: Tensor<4>,
    keys: Tensor<4>,
    values: Tensor<4>,
    log_decay: Tensor<3>,
    beta: Tensor<3>,
    state: Tensor<4>,
) -> (Tensor<4>, Tensor<4>) {
    let seq = queries.dims()[2];
    let mut state = state;
    let mut outputs = Vec::with_capacity(seq.div_ceil(DELTA_RULE_CHUNK));
    for start in (0..seq).step_by(DELTA_RULE_CHUNK) {
        let len = DELTA_RULE_CHUNK.min(seq - start);
        let (output, next) = chunk(
            queries.clone().narrow(2, start, len),
            keys.clone().narrow(2, start, len),
            values.clone().narrow(2, start, len),
            log_decay.clone().narrow(2, start, len),
            beta.clone().narrow(2, start, len),
            state,
        );
        outputs.push(output);
        state = next;
    }
    (Tensor::cat(outputs, 2), state)
}

/// One chunk of [`gated_delta_rule`].
///
/// With `c_i` the cumulative log decay from the chunk's start to position `i` and
/// `D[i, j] = exp(c_i − c_j)` for `j ≤ i` (0 above the diagonal), the chunk's
/// corrections `u_i − w_i S₀` solve `(I + A) X = …` with `A[i, j] = β_i k_i·k_j D[i, j]`
/// strictly below the diagonal (each position's correction sees the earlier ones'
/// writes):
/// - `T = (I + A)⁻¹`, `U = T (β ∘ V)`, `W = T (β exp(c) ∘ K)`, `V' = U − W S₀`;
/// - `O = (exp(c) ∘ Q) S₀ + ((Q Kᵀ) ∘ D) V'`;
/// - `S = exp(c_last) S₀ + (exp(c_last − c) ∘ K)ᵀ V'`.
///
/// # Shapes
/// As [`gated_delta_rule`] with `seq` the chunk's length (at most
/// [`DELTA_RULE_CHUNK`]).
fn chunk(
    queries: Tensor<4>,
    keys: Tensor<4>,
    values: Tensor<4>,
    log_decay: Tensor<3>,
    beta: Tensor<3>,
    state: Tensor<4>,
) -> (Tensor<4>, Tensor<4>) {
    let len = queries.dims()[2];
    let device = queries.device();
    let cumulative = log_decay.cumsum(2); // [batch, heads, len]
    let by_row = cumulative.clone().unsqueeze_dim::<4>(3); // [batch, heads, len, 1]
    let by_column = cumulative.clone().unsqueeze_dim::<4>(2); // [batch, heads, 1, len]
    // Masked before the exponential: above the diagonal c_i − c_j > 0 could overflow.
    let future: Tensor<4, Bool> = Tensor::<2, Bool>::tril_mask([len, len], 0, &device).unsqueeze();
    let decay = (by_row.clone() - by_column)
        .mask_fill(future, f32::NEG_INFINITY)
        .exp(); // [batch, heads, len, len]
    let beta = beta.unsqueeze_dim::<4>(3); // [batch, heads, len, 1]
    let keys_t = keys.clone().swap_dims(2, 3); // [batch, heads, d_k, len]
    let weighted_keys = keys.clone() * beta.clone();
    let on_and_above: Tensor<4, Bool> =
        Tensor::<2, Bool>::tril_mask([len, len], -1, &device).unsqueeze();
    let strictly_lower =
        (weighted_keys.clone().matmul(keys_t.clone()) * decay.clone()).mask_fill(on_and_above, 0.0);
    let inverse = unit_lower_inverse(strictly_lower.neg());
    let corrections = inverse.clone().matmul(values * beta)
        - inverse
            .matmul(weighted_keys * by_row.clone().exp())
            .matmul(state.clone()); // [batch, heads, len, d_v]
    let scores = queries.clone().matmul(keys_t) * decay;
    let output =
        (queries * by_row.clone().exp()).matmul(state.clone()) + scores.matmul(corrections.clone());
    let last = cumulative.narrow(2, len - 1, 1).unsqueeze_dim::<4>(3); // [batch, heads, 1, 1]
    let state = state * last.clone().exp()
        + (keys * (last - by_row).exp())
            .swap_dims(2, 3)
            .matmul(corrections);
    (output, state)
}

/// `(I − N)⁻¹` for a strictly lower triangular `N`: `N` is nilpotent, so the inverse
/// is the finite sum `I + N + N² + …`, which the product `(I + N)(I + N²)(I + N⁴)…`
/// forms in `⌈log₂ len⌉` squarings (matrix products, where a forward substitution
/// would take `len` dependent steps).
///
/// # Shapes
/// - strict: `[batch, heads, len, len]`, zero on and above the diagonal
/// - output: as `strict`
fn unit_lower_inverse(strict: Tensor<4>) -> Tensor<4> {
    let len = strict.dims()[2];
    let identity: Tensor<4> = Tensor::<2>::eye(len, &strict.device())
        .cast(strict.dtype())
        .unsqueeze();
    let mut inverse = identity + strict.clone();
    let mut power = strict;
    // `inverse` holds the powers below `span`.
    let mut span = 2;
    while span < len {
        power = power.clone().matmul(power);
        inverse = inverse.clone() + inverse.matmul(power.clone());
        span *= 2;
    }
    inverse
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_utils::{assert_close, test_devices};
    use burn::tensor::{Device, Distribution};

    /// The rule written as its definition: one position at a time.
    fn stepwise(
        queries: Tensor<4>,
        keys: Tensor<4>,
        values: Tensor<4>,
        log_decay: Tensor<3>,
        beta: Tensor<3>,
        state: Tensor<4>,
    ) -> (Tensor<4>, Tensor<4>) {
        let seq = queries.dims()[2];
        let mut state = state;
        let mut outputs = Vec::new();
        for t in 0..seq {
            let at = |x: &Tensor<4>| x.clone().narrow(2, t, 1); // [batch, heads, 1, d]
            let (q, k, v) = (at(&queries), at(&keys), at(&values));
            let g = log_decay.clone().narrow(2, t, 1).unsqueeze_dim::<4>(3); // [b, h, 1, 1]
            let b = beta.clone().narrow(2, t, 1).unsqueeze_dim::<4>(3);
            state = state * g.exp();
            let predicted = k.clone().matmul(state.clone()); // [batch, heads, 1, d_v]
            state = state + k.swap_dims(2, 3).matmul((v - predicted) * b);
            outputs.push(q.matmul(state.clone()));
        }
        (Tensor::cat(outputs, 2), state)
    }

    struct Inputs {
        queries: Tensor<4>,
        keys: Tensor<4>,
        values: Tensor<4>,
        log_decay: Tensor<3>,
        beta: Tensor<3>,
        state: Tensor<4>,
    }

    /// Unit-norm keys and queries (as the layers give them), decays from 0.5 to 1 per
    /// position, strengths in (0, 1), a state from an earlier call.
    fn inputs(seq: usize, device: &Device) -> Inputs {
        let [batch, heads, d_k, d_v] = [2, 3, 8, 6];
        let unit = |shape: [usize; 4]| {
            let x = Tensor::<4>::random(shape, Distribution::Normal(0.0, 1.0), device);
            x.clone() / x.powf_scalar(2.0).sum_dim(3).sqrt()
        };
        Inputs {
            queries: unit([batch, heads, seq, d_k]),
            keys: unit([batch, heads, seq, d_k]),
            values: Tensor::random(
                [batch, heads, seq, d_v],
                Distribution::Normal(0.0, 1.0),
                device,
            ),
            log_decay: Tensor::random(
                [batch, heads, seq],
                Distribution::Uniform(-0.7, 0.0),
                device,
            ),
            beta: Tensor::random(
                [batch, heads, seq],
                Distribution::Uniform(0.05, 0.95),
                device,
            ),
            state: Tensor::random(
                [batch, heads, d_k, d_v],
                Distribution::Normal(0.0, 0.5),
                device,
            ),
        }
    }

    /// Chunks equal the step-by-step rule, outputs and final state, across chunk
    /// boundaries (a full chunk, then a partial one).
    #[test]
    fn chunks_equal_the_rule_step_by_step() {
        for device in test_devices() {
            device.seed(5);
            let Inputs {
                queries,
                keys,
                values,
                log_decay,
                beta,
                state,
            } = inputs(DELTA_RULE_CHUNK + 9, &device);
            let (expected, expected_state) = stepwise(
                queries.clone(),
                keys.clone(),
                values.clone(),
                log_decay.clone(),
                beta.clone(),
                state.clone(),
            );
            let (output, final_state) =
                gated_delta_rule(queries, keys, values, log_decay, beta, state);
            assert_close(output, expected, 2e-5, "delta rule outputs");
            assert_close(final_state, expected_state, 2e-5, "delta rule state");
        }
    }

    /// A sequence run in two calls, the state carried between them, equals one call.
    #[test]
    fn the_state_carries_a_sequence_across_calls() {
        let device = Device::flex();
        device.seed(9);
        let Inputs {
            queries,
            keys,
            values,
            log_decay,
            beta,
            state,
        } = inputs(11, &device);
        let (whole, whole_state) = gated_delta_rule(
            queries.clone(),
            keys.clone(),
            values.clone(),
            log_decay.clone(),
            beta.clone(),
            state.clone(),
        );
        let part = |x: &Tensor<4>, start, len| x.clone().narrow(2, start, len);
        let part3 = |x: &Tensor<3>, start, len| x.clone().narrow(2, start, len);
        let (first, middle) = gated_delta_rule(
            part(&queries, 0, 4),
            part(&keys, 0, 4),
            part(&values, 0, 4),
            part3(&log_decay, 0, 4),
            part3(&beta, 0, 4),
            state,
        );
        let (second, last) = gated_delta_rule(
            part(&queries, 4, 7),
            part(&keys, 4, 7),
            part(&values, 4, 7),
            part3(&log_decay, 4, 7),
            part3(&beta, 4, 7),
            middle,
        );
        assert_close(
            Tensor::cat(vec![first, second], 2),
            whole,
            1e-5,
            "split call",
        );
        assert_close(last, whole_state, 1e-5, "split call state");
    }

    /// The squarings invert `I − N` for a strictly lower triangular `N` of every size up
    /// to a chunk's (odd sizes and powers of two).
    #[test]
    fn unit_lower_inverse_inverts() {
        let device = Device::flex();
        device.seed(2);
        for len in [1, 2, 3, 7, 8, 33, DELTA_RULE_CHUNK] {
            let strict =
                Tensor::<4>::random([1, 2, len, len], Distribution::Uniform(-0.3, 0.3), &device)
                    .tril(-1);
            let identity: Tensor<4> = Tensor::<2>::eye(len, &device).unsqueeze();
            let product = (identity.clone() - strict.clone()).matmul(unit_lower_inverse(strict));
            assert_close(
                product,
                identity.repeat_dim(1, 2),
                1e-5,
                &format!("len {len}"),
            );
        }
    }
}
