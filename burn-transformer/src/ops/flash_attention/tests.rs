//! Parity of the fused op with the reference path and a float64 host oracle.
//!
//! Tolerance rule (DESIGN.md, as flash-attention's own suite): the error of the fused
//! path against the f64 oracle must not exceed twice the error of the naive
//! reference path run at the same precision, plus a small floor so that exact
//! agreement passes (wider for the sinks' gradient, which sums the rounding of every
//! row of a head). Outputs and the gradients of q, k, v and the sinks are all checked.

use burn::tensor::{Bool, DType, Device, Tensor, TensorData};

use super::*;
use crate::ops::alibi::Alibi;
use crate::ops::mask::{MaskRule, padding_mask_from_lengths};

/// One attention call of the grid.
#[derive(Clone, Debug)]
pub(crate) struct Case {
    pub batch: usize,
    pub heads: usize,
    pub kv_heads: usize,
    pub seq_q: usize,
    pub seq_k: usize,
    pub d_qk: usize,
    pub d_v: usize,
    pub causal: bool,
    pub window: Option<usize>,
    /// Chunks of positions (Llama 4's local attention).
    pub chunk: Option<usize>,
    /// Key lengths per batch entry (right padding).
    pub lengths: Option<Vec<usize>>,
    pub softcap: Option<f64>,
    pub scale: Option<f64>,
    /// A learned sink logit per query head (gpt-oss), drawn with the inputs.
    pub sinks: bool,
    /// ALiBi's bias on the scores (BLOOM, MPT).
    pub alibi: Option<Alibi>,
    /// The kernel family on CubeCL devices.
    pub kernel: FlashKernel,
    /// Lanes a row of the register tiles takes on every device (see
    /// [`ScoreOptions::forced_lanes`]); as the device decides without.
    pub lanes: Option<usize>,
}

impl Case {
    pub fn new(
        heads: usize,
        kv_heads: usize,
        seq_q: usize,
        seq_k: usize,
        dims: (usize, usize),
    ) -> Self {
        Self {
            batch: 1,
            heads,
            kv_heads,
            seq_q,
            seq_k,
            d_qk: dims.0,
            d_v: dims.1,
            causal: false,
            window: None,
            chunk: None,
            lengths: None,
            softcap: None,
            scale: None,
            sinks: false,
            alibi: None,
            kernel: FlashKernel::Auto,
            lanes: None,
        }
    }

    /// The case with a causal mask over a batch of two with key lengths `lengths`.
    pub fn causal_padded(mut self, lengths: Vec<usize>) -> Self {
        self.causal = true;
        self.batch = lengths.len();
        self.lengths = Some(lengths);
        self
    }

    fn options(&self) -> ScoreOptions {
        let options = ScoreOptions::new(
            self.scale.unwrap_or(1.0 / (self.d_qk as f64).sqrt()),
            self.softcap,
            MaskRule::new(self.causal, self.window).with_chunk(self.chunk),
        )
        .with_key_mask(self.lengths.is_some())
        .with_alibi(self.alibi)
        .with_kernel(self.kernel);
        ScoreOptions {
            forced_lanes: self.lanes,
            ..options
        }
    }

    fn padding(&self, device: &Device) -> Option<Tensor<2, Bool>> {
        self.lengths
            .as_ref()
            .map(|lengths| padding_mask_from_lengths(lengths, self.seq_k, device))
    }

    fn problem(&self) -> Problem {
        Problem {
            batch: self.batch,
            heads: self.heads,
            kv_heads: self.kv_heads,
            seq_q: self.seq_q,
            seq_k: self.seq_k,
            d_qk: self.d_qk,
            d_v: self.d_v,
            mask: MaskRule::new(self.causal, self.window).with_chunk(self.chunk),
            has_key_mask: self.lengths.is_some(),
            has_alibi: self.alibi.is_some(),
        }
    }

    pub fn shapes(&self) -> [[usize; 4]; 4] {
        [
            [self.batch, self.heads, self.seq_q, self.d_qk],
            [self.batch, self.kv_heads, self.seq_k, self.d_qk],
            [self.batch, self.kv_heads, self.seq_k, self.d_v],
            [self.batch, self.heads, self.seq_q, self.d_v],
        ]
    }
}

/// Host data of one case: q, k, v, the output gradient and a sink logit per head
/// (used when the case has sinks).
pub(crate) struct Inputs {
    pub q: Vec<f32>,
    pub k: Vec<f32>,
    pub v: Vec<f32>,
    pub grad: Vec<f32>,
    pub sinks: Vec<f32>,
}

impl Inputs {
    /// Normal(0, 1) inputs from a generator of their own seeded with `seed`: the same
    /// data on every device, machine and run. (The backends' generators are global to
    /// the process, so inputs drawn from them changed with whatever tests ran beside
    /// these, and a bound that held for one draw could fail on another.)
    pub fn random(case: &Case, seed: u64, q_scale: f32) -> Self {
        use rand::{Rng, SeedableRng};
        let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
        // Box–Muller: a uniform in (0, 1] for the radius (no ln 0), one in [0, 1) for
        // the angle.
        let mut draw = |shape: [usize; 4]| {
            (0..shape.iter().product::<usize>())
                .map(|_| {
                    let radius = (-2.0 * (1.0 - rng.random::<f64>()).ln()).sqrt();
                    let angle = std::f64::consts::TAU * rng.random::<f64>();
                    (radius * angle.cos()) as f32
                })
                .collect::<Vec<f32>>()
        };
        let [sq, sk, sv, so] = case.shapes();
        let (q, k, v, grad) = (draw(sq), draw(sk), draw(sv), draw(so));
        // Sinks of the size of a row's log-sum-exp (≈ ln seq_k for these inputs), so
        // that they take a real share of every row.
        let sinks = draw([1, 1, 1, case.heads])
            .into_iter()
            .map(|x| x + (case.seq_k as f32).ln())
            .collect();
        Self {
            q: q.into_iter().map(|x| x * q_scale).collect(),
            k,
            v,
            grad,
            sinks,
        }
    }
}

/// The largest `|q·k|·scale` of a case over every query and key of a head (visible
/// or not): the size of the logits that f32 rounds in the kernels.
#[cfg(feature = "cube")]
fn largest_logit(case: &Case, inputs: &Inputs) -> f64 {
    let scale = case.scale.unwrap_or(1.0 / (case.d_qk as f64).sqrt());
    let group = case.heads / case.kv_heads;
    let key_rows: Vec<&[f32]> = inputs.k.chunks(case.d_qk).collect();
    let mut largest = 0.0f64;
    for (row, q_row) in inputs.q.chunks(case.d_qk).enumerate() {
        let head = row / case.seq_q;
        let (b, h) = (head / case.heads, head % case.heads);
        let kv = b * case.kv_heads + h / group;
        for k_row in &key_rows[kv * case.seq_k..(kv + 1) * case.seq_k] {
            let dot: f64 = q_row
                .iter()
                .zip(*k_row)
                .map(|(&a, &b)| f64::from(a) * f64::from(b))
                .sum();
            largest = largest.max((dot * scale).abs());
        }
    }
    largest
}

/// Output and gradients `(out, dq, dk, dv, dsinks)` as f64 host vectors (`dsinks`
/// empty without sinks).
pub(crate) type Results = [Vec<f64>; 5];

/// Names of the [`Results`] entries.
const QUANTITIES: [&str; 5] = ["out", "dq", "dk", "dv", "dsinks"];

/// The float64 oracle: direct loops over the masking rule of [`MaskRule::is_hidden`],
/// with ALiBi's bias `slope·(j − position)` added after the soft-cap.
pub(crate) fn oracle(case: &Case, inputs: &Inputs) -> Results {
    let problem = case.problem();
    let group = case.heads / case.kv_heads;
    let scale = case.scale.unwrap_or(1.0 / (case.d_qk as f64).sqrt());
    let (d_qk, d_v, seq_q, seq_k) = (case.d_qk, case.d_v, case.seq_q, case.seq_k);
    let f = |x: &[f32]| x.iter().map(|&v| v as f64).collect::<Vec<f64>>();
    let (q, k, v, grad) = (f(&inputs.q), f(&inputs.k), f(&inputs.v), f(&inputs.grad));
    let mut out = vec![0.0; q.len() / d_qk * d_v];
    let mut dq = vec![0.0; q.len()];
    let mut dk = vec![0.0; k.len()];
    let mut dv = vec![0.0; v.len()];
    let sinks: Vec<f64> = inputs.sinks.iter().map(|&x| x as f64).collect();
    let mut dsinks = vec![0.0; if case.sinks { case.heads } else { 0 }];
    let slopes = case.alibi.map(|alibi| alibi.slopes(case.heads));
    for b in 0..case.batch {
        let length = case.lengths.as_ref().map_or(seq_k, |l| l[b]);
        for h in 0..case.heads {
            let kv = b * case.kv_heads + h / group;
            for i in 0..seq_q {
                let row = (b * case.heads + h) * seq_q + i;
                let visible: Vec<usize> = (0..seq_k)
                    .filter(|&j| j < length && !problem.mask.is_hidden(i, j, seq_q, seq_k))
                    .collect();
                if visible.is_empty() {
                    continue;
                }
                let q_row = &q[row * d_qk..(row + 1) * d_qk];
                let capped: Vec<f64> = visible
                    .iter()
                    .map(|&j| {
                        let k_row = &k[(kv * seq_k + j) * d_qk..][..d_qk];
                        let t = q_row.iter().zip(k_row).map(|(a, b)| a * b).sum::<f64>() * scale;
                        match case.softcap {
                            Some(c) => c * (t / c).tanh(),
                            None => t,
                        }
                    })
                    .collect();
                let position = (i + seq_k) as f64 - seq_q as f64;
                let scores: Vec<f64> = capped
                    .iter()
                    .zip(&visible)
                    .map(|(s, &j)| match &slopes {
                        Some(slopes) => s + slopes[h] * (j as f64 - position),
                        None => *s,
                    })
                    .collect();
                // The sink is one more logit of the row, with no value.
                let sink = case.sinks.then(|| sinks[h]);
                let max = scores
                    .iter()
                    .chain(&sink)
                    .cloned()
                    .fold(f64::NEG_INFINITY, f64::max);
                let weights: Vec<f64> = scores.iter().map(|s| (s - max).exp()).collect();
                let sink_weight = sink.map_or(0.0, |s| (s - max).exp());
                let total: f64 = weights.iter().sum::<f64>() + sink_weight;
                let probs: Vec<f64> = weights.iter().map(|w| w / total).collect();
                let g_row = &grad[row * d_v..(row + 1) * d_v];
                let mut dps = Vec::with_capacity(visible.len());
                for (p, &j) in probs.iter().zip(&visible) {
                    let v_row = &v[(kv * seq_k + j) * d_v..][..d_v];
                    for d in 0..d_v {
                        out[row * d_v + d] += p * v_row[d];
                        dv[(kv * seq_k + j) * d_v + d] += p * g_row[d];
                    }
                    dps.push(g_row.iter().zip(v_row).map(|(a, b)| a * b).sum::<f64>());
                }
                let delta: f64 = probs.iter().zip(&dps).map(|(p, dp)| p * dp).sum();
                if case.sinks {
                    // ∂L/∂sink = p_sink · (0 − delta): the sink's value is 0.
                    dsinks[h] -= sink_weight / total * delta;
                }
                for ((p, dp), (&j, s)) in probs.iter().zip(&dps).zip(visible.iter().zip(&capped)) {
                    let cap = case.softcap.map_or(1.0, |c| 1.0 - (s / c) * (s / c));
                    let ds = p * (dp - delta) * cap * scale;
                    let k_row = (kv * seq_k + j) * d_qk;
                    for d in 0..d_qk {
                        dq[row * d_qk + d] += ds * k[k_row + d];
                        dk[k_row + d] += ds * q_row[d];
                    }
                }
            }
        }
    }
    [out, dq, dk, dv, dsinks]
}

/// Which implementation a run uses.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Path {
    /// The fused op (must be supported).
    Fused,
    /// The reference attention in tensor ops.
    Reference,
}

fn host<const D: usize>(tensor: Tensor<D>) -> Vec<f64> {
    tensor
        .into_data()
        .convert::<f64>()
        .try_to_vec::<f64>()
        .unwrap()
}

/// Runs forward and backward (loss = Σ out ∘ grad) on an autodiff version of `device`.
pub(super) fn run(
    case: &Case,
    inputs: &Inputs,
    device: &Device,
    dtype: DType,
    path: Path,
) -> Results {
    let device = device.clone().autodiff();
    let [sq, sk, sv, so] = case.shapes();
    let load = |data: &[f32], shape: [usize; 4]| {
        Tensor::<4>::from_data(TensorData::new(data.to_vec(), shape), &device)
            .cast(dtype)
            .require_grad()
    };
    let q = load(&inputs.q, sq);
    let k = load(&inputs.k, sk);
    let v = load(&inputs.v, sv);
    let grad =
        Tensor::<4>::from_data(TensorData::new(inputs.grad.clone(), so), &device).cast(dtype);
    let sinks = case.sinks.then(|| {
        Tensor::<1>::from_data(TensorData::new(inputs.sinks.clone(), [case.heads]), &device)
            .require_grad()
    });
    let (options, padding) = (case.options(), case.padding(&device));
    let output = match path {
        Path::Fused => flash_attention(
            q.clone(),
            k.clone(),
            v.clone(),
            padding,
            sinks.clone(),
            &options,
        )
        .unwrap_or_else(|reason| panic!("{case:?}: fused op unsupported: {reason}")),
        Path::Reference => {
            reference::attention(
                q.clone(),
                k.clone(),
                v.clone(),
                padding,
                &options,
                sinks.as_ref(),
                0.0,
            )
            .0
        }
    };
    let grads = (output.clone() * grad).sum().backward();
    let gradient = |t: &Tensor<4>| {
        t.grad(&grads)
            .map(host)
            .unwrap_or_else(|| vec![0.0; t.shape().num_elements()])
    };
    let dsinks = sinks.map_or_else(Vec::new, |sinks| {
        sinks
            .grad(&grads)
            .map(host)
            .unwrap_or_else(|| vec![0.0; case.heads])
    });
    [
        host(output.inner()),
        gradient(&q),
        gradient(&k),
        gradient(&v),
        dsinks,
    ]
}

/// `(fused, naive, oracle)` results of one case on `device`.
pub(super) fn compare(
    case: &Case,
    inputs: &Inputs,
    device: &Device,
    dtype: DType,
) -> (Results, Results, Results) {
    let fused = run(case, inputs, device, dtype, Path::Fused);
    let naive = run(case, inputs, device, dtype, Path::Reference);
    (fused, naive, oracle(case, inputs))
}

/// Largest absolute difference (NaN counts as infinite).
fn max_error(actual: &[f64], expected: &[f64]) -> f64 {
    actual
        .iter()
        .zip(expected)
        .map(|(a, e)| {
            if a.is_finite() {
                (a - e).abs()
            } else {
                f64::INFINITY
            }
        })
        .fold(0.0, f64::max)
}

/// Asserts the tolerance rule for the output and the gradients.
///
/// `floor` is relative to the largest magnitude of the expected values.
pub(super) fn assert_rule(
    what: &str,
    fused: &Results,
    naive: &Results,
    oracle: &Results,
    floor: f64,
) {
    let failures = rule_failures(what, fused, naive, oracle, floor);
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// How many times the others' floor the sinks' gradient gets. The fused op sums
/// `exp(s − LSE)·rowsum(dO ∘ O)` over every row of a head from `O` and `dO` as the dtype
/// rounds them, and the naive path takes another formula (softmax's backward), so the
/// naive error is no yardstick for that rounding: over 2000 random draws of a bf16
/// case (3 heads, 17 rows, head dim 64), rounding the inputs and `O` alone left errors
/// up to 3.2% of the largest dsinks (1.6% at the 99th percentile, 0.34% at the
/// median), where the floor of the half types is 0.1%.
const SINK_FLOOR_FACTOR: f64 = 16.0;

/// The quantities (output, dq, dk, dv, dsinks) that break the tolerance rule: the fused
/// error against the oracle at most twice the naive path's plus `floor` (for dsinks
/// [`SINK_FLOOR_FACTOR`] times it) times the largest expected magnitude.
pub(super) fn rule_failures(
    what: &str,
    fused: &Results,
    naive: &Results,
    oracle: &Results,
    floor: f64,
) -> Vec<String> {
    let mut failures = Vec::new();
    for (name, ((f, n), o)) in QUANTITIES.iter().zip(fused.iter().zip(naive).zip(oracle)) {
        let magnitude = o.iter().fold(1.0f64, |m, x| m.max(x.abs()));
        let fused_error = max_error(f, o);
        let naive_error = max_error(n, o);
        let floor = if *name == "dsinks" {
            floor * SINK_FLOOR_FACTOR
        } else {
            floor
        };
        let bound = 2.0 * naive_error + floor * magnitude;
        if fused_error > bound || fused_error.is_nan() {
            failures.push(format!(
                "{what}: {name} error {fused_error:e} > bound {bound:e} (naive error \
                 {naive_error:e}, magnitude {magnitude:e})"
            ));
        }
    }
    failures
}

/// (seq_q, seq_k, causal, window, padding, softcap) of one mask configuration.
type MaskCase = (usize, usize, bool, Option<usize>, bool, Option<f64>);

/// The f32 parity grid: at least 100 configurations covering MHA/GQA/MQA, causal or
/// not, windows, padding (with fully padded entries), soft-capping, attention sinks
/// (a quarter of the cases, with and without windows), chunks (the causal cases at
/// head dim 64, and a long one), seq lengths 1, 17, 64, 129
/// and 1000 with seq_q ≠ seq_k, head dims 32, 64, 80, 128 and 192/128.
pub(super) fn parity_grid() -> Vec<Case> {
    let dims = [(32, 32), (64, 64), (80, 80), (128, 128), (192, 128)];
    let heads = [(2, 2), (4, 2), (3, 1)];
    let masks: [MaskCase; 8] = [
        (17, 17, false, None, false, None),
        (1, 17, true, None, false, None),
        (17, 64, true, None, true, None),
        (64, 17, true, Some(5), false, None),
        (129, 64, false, Some(9), false, None),
        (64, 129, true, Some(40), true, Some(5.0)),
        (17, 129, false, None, true, Some(20.0)),
        (129, 129, true, None, false, None),
    ];
    let mut cases = Vec::new();
    for (d, &dim) in dims.iter().enumerate() {
        for (h, &(heads, kv_heads)) in heads.iter().enumerate() {
            for (m, &(seq_q, seq_k, causal, window, padding, softcap)) in masks.iter().enumerate() {
                let mut case = Case::new(heads, kv_heads, seq_q, seq_k, dim);
                case.causal = causal;
                case.window = window;
                case.softcap = softcap;
                if padding {
                    // Batch of two: one entry with keys cut short, one fully padded
                    // (every row of it sees nothing).
                    case.batch = 2;
                    let cut = (seq_k * 2 / 3).max(1);
                    case.lengths = Some(if (d + h + m) % 2 == 0 {
                        vec![cut, 0]
                    } else {
                        vec![seq_k, cut]
                    });
                }
                if (d + h + m) % 5 == 0 {
                    case.scale = Some(0.3);
                }
                // Sinks are a runtime flag of the kernels: no new compiled kernel.
                case.sinks = (d + 2 * h + m) % 4 == 1;
                // Chunks compile kernels of their own (`ScoreTerms::chunk`): at one
                // head dim, every causal mask and head layout cuts its positions into
                // chunks that do not divide the blocks.
                if causal && dim == (64, 64) {
                    case.chunk = Some(seq_k / 3 + 2);
                }
                cases.push(case);
            }
        }
    }
    // Long sequences, a few shapes only.
    let mut long = Case::new(2, 1, 1000, 1000, (64, 64));
    long.causal = true;
    cases.push(long);
    let mut long = Case::new(2, 2, 1000, 999, (128, 128));
    long.window = Some(100);
    long.sinks = true;
    cases.push(long);
    let mut long = Case::new(2, 1, 1000, 1000, (64, 64));
    long.causal = true;
    long.chunk = Some(300);
    cases.push(long);
    let mut long = Case::new(1, 1, 129, 1000, (192, 128));
    long.lengths = Some(vec![700]);
    cases.push(long);
    // MLA's absorbed decode: one latent key/value head of 576/512 for every query head.
    for (seq_q, seq_k) in [(1, 65), (17, 40)] {
        let mut latent = Case::new(4, 1, seq_q, seq_k, (576, 512));
        latent.causal = true;
        latent.scale = Some(0.07);
        cases.push(latent);
    }
    cases
}

/// ALiBi's cases, at one head dim of the grid: a causal, padded GQA batch (BLOOM's and
/// MPT's call); 12 heads (padded to 16: fractional powers of two, here with another
/// `max_bias`) over one key/value head, not causal (keys ahead of a query get a
/// positive bias), scaled apart; a window with soft-capping (the cap, then the bias),
/// sinks and scaled slopes; several tiles of rows and keys; and a decoding step over
/// a long cache, which the kernels split (flash-decoding, each split biasing its keys
/// by their absolute positions).
pub(super) fn alibi_cases() -> Vec<Case> {
    let mut padded = Case::new(4, 2, 17, 64, (64, 64)).causal_padded(vec![64, 40]);
    padded.alibi = Some(Alibi::new());
    let mut wide = Case::new(12, 1, 33, 33, (64, 64));
    wide.alibi = Some(Alibi::new().with_max_bias(6.0));
    wide.scale = Some(0.3);
    let mut capped = Case::new(6, 3, 64, 129, (64, 64));
    capped.causal = true;
    capped.window = Some(40);
    capped.softcap = Some(5.0);
    capped.sinks = true;
    capped.alibi = Some(Alibi::new().with_slope_scale(0.125));
    let mut long = Case::new(2, 2, 129, 129, (64, 64));
    long.causal = true;
    long.alibi = Some(Alibi::new());
    let mut decode = Case::new(4, 2, 1, 1000, (64, 64));
    decode.causal = true;
    decode.alibi = Some(Alibi::new());
    vec![padded, wide, capped, long, decode]
}

/// `count` random configurations drawn from `seed`, beyond the grid's: head dims of
/// every size the kernels take (multiples of 8 up to 256, `d_qk ≠ d_v`), lengths 1–300
/// (a few up to 700, and one case in six decoding: 1–16 rows against 500–1500 keys),
/// batches of 1–3, any GQA grouping, and each mask option (causal, window, chunks, padding with
/// fully padded entries, soft-capping, scale, sinks, ALiBi) drawn apart.
pub(super) fn random_cases(seed: u64, count: usize) -> Vec<Case> {
    use rand::{Rng, SeedableRng};
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let dims = [8, 16, 24, 32, 40, 48, 64, 72, 96, 112, 128, 160, 256];
    (0..count)
        .map(|_| {
            let d_qk = dims[rng.random_range(0..dims.len())];
            let d_v = if rng.random_bool(0.25) {
                dims[rng.random_range(0..dims.len())].min(128)
            } else {
                d_qk
            };
            let kv_heads = rng.random_range(1..=3);
            let heads = kv_heads * rng.random_range(1..=3);
            let length = |rng: &mut rand::rngs::StdRng| {
                if rng.random_bool(0.1) {
                    rng.random_range(301..=700)
                } else {
                    rng.random_range(1..=300)
                }
            };
            // One case in six decodes: a few query rows against a long cache, which the
            // CubeCL kernels split across cubes (flash-decoding).
            let (seq_q, seq_k) = if rng.random_bool(1.0 / 6.0) {
                (rng.random_range(1..=16), rng.random_range(500..=1500))
            } else {
                (length(&mut rng), length(&mut rng))
            };
            let mut case = Case::new(heads, kv_heads, seq_q, seq_k, (d_qk, d_v));
            case.batch = rng.random_range(1..=3);
            case.causal = rng.random_bool(0.5);
            if rng.random_bool(0.3) {
                case.window = Some(rng.random_range(1..=seq_k.max(2)));
            }
            if rng.random_bool(0.4) {
                case.lengths = Some(
                    (0..case.batch)
                        .map(|_| rng.random_range(0..=seq_k))
                        .collect(),
                );
            }
            if rng.random_bool(0.25) {
                case.softcap = Some(rng.random_range(2.0..50.0));
            }
            if rng.random_bool(0.3) {
                case.scale = Some(rng.random_range(0.02..1.0));
            }
            case.sinks = rng.random_bool(0.3);
            if rng.random_bool(0.2) {
                case.alibi = Some(Alibi::new().with_max_bias(rng.random_range(2.0..10.0)));
            }
            if rng.random_bool(0.2) {
                case.chunk = Some(rng.random_range(1..=seq_k.max(2)));
            }
            case
        })
        .collect()
}

/// Seed and size of the random sweeps (`BURN_TRANSFORMER_SWEEP=SEED:COUNT`, default
/// `1:40`).
fn sweep_settings() -> (u64, usize) {
    let value = std::env::var("BURN_TRANSFORMER_SWEEP").unwrap_or_default();
    let mut parts = value.split(':').map(|part| part.trim().parse::<u64>().ok());
    let seed = parts.next().flatten().unwrap_or(1);
    let count = parts.next().flatten().unwrap_or(40) as usize;
    (seed, count)
}

/// The tiled CPU flash attention on random configurations (an exhaustive check outside
/// the default run: `cargo test --release -p burn-transformer -- --ignored
/// random_sweep`).
#[test]
#[ignore = "exhaustive: run with --ignored"]
fn flex_random_sweep() {
    let device = Device::flex();
    let (seed, count) = sweep_settings();
    let mut failures = Vec::new();
    for (index, case) in random_cases(seed, count).iter().enumerate() {
        let inputs = Inputs::random(case, seed + index as u64, 1.0);
        let (fused, naive, expected) = compare(case, &inputs, &device, DType::F32);
        let what = format!("flex sweep {seed}:{index} {case:?}");
        failures.extend(rule_failures(&what, &fused, &naive, &expected, 1e-5));
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// The reference path itself against the f64 oracle, output and gradients: the
/// tolerance rule compares the fused paths with it, so it is pinned directly.
#[test]
fn reference_matches_the_oracle() {
    let cases: Vec<(usize, Case)> = parity_grid()
        .into_iter()
        .enumerate()
        .filter(|(i, case)| i % 9 == 4 && case.seq_q.max(case.seq_k) <= 129)
        .collect();
    assert!(cases.len() >= 5, "{} cases", cases.len());
    for device in crate::test_utils::test_devices() {
        for (index, case) in &cases {
            let inputs = Inputs::random(case, *index as u64, 1.0);
            let expected = oracle(case, &inputs);
            let naive = run(case, &inputs, &device, DType::F32, Path::Reference);
            for (name, (actual, expected)) in QUANTITIES.iter().zip(naive.iter().zip(&expected)) {
                let magnitude = expected.iter().fold(1.0f64, |m, x| m.max(x.abs()));
                let error = max_error(actual, expected);
                assert!(
                    error <= 1e-5 * magnitude,
                    "{device:?} #{index} {case:?}: {name} error {error:e}"
                );
            }
        }
    }
}

/// The whole parity grid through the op on flex: the tiled CPU flash attention.
#[test]
fn flex_flash_path_matches_the_oracle() {
    let device = Device::flex();
    let mut failures = Vec::new();
    for (index, case) in parity_grid().iter().enumerate() {
        let inputs = Inputs::random(case, index as u64, 1.0);
        let (fused, naive, expected) = compare(case, &inputs, &device, DType::F32);
        let what = format!("flex #{index} {case:?}");
        failures.extend(rule_failures(&what, &fused, &naive, &expected, 1e-5));
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// ALiBi's cases through the op on flex (the tiled CPU flash attention), and the
/// reference path's bias pinned to the oracle's.
#[test]
fn flex_alibi_matches_the_oracle() {
    let device = Device::flex();
    let mut failures = Vec::new();
    for (index, case) in alibi_cases().iter().enumerate() {
        let inputs = Inputs::random(case, 500 + index as u64, 1.0);
        let (fused, naive, expected) = compare(case, &inputs, &device, DType::F32);
        let what = format!("flex ALiBi #{index} {case:?}");
        failures.extend(rule_failures(&what, &fused, &naive, &expected, 1e-5));
        for (name, (actual, expected)) in QUANTITIES.iter().zip(naive.iter().zip(&expected)) {
            let magnitude = expected.iter().fold(1.0f64, |m, x| m.max(x.abs()));
            let error = max_error(actual, expected);
            if error > 1e-5 * magnitude {
                failures.push(format!("{what}: reference {name} error {error:e}"));
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// Peaked rows on flex: with large logits the tiled path keeps the naive path's
/// accuracy (the backward recomputes the forward's scores bit for bit, so each row's
/// largest score cancels against its log-sum-exp), and a row that sees one key gets
/// exactly zero dQ and dK, as the math says.
#[test]
fn flex_peaked_rows_keep_the_naive_accuracy() {
    let device = Device::flex();
    // Logits of about ±40: scale 0.82 at head dim 160.
    let mut case = Case::new(4, 2, 92, 148, (160, 160));
    case.batch = 2;
    case.causal = true;
    case.scale = Some(0.82);
    let inputs = Inputs::random(&case, 602, 1.0);
    let (fused, naive, expected) = compare(&case, &inputs, &device, DType::F32);
    // A floor far below the errors themselves (2e-5 to 2e-4): the rule is the naive
    // path's error alone.
    assert_rule("peaked rows", &fused, &naive, &expected, 1e-7);

    let mut single = Case::new(4, 2, 40, 30, (64, 64));
    single.lengths = Some(vec![1]);
    let inputs = Inputs::random(&single, 7, 1.0);
    let [out, dq, dk, dv, _] = run(&single, &inputs, &device, DType::F32, Path::Fused);
    assert!(out.iter().any(|x| *x != 0.0) && dv.iter().any(|x| *x != 0.0));
    assert!(dq.iter().all(|x| *x == 0.0), "dq of rows that see one key");
    assert!(
        dk.iter().all(|x| *x == 0.0),
        "dk of the one key every row sees"
    );
}

/// Half types on flex take the portable version of the op.
#[test]
fn flex_half_precision_takes_the_portable_path() {
    let device = Device::flex();
    let case = Case::new(4, 2, 17, 33, (32, 32)).causal_padded(vec![33, 20]);
    let inputs = Inputs::random(&case, 21, 1.0);
    let (fused, naive, expected) = compare(&case, &inputs, &device, DType::F16);
    assert_rule("flex f16", &fused, &naive, &expected, 1e-3);
}

#[test]
fn portable_path_runs_on_ndarray() {
    #[cfg(feature = "ndarray")]
    {
        #[allow(deprecated)] // ndarray is deprecated upstream; we keep supporting it.
        let device = Device::ndarray();
        let case = Case::new(4, 2, 17, 64, (32, 32)).causal_padded(vec![40, 0]);
        let inputs = Inputs::random(&case, 3, 1.0);
        let (fused, naive, expected) = compare(&case, &inputs, &device, DType::F32);
        assert_rule("ndarray", &fused, &naive, &expected, 1e-5);
    }
}

#[test]
fn unsupported_dtype_is_reported() {
    let device = Device::flex();
    let problem = Case::new(1, 1, 2, 2, (4, 4)).problem();
    assert_eq!(
        check_support(&device, DType::I32, &problem),
        Err(Unsupported::DType(DType::I32))
    );
    let mut empty = problem;
    empty.seq_k = 0;
    assert!(matches!(
        check_support(&device, DType::F32, &empty),
        Err(Unsupported::Empty(_))
    ));
}

/// The kernel checks, written once for any CubeCL device; `mod wgpu` and `mod cuda`
/// run them on each runtime this build has.
#[cfg(feature = "cube")]
mod on_device {
    use super::*;
    use std::sync::atomic::Ordering;

    /// Outputs and gradients of `cases` with the kernel family `kernel`, fused against
    /// the naive f32 path and the f64 oracle.
    fn parity(device: &Device, label: &str, cases: &[(usize, Case)], kernel: FlashKernel) {
        parity_in(device, label, cases, kernel, DType::F32);
    }

    /// [`parity`] with inputs of `dtype` (the naive path runs in it too).
    fn parity_in(
        device: &Device,
        label: &str,
        cases: &[(usize, Case)],
        kernel: FlashKernel,
        dtype: DType,
    ) {
        let launches = super::super::op::FORWARD_LAUNCHES.load(Ordering::Relaxed);
        let staged = super::super::op::STAGED_LAUNCHES.load(Ordering::Relaxed);
        // Every configuration runs before the verdict, so that a failure shows its
        // whole pattern (which quantities, which shapes), not just the first case.
        let mut failures = Vec::new();
        for (index, case) in cases {
            let case = Case {
                kernel,
                ..case.clone()
            };
            let inputs = Inputs::random(&case, *index as u64, 1.0);
            let (fused, naive, expected) = compare(&case, &inputs, device, dtype);
            // Half types round every input and output: a floor at their precision.
            let floor = if dtype == DType::F32 { 1e-5 } else { 1e-3 };
            failures.extend(rule_failures(
                &format!("{label} {kernel:?} {dtype:?} #{index} {case:?}"),
                &fused,
                &naive,
                &expected,
                floor,
            ));
        }
        assert!(
            failures.is_empty(),
            "{} of {} quantities break the rule:\n{}",
            failures.len(),
            QUANTITIES.len() * cases.len(),
            failures.join("\n")
        );
        // The CubeCL kernel really ran for these calls (under Fusion, at execution),
        // and the staged family did when asked for (forward and backward of each).
        assert!(
            super::super::op::FORWARD_LAUNCHES.load(Ordering::Relaxed) >= launches + cases.len()
        );
        if kernel == FlashKernel::Staged {
            // Every case but MLA's absorbed 576/512 fits 32 KiB of shared memory
            // (lavapipe's); larger devices fit those too.
            let mut fitting = 0;
            for (index, case) in cases {
                let (fits, shared) =
                    super::super::cube::tiling::staged_fits(device, DType::F32, &case.problem());
                fitting += fits as usize;
                assert!(
                    fits || (case.d_qk > 192 && shared < 64 * 1024),
                    "#{index} {case:?}: the staged tiles do not fit {shared} B"
                );
            }
            assert!(
                super::super::op::STAGED_LAUNCHES.load(Ordering::Relaxed) >= staged + 2 * fitting
            );
        }
    }

    /// The whole parity grid through the register-tile kernels (CPU runtimes'
    /// default, and the fallback of every other family).
    pub fn parity_grid_f32(device: &Device, label: &str) {
        let cases: Vec<(usize, Case)> = parity_grid().into_iter().enumerate().collect();
        assert!(cases.len() >= 100, "{} configurations", cases.len());
        parity(device, label, &cases, FlashKernel::RegisterTile);
    }

    /// The register tiles with each row split over several lanes, as GPUs split the
    /// rows that would not fit a unit's registers (on CPU runtimes the lanes sum
    /// through shared memory, on GPUs with plane shuffles): the lane offsets, the
    /// sums and the writes are all that differ from [`parity_grid_f32`], so a third
    /// of the grid's cases at head dims 32 and 64 (every mask, rows and keys past a
    /// tile's end, single-row decoding), two at 80 (an odd count of vectors a lane
    /// with four lanes) and two at 192/128 (a query/key share unlike the value one).
    pub fn parity_grid_split_rows(device: &Device, label: &str) {
        let cases: Vec<(usize, Case)> = parity_grid()
            .into_iter()
            .enumerate()
            .filter(|(index, case)| {
                let short = case.seq_q.max(case.seq_k) <= 129;
                let third = (index % 8 + index / 8) % 3 == 0;
                short
                    && ((third && case.d_qk <= 64)
                        || (index % 12 == 1 && matches!(case.d_qk, 80 | 192)))
            })
            // 2, 4 and 16 lanes in turn (16 take as many as divide a row's vectors: 8
            // at head dim 32, 4 at 80), as GPUs take 2 to 16.
            .enumerate()
            .map(|(position, (index, case))| {
                let lanes = Some([2, 4, 16][position % 3]);
                (index, Case { lanes, ..case })
            })
            .collect();
        let split = super::super::op::SPLIT_ROW_LAUNCHES.load(Ordering::Relaxed);
        parity(device, label, &cases, FlashKernel::RegisterTile);
        // Forward, dQ and dK/dV of every case ran with split rows.
        assert!(
            super::super::op::SPLIT_ROW_LAUNCHES.load(Ordering::Relaxed) >= split + 3 * cases.len()
        );
    }

    /// The parity grid through the staged kernels (GPUs' default; CPU runtimes such
    /// as lavapipe run them when asked), with plain tile products.
    ///
    /// Every mask, head and head-dim configuration of the grid with sequences up to
    /// 129, and one long causal case: the kernels compile once per head dim and tile,
    /// whatever the mask, so this covers the staged code without the long cases'
    /// lavapipe time.
    pub fn parity_grid_staged(device: &Device, label: &str) {
        let cases = grid_and_decoding(|index, case, long| {
            (index % 2 == 0 && !long) || (long && case.causal && case.d_qk == 64)
        });
        let splits = super::super::op::SPLIT_LAUNCHES.load(Ordering::Relaxed);
        parity(device, label, &cases, FlashKernel::Staged);
        // The decoding cases split their keys (each forward runs at least once).
        assert!(
            super::super::op::SPLIT_LAUNCHES.load(Ordering::Relaxed)
                >= splits + decode_cases().len()
        );
    }

    /// The parity grid through the fragment kernels (tensor cores on GPUs, in bf16;
    /// CPU runtimes emulate their operations through shared memory, in f32, which
    /// checks the fragment layouts and the register reuse of `P` and `dS`): a third of
    /// the grid's shapes with sequences up to 129 at every head dim they take (all but
    /// MLA's absorbed 576/512), the long causal case and the long windowed one (whose
    /// blocks away from the mask's edges skip the per-score masking, causal or not),
    /// and the decoding cases, which split their keys.
    pub fn parity_grid_fragments(device: &Device, label: &str) {
        let cases = grid_and_decoding(|index, case, long| {
            let long_masked = case.causal || case.window.is_some();
            case.d_v <= 128
                && ((index % 3 == 0 && !long) || (long && long_masked && case.d_qk <= 128))
        });
        parity_fragments(device, label, &cases, FlashKernel::Fragments);
    }

    /// The parity grid through the wide fragment forward (two row tiles a plane; the
    /// backward is the narrow one): the row-tile indexing is all that differs from
    /// [`parity_grid_fragments`], so a leaner set checks it: half the grid's cases at
    /// head dims 32 and 64, every mask at each of them (one plane-row tile beside the
    /// other, rows past the end in both), a few at 80 (an odd count of 16-column
    /// chunks; the largest head dim whose wide tiles fit lavapipe's 32 KiB in f32), the
    /// long causal case and the decoding cases.
    pub fn parity_grid_wide_fragments(device: &Device, label: &str) {
        let cases = grid_and_decoding(|index, case, long| {
            // Odd masks for one head configuration, even ones for the next.
            let alternate = (index + index / 8) % 2 == 1;
            (alternate && !long && case.d_qk <= 64)
                || (index % 6 == 1 && !long && case.d_qk == 80)
                || (long && case.causal && case.d_qk == 64)
        });
        parity_fragments(device, label, &cases, FlashKernel::WideFragments);
    }

    /// The parity grid through the one-pass fragment backward (its dK/dV kernel adds
    /// dQ atomically; the forward is the narrow one on runtimes that do not report
    /// their multiprocessors): only the dK/dV kernel differs from
    /// [`parity_grid_fragments`], so the half of the cases at head dims up to 64 that
    /// the wide grid leaves (every mask, rows and keys past the tiles' ends), a few at
    /// 80 (whose column blocks do not split evenly over the planes' passes) and, where
    /// the device's tiles take its one-pass kernel there (GPUs), at 128, the largest
    /// head dim it takes, the long causal case (many query tiles adding to the same
    /// rows) and the decoding cases.
    pub fn parity_grid_fragments_atomic_dq(device: &Device, label: &str) {
        let properties = device_properties(device);
        let dtype = fragment_dtype(&properties, FlashKernel::FragmentsAtomicDq);
        let one_pass = |case: &Case| {
            super::super::cube::tiling::plan_fragments(
                &case.problem(),
                dtype,
                &properties,
                super::super::cube::tiling::fragment_row_tiles(false),
                true,
                false,
                false,
            )
            .and_then(|plan| plan.backward)
            .is_some_and(|(_, keys)| keys.adds_dq)
        };
        let cases = grid_and_decoding(|index, case, long| {
            let alternate = (index + index / 8) % 2 == 0;
            let sampled = index % 6 == 1 && !long;
            (alternate && !long && case.d_qk <= 64)
                || (sampled && (case.d_qk == 80 || (case.d_qk == 128 && one_pass(case))))
                || (long && case.causal && case.d_qk == 64)
        });
        let one_pass = super::super::op::ATOMIC_DQ_LAUNCHES.load(Ordering::Relaxed);
        parity_fragments(device, label, &cases, FlashKernel::FragmentsAtomicDq);
        // Where the device adds f32 atomically (lavapipe does), its backward is the
        // one-pass one.
        let properties = device_properties(device);
        if super::super::cube::tiling::adds_f32_atomically(&properties) {
            assert!(super::super::op::ATOMIC_DQ_LAUNCHES.load(Ordering::Relaxed) > one_pass);
        }
    }

    /// The parity grid through the TF32 fragment kernels, in f32 (on GPUs with TF32
    /// tensor cores each product is three TF32 products of split elements; CPU runtimes
    /// run the same split emulated, reading each operand as a tensor core does): only
    /// the products differ from [`parity_grid_fragments`], so a third of the short
    /// cases at head dims 32 (two 16-column chunks) and 80 (five: the chunk loops'
    /// odd end), every mask among them, and the decoding cases, which split their
    /// keys. The f32 rule holds them to f32's accuracy, which a single TF32 product
    /// (10 mantissa bits) misses by far.
    pub fn parity_grid_fragments_tf32(device: &Device, label: &str) {
        let cases = grid_and_decoding(|index, case, long| {
            index % 3 == 1 && !long && matches!(case.d_qk, 32 | 80)
        });
        parity_fragments(device, label, &cases, FlashKernel::FragmentsTf32);
    }

    /// The parity grid through the fragment kernels with the copies of the tiles they
    /// stream overlapped with their computation (`cp.async` on CUDA; synchronous copies
    /// in the same order on CPU runtimes): only the order of the copies and waits
    /// differs, and the backward's alternating buffers (dQ's keys, dK/dV's query rows),
    /// so a third of the short cases at head dims up to 64, not the fragment grid's
    /// (every mask, key padding among them, whose kept keys travel with `K`; rows and
    /// keys past the tiles' ends; one tile or several; grouped heads, whose dK/dV walks
    /// pass from one query head to the next), the long causal case (many tiles, most of
    /// them skipping the per-score masking), and the decoding cases, whose splits start
    /// and end their walks inside the keys. It asserts that every forward overlapped its
    /// copies, and every backward kernel whose second buffers fit.
    pub fn parity_grid_fragments_overlapped(device: &Device, label: &str) {
        let cases = grid_and_decoding(|index, case, long| {
            (index % 3 == 2 && !long && case.d_qk <= 64) || (long && case.causal && case.d_qk == 64)
        });
        let properties = device_properties(device);
        let dtype = fragment_dtype(&properties, FlashKernel::FragmentsOverlapped);
        // The forward's copies are always overlapped: the backward's where it is
        // planned (its second buffers fit).
        let overlapped_backward = cases
            .iter()
            .filter_map(|(_, case)| {
                super::super::cube::tiling::plan_fragments(
                    &case.problem(),
                    dtype,
                    &properties,
                    1,
                    false,
                    false,
                    true,
                )
            })
            .filter(|plan| {
                plan.backward.is_some_and(|(dq, dkdv)| {
                    dq.copies == plan.forward.copies && dkdv.copies == plan.forward.copies
                })
            })
            .count();
        let launches = || {
            [
                &super::super::op::OVERLAPPED_LAUNCHES,
                &super::super::op::OVERLAPPED_DQ_LAUNCHES,
                &super::super::op::OVERLAPPED_DKDV_LAUNCHES,
            ]
            .map(|counter| counter.load(Ordering::Relaxed))
        };
        let before = launches();
        parity_fragments(device, label, &cases, FlashKernel::FragmentsOverlapped);
        if device.supports_dtype(dtype) {
            let [forwards, dqs, dkdvs] = launches();
            assert!(forwards >= before[0] + cases.len());
            assert!(dqs >= before[1] + overlapped_backward);
            assert!(dkdvs >= before[2] + overlapped_backward);
            // Lavapipe's 32 KiB hold the backward's second buffers at these head dims.
            assert!(
                overlapped_backward * 2 >= cases.len(),
                "{overlapped_backward} of {}",
                cases.len()
            );
        }
    }

    /// ALiBi's cases ([`alibi_cases`]) through the register tiles, the staged kernels
    /// and the fragment kernels: ALiBi is compiled into kernels of its own, whose
    /// scores each take the bias; the other fragment variants share the fragment
    /// kernels' score code and run ALiBi in the random sweep.
    pub fn parity_grid_alibi(device: &Device, label: &str) {
        let cases: Vec<(usize, Case)> = alibi_cases()
            .into_iter()
            .enumerate()
            .map(|(index, case)| (500 + index, case))
            .collect();
        parity(device, label, &cases, FlashKernel::RegisterTile);
        parity(device, label, &cases, FlashKernel::Staged);
        let properties = device_properties(device);
        let dtype = fragment_dtype(&properties, FlashKernel::Fragments);
        if device.supports_dtype(dtype) {
            let fragments = super::super::op::FRAGMENT_LAUNCHES.load(Ordering::Relaxed);
            parity_in(device, label, &cases, FlashKernel::Fragments, dtype);
            // At head dim 64 the fragment tiles fit every device, lavapipe's 32 KiB too.
            assert!(
                super::super::op::FRAGMENT_LAUNCHES.load(Ordering::Relaxed)
                    >= fragments + cases.len()
            );
        }
    }

    /// Every family on random configurations ([`random_cases`]), each in the dtype its
    /// parity grid uses on this device (an exhaustive check outside the default run).
    pub fn random_sweep(device: &Device, label: &str) {
        let (seed, count) = sweep_settings();
        let cases: Vec<(usize, Case)> = random_cases(seed, count)
            .into_iter()
            .enumerate()
            .map(|(index, case)| (seed as usize * 100_000 + index, case))
            .collect();
        // One family only, by its name (`register`, `staged`, `fragments`, …): a name
        // that is none would run nothing, so it stops the sweep instead.
        let only = std::env::var("BURN_TRANSFORMER_SWEEP_KERNEL")
            .ok()
            .map(|name| {
                FlashKernel::parse(&name).unwrap_or_else(|| {
                    let names: Vec<&str> = FlashKernel::ALL.iter().map(|k| k.name()).collect();
                    panic!(
                        "BURN_TRANSFORMER_SWEEP_KERNEL={name} is not a kernel family: one of {}",
                        names.join(", ")
                    )
                })
            });
        let properties = device_properties(device);
        for kernel in [
            FlashKernel::RegisterTile,
            FlashKernel::Staged,
            FlashKernel::Fragments,
            FlashKernel::WideFragments,
            FlashKernel::FragmentsAtomicDq,
            FlashKernel::FragmentsTf32,
            FlashKernel::FragmentsOverlapped,
        ] {
            if only.is_some_and(|only| only != kernel) {
                continue;
            }
            let dtype = match kernel {
                FlashKernel::RegisterTile | FlashKernel::Staged => DType::F32,
                _ => fragment_dtype(&properties, kernel),
            };
            parity_in(device, label, &cases, kernel, dtype);
        }
    }

    /// The parity grid's cases that `keep(index, case, long)` takes (`long`: a sequence
    /// beyond 129 tokens), numbered by their place in the grid, then the decoding cases.
    fn grid_and_decoding(keep: impl Fn(usize, &Case, bool) -> bool) -> Vec<(usize, Case)> {
        parity_grid()
            .into_iter()
            .enumerate()
            .filter(|(index, case)| keep(*index, case, case.seq_q.max(case.seq_k) > 129))
            .chain(decode_cases().into_iter().map(|case| (1000, case)))
            .collect()
    }

    /// The input type of the fragment family `kernel` in the tests: f32 for the TF32
    /// family and where the products are emulated, bf16 on GPUs (tensor cores).
    fn fragment_dtype(properties: &cubecl::ir::DeviceProperties, kernel: FlashKernel) -> DType {
        if kernel == FlashKernel::FragmentsTf32
            || super::super::cube::tiling::is_cpu_runtime(properties)
        {
            DType::F32
        } else {
            DType::BF16
        }
    }

    /// [`parity_in`] of `cases` through the fragment family `kernel`, and the checks
    /// that its kernels ran where the device's tiles take them.
    fn parity_fragments(
        device: &Device,
        label: &str,
        cases: &[(usize, Case)],
        kernel: FlashKernel,
    ) {
        let row_tiles =
            super::super::cube::tiling::fragment_row_tiles(kernel == FlashKernel::WideFragments);
        let properties = device_properties(device);
        let dtype = fragment_dtype(&properties, kernel);
        if !device.supports_dtype(dtype) {
            return;
        }
        let fragments = super::super::op::FRAGMENT_LAUNCHES.load(Ordering::Relaxed);
        let backwards = super::super::op::FRAGMENT_BACKWARD_LAUNCHES.load(Ordering::Relaxed);
        let splits = super::super::op::SPLIT_LAUNCHES.load(Ordering::Relaxed);
        parity_in(device, label, cases, kernel, dtype);
        // Every case the device's fragments take ran the fragment forward (on
        // tensor-core GPUs all of them; on lavapipe, whose 32 KiB hold one plane's f32
        // rows of Q beside its key tiles up to d_qk 128, all but MLA's 192/128), those
        // whose backward tiles fit the fragment backward (at head dims up to 80 on
        // lavapipe, all on a GPU), and the decoding cases split their keys.
        let plans: Vec<_> = cases
            .iter()
            .filter_map(|(_, case)| {
                super::super::cube::tiling::plan_fragments(
                    &case.problem(),
                    dtype,
                    &properties,
                    row_tiles,
                    kernel == FlashKernel::FragmentsAtomicDq,
                    kernel == FlashKernel::FragmentsTf32,
                    kernel == FlashKernel::FragmentsOverlapped,
                )
            })
            .collect();
        let taken = plans.len();
        let with_backward = plans.iter().filter(|plan| plan.backward.is_some()).count();
        assert!(
            with_backward * 2 >= taken,
            "{with_backward} of {taken} plan a fragment backward"
        );
        assert!(
            super::super::op::FRAGMENT_BACKWARD_LAUNCHES.load(Ordering::Relaxed)
                >= backwards + with_backward
        );
        let bf16 = cubecl::ir::ElemType::Float(cubecl::ir::FloatKind::BF16);
        let takes_all = if dtype == DType::F32 {
            super::super::cube::tiling::is_cpu_runtime(&properties)
                || super::super::cube::tiling::has_tf32_fragment_mma(&properties)
        } else {
            properties
                .features
                .matmul
                .mma
                .iter()
                .any(|m| m.a_type == bf16 && (m.m, m.n, m.k) == (16, 8, 16))
        };
        let small_shared = properties.hardware.max_shared_memory_size <= 32 * 1024;
        let fitting = cases
            .iter()
            .filter(|(_, case)| !(small_shared && dtype == DType::F32 && case.d_qk > 128))
            .count();
        assert!(
            taken == fitting || !takes_all,
            "{taken} of {fitting}: {:?} {:?}",
            properties.features.plane,
            properties.hardware
        );
        assert!(super::super::op::FRAGMENT_LAUNCHES.load(Ordering::Relaxed) >= fragments + taken);
        assert!(
            super::super::op::SPLIT_LAUNCHES.load(Ordering::Relaxed)
                >= splits + decode_cases().len()
        );
    }

    /// Autotuning: the first call of a shape class times every candidate (forward and
    /// backward apart) and returns the winner's results; a second call of the class
    /// (other sizes rounding to the same powers of two) runs the cached winner once;
    /// `Auto` tunes on GPUs only, so that CPU runtimes keep their register tiles.
    pub fn autotune_times_each_class_once(device: &Device, label: &str) {
        use super::super::cube::autotune::{Candidate, candidate_runs};
        // Head dims of the parity grid (their kernels are compiled once for both); the
        // lengths (classes 64 × 128) are this test's alone, so its counts are its own.
        let mut case = Case::new(4, 2, 40, 70, (32, 32)).causal_padded(vec![70, 33]);
        case.kernel = FlashKernel::Autotune;
        let runs = |case: &Case| candidate_runs(&case.problem(), DType::F32);
        let first = runs(&case);
        let (fused, naive, expected) =
            compare(&case, &Inputs::random(&case, 31, 1.0), device, DType::F32);
        assert_rule(&format!("{label} tuned"), &fused, &naive, &expected, 1e-5);
        let candidates = Candidate::all(&device_properties(device)).len();
        let tuned = runs(&case) - first;
        // Each candidate ran at least once in each pass, then the winners on the call.
        assert!(
            tuned >= 2 * candidates + 2,
            "{tuned} runs for {candidates} candidates"
        );

        let mut again = case.clone();
        (again.seq_q, again.seq_k) = (57, 100);
        let (fused, naive, expected) =
            compare(&again, &Inputs::random(&again, 32, 1.0), device, DType::F32);
        assert_rule(&format!("{label} cached"), &fused, &naive, &expected, 1e-5);
        assert_eq!(runs(&again), first + tuned + 2, "the class was timed again");

        let default = Case {
            kernel: FlashKernel::Auto,
            ..case
        };
        let before = runs(&default);
        compare(
            &default,
            &Inputs::random(&default, 33, 1.0),
            device,
            DType::F32,
        );
        let properties = device_properties(device);
        let cpu = super::super::cube::tiling::is_cpu_runtime(&properties);
        // BURN_TRANSFORMER_FLASH_KERNEL, when it names a family, replaces `Auto`'s choice.
        let overridden = FlashKernel::from_env().is_some();
        assert_eq!(
            runs(&default) > before,
            !cpu && !overridden,
            "Auto tunes on GPUs only (BURN_TRANSFORMER_FLASH_KERNEL unset)"
        );
    }

    /// The properties of a CubeCL device.
    fn device_properties(device: &Device) -> cubecl::ir::DeviceProperties {
        match device.clone().inner().as_dispatch() {
            burn::backend::DispatchDevice::Cube(cube) => cube.client().properties().clone(),
            #[allow(unreachable_patterns)]
            _ => unreachable!("kernel tests run on CubeCL devices"),
        }
    }

    /// Decoding shapes over long caches, which the staged forward splits across cubes
    /// (flash-decoding): one query row with GQA and sinks; 16 rows with a window,
    /// padding (a short entry) and soft-capping.
    fn decode_cases() -> Vec<Case> {
        let mut single = Case::new(4, 2, 1, 1000, (64, 64));
        single.causal = true;
        single.sinks = true;
        let mut rows = Case::new(4, 1, 16, 999, (32, 32));
        rows.window = Some(300);
        rows.softcap = Some(20.0);
        rows.batch = 2;
        rows.lengths = Some(vec![999, 500]);
        vec![single, rows]
    }

    /// Peaked rows (logits of about ±30: scale 0.9 at head dim 128) through the
    /// register tiles, the staged kernels and the fragment kernels: the backward
    /// recomputes the forward's scores bit for bit, so each row's largest score cancels
    /// against its log-sum-exp and the gradients keep the naive path's accuracy (the
    /// rule with a floor far below the errors themselves). The grid's head dim and
    /// lengths: no kernel of its own.
    pub fn peaked_rows_keep_the_naive_accuracy(device: &Device) {
        let mut case = Case::new(4, 2, 64, 129, (128, 128)).causal_padded(vec![129, 90]);
        case.scale = Some(0.9);
        // dK's and dV's errors through the register tiles, and the naive path's, summed
        // over the draws.
        let mut register_errors = [(0.0f64, 0.0f64); 2];
        for seed in 31..35 {
            let inputs = Inputs::random(&case, seed, 1.0);
            for kernel in [
                FlashKernel::RegisterTile,
                FlashKernel::Staged,
                FlashKernel::Fragments,
            ] {
                let case = Case {
                    kernel,
                    ..case.clone()
                };
                let (fused, naive, expected) = compare(&case, &inputs, device, DType::F32);
                assert_rule(
                    &format!("peaked rows, {kernel:?}, draw {seed}"),
                    &fused,
                    &naive,
                    &expected,
                    1e-7,
                );
                if kernel == FlashKernel::RegisterTile {
                    for (sums, quantity) in register_errors.iter_mut().zip([2, 3]) {
                        sums.0 += max_error(&fused[quantity], &expected[quantity]);
                        sums.1 += max_error(&naive[quantity], &expected[quantity]);
                    }
                }
            }
        }
        // The register tiles sum their dot products in vector lanes, closer to exact
        // than the naive path's sequential sums: over 40 draws their dK and dV errors
        // were 0.6 of the naive path's on average (above it in 2 draws, by up to 1.4
        // times). Scores that the dK/dV kernel rounds apart from the forward's (scaled
        // keys instead of scaled queries) put one of them at 1.1 to over 2 times the
        // naive error in each of those draws, so sums over a few draws tell the two
        // apart where a single draw may not.
        for ((fused, naive), quantity) in register_errors.into_iter().zip([2, 3]) {
            assert!(
                fused <= naive,
                "peaked rows, register tiles: {} errors sum to {fused:e} > naive {naive:e}",
                QUANTITIES[quantity]
            );
        }
    }

    pub fn fully_masked_rows_and_large_logits_stay_finite(device: &Device) {
        // seq_q > seq_k with causal: the first rows see no key; one batch entry is
        // fully padded; q is scaled by 1e3 so logits are in the thousands.
        let case = Case::new(2, 1, 129, 64, (64, 64)).causal_padded(vec![64, 0]);
        let inputs = Inputs::random(&case, 11, 1e3);
        let (fused, naive, expected) = compare(&case, &inputs, device, DType::F32);
        for values in &fused {
            assert!(values.iter().all(|x| x.is_finite()));
        }
        // f32 holds a logit L to within ε·|L|, and the exponential turns that into a
        // relative error of the probability, whatever the summation order, so both
        // paths carry errors of about ε·L relative to the largest value (L ≈ 4e3–6e3
        // here). Over 60 draws of these inputs the fused kernels (register tiles,
        // staged) reached 2.1·ε·L, the naive path 1.3·ε·L; an error of the masking or
        // of the maximum is of the order of the values themselves.
        let floor = 2.0 * f64::from(f32::EPSILON) * largest_logit(&case, &inputs);
        assert_rule("large logits", &fused, &naive, &expected, floor);
        // Rows 0..65 see nothing: zero output.
        assert!(fused[0][..65 * 64].iter().all(|x| *x == 0.0));
    }

    /// f16 and bf16 (where the device has them) through the default kernels, the
    /// staged ones and the fragment forward.
    pub fn half_precision_subset(device: &Device) {
        for (dtype, kernel) in [DType::F16, DType::BF16].into_iter().flat_map(|dtype| {
            [
                (dtype, FlashKernel::Auto),
                (dtype, FlashKernel::Staged),
                (dtype, FlashKernel::Fragments),
            ]
        }) {
            let mut case = Case::new(4, 2, 64, 129, (64, 64)).causal_padded(vec![129, 50]);
            case.kernel = kernel;
            let inputs = Inputs::random(&case, 5, 1.0);
            let problem = case.problem();
            match check_support(device, dtype, &problem) {
                Ok(()) => {
                    let (fused, naive, expected) = compare(&case, &inputs, device, dtype);
                    let what = format!("{dtype:?} {kernel:?}");
                    assert_rule(&what, &fused, &naive, &expected, 1e-3);
                }
                Err(reason) => {
                    assert_eq!(reason, Unsupported::DeviceDType(dtype));
                    assert!(!device.supports_dtype(dtype));
                }
            }
        }
    }

    /// Tensors of `device` reach the kernel through Burn's fusion wrapper
    /// (`Fusion<CubeBackend>`, the dispatch backend with Burn's `fusion` feature), so
    /// the fusion implementation of the op is the one that runs.
    pub fn tensors_go_through_fusion(device: &Device) {
        let tensor = Tensor::<2>::zeros([1, 1], device);
        assert!(
            tensor
                .try_into_primitive::<burn::backend::fusion::Fusion<burn_cubecl::CubeBackend>>()
                .is_ok()
        );
    }
}

/// The kernel checks of [`on_device`] as tests of one CubeCL runtime, in a module named
/// after it (`wgpu::parity_grid_f32`, `cuda::parity_grid_f32`, …).
#[cfg(feature = "cube")]
macro_rules! kernel_tests {
    ($runtime:ident, $device:path) => {
        mod $runtime {
            use super::on_device;

            #[test]
            fn parity_grid_f32() {
                on_device::parity_grid_f32(&$device(), stringify!($runtime));
            }

            #[test]
            fn parity_grid_split_rows() {
                on_device::parity_grid_split_rows(&$device(), stringify!($runtime));
            }

            #[test]
            fn parity_grid_staged() {
                on_device::parity_grid_staged(&$device(), stringify!($runtime));
            }

            #[test]
            fn parity_grid_fragments() {
                on_device::parity_grid_fragments(&$device(), stringify!($runtime));
            }

            #[test]
            fn parity_grid_wide_fragments() {
                on_device::parity_grid_wide_fragments(&$device(), stringify!($runtime));
            }

            #[test]
            fn parity_grid_fragments_atomic_dq() {
                on_device::parity_grid_fragments_atomic_dq(&$device(), stringify!($runtime));
            }

            #[test]
            fn parity_grid_fragments_tf32() {
                on_device::parity_grid_fragments_tf32(&$device(), stringify!($runtime));
            }

            #[test]
            fn parity_grid_fragments_overlapped() {
                on_device::parity_grid_fragments_overlapped(&$device(), stringify!($runtime));
            }

            #[test]
            fn parity_grid_alibi() {
                on_device::parity_grid_alibi(&$device(), stringify!($runtime));
            }

            #[test]
            fn autotune_times_each_class_once() {
                on_device::autotune_times_each_class_once(&$device(), stringify!($runtime));
            }

            #[test]
            #[ignore = "exhaustive: run with --ignored"]
            fn random_sweep() {
                on_device::random_sweep(&$device(), stringify!($runtime));
            }

            #[test]
            fn tensors_go_through_fusion() {
                on_device::tensors_go_through_fusion(&$device());
            }

            #[test]
            fn peaked_rows_keep_the_naive_accuracy() {
                on_device::peaked_rows_keep_the_naive_accuracy(&$device());
            }

            #[test]
            fn fully_masked_rows_and_large_logits_stay_finite() {
                on_device::fully_masked_rows_and_large_logits_stay_finite(&$device());
            }

            #[test]
            fn half_precision_subset() {
                on_device::half_precision_subset(&$device());
            }
        }
    };
}

#[cfg(feature = "wgpu")]
kernel_tests!(wgpu, crate::test_utils::wgpu_device);

// On CUDA the tests run where the `cuda` feature is on, and need an NVIDIA GPU with its
// driver: CI (no GPU) only compiles them (`cargo check --features cuda`); a developer
// with a GPU runs `cargo test --release -p burn-transformer --features cuda
// ops::flash_attention::tests::cuda`.
#[cfg(feature = "cuda")]
kernel_tests!(cuda, crate::test_utils::cuda_device);
