//! Flash attention on the CPU, forward and backward, in plain Rust on f32 slices.
//!
//! FlashAttention-2 (Dao, 2023) for CPUs: the `[seq_q, seq_k]` score matrix never
//! exists; a task holds one tile of scores at a time and the extra memory is `O(N)`
//! (per-thread scratch and, in the backward, `D = rowsum(dO ∘ O)`).
//!
//! # Semantics
//! Those of the reference `forward_with_lse` / `backward_from_lse`:
//! logits `softcap(scale·q·kᵀ)` with `softcap(s) = c·tanh(s/c)`; the mask rule of
//! `MaskRule` (queries aligned bottom-right with the keys: row `i` sits at absolute
//! position `i + seq_k − seq_q`; `causal` hides later keys; a window `w` hides keys
//! `w` or more positions back and, without `causal`, `w` or more ahead; chunks of `c`
//! hide keys outside the query's chunk) plus key padding; GQA (query head `h` reads key/value head `h / (heads / kv_heads)`); a
//! learned sink per query head that joins each row's normalization and takes no
//! value (folded into the log-sum-exp). A row that sees no key returns zeros and
//! `LSE = masked_row_lse` (or `LSE = sink` with a sink), and gets zero gradients.
//!
//! # Work split
//! - Forward: one task per (batch, head, block of [`BR`] query rows). The task
//!   streams the key blocks ([`BC`] keys) its rows can see (causal, window and chunks
//!   skip whole blocks), computes the score tile, applies soft-cap and mask, runs the online
//!   softmax (running max and sum per row) and accumulates `P·V`.
//! - Backward: `D = rowsum(dO ∘ O)` first, then either
//!   - two passes (FA2): pass 1, one task per (batch, kv head, key block),
//!     recomputes `S`, `P = exp(S − LSE)` and `dP = dO·Vᵀ` for every query block of
//!     every query head of the group that can see the key block, and sums
//!     `dV += Pᵀ·dO`, `dK += dSᵀ·Q` with `dS = scale·P∘(dP − D)∘softcap'`; pass 2, one
//!     task per (batch, head, query block), recomputes them again for `dQ += dS·K`;
//!   - or one pass when there are enough (batch, kv head) pairs to keep every thread
//!     busy: one task per pair walks its key blocks as in pass 1 and also sums `dQ`
//!     (the task owns the query heads of its group). This saves the three tile
//!     products of pass 2 ([`single_pass_pays`]).
//!
//!   Every output element is one sequential sum in a fixed order (keys ascending for
//!   `dQ`; query heads, then rows ascending for `dK` and `dV`) whatever the split, so
//!   the two variants give the same bits and results are reproducible run to run
//!   (on one machine: the AVX-512, AVX2 + FMA and baseline builds may round differently).
//!
//! # Tiles
//! Tasks that own query rows (forward, dQ) pack their rows once, transposed
//! (`Qᵀ`, and `dOᵀ` for dQ, `[d][width]` with `width` the block's rows rounded up to
//! 8), and compute transposed tiles `Sᵀ = K·Qᵀ` (`[keys][width]`) straight from the
//! key rows in memory: the per-row softmax state (max, sum, LSE, D, visible range)
//! is then a vector across rows, and no key block is transposed per tile. Tasks that
//! own keys (dK, dV) pack their key and value block once, transposed (`[d][BC]`),
//! and compute `S = Q·Kᵀ` tiles (`[rows][BC]`) from the query rows in memory.
//!
//! # Kernels
//! Every tile product is [`gemm`]: `C[m × cols] (+)= A[m × n]·B[n × cols]` where
//! `B`'s rows are contiguous (a packed transposed block, or value/query/key/dO rows
//! straight from memory) and `A` is read one scalar at a time with any strides (so
//! `Pᵀ`, `dSᵀ` and the transposed tiles need no further transpose). Its micro-kernel
//! keeps a register tile of accumulators as large as the build's registers allow, so
//! that enough independent chains hide the multiply-add latency: 8 rows × 32 columns
//! with AVX-512 (16 accumulator registers), 6 × 16 with AVX2 (12), [`MR`]` × 8` in
//! the baseline build (SSE2). Per step it loads the tile's `B` vectors and broadcasts one
//! `A` value per row. Each accumulator is one chain of multiply-adds over `n` in
//! order, so the tile's shape changes no bit. The softmax and gradient passes are
//! branch-free loops over whole tile rows with a polynomial `exp` and `tanh`, so they
//! vectorize.
//!
//! The hot functions are written once as generic code and compiled three times: for
//! the build's target features (SSE2 on x86-64, separate multiply and add) and, picked
//! at run time, with AVX2 + FMA or with AVX-512 enabled (`#[target_feature]`), so the
//! default target features suffice.

use rayon::prelude::*;

use crate::ops::alibi::Alibi;
use crate::ops::mask::{MaskRule, query_position};

/// The shape and options of one call.
#[derive(Clone, Copy, Debug)]
pub(crate) struct CpuAttention {
    /// Batch size.
    pub batch: usize,
    /// Query heads.
    pub heads: usize,
    /// Key/value heads; divides `heads`.
    pub kv_heads: usize,
    /// Query sequence length.
    pub seq_q: usize,
    /// Key/value sequence length.
    pub seq_k: usize,
    /// Head dimension of queries and keys.
    pub d_qk: usize,
    /// Head dimension of values.
    pub d_v: usize,
    /// Multiplies `q·kᵀ`.
    pub scale: f32,
    /// Logit soft-cap `c`: logits are `c·tanh(scale·q·kᵀ / c)`.
    pub softcap: Option<f32>,
    /// ALiBi's bias `slope_h · (j − p)`, added to the (capped) logits.
    pub alibi: Option<Alibi>,
    /// Which keys each query sees by position (causal, window, chunks).
    pub mask: MaskRule,
    /// Log-sum-exp of a row that sees no key and has no sink (`MASKED_ROW_LSE`).
    pub masked_row_lse: f32,
}

/// Query rows per block.
const BR: usize = 64;
/// Keys per block.
const BC: usize = 64;
/// Rows of the baseline build's register tile (see [`gemm`]).
const MR: usize = 4;
/// Rows of the AVX-512 build's register tile (see [`gemm`]).
const WIDE_R: usize = 8;
/// 8-lane vectors per row of the AVX-512 build's register tile (two registers).
const WIDE_V: usize = 4;
/// Rows of the AVX2 + FMA build's register tile (see [`gemm`]).
const AVX2_R: usize = 6;
/// 8-lane vectors per row of the AVX2 + FMA build's register tile.
const AVX2_V: usize = 2;
/// f32 lanes of one AVX2 register.
const LANES: usize = 8;

/// Flash attention forward.
///
/// q `[batch, heads, seq_q, d_qk]`, k `[batch, kv_heads, seq_k, d_qk]`,
/// v `[batch, kv_heads, seq_k, d_v]`, key_padding `[batch, seq_k]` (true = padded key,
/// hidden from every query), sinks `[heads]`.
/// Returns (out `[batch, heads, seq_q, d_v]`, lse `[batch, heads, seq_q]`).
pub(crate) fn forward(
    p: &CpuAttention,
    q: &[f32],
    k: &[f32],
    v: &[f32],
    key_padding: Option<&[bool]>,
    sinks: Option<&[f32]>,
) -> (Vec<f32>, Vec<f32>) {
    forward_with(Isa::detect(), p, q, k, v, key_padding, sinks)
}

/// `D = rowsum(dO ∘ O)` per query row, `[batch, heads, seq_q]`, from out and grad_out
/// `[batch, heads, seq_q, d_v]`. It is all the backward reads of the saved output, so
/// a caller can release the output before [`backward`] allocates the gradients.
pub(crate) fn backward_deltas(p: &CpuAttention, out: &[f32], grad_out: &[f32]) -> Vec<f32> {
    backward_deltas_with(Isa::detect(), p, out, grad_out)
}

/// Gradients (dq, dk, dv) shaped like (q, k, v), from [`backward_deltas`] and the
/// saved lse (lse includes the sinks, which need nothing else).
#[allow(clippy::too_many_arguments)]
pub(crate) fn backward(
    p: &CpuAttention,
    q: &[f32],
    k: &[f32],
    v: &[f32],
    delta: &[f32],
    lse: &[f32],
    grad_out: &[f32],
    key_padding: Option<&[bool]>,
) -> (Vec<f32>, Vec<f32>, Vec<f32>) {
    let ctx = Ctx::new(p, q, k, v, key_padding);
    let single_pass = single_pass_pays(p.batch * p.kv_heads, rayon::current_num_threads());
    backward_with(Isa::detect(), single_pass, &ctx, delta, lse, grad_out)
}

/// Whether the one-pass backward (5 tile products per tile, one task per
/// (batch, kv head)) beats the two-pass one (7 products, finer tasks) on `threads`
/// threads: it runs `⌈tasks / threads⌉` rounds of 5 against `7·tasks / threads`.
fn single_pass_pays(tasks: usize, threads: usize) -> bool {
    let threads = threads.max(1);
    tasks.div_ceil(threads) * 5 * threads < 7 * tasks
}

/// The instruction set the hot loops were compiled for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Isa {
    /// The build's target features (SSE2 on x86-64), no fused multiply-add.
    Baseline,
    /// AVX2 and FMA, detected at run time.
    #[cfg(target_arch = "x86_64")]
    Avx2Fma,
    /// AVX-512 (with AVX2 and FMA), detected at run time: the same code with a larger
    /// register tile of 16-lane registers ([`gemm`]); on an AVX-512 CPU its forward
    /// and backward take about 0.6 times the AVX2 build's time.
    #[cfg(target_arch = "x86_64")]
    Avx512,
}

impl Isa {
    fn detect() -> Self {
        #[cfg(target_arch = "x86_64")]
        {
            let avx2 = std::arch::is_x86_feature_detected!("avx2")
                && std::arch::is_x86_feature_detected!("fma");
            if avx2 && crate::ops::simd::use_avx512() {
                return Isa::Avx512;
            }
            if avx2 {
                return Isa::Avx2Fma;
            }
        }
        Isa::Baseline
    }
}

/// The inputs of one call and what is derived from them once.
struct Ctx<'a> {
    p: CpuAttention,
    /// Query heads per key/value head.
    group: usize,
    q: &'a [f32],
    k: &'a [f32],
    v: &'a [f32],
    key_padding: Option<&'a [bool]>,
    /// Per batch entry: the first unpadded key and one past the last one (`(0, 0)`
    /// when every key is padded).
    key_bounds: Vec<(usize, usize)>,
    /// Per batch entry, `seq_k + 1` prefix counts of padded keys (empty without
    /// padding).
    padded_before: Vec<u32>,
    /// ALiBi's slope of each query head (empty without ALiBi).
    alibi_slopes: Vec<f32>,
}

impl<'a> Ctx<'a> {
    fn new(
        p: &CpuAttention,
        q: &'a [f32],
        k: &'a [f32],
        v: &'a [f32],
        key_padding: Option<&'a [bool]>,
    ) -> Self {
        assert!(
            p.kv_heads > 0 && p.heads.is_multiple_of(p.kv_heads),
            "kv_heads must divide heads"
        );
        assert!(p.d_qk > 0 && p.d_v > 0, "head dimensions must be positive");
        assert_eq!(q.len(), p.batch * p.heads * p.seq_q * p.d_qk, "q's length");
        assert_eq!(
            k.len(),
            p.batch * p.kv_heads * p.seq_k * p.d_qk,
            "k's length"
        );
        assert_eq!(
            v.len(),
            p.batch * p.kv_heads * p.seq_k * p.d_v,
            "v's length"
        );
        let mut key_bounds = vec![(0, p.seq_k); p.batch];
        let mut padded_before = Vec::new();
        if let Some(padding) = key_padding {
            assert_eq!(padding.len(), p.batch * p.seq_k, "key_padding's length");
            padded_before.reserve(p.batch * (p.seq_k + 1));
            for (b, bounds) in key_bounds.iter_mut().enumerate() {
                let row = &padding[b * p.seq_k..][..p.seq_k];
                let first = row.iter().position(|&x| !x);
                let last = row.iter().rposition(|&x| !x);
                *bounds = match (first, last) {
                    (Some(first), Some(last)) => (first, last + 1),
                    _ => (0, 0),
                };
                let mut count = 0u32;
                padded_before.push(0);
                for &x in row {
                    count += x as u32;
                    padded_before.push(count);
                }
            }
        }
        let alibi_slopes = p.alibi.map_or_else(Vec::new, |alibi| {
            alibi
                .slopes(p.heads)
                .into_iter()
                .map(|slope| slope as f32)
                .collect()
        });
        Ctx {
            p: *p,
            group: p.heads / p.kv_heads,
            q,
            k,
            v,
            key_padding,
            key_bounds,
            padded_before,
            alibi_slopes,
        }
    }

    /// ALiBi's slope of query head `h`, if the call has ALiBi.
    #[inline(always)]
    fn alibi_slope(&self, h: usize) -> Option<f32> {
        self.alibi_slopes.get(h).copied()
    }

    /// The absolute positions of query rows `r0..` (bottom-right aligned), one per row
    /// of a block, as floats: exact below 2²⁴, so that `key − position` is the exact
    /// distance and ALiBi's bias rounds once.
    fn positions(&self, r0: usize) -> [f32; BR] {
        std::array::from_fn(|r| query_position(r0 + r, self.p.seq_q, self.p.seq_k) as f32)
    }

    /// The keys `lo..hi` query row `row` of batch entry `b` may see: the mask rule's
    /// range trimmed to the unpadded span (padded keys inside it are masked apart).
    /// Both ends are non-decreasing in `row`, and `lo <= hi`.
    #[inline(always)]
    fn visible(&self, b: usize, row: usize) -> (usize, usize) {
        let p = &self.p;
        let keys = p.mask.visible_keys(row, p.seq_q, p.seq_k);
        let (lo, hi) = (keys.start, keys.end);
        let (first, end) = self.key_bounds[b];
        if first >= end {
            // Every key is padded.
            return (0, 0);
        }
        let lo = lo.max(first);
        (lo, hi.min(end).max(lo))
    }

    /// Whether key `key` of batch entry `b` is padded.
    #[inline(always)]
    fn is_padded(&self, b: usize, key: usize) -> bool {
        self.key_padding
            .is_some_and(|padding| padding[b * self.p.seq_k + key])
    }

    /// Whether keys `k0..k0 + len` of batch entry `b` include a padded key.
    #[inline(always)]
    fn has_padding(&self, b: usize, k0: usize, len: usize) -> bool {
        if self.key_padding.is_none() {
            return false;
        }
        let base = b * (self.p.seq_k + 1);
        self.padded_before[base + k0 + len] != self.padded_before[base + k0]
    }

    /// Fills `bias` for keys `k0..k0 + len` of batch entry `b`: 0 for kept keys,
    /// `-inf` for padded ones (entries past `len` untouched).
    #[inline(always)]
    fn padding_bias(&self, b: usize, k0: usize, len: usize, bias: &mut [f32; BC]) {
        bias.fill(0.0);
        if let Some(padding) = self.key_padding {
            let row = &padding[b * self.p.seq_k + k0..][..len];
            for (x, &padded) in bias.iter_mut().zip(row) {
                if padded {
                    *x = f32::NEG_INFINITY;
                }
            }
        }
    }

    /// Query rows `start..end` that may see a key of `k0..k1` in batch entry `b`
    /// (rows inside that see none are masked in the tile).
    fn rows_seeing(&self, b: usize, k0: usize, k1: usize) -> (usize, usize) {
        let seq_q = self.p.seq_q;
        // `hi(row) > k0` holds from some row on, `lo(row) >= k1` too.
        let start = partition_point(seq_q, |row| self.visible(b, row).1 <= k0);
        let end = partition_point(seq_q, |row| self.visible(b, row).0 < k1);
        (start, end.max(start))
    }
}

/// The first `i` in `0..n` where the monotone predicate `pred` becomes false.
fn partition_point(n: usize, pred: impl Fn(usize) -> bool) -> usize {
    let (mut lo, mut hi) = (0, n);
    while lo < hi {
        let mid = lo + (hi - lo) / 2;
        if pred(mid) {
            lo = mid + 1;
        } else {
            hi = mid;
        }
    }
    lo
}

/// Per-thread buffers, reused across the blocks a thread runs.
///
/// Tasks that own query rows (forward, dQ) work on transposed tiles `[BC keys][width
/// rows]` so that per-row state is a vector across rows; tasks that own keys (dK, dV)
/// on `[BR rows][BC keys]` tiles.
struct Scratch {
    /// The task's query rows, transposed: `[d_qk][BR]`.
    qt: Vec<f32>,
    /// The task's output gradient rows, transposed: `[d_v][BR]` (dQ).
    ot: Vec<f32>,
    /// The task's keys, transposed: `[d_qk][BC]` (dK, dV).
    kt: Vec<f32>,
    /// The task's values, transposed: `[d_v][BC]` (dK, dV).
    vt: Vec<f32>,
    /// A score tile; then the probabilities.
    s: Vec<f32>,
    /// A `dO·Vᵀ` tile; then `dS` (backward).
    dp: Vec<f32>,
    /// Unnormalized output rows `[BR][d_v]` (forward).
    acc: Vec<f32>,
    /// Per row: the running maximum (forward), the log-sum-exp (dQ).
    max: [f32; BR],
    /// Per row: the running sum (forward), `D` (dQ).
    sum: [f32; BR],
    /// Visible key range `lo..hi` of each row of the block (empty past the block).
    lo: [u32; BR],
    hi: [u32; BR],
    /// 0 or `-inf` per key of the tile (padding; dK, dV).
    bias: [f32; BC],
}

impl Scratch {
    fn new(p: &CpuAttention, backward: bool) -> Self {
        Scratch {
            qt: vec![0.0; p.d_qk * BR],
            ot: if backward {
                vec![0.0; p.d_v * BR]
            } else {
                Vec::new()
            },
            kt: if backward {
                vec![0.0; p.d_qk * BC]
            } else {
                Vec::new()
            },
            vt: if backward {
                vec![0.0; p.d_v * BC]
            } else {
                Vec::new()
            },
            s: vec![0.0; BR * BC],
            dp: if backward {
                vec![0.0; BR * BC]
            } else {
                Vec::new()
            },
            acc: if backward {
                Vec::new()
            } else {
                vec![0.0; BR * p.d_v]
            },
            max: [0.0; BR],
            sum: [0.0; BR],
            lo: [0; BR],
            hi: [0; BR],
            bias: [0.0; BC],
        }
    }

    /// Fills `lo`, `hi` for rows `r0..r0 + rows` of batch entry `b` (empty ranges
    /// past `rows`) and returns the keys the block may see.
    #[inline(always)]
    fn visible_rows(&mut self, ctx: &Ctx, b: usize, r0: usize, rows: usize) -> (usize, usize) {
        for r in 0..BR {
            let (lo, hi) = if r < rows {
                ctx.visible(b, r0 + r)
            } else {
                (0, 0)
            };
            (self.lo[r], self.hi[r]) = (lo as u32, hi as u32);
        }
        // The ranges move forward with the row.
        (self.lo[0] as usize, self.hi[rows - 1] as usize)
    }
}

// ---------------------------------------------------------------------------------
// Forward.

fn forward_with(
    isa: Isa,
    p: &CpuAttention,
    q: &[f32],
    k: &[f32],
    v: &[f32],
    key_padding: Option<&[bool]>,
    sinks: Option<&[f32]>,
) -> (Vec<f32>, Vec<f32>) {
    let ctx = Ctx::new(p, q, k, v, key_padding);
    if let Some(sinks) = sinks {
        assert_eq!(sinks.len(), p.heads, "sinks' length");
    }
    let rows = p.batch * p.heads * p.seq_q;
    let mut out = vec![0.0f32; rows * p.d_v];
    let mut lse = vec![0.0f32; rows];
    if rows == 0 {
        return (out, lse);
    }
    // One task per (batch·head, block of rows), each writing its own rows.
    let mut tasks = Vec::with_capacity(p.batch * p.heads * p.seq_q.div_ceil(BR));
    for (bh, (out, lse)) in out
        .chunks_mut(p.seq_q * p.d_v)
        .zip(lse.chunks_mut(p.seq_q))
        .enumerate()
    {
        for (block, chunk) in out
            .chunks_mut(BR * p.d_v.max(1))
            .zip(lse.chunks_mut(BR))
            .enumerate()
        {
            tasks.push((bh, block * BR, chunk));
        }
    }
    tasks.into_par_iter().for_each_init(
        || Scratch::new(p, false),
        |scratch, (bh, r0, (out, lse))| {
            let args = FwdArgs {
                ctx: &ctx,
                sinks,
                bh,
                r0,
                out,
                lse,
            };
            match isa {
                Isa::Baseline => forward_block::<false, false>(scratch, args),
                // SAFETY: `Isa::detect` found AVX2 and FMA on this CPU.
                #[cfg(target_arch = "x86_64")]
                Isa::Avx2Fma => unsafe { forward_block_avx2(scratch, args) },
                // SAFETY: `Isa::detect` found AVX-512, AVX2 and FMA on this CPU.
                #[cfg(target_arch = "x86_64")]
                Isa::Avx512 => unsafe { forward_block_avx512(scratch, args) },
            }
        },
    );
    (out, lse)
}

/// One forward task: query rows `r0..` of head `bh` (flattened batch·heads).
struct FwdArgs<'a, 'b> {
    ctx: &'b Ctx<'a>,
    sinks: Option<&'b [f32]>,
    bh: usize,
    r0: usize,
    /// `[rows, d_v]`
    out: &'b mut [f32],
    /// `[rows]`
    lse: &'b mut [f32],
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
fn forward_block_avx2(scratch: &mut Scratch, args: FwdArgs) {
    forward_block::<true, false>(scratch, args)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx2,fma")]
fn forward_block_avx512(scratch: &mut Scratch, args: FwdArgs) {
    forward_block::<true, true>(scratch, args)
}

#[inline(always)]
fn forward_block<const FMA: bool, const WIDE: bool>(sc: &mut Scratch, args: FwdArgs) {
    let FwdArgs {
        ctx,
        sinks,
        bh,
        r0,
        out,
        lse,
    } = args;
    let p = &ctx.p;
    let (d_qk, d_v, seq_k) = (p.d_qk, p.d_v, p.seq_k);
    let rows = lse.len();
    let (b, h) = (bh / p.heads, bh % p.heads);
    let kv = b * p.kv_heads + h / ctx.group;
    let q = &ctx.q[(bh * p.seq_q + r0) * d_qk..][..rows * d_qk];
    let k = &ctx.k[kv * seq_k * d_qk..][..seq_k * d_qk];
    let v = &ctx.v[kv * seq_k * d_v..][..seq_k * d_v];

    let (start, end) = sc.visible_rows(ctx, b, r0, rows);
    // Tiles are `width` rows wide: a short block (decoding) computes no more.
    let width = rows.next_multiple_of(LANES);
    pack_transposed(q, d_qk, rows, width, &mut sc.qt);
    let alibi = ctx.alibi_slope(h).map(|slope| (slope, ctx.positions(r0)));
    sc.max.fill(f32::NEG_INFINITY);
    sc.sum.fill(0.0);
    sc.acc[..rows * d_v].fill(0.0);

    let mut k0 = start;
    while k0 < end {
        let len = (end - k0).min(BC);
        // Sᵀ = K·Qᵀ: key j of the tile is row j, `[len][width]`. The scale is applied
        // to the products, not folded into Q: the backward recomputes the same bits
        // of `q·k` (every product is one chain of multiply-adds over the head dim),
        // so a row's largest score cancels exactly against its log-sum-exp there.
        // Pre-scaled queries would round the two sums apart, and in peaked rows
        // (large logits) that difference would dominate dV's and dK's error.
        let k_block = &k[k0 * d_qk..][..len * d_qk];
        gemm::<FMA, WIDE>(
            len, d_qk, width, k_block, d_qk, 1, &sc.qt, width, &mut sc.s, width, false,
        );
        // Every row sees every key of the tile: nothing to mask.
        let full = sc.lo[rows - 1] as usize <= k0 && sc.hi[0] as usize >= k0 + len;
        for j in 0..len {
            let key = k0 + j;
            let column = &mut sc.s[j * width..][..width];
            if ctx.is_padded(b, key) {
                column.fill(f32::NEG_INFINITY);
                continue;
            }
            logits_column::<FMA>(column, p.scale, p.softcap);
            if let Some((slope, positions)) = &alibi {
                alibi_column(column, *slope, key as f32, &positions[..width]);
            }
            if !full {
                mask_column(column, key as u32, &sc.lo[..width], &sc.hi[..width]);
            }
        }
        let tile = &mut sc.s[..len * width];
        let tile_max = column_max(tile, width);
        // Online softmax, every row at once: new maxima, rescaled sums.
        let mut shift = [0.0f32; BR];
        let mut correction = [0.0f32; BR];
        for r in 0..width {
            let new_max = fmax(sc.max[r], tile_max[r]);
            // A row that has seen no key yet keeps a finite shift: exp(-inf − 0) = 0.
            shift[r] = if new_max == f32::NEG_INFINITY {
                0.0
            } else {
                new_max
            };
            correction[r] = exp::<FMA>(sc.max[r] - shift[r]);
            sc.max[r] = new_max;
        }
        let tile_sum = exp_columns::<FMA>(tile, &shift[..width]);
        for r in 0..width {
            sc.sum[r] = madd::<FMA>(sc.sum[r], correction[r], tile_sum[r]);
        }
        for (r, &c) in correction.iter().enumerate().take(rows) {
            if c != 1.0 {
                for x in &mut sc.acc[r * d_v..][..d_v] {
                    *x *= c;
                }
            }
        }
        // acc += P·V, P = (Sᵀ)ᵀ
        let v_block = &v[k0 * d_v..][..len * d_v];
        gemm::<FMA, WIDE>(
            rows,
            len,
            d_v,
            &sc.s,
            1,
            width,
            v_block,
            d_v,
            &mut sc.acc,
            d_v,
            true,
        );
        k0 += len;
    }

    // A head's sink joins each row's normalization once: one more logit, no value.
    let sink = sinks.map(|sinks| sinks[h]);
    for r in 0..rows {
        let (mut max, mut total, mut kept) = (sc.max[r], sc.sum[r], 1.0f32);
        if let Some(sink) = sink {
            let new_max = max.max(sink);
            if new_max > f32::NEG_INFINITY {
                kept = (max - new_max).exp();
                total = total * kept + (sink - new_max).exp();
                max = new_max;
            }
        }
        let (inverse, row_lse) = if total > 0.0 {
            (kept / total, max + total.ln())
        } else {
            (0.0, p.masked_row_lse)
        };
        lse[r] = row_lse;
        for (o, &a) in out[r * d_v..][..d_v]
            .iter_mut()
            .zip(&sc.acc[r * d_v..][..d_v])
        {
            *o = a * inverse;
        }
    }
}

// ---------------------------------------------------------------------------------
// Backward.

/// [`backward_deltas`] on `isa`.
fn backward_deltas_with(isa: Isa, p: &CpuAttention, out: &[f32], grad_out: &[f32]) -> Vec<f32> {
    let rows = p.batch * p.heads * p.seq_q;
    let d_v = p.d_v;
    assert_eq!(out.len(), rows * d_v, "out's length");
    assert_eq!(grad_out.len(), rows * d_v, "grad_out's length");
    let mut delta = vec![0.0f32; rows];
    delta
        .par_chunks_mut(4096)
        .enumerate()
        .for_each(|(chunk, delta)| {
            let first = chunk * 4096 * d_v;
            let grad_out = &grad_out[first..][..delta.len() * d_v];
            let out = &out[first..][..delta.len() * d_v];
            match isa {
                Isa::Baseline => row_deltas::<false>(grad_out, out, d_v, delta),
                // SAFETY: `Isa::detect` found FMA on this CPU.
                #[cfg(target_arch = "x86_64")]
                Isa::Avx2Fma | Isa::Avx512 => unsafe { row_deltas_fma(grad_out, out, d_v, delta) },
            }
        });
    delta
}

/// [`backward`] on `isa`, in one pass or two.
fn backward_with(
    isa: Isa,
    single_pass: bool,
    ctx: &Ctx,
    delta: &[f32],
    lse: &[f32],
    grad_out: &[f32],
) -> (Vec<f32>, Vec<f32>, Vec<f32>) {
    let p = &ctx.p;
    let rows = p.batch * p.heads * p.seq_q;
    assert_eq!(grad_out.len(), rows * p.d_v, "grad_out's length");
    assert_eq!(lse.len(), rows, "lse's length");
    assert_eq!(delta.len(), rows, "delta's length");
    let mut dq = vec![0.0f32; ctx.q.len()];
    let mut dk = vec![0.0f32; ctx.k.len()];
    let mut dv = vec![0.0f32; ctx.v.len()];
    if rows == 0 || p.seq_k == 0 {
        return (dq, dk, dv);
    }
    let d_v = p.d_v;
    let grads = Grads {
        ctx,
        grad_out,
        lse,
        delta,
    };
    let run_kv = |scratch: &mut Scratch, args: KvArgs| match isa {
        Isa::Baseline => backward_kv::<false, false>(scratch, &grads, args),
        // SAFETY: `Isa::detect` found AVX2 and FMA on this CPU.
        #[cfg(target_arch = "x86_64")]
        Isa::Avx2Fma => unsafe { backward_kv_avx2(scratch, &grads, args) },
        // SAFETY: `Isa::detect` found AVX-512, AVX2 and FMA on this CPU.
        #[cfg(target_arch = "x86_64")]
        Isa::Avx512 => unsafe { backward_kv_avx512(scratch, &grads, args) },
    };

    let (seq_q, seq_k, d_qk) = (p.seq_q, p.seq_k, p.d_qk);
    let kv_heads = p.batch * p.kv_heads;
    if single_pass {
        // One task per (batch, kv head): its keys' dK, dV and its query heads' dQ.
        let tasks: Vec<_> = dk
            .chunks_mut(seq_k * d_qk)
            .zip(dv.chunks_mut(seq_k * d_v))
            .zip(dq.chunks_mut(ctx.group * seq_q * d_qk))
            .enumerate()
            .collect();
        debug_assert_eq!(tasks.len(), kv_heads);
        tasks.into_par_iter().for_each_init(
            || Scratch::new(p, true),
            |scratch, (kv, ((dk, dv), dq))| {
                first_touch(dk);
                first_touch(dv);
                first_touch(dq);
                let mut dq = Some(dq);
                for (block, (dk, dv)) in dk
                    .chunks_mut(BC * d_qk.max(1))
                    .zip(dv.chunks_mut(BC * d_v.max(1)))
                    .enumerate()
                {
                    let k0 = block * BC;
                    run_kv(
                        scratch,
                        KvArgs {
                            kv,
                            k0,
                            len: (seq_k - k0).min(BC),
                            dk,
                            dv,
                            dq: dq.as_deref_mut(),
                        },
                    );
                }
            },
        );
        return (dq, dk, dv);
    }

    // Pass 1: one task per (batch, kv head, key block) for dK and dV.
    let mut tasks = Vec::with_capacity(kv_heads * seq_k.div_ceil(BC));
    for (kv, (dk, dv)) in dk
        .chunks_mut(seq_k * d_qk)
        .zip(dv.chunks_mut(seq_k * d_v))
        .enumerate()
    {
        for (block, (dk, dv)) in dk
            .chunks_mut(BC * d_qk.max(1))
            .zip(dv.chunks_mut(BC * d_v.max(1)))
            .enumerate()
        {
            let k0 = block * BC;
            tasks.push(KvArgs {
                kv,
                k0,
                len: (seq_k - k0).min(BC),
                dk,
                dv,
                dq: None,
            });
        }
    }
    tasks.into_par_iter().for_each_init(
        || Scratch::new(p, true),
        |scratch, args| {
            first_touch(args.dk);
            first_touch(args.dv);
            run_kv(scratch, args)
        },
    );

    // Pass 2: one task per (batch·head, query block) for dQ.
    let mut tasks = Vec::with_capacity(p.batch * p.heads * seq_q.div_ceil(BR));
    for (bh, dq) in dq.chunks_mut(seq_q * d_qk).enumerate() {
        for (block, dq) in dq.chunks_mut(BR * d_qk.max(1)).enumerate() {
            tasks.push((bh, block * BR, dq));
        }
    }
    tasks.into_par_iter().for_each_init(
        || Scratch::new(p, true),
        |scratch, (bh, r0, dq)| {
            first_touch(dq);
            let rows = (seq_q - r0).min(BR);
            match isa {
                Isa::Baseline => backward_q::<false, false>(scratch, &grads, bh, r0, rows, dq),
                // SAFETY: `Isa::detect` found AVX2 and FMA on this CPU.
                #[cfg(target_arch = "x86_64")]
                Isa::Avx2Fma => unsafe { backward_q_avx2(scratch, &grads, bh, r0, rows, dq) },
                // SAFETY: `Isa::detect` found AVX-512, AVX2 and FMA on this CPU.
                #[cfg(target_arch = "x86_64")]
                Isa::Avx512 => unsafe { backward_q_avx512(scratch, &grads, bh, r0, rows, dq) },
            }
        },
    );
    (dq, dk, dv)
}

/// Writes zeros over a fresh (zeroed) output chunk before the tile products read and
/// add to it. A fresh allocation's pages are mapped lazily: a read first maps the
/// shared zero page, and the write after it must then flush that mapping from every
/// core's TLB (an inter-processor interrupt per page, a fifth of the backward's time at
/// `seq = 512`); a first write maps a private page directly.
#[inline]
fn first_touch(chunk: &mut [f32]) {
    chunk.fill(0.0);
}

/// The backward's shared inputs.
struct Grads<'a, 'b> {
    ctx: &'b Ctx<'a>,
    grad_out: &'b [f32],
    lse: &'b [f32],
    /// `rowsum(dO ∘ O)` per query row.
    delta: &'b [f32],
}

/// One dK/dV task: keys `k0..k0 + len` of kv head `kv` (flattened batch·kv_heads).
struct KvArgs<'b> {
    kv: usize,
    k0: usize,
    len: usize,
    /// `[len, d_qk]`
    dk: &'b mut [f32],
    /// `[len, d_v]`
    dv: &'b mut [f32],
    /// The group's query heads' dQ `[group, seq_q, d_qk]` (one-pass backward).
    dq: Option<&'b mut [f32]>,
}

/// `D = rowsum(dO ∘ O)` for the rows of `grad_out` and `out` (`d_v` apart), each one
/// chain of multiply-adds in column order, as [`gemm`] sums `dP = dO·Vᵀ`: where a row
/// sees one key, `O` is that key's value row and `dP − D` is exactly 0, as are the
/// row's `dS` (a pairwise-summed `D` left rounding noise in `dQ` and `dK` there).
#[inline(always)]
fn row_deltas<const FMA: bool>(grad_out: &[f32], out: &[f32], d_v: usize, delta: &mut [f32]) {
    // Eight rows at once: eight independent chains hide the multiply-add latency.
    const ROWS: usize = 8;
    let mut chunks = delta.chunks_mut(ROWS);
    let mut first = 0;
    for delta in &mut chunks {
        let mut sums = [0.0f32; ROWS];
        for c in 0..d_v {
            for (r, sum) in sums.iter_mut().enumerate().take(delta.len()) {
                let at = (first + r) * d_v + c;
                *sum = madd::<FMA>(grad_out[at], out[at], *sum);
            }
        }
        delta.copy_from_slice(&sums[..delta.len()]);
        first += delta.len();
    }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "fma")]
fn row_deltas_fma(grad_out: &[f32], out: &[f32], d_v: usize, delta: &mut [f32]) {
    row_deltas::<true>(grad_out, out, d_v, delta)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx2,fma")]
fn backward_kv_avx512(scratch: &mut Scratch, grads: &Grads, args: KvArgs) {
    backward_kv::<true, true>(scratch, grads, args)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
fn backward_kv_avx2(scratch: &mut Scratch, grads: &Grads, args: KvArgs) {
    backward_kv::<true, false>(scratch, grads, args)
}

#[inline(always)]
fn backward_kv<const FMA: bool, const WIDE: bool>(sc: &mut Scratch, g: &Grads, args: KvArgs) {
    let KvArgs {
        kv,
        k0,
        len,
        dk,
        dv,
        mut dq,
    } = args;
    let ctx = g.ctx;
    let p = &ctx.p;
    let (d_qk, d_v, seq_q, seq_k) = (p.d_qk, p.d_v, p.seq_q, p.seq_k);
    let (b, kv_head) = (kv / p.kv_heads, kv % p.kv_heads);
    let k_block = &ctx.k[(kv * seq_k + k0) * d_qk..][..len * d_qk];
    let v_block = &ctx.v[(kv * seq_k + k0) * d_v..][..len * d_v];
    let (row_start, row_end) = ctx.rows_seeing(b, k0, k0 + len);
    if row_start >= row_end {
        return;
    }
    pack_transposed(k_block, d_qk, len, BC, &mut sc.kt);
    pack_transposed(v_block, d_v, len, BC, &mut sc.vt);
    let padded = ctx.has_padding(b, k0, len);
    ctx.padding_bias(b, k0, len, &mut sc.bias);

    for gh in 0..ctx.group {
        let h = kv_head * ctx.group + gh;
        let bh = b * p.heads + h;
        let mut r0 = row_start;
        while r0 < row_end {
            let rows = (row_end - r0).min(BR);
            let q = &ctx.q[(bh * seq_q + r0) * d_qk..][..rows * d_qk];
            let grad_out = &g.grad_out[(bh * seq_q + r0) * d_v..][..rows * d_v];
            grad_tile::<FMA, WIDE>(sc, g, bh, b, r0, rows, k0, len, padded, q, grad_out);
            // dV += Pᵀ·dO, dK += dSᵀ·Q
            gemm::<FMA, WIDE>(len, rows, d_v, &sc.s, 1, BC, grad_out, d_v, dv, d_v, true);
            gemm::<FMA, WIDE>(len, rows, d_qk, &sc.dp, 1, BC, q, d_qk, dk, d_qk, true);
            if let Some(dq) = dq.as_deref_mut() {
                // dQ += dS·K
                let dq = &mut dq[(gh * seq_q + r0) * d_qk..][..rows * d_qk];
                gemm::<FMA, WIDE>(
                    rows, len, d_qk, &sc.dp, BC, 1, k_block, d_qk, dq, d_qk, true,
                );
            }
            r0 += rows;
        }
    }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx2,fma")]
fn backward_q_avx512(
    scratch: &mut Scratch,
    grads: &Grads,
    bh: usize,
    r0: usize,
    rows: usize,
    dq: &mut [f32],
) {
    backward_q::<true, true>(scratch, grads, bh, r0, rows, dq)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
fn backward_q_avx2(
    scratch: &mut Scratch,
    grads: &Grads,
    bh: usize,
    r0: usize,
    rows: usize,
    dq: &mut [f32],
) {
    backward_q::<true, false>(scratch, grads, bh, r0, rows, dq)
}

/// dQ for query rows `r0..r0 + rows` of head `bh` (flattened batch·heads), on
/// transposed tiles `[len keys][width rows]`.
#[inline(always)]
fn backward_q<const FMA: bool, const WIDE: bool>(
    sc: &mut Scratch,
    g: &Grads,
    bh: usize,
    r0: usize,
    rows: usize,
    dq: &mut [f32],
) {
    let ctx = g.ctx;
    let p = &ctx.p;
    let (d_qk, d_v, seq_q, seq_k) = (p.d_qk, p.d_v, p.seq_q, p.seq_k);
    let (b, h) = (bh / p.heads, bh % p.heads);
    let kv = b * p.kv_heads + h / ctx.group;
    let q = &ctx.q[(bh * seq_q + r0) * d_qk..][..rows * d_qk];
    let grad_out = &g.grad_out[(bh * seq_q + r0) * d_v..][..rows * d_v];
    let (start, end) = sc.visible_rows(ctx, b, r0, rows);
    if start >= end {
        return;
    }
    let width = rows.next_multiple_of(LANES);
    pack_transposed(q, d_qk, rows, width, &mut sc.qt);
    pack_transposed(grad_out, d_v, rows, width, &mut sc.ot);
    // Rows past the block see nothing (their ranges are empty).
    sc.max.fill(0.0);
    sc.sum.fill(0.0);
    sc.max[..rows].copy_from_slice(&g.lse[bh * seq_q + r0..][..rows]);
    sc.sum[..rows].copy_from_slice(&g.delta[bh * seq_q + r0..][..rows]);
    let alibi = ctx.alibi_slope(h).map(|slope| (slope, ctx.positions(r0)));
    let mut k0 = start;
    while k0 < end {
        let len = (end - k0).min(BC);
        let k_block = &ctx.k[(kv * seq_k + k0) * d_qk..][..len * d_qk];
        let v_block = &ctx.v[(kv * seq_k + k0) * d_v..][..len * d_v];
        // Sᵀ = K·Qᵀ, dPᵀ = V·dOᵀ
        gemm::<FMA, WIDE>(
            len, d_qk, width, k_block, d_qk, 1, &sc.qt, width, &mut sc.s, width, false,
        );
        gemm::<FMA, WIDE>(
            len, d_v, width, v_block, d_v, 1, &sc.ot, width, &mut sc.dp, width, false,
        );
        let full = sc.lo[rows - 1] as usize <= k0 && sc.hi[0] as usize >= k0 + len;
        for j in 0..len {
            let key = k0 + j;
            let s = &mut sc.s[j * width..][..width];
            let dp = &mut sc.dp[j * width..][..width];
            if ctx.is_padded(b, key) {
                dp.fill(0.0);
                continue;
            }
            // ALiBi's bias joins the log-sum-exp: exp(s + bias − lse) = exp(s − (lse − bias)).
            let mut unbiased_lse = [0.0f32; BR];
            let lse = match &alibi {
                Some((slope, positions)) => {
                    unbiased_lse[..width].copy_from_slice(&sc.max[..width]);
                    let lse = &mut unbiased_lse[..width];
                    alibi_column(lse, -*slope, key as f32, &positions[..width]);
                    &unbiased_lse[..width]
                }
                None => &sc.max[..width],
            };
            grad_column::<FMA>(s, dp, p.scale, p.softcap, lse, &sc.sum[..width]);
            if !full {
                for ((ds, &lo), &hi) in dp.iter_mut().zip(&sc.lo[..width]).zip(&sc.hi[..width]) {
                    let visible = (key as u32 >= lo) & ((key as u32) < hi);
                    // A bit mask, not a select: a select that keeps `ds` compiles to
                    // a masked store.
                    let keep = if visible { u32::MAX } else { 0 };
                    *ds = f32::from_bits(ds.to_bits() & keep);
                }
            }
        }
        // dQ += dS·K, dS = (dSᵀ)ᵀ
        gemm::<FMA, WIDE>(
            rows, len, d_qk, &sc.dp, 1, width, k_block, d_qk, dq, d_qk, true,
        );
        k0 += len;
    }
}

/// One backward tile of query rows `r0..r0 + rows` of head `bh` against keys
/// `k0..k0 + len` (packed in `sc.kt`, `sc.vt`, padding bias in `sc.bias`): leaves
/// `P` in `sc.s` and `dS = scale·P∘(dP − D)∘softcap'` in `sc.dp`, both zero at hidden
/// entries and at columns past `len`.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
fn grad_tile<const FMA: bool, const WIDE: bool>(
    sc: &mut Scratch,
    g: &Grads,
    bh: usize,
    b: usize,
    r0: usize,
    rows: usize,
    k0: usize,
    len: usize,
    padded: bool,
    q: &[f32],
    grad_out: &[f32],
) {
    let ctx = g.ctx;
    let p = &ctx.p;
    let (d_qk, d_v) = (p.d_qk, p.d_v);
    // S = Q·Kᵀ, dP = dO·Vᵀ
    gemm::<FMA, WIDE>(rows, d_qk, BC, q, d_qk, 1, &sc.kt, BC, &mut sc.s, BC, false);
    gemm::<FMA, WIDE>(
        rows, d_v, BC, grad_out, d_v, 1, &sc.vt, BC, &mut sc.dp, BC, false,
    );
    let first_row = ctx.visible(b, r0);
    let last_row = ctx.visible(b, r0 + rows - 1);
    let full = len == BC && last_row.0 <= k0 && first_row.1 >= k0 + BC && !padded;
    let stats = bh * p.seq_q + r0;
    let alibi = ctx
        .alibi_slope(bh % p.heads)
        .map(|slope| (slope, ctx.positions(r0)));
    let mut row_bias = [0.0f32; BC];
    for r in 0..rows {
        let s: &mut [f32; BC] = (&mut sc.s[r * BC..][..BC]).try_into().unwrap();
        let dp: &mut [f32; BC] = (&mut sc.dp[r * BC..][..BC]).try_into().unwrap();
        let (first, last) = if full {
            (0, BC)
        } else {
            let (lo, hi) = ctx.visible(b, r0 + r);
            (lo.clamp(k0, k0 + len) - k0, hi.clamp(k0, k0 + len) - k0)
        };
        if first >= last {
            s.fill(0.0);
            dp.fill(0.0);
            continue;
        }
        let bias = match &alibi {
            // The padding's bias, plus ALiBi's for this row.
            Some((slope, positions)) => {
                for (j, bias) in row_bias.iter_mut().enumerate() {
                    let distance = (k0 + j) as f32 - positions[r];
                    *bias = if padded { sc.bias[j] } else { 0.0 } + slope * distance;
                }
                Some(&row_bias)
            }
            None => padded.then_some(&sc.bias),
        };
        grad_row::<FMA>(
            s,
            dp,
            p.scale,
            p.softcap,
            bias,
            g.lse[stats + r],
            g.delta[stats + r],
        );
        s[..first].fill(0.0);
        s[last..].fill(0.0);
        dp[..first].fill(0.0);
        dp[last..].fill(0.0);
    }
}

// ---------------------------------------------------------------------------------
// Row passes: fixed-length rows, branch-free bodies, so that they vectorize.

/// `fma` where the target has it (`FMA`), `a·b + c` otherwise.
#[inline(always)]
fn madd<const FMA: bool>(a: f32, b: f32, c: f32) -> f32 {
    if FMA { a.mul_add(b, c) } else { a * b + c }
}

/// `max(a, b)` as one `maxps` (no NaN handling).
#[inline(always)]
fn fmax(a: f32, b: f32) -> f32 {
    if a > b { a } else { b }
}

/// `exp(x)`, vectorizable: Cody–Waite reduction and Cephes' degree-6 polynomial
/// (about 1 ulp), 0 below `-87.3` (so `exp(-inf) = 0`), saturating above 88.
#[inline(always)]
fn exp<const FMA: bool>(x: f32) -> f32 {
    const LOG2_E: f32 = std::f32::consts::LOG2_E;
    const LN2_HI: f32 = 0.693_359_4;
    const LN2_LO: f32 = -2.121_944_4e-4;
    // Adding 1.5·2²³ rounds to the nearest integer and leaves it in the low bits.
    const ROUNDER: f32 = 12_582_912.0;
    const LOW: f32 = -87.3;
    let xc = x.clamp(LOW, 88.0);
    let shifted = madd::<FMA>(xc, LOG2_E, ROUNDER);
    let n = shifted - ROUNDER;
    let r = madd::<FMA>(n, -LN2_LO, madd::<FMA>(n, -LN2_HI, xc));
    let mut poly = 1.987_569_1e-4f32;
    poly = madd::<FMA>(poly, r, 1.398_199_9e-3);
    poly = madd::<FMA>(poly, r, 8.333_452e-3);
    poly = madd::<FMA>(poly, r, 4.166_579_6e-2);
    poly = madd::<FMA>(poly, r, 1.666_666_5e-1);
    poly = madd::<FMA>(poly, r, 0.5);
    let exp_r = madd::<FMA>(poly, r * r, r) + 1.0;
    // `shifted`'s low bits hold n; 2ⁿ has exponent field n + 127.
    let n_bits = shifted.to_bits().wrapping_sub(ROUNDER.to_bits());
    let two_n = f32::from_bits(n_bits.wrapping_add(127) << 23);
    if x < LOW { 0.0 } else { exp_r * two_n }
}

/// `tanh(x)`, vectorizable: Cephes' odd polynomial below 0.625, `1 − 2/(e^{2x} + 1)`
/// above (a few ulp).
#[inline(always)]
fn tanh<const FMA: bool>(x: f32) -> f32 {
    let ax = x.abs();
    let z = ax * ax;
    let mut poly = -5.704_988_7e-3f32;
    poly = madd::<FMA>(poly, z, 2.063_909e-2);
    poly = madd::<FMA>(poly, z, -5.373_971_6e-2);
    poly = madd::<FMA>(poly, z, 1.333_144_2e-1);
    poly = madd::<FMA>(poly, z, -3.333_328e-1);
    let small = madd::<FMA>(poly * z, ax, ax);
    // tanh(10) rounds to 1 in f32.
    let e = exp::<FMA>(2.0 * ax.min(10.0));
    let large = 1.0 - 2.0 / (e + 1.0);
    let t = if ax < 0.625 { small } else { large };
    t.copysign(x)
}

/// One key of a transposed tile against every row: `softcap(x·scale)`.
#[inline(always)]
fn logits_column<const FMA: bool>(column: &mut [f32], scale: f32, softcap: Option<f32>) {
    match softcap {
        None => {
            for x in column.iter_mut() {
                *x *= scale;
            }
        }
        Some(cap) => {
            let inverse = 1.0 / cap;
            for x in column.iter_mut() {
                *x = cap * tanh::<FMA>(*x * scale * inverse);
            }
        }
    }
}

/// One key of a transposed tile against every row: `+ slope · (key − positions[r])`,
/// ALiBi's bias.
#[inline(always)]
fn alibi_column(column: &mut [f32], slope: f32, key: f32, positions: &[f32]) {
    for (x, &position) in column.iter_mut().zip(positions) {
        *x += slope * (key - position);
    }
}

/// `-inf` where key `key` is outside row `r`'s visible range `lo[r]..hi[r]`.
#[inline(always)]
fn mask_column(column: &mut [f32], key: u32, lo: &[u32], hi: &[u32]) {
    for ((x, &lo), &hi) in column.iter_mut().zip(lo).zip(hi) {
        let visible = (key >= lo) & (key < hi);
        // An add, not a select: a select that keeps `x` compiles to a masked store.
        *x += if visible { 0.0 } else { f32::NEG_INFINITY };
    }
}

/// One key of a transposed backward tile against every row, as [`grad_row`]
/// (the same arithmetic, so the same bits): `s ← P`, `dp ← dS`, with each row's
/// log-sum-exp and `D`.
#[inline(always)]
fn grad_column<const FMA: bool>(
    s: &mut [f32],
    dp: &mut [f32],
    scale: f32,
    softcap: Option<f32>,
    lse: &[f32],
    delta: &[f32],
) {
    match softcap {
        None => {
            for (((s, dp), &lse), &delta) in s.iter_mut().zip(dp.iter_mut()).zip(lse).zip(delta) {
                let prob = exp::<FMA>(madd::<FMA>(*s, scale, 0.0 - lse));
                *s = prob;
                *dp = prob * (*dp - delta) * scale;
            }
        }
        Some(cap) => {
            let inverse = 1.0 / cap;
            for (((s, dp), &lse), &delta) in s.iter_mut().zip(dp.iter_mut()).zip(lse).zip(delta) {
                let t = tanh::<FMA>(*s * scale * inverse);
                let prob = exp::<FMA>(madd::<FMA>(cap, t, 0.0 - lse));
                *s = prob;
                *dp = prob * (*dp - delta) * (1.0 - t * t) * scale;
            }
        }
    }
}

/// The maximum over the keys (rows) of a transposed tile `[len][width]`, per query
/// row (`width` a multiple of 8; entries past it unset). Eight query rows at a time, so
/// that the running maxima stay in a register.
#[inline(always)]
fn column_max(tile: &[f32], width: usize) -> [f32; BR] {
    let mut max = [f32::NEG_INFINITY; BR];
    for (r, max) in max[..width].chunks_exact_mut(LANES).enumerate() {
        let mut lanes = [f32::NEG_INFINITY; LANES];
        for column in tile.chunks_exact(width) {
            for (lane, &x) in lanes.iter_mut().zip(&column[r * LANES..][..LANES]) {
                *lane = fmax(x, *lane);
            }
        }
        max.copy_from_slice(&lanes);
    }
    max
}

/// `tile ← exp(tile − shift)` for a transposed tile `[len][width]` (`shift` per query
/// row, `width` long); returns the sums over the keys, per query row.
#[inline(always)]
fn exp_columns<const FMA: bool>(tile: &mut [f32], shift: &[f32]) -> [f32; BR] {
    let width = shift.len();
    let mut sum = [0.0f32; BR];
    for column in tile.chunks_exact_mut(width) {
        for ((x, &m), total) in column.iter_mut().zip(shift).zip(sum.iter_mut()) {
            *x = exp::<FMA>(*x - m);
            *total += *x;
        }
    }
    sum
}

/// One row of the backward tile: `s ← P = exp(logit + bias − lse)`,
/// `dp ← dS = scale·P·(dp − delta)·softcap'`.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
fn grad_row<const FMA: bool>(
    s: &mut [f32; BC],
    dp: &mut [f32; BC],
    scale: f32,
    softcap: Option<f32>,
    bias: Option<&[f32; BC]>,
    lse: f32,
    delta: f32,
) {
    const ZERO: [f32; BC] = [0.0; BC];
    let bias = bias.unwrap_or(&ZERO);
    match softcap {
        None => {
            for ((s, dp), &b) in s.iter_mut().zip(dp.iter_mut()).zip(bias) {
                let prob = exp::<FMA>(madd::<FMA>(*s, scale, b - lse));
                *s = prob;
                *dp = prob * (*dp - delta) * scale;
            }
        }
        Some(cap) => {
            let inverse = 1.0 / cap;
            for ((s, dp), &b) in s.iter_mut().zip(dp.iter_mut()).zip(bias) {
                // s = c·tanh(t/c), ds/dt = 1 − (s/c)² = 1 − tanh².
                let t = tanh::<FMA>(*s * scale * inverse);
                let prob = exp::<FMA>(madd::<FMA>(cap, t, b - lse));
                *s = prob;
                *dp = prob * (*dp - delta) * (1.0 - t * t) * scale;
            }
        }
    }
}

/// `dst[c·width + j] = src[j·d + c]` for `j < len` (a block of `len` rows of width
/// `d`, transposed); columns `len..width` are zeroed.
#[inline(always)]
fn pack_transposed(src: &[f32], d: usize, len: usize, width: usize, dst: &mut [f32]) {
    let dst = &mut dst[..d * width];
    let src = &src[..len * d];
    // 8 source rows at a time: each destination row gets 8 contiguous values.
    let mut j = 0;
    while j + LANES <= len {
        let rows: [&[f32]; LANES] = std::array::from_fn(|i| &src[(j + i) * d..][..d]);
        for (c, out) in dst.chunks_exact_mut(width).enumerate() {
            let out: &mut [f32; LANES] = (&mut out[j..j + LANES]).try_into().unwrap();
            for i in 0..LANES {
                out[i] = rows[i][c];
            }
        }
        j += LANES;
    }
    for j in j..len {
        let row = &src[j * d..][..d];
        for (out, &x) in dst.chunks_exact_mut(width).zip(row) {
            out[j] = x;
        }
    }
    if len < width {
        for out in dst.chunks_exact_mut(width) {
            out[len..].fill(0.0);
        }
    }
}

// ---------------------------------------------------------------------------------
// Tile products.

/// `C[m × cols] (+)= A[m × n]·B[n × cols]`: `A[r][t] = a[r·ars + t·ats]`,
/// `B[t][j] = b[t·ldb + j]`, `C[r][j] = c[r·ldc + j]`; adds to `C` when `accumulate`,
/// overwrites it otherwise. Each `C` entry is one chain of multiply-adds over
/// `t = 0..n` in order, whatever the blocking (so the register tile's shape, which
/// differs per build, changes no bit).
///
/// The register tile is as large as the build's registers allow, so that enough
/// independent multiply-add chains are in flight to cover their latency (4 cycles at
/// 2 per cycle: at least 8 chains) and each loaded value serves many of them:
/// - AVX-512 (`WIDE`, 32 registers of 16 lanes): [`WIDE_R`] rows ×
///   8·[`WIDE_V`] = 32 columns, 16 accumulators; per step 2 `B` loads and 8
///   broadcasts for 16 multiply-adds. On a Xeon (Emerald Rapids) core a 64 × 64 × 64
///   product runs at about 170 GFLOP/s, against 100 with a 4 × 16 tile (4 chains,
///   latency-bound); 4 × 64, 6 × 64 and 12 × 32 measured the same as 8 × 32,
///   which needs the fewest registers and no row tail at 64 rows.
/// - AVX2 + FMA (16 registers of 8 lanes): [`AVX2_R`] rows × 8·[`AVX2_V`] = 16
///   columns, 12 accumulators, 2 `B` registers and a broadcast (BLIS's Haswell
///   shape): 86 GFLOP/s against 75 with 4 × 16; 4 × 24 and 3 × 32 were slower.
/// - Baseline (SSE2, 16 registers of 4 lanes): [`MR`] rows × 8 columns.
///
/// Rows left over take strips of 4 rows, then of 1; columns left over, tiles of 16,
/// 8, then fewer.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
fn gemm<const FMA: bool, const WIDE: bool>(
    m: usize,
    n: usize,
    cols: usize,
    a: &[f32],
    ars: usize,
    ats: usize,
    b: &[f32],
    ldb: usize,
    c: &mut [f32],
    ldc: usize,
    accumulate: bool,
) {
    if m == 0 || cols == 0 {
        return;
    }
    if n == 0 {
        if !accumulate {
            for r in 0..m {
                c[r * ldc..][..cols].fill(0.0);
            }
        }
        return;
    }
    assert!(
        (m - 1) * ars + (n - 1) * ats < a.len(),
        "gemm: A out of bounds"
    );
    assert!((n - 1) * ldb + cols <= b.len(), "gemm: B out of bounds");
    assert!((m - 1) * ldc + cols <= c.len(), "gemm: C out of bounds");
    let t = Operands {
        m,
        n,
        cols,
        a: a.as_ptr(),
        ars,
        ats,
        b: b.as_ptr(),
        ldb,
        c: c.as_mut_ptr(),
        ldc,
        accumulate,
    };
    // SAFETY: every strip reads A at rows < m, steps < n, B at rows < n, columns
    // < cols, and writes C at rows < m, columns < cols: in bounds by the asserts.
    unsafe {
        if WIDE {
            let r = strips::<FMA, WIDE_R, WIDE_V>(&t, 0);
            let r = strips::<FMA, 4, WIDE_V>(&t, r);
            strips::<FMA, 1, WIDE_V>(&t, r);
        } else if FMA {
            let r = strips::<FMA, AVX2_R, AVX2_V>(&t, 0);
            let r = strips::<FMA, 4, AVX2_V>(&t, r);
            strips::<FMA, 1, AVX2_V>(&t, r);
        } else {
            let r = strips::<FMA, MR, 1>(&t, 0);
            strips::<FMA, 1, 1>(&t, r);
        }
    }
}

/// A [`gemm`] call's operands as raw pointers (bounds checked by [`gemm`]).
struct Operands {
    m: usize,
    n: usize,
    cols: usize,
    a: *const f32,
    ars: usize,
    ats: usize,
    b: *const f32,
    ldb: usize,
    c: *mut f32,
    ldc: usize,
    accumulate: bool,
}

/// Rows `r..` of [`gemm`] in strips of `R` rows while `R` rows are left; returns the
/// first row not done. In a strip, columns go `8V` at a time (`V` vectors of 8 lanes
/// per row), then 16, then 8, then the rest.
///
/// # Safety
/// `t` as [`gemm`] checks it: every pointer in bounds for `m`, `n` and `cols`.
#[inline(always)]
unsafe fn strips<const FMA: bool, const R: usize, const V: usize>(
    t: &Operands,
    mut r: usize,
) -> usize {
    let (n, ars, ats, ldb, ldc, acc) = (t.n, t.ars, t.ats, t.ldb, t.ldc, t.accumulate);
    unsafe {
        while r + R <= t.m {
            let a = t.a.add(r * ars);
            let c = t.c.add(r * ldc);
            let mut j = 0;
            while j + V * LANES <= t.cols {
                micro::<FMA, R, V>(n, a, ars, ats, t.b.add(j), ldb, c.add(j), ldc, acc);
                j += V * LANES;
            }
            if V > 2 {
                while j + 2 * LANES <= t.cols {
                    micro::<FMA, R, 2>(n, a, ars, ats, t.b.add(j), ldb, c.add(j), ldc, acc);
                    j += 2 * LANES;
                }
            }
            if V > 1 {
                while j + LANES <= t.cols {
                    micro::<FMA, R, 1>(n, a, ars, ats, t.b.add(j), ldb, c.add(j), ldc, acc);
                    j += LANES;
                }
            }
            if j < t.cols {
                micro_tail::<FMA, R>(
                    n,
                    a,
                    ars,
                    ats,
                    t.b.add(j),
                    ldb,
                    c.add(j),
                    ldc,
                    acc,
                    t.cols - j,
                );
            }
            r += R;
        }
    }
    r
}

/// The register tile: `R` rows × `V` vectors of 8 columns.
///
/// # Safety
/// Reads `a[r·ars + t·ats]`, `b[t·ldb + 0..8V]`, and `c[r·ldc + 0..8V]` for
/// `r < R`, `t < n`; all must be in bounds.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
unsafe fn micro<const FMA: bool, const R: usize, const V: usize>(
    n: usize,
    a: *const f32,
    ars: usize,
    ats: usize,
    b: *const f32,
    ldb: usize,
    c: *mut f32,
    ldc: usize,
    accumulate: bool,
) {
    unsafe {
        let mut acc = [[[0.0f32; LANES]; V]; R];
        if accumulate {
            for (r, acc) in acc.iter_mut().enumerate() {
                for (v, acc) in acc.iter_mut().enumerate() {
                    *acc = c
                        .add(r * ldc + v * LANES)
                        .cast::<[f32; LANES]>()
                        .read_unaligned();
                }
            }
        }
        let mut a = a;
        let mut b = b;
        for _ in 0..n {
            let mut bv = [[0.0f32; LANES]; V];
            for (v, bv) in bv.iter_mut().enumerate() {
                *bv = b.add(v * LANES).cast::<[f32; LANES]>().read_unaligned();
            }
            for (r, acc) in acc.iter_mut().enumerate() {
                let x = *a.add(r * ars);
                for (acc, bv) in acc.iter_mut().zip(&bv) {
                    for (acc, &y) in acc.iter_mut().zip(bv) {
                        *acc = madd::<FMA>(x, y, *acc);
                    }
                }
            }
            a = a.add(ats);
            b = b.add(ldb);
        }
        for (r, acc) in acc.iter().enumerate() {
            for (v, acc) in acc.iter().enumerate() {
                c.add(r * ldc + v * LANES)
                    .cast::<[f32; LANES]>()
                    .write_unaligned(*acc);
            }
        }
    }
}

/// [`micro`] for the last `w < 8` columns.
///
/// # Safety
/// As [`micro`] with `w` columns.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
unsafe fn micro_tail<const FMA: bool, const R: usize>(
    n: usize,
    a: *const f32,
    ars: usize,
    ats: usize,
    b: *const f32,
    ldb: usize,
    c: *mut f32,
    ldc: usize,
    accumulate: bool,
    w: usize,
) {
    unsafe {
        let mut acc = [[0.0f32; LANES]; R];
        if accumulate {
            for (r, acc) in acc.iter_mut().enumerate() {
                for (l, acc) in acc.iter_mut().enumerate().take(w) {
                    *acc = *c.add(r * ldc + l);
                }
            }
        }
        for t in 0..n {
            let mut bv = [0.0f32; LANES];
            for (l, bv) in bv.iter_mut().enumerate().take(w) {
                *bv = *b.add(t * ldb + l);
            }
            for (r, acc) in acc.iter_mut().enumerate() {
                let x = *a.add(r * ars + t * ats);
                for (acc, &y) in acc.iter_mut().zip(&bv) {
                    *acc = madd::<FMA>(x, y, *acc);
                }
            }
        }
        for (r, acc) in acc.iter().enumerate() {
            for (l, &acc) in acc.iter().enumerate().take(w) {
                *c.add(r * ldc + l) = acc;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MASKED: f32 = 1.0e30;

    /// xorshift64*: deterministic test data without dependencies.
    struct Rng(u64);

    impl Rng {
        fn next(&mut self) -> u64 {
            self.0 ^= self.0 >> 12;
            self.0 ^= self.0 << 25;
            self.0 ^= self.0 >> 27;
            self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
        }

        /// Uniform in `[-1, 1)`.
        fn uniform(&mut self) -> f32 {
            (self.next() >> 40) as f32 / (1u64 << 23) as f32 - 1.0
        }

        fn vec(&mut self, len: usize, amplitude: f32) -> Vec<f32> {
            (0..len).map(|_| self.uniform() * amplitude).collect()
        }
    }

    /// Key padding of a case.
    #[derive(Clone, Copy, Debug, PartialEq)]
    enum Padding {
        None,
        /// About a quarter of the keys, at random.
        Random,
        /// Random, and the last batch entry entirely padded.
        WithEmptyEntry,
    }

    #[derive(Clone, Copy, Debug)]
    struct Case {
        batch: usize,
        heads: usize,
        kv_heads: usize,
        seq_q: usize,
        seq_k: usize,
        d_qk: usize,
        d_v: usize,
        causal: bool,
        window: Option<usize>,
        chunk: Option<usize>,
        softcap: Option<f32>,
        /// Multiplies the usual `1/√d_qk` (larger scores exercise the soft-cap).
        scale_factor: f32,
        padding: Padding,
        sinks: bool,
        alibi: Option<Alibi>,
    }

    const BASE: Case = Case {
        batch: 1,
        heads: 1,
        kv_heads: 1,
        seq_q: 1,
        seq_k: 1,
        d_qk: 8,
        d_v: 8,
        causal: false,
        window: None,
        chunk: None,
        softcap: None,
        scale_factor: 1.0,
        padding: Padding::None,
        sinks: false,
        alibi: None,
    };

    impl Case {
        fn attention(&self) -> CpuAttention {
            CpuAttention {
                batch: self.batch,
                heads: self.heads,
                kv_heads: self.kv_heads,
                seq_q: self.seq_q,
                seq_k: self.seq_k,
                d_qk: self.d_qk,
                d_v: self.d_v,
                scale: self.scale_factor / (self.d_qk as f32).sqrt(),
                softcap: self.softcap,
                alibi: self.alibi,
                mask: MaskRule::new(self.causal, self.window).with_chunk(self.chunk),
                masked_row_lse: MASKED,
            }
        }
    }

    struct Inputs {
        q: Vec<f32>,
        k: Vec<f32>,
        v: Vec<f32>,
        grad: Vec<f32>,
        padding: Option<Vec<bool>>,
        sinks: Option<Vec<f32>>,
    }

    fn inputs(case: &Case, seed: u64) -> Inputs {
        let mut rng = Rng(seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1);
        let p = case.attention();
        let q = rng.vec(p.batch * p.heads * p.seq_q * p.d_qk, 1.0);
        let k = rng.vec(p.batch * p.kv_heads * p.seq_k * p.d_qk, 1.0);
        let v = rng.vec(p.batch * p.kv_heads * p.seq_k * p.d_v, 1.0);
        let grad = rng.vec(p.batch * p.heads * p.seq_q * p.d_v, 1.0);
        let padding = (case.padding != Padding::None).then(|| {
            let mut padding: Vec<bool> = (0..p.batch * p.seq_k)
                .map(|_| rng.next().is_multiple_of(4))
                .collect();
            if case.padding == Padding::WithEmptyEntry {
                padding[(p.batch - 1) * p.seq_k..].fill(true);
            }
            padding
        });
        let sinks = case.sinks.then(|| rng.vec(p.heads, 2.0));
        Inputs {
            q,
            k,
            v,
            grad,
            padding,
            sinks,
        }
    }

    /// The mask rule as its definition reads (`MaskRule::is_hidden`).
    fn hidden(p: &CpuAttention, row: usize, key: usize) -> bool {
        let position = row as i64 + p.seq_k as i64 - p.seq_q as i64;
        let key = key as i64;
        let mask = p.mask;
        let causal_hides = mask.causal && key > position;
        let window_hides = mask.window.is_some_and(|w| {
            let w = w as i64;
            position - key >= w || (!mask.causal && key - position >= w)
        });
        let chunk_hides = mask
            .chunk
            .is_some_and(|c| key.div_euclid(c as i64) != position.div_euclid(c as i64));
        causal_hides || window_hides || chunk_hides
    }

    /// The f64 reference of one case.
    struct Reference {
        out: Vec<f64>,
        lse: Vec<f64>,
        dq: Vec<f64>,
        dk: Vec<f64>,
        dv: Vec<f64>,
        /// The largest entry of dQ and dK summed from `|dS|` terms computed without
        /// cancellation (`P·(|dP| + |D|)`): the scale of their rounding errors where
        /// the exact gradients vanish (a row seeing one key has `dP = D`).
        dq_terms: f64,
        dk_terms: f64,
    }

    /// Direct f64 loops.
    fn reference(p: &CpuAttention, x: &Inputs) -> Reference {
        let f = |v: &[f32]| v.iter().map(|&x| x as f64).collect::<Vec<f64>>();
        let (q, k, v, grad) = (f(&x.q), f(&x.k), f(&x.v), f(&x.grad));
        let (d_qk, d_v, seq_q, seq_k) = (p.d_qk, p.d_v, p.seq_q, p.seq_k);
        let group = p.heads / p.kv_heads;
        let scale = p.scale as f64;
        let slopes = p.alibi.map(|alibi| alibi.slopes(p.heads));
        let mut out = vec![0.0; q.len() / d_qk * d_v];
        let mut lse = vec![0.0; q.len() / d_qk];
        let mut dq = vec![0.0; q.len()];
        let mut dk = vec![0.0; k.len()];
        let mut dv = vec![0.0; v.len()];
        let mut dq_terms = vec![0.0f64; q.len()];
        let mut dk_terms = vec![0.0f64; k.len()];
        for b in 0..p.batch {
            for h in 0..p.heads {
                let kv = b * p.kv_heads + h / group;
                for i in 0..seq_q {
                    let row = (b * p.heads + h) * seq_q + i;
                    let visible: Vec<usize> = (0..seq_k)
                        .filter(|&j| {
                            !hidden(p, i, j)
                                && !x.padding.as_ref().is_some_and(|pad| pad[b * seq_k + j])
                        })
                        .collect();
                    let sink = x.sinks.as_ref().map(|s| s[h] as f64);
                    if visible.is_empty() && sink.is_none() {
                        lse[row] = MASKED as f64;
                        continue;
                    }
                    let q_row = &q[row * d_qk..][..d_qk];
                    let logits: Vec<f64> = visible
                        .iter()
                        .map(|&j| {
                            let k_row = &k[(kv * seq_k + j) * d_qk..][..d_qk];
                            let t =
                                q_row.iter().zip(k_row).map(|(a, b)| a * b).sum::<f64>() * scale;
                            match p.softcap {
                                Some(c) => c as f64 * (t / c as f64).tanh(),
                                None => t,
                            }
                        })
                        .collect();
                    // ALiBi's bias, after the cap: slope · (j − position).
                    let position = i as f64 + seq_k as f64 - seq_q as f64;
                    let biased: Vec<f64> = visible
                        .iter()
                        .zip(&logits)
                        .map(|(&j, &logit)| {
                            let slope = slopes.as_ref().map_or(0.0, |slopes| slopes[h]);
                            logit + slope * (j as f64 - position)
                        })
                        .collect();
                    let max = biased
                        .iter()
                        .chain(&sink)
                        .fold(f64::NEG_INFINITY, |m, &x| m.max(x));
                    let total = biased
                        .iter()
                        .chain(&sink)
                        .map(|l| (l - max).exp())
                        .sum::<f64>();
                    let row_lse = max + total.ln();
                    lse[row] = row_lse;
                    let probs: Vec<f64> = biased.iter().map(|l| (l - row_lse).exp()).collect();
                    let g_row = &grad[row * d_v..][..d_v];
                    let mut dps = Vec::with_capacity(visible.len());
                    for (&j, &prob) in visible.iter().zip(&probs) {
                        let v_row = &v[(kv * seq_k + j) * d_v..][..d_v];
                        for c in 0..d_v {
                            out[row * d_v + c] += prob * v_row[c];
                            dv[(kv * seq_k + j) * d_v + c] += prob * g_row[c];
                        }
                        dps.push(g_row.iter().zip(v_row).map(|(a, b)| a * b).sum::<f64>());
                    }
                    let delta: f64 = probs.iter().zip(&dps).map(|(p, d)| p * d).sum();
                    for ((&j, &prob), (&dp, &logit)) in
                        visible.iter().zip(&probs).zip(dps.iter().zip(&logits))
                    {
                        let derivative = p.softcap.map_or(1.0, |c| {
                            let ratio = logit / c as f64;
                            1.0 - ratio * ratio
                        });
                        let ds = prob * (dp - delta) * derivative * scale;
                        let ds_terms = (prob * (dp.abs() + delta.abs()) * derivative * scale).abs();
                        for c in 0..d_qk {
                            let key = (kv * seq_k + j) * d_qk + c;
                            dq[row * d_qk + c] += ds * k[key];
                            dk[key] += ds * q_row[c];
                            dq_terms[row * d_qk + c] += ds_terms * k[key].abs();
                            dk_terms[key] += ds_terms * q_row[c].abs();
                        }
                    }
                }
            }
        }
        let largest = |x: &[f64]| x.iter().fold(0.0f64, |m, &x| m.max(x));
        Reference {
            out,
            lse,
            dq,
            dk,
            dv,
            dq_terms: largest(&dq_terms),
            dk_terms: largest(&dk_terms),
        }
    }

    /// Largest difference relative to the largest reference magnitude, or to
    /// `floor` when that is larger.
    fn relative_error(got: &[f32], expected: &[f64], floor: f64) -> f64 {
        assert_eq!(got.len(), expected.len());
        let scale = expected
            .iter()
            .fold(0.0f64, |m, x| m.max(x.abs()))
            .max(floor)
            .max(1e-30);
        got.iter()
            .zip(expected)
            .map(|(&g, &e)| (g as f64 - e).abs())
            .fold(0.0, f64::max)
            / scale
    }

    /// Errors of (out, lse, dq, dk, dv) against the reference; rows that see nothing
    /// must be exact (LSE = masked_row_lse, zero output and dQ).
    fn errors(
        p: &CpuAttention,
        reference: &Reference,
        (out, lse): (&[f32], &[f32]),
        (dq, dk, dv): (&[f32], &[f32], &[f32]),
    ) -> [f64; 5] {
        let (mut lse_got, mut lse_expected) = (Vec::new(), Vec::new());
        for (row, (&got, &expected)) in lse.iter().zip(&reference.lse).enumerate() {
            if expected == MASKED as f64 {
                assert_eq!(got, MASKED, "masked row {row}'s LSE");
                assert!(out[row * p.d_v..][..p.d_v].iter().all(|&x| x == 0.0));
                assert!(dq[row * p.d_qk..][..p.d_qk].iter().all(|&x| x == 0.0));
            } else {
                lse_got.push(got);
                lse_expected.push(expected);
            }
        }
        [
            relative_error(out, &reference.out, 0.0),
            relative_error(&lse_got, &lse_expected, 0.0),
            relative_error(dq, &reference.dq, 0.1 * reference.dq_terms),
            relative_error(dk, &reference.dk, 0.1 * reference.dk_terms),
            relative_error(dv, &reference.dv, 0.0),
        ]
    }

    fn cases() -> Vec<Case> {
        let c = BASE;
        vec![
            // Single key and query.
            c,
            // GQA, causal, a size past one block of 16.
            Case {
                batch: 2,
                heads: 4,
                kv_heads: 2,
                seq_q: 17,
                seq_k: 17,
                d_qk: 32,
                d_v: 32,
                causal: true,
                ..c
            },
            // Whole blocks and a tail.
            Case {
                heads: 2,
                kv_heads: 2,
                seq_q: 129,
                seq_k: 129,
                d_qk: 64,
                d_v: 64,
                ..c
            },
            Case {
                heads: 2,
                kv_heads: 2,
                seq_q: 128,
                seq_k: 128,
                d_qk: 64,
                d_v: 64,
                causal: true,
                ..c
            },
            // MQA, fewer queries than keys (bottom-right alignment).
            Case {
                heads: 4,
                kv_heads: 1,
                seq_q: 129,
                seq_k: 200,
                d_qk: 64,
                d_v: 64,
                causal: true,
                ..c
            },
            // More queries than keys: the first rows see nothing.
            Case {
                heads: 2,
                kv_heads: 1,
                seq_q: 200,
                seq_k: 129,
                d_qk: 80,
                d_v: 80,
                causal: true,
                ..c
            },
            // Sliding windows, causal and symmetric.
            Case {
                batch: 2,
                heads: 2,
                kv_heads: 2,
                seq_q: 100,
                seq_k: 100,
                d_qk: 64,
                d_v: 64,
                causal: true,
                window: Some(16),
                ..c
            },
            Case {
                heads: 2,
                kv_heads: 1,
                seq_q: 150,
                seq_k: 130,
                d_qk: 32,
                d_v: 32,
                window: Some(20),
                ..c
            },
            Case {
                heads: 2,
                kv_heads: 2,
                seq_q: 64,
                seq_k: 64,
                d_qk: 32,
                d_v: 32,
                causal: true,
                window: Some(1),
                ..c
            },
            // Key padding, with a fully padded batch entry.
            Case {
                batch: 3,
                heads: 2,
                kv_heads: 1,
                seq_q: 70,
                seq_k: 90,
                d_qk: 64,
                d_v: 64,
                padding: Padding::WithEmptyEntry,
                ..c
            },
            Case {
                batch: 2,
                heads: 4,
                kv_heads: 2,
                seq_q: 130,
                seq_k: 130,
                d_qk: 32,
                d_v: 32,
                causal: true,
                window: Some(40),
                padding: Padding::Random,
                ..c
            },
            // Chunks (Llama 4's local layers): causal within chunks of 24 that cut the
            // blocks of 64, with padding and GQA; fewer queries than keys, as a cached
            // prefill; block-diagonal without causal, with a window too.
            Case {
                batch: 2,
                heads: 4,
                kv_heads: 2,
                seq_q: 130,
                seq_k: 130,
                d_qk: 32,
                d_v: 32,
                causal: true,
                chunk: Some(24),
                padding: Padding::Random,
                ..c
            },
            Case {
                heads: 2,
                kv_heads: 1,
                seq_q: 70,
                seq_k: 200,
                d_qk: 16,
                d_v: 24,
                causal: true,
                chunk: Some(64),
                ..c
            },
            Case {
                heads: 2,
                kv_heads: 2,
                seq_q: 100,
                seq_k: 100,
                d_qk: 16,
                d_v: 16,
                window: Some(10),
                chunk: Some(30),
                ..c
            },
            // Soft-cap, with large scores.
            Case {
                heads: 2,
                kv_heads: 2,
                seq_q: 65,
                seq_k: 129,
                d_qk: 128,
                d_v: 128,
                causal: true,
                softcap: Some(5.0),
                scale_factor: 6.0,
                ..c
            },
            Case {
                batch: 2,
                heads: 4,
                kv_heads: 2,
                seq_q: 50,
                seq_k: 77,
                d_qk: 64,
                d_v: 64,
                softcap: Some(3.0),
                scale_factor: 4.0,
                padding: Padding::Random,
                ..c
            },
            // Sinks: plain, with a window and empty rows, with a fully padded entry.
            Case {
                heads: 2,
                kv_heads: 2,
                seq_q: 33,
                seq_k: 47,
                d_qk: 64,
                d_v: 64,
                sinks: true,
                ..c
            },
            Case {
                batch: 2,
                heads: 4,
                kv_heads: 2,
                seq_q: 90,
                seq_k: 60,
                d_qk: 32,
                d_v: 32,
                causal: true,
                window: Some(8),
                sinks: true,
                ..c
            },
            Case {
                batch: 3,
                heads: 2,
                kv_heads: 2,
                seq_q: 40,
                seq_k: 40,
                d_qk: 64,
                d_v: 64,
                causal: true,
                padding: Padding::WithEmptyEntry,
                sinks: true,
                ..c
            },
            // d_qk ≠ d_v: 192/128 and MLA's 576/512 (MQA, decoding-like).
            Case {
                heads: 2,
                kv_heads: 1,
                seq_q: 80,
                seq_k: 96,
                d_qk: 192,
                d_v: 128,
                causal: true,
                ..c
            },
            Case {
                heads: 4,
                kv_heads: 1,
                seq_q: 20,
                seq_k: 70,
                d_qk: 576,
                d_v: 512,
                causal: true,
                ..c
            },
            // One query against a long cache with a window.
            Case {
                heads: 2,
                kv_heads: 2,
                seq_q: 1,
                seq_k: 1000,
                d_qk: 64,
                d_v: 64,
                causal: true,
                window: Some(100),
                ..c
            },
            // Long causal.
            Case {
                seq_q: 1000,
                seq_k: 1000,
                d_qk: 64,
                d_v: 64,
                causal: true,
                ..c
            },
            // Tiny head dimension, many queries, few keys, padding.
            Case {
                heads: 2,
                kv_heads: 1,
                seq_q: 1000,
                seq_k: 17,
                padding: Padding::Random,
                ..c
            },
            // One key for many queries.
            Case {
                seq_q: 17,
                seq_k: 1,
                d_qk: 16,
                d_v: 16,
                ..c
            },
            // ALiBi: GQA over blocks and a tail, causal, with padding and a fully
            // padded entry; with a soft-cap, a window and sinks, fewer queries than keys
            // (a non-power-of-two head count).
            Case {
                batch: 3,
                heads: 4,
                kv_heads: 2,
                seq_q: 130,
                seq_k: 130,
                d_qk: 32,
                d_v: 32,
                causal: true,
                padding: Padding::WithEmptyEntry,
                alibi: Some(Alibi::new()),
                ..c
            },
            Case {
                heads: 6,
                kv_heads: 3,
                seq_q: 70,
                seq_k: 150,
                d_qk: 64,
                d_v: 64,
                causal: true,
                window: Some(90),
                softcap: Some(5.0),
                scale_factor: 3.0,
                sinks: true,
                alibi: Some(Alibi::new().with_max_bias(4.0).with_slope_scale(0.5)),
                ..c
            },
            // Odd head dimensions (column tails) and a window wider than the sequence.
            Case {
                batch: 2,
                heads: 3,
                kv_heads: 3,
                seq_q: 45,
                seq_k: 45,
                d_qk: 13,
                d_v: 7,
                window: Some(200),
                padding: Padding::Random,
                sinks: true,
                ..c
            },
        ]
    }

    const TOLERANCE: f64 = 1e-5;

    #[test]
    fn matches_the_f64_reference() {
        let isas: &[Isa] = match Isa::detect() {
            Isa::Baseline => &[Isa::Baseline],
            #[cfg(target_arch = "x86_64")]
            Isa::Avx2Fma => &[Isa::Baseline, Isa::Avx2Fma],
            #[cfg(target_arch = "x86_64")]
            Isa::Avx512 => &[Isa::Baseline, Isa::Avx2Fma, Isa::Avx512],
        };
        for (index, case) in cases().iter().enumerate() {
            let p = case.attention();
            let x = inputs(case, index as u64 + 1);
            let reference = reference(&p, &x);
            for &isa in isas {
                let (out, lse) = forward_with(
                    isa,
                    &p,
                    &x.q,
                    &x.k,
                    &x.v,
                    x.padding.as_deref(),
                    x.sinks.as_deref(),
                );
                let ctx = Ctx::new(&p, &x.q, &x.k, &x.v, x.padding.as_deref());
                let delta = backward_deltas_with(isa, &p, &out, &x.grad);
                let (dq, dk, dv) = backward_with(isa, false, &ctx, &delta, &lse, &x.grad);
                let (dq1, dk1, dv1) = backward_with(isa, true, &ctx, &delta, &lse, &x.grad);
                let bits = |a: &[f32]| a.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
                assert_eq!(bits(&dq), bits(&dq1), "case {index}: one-pass dq differs");
                assert_eq!(bits(&dk), bits(&dk1), "case {index}: one-pass dk differs");
                assert_eq!(bits(&dv), bits(&dv1), "case {index}: one-pass dv differs");
                let errors = errors(&p, &reference, (&out, &lse), (&dq, &dk, &dv));
                println!(
                    "case {index:2} {isa:?}: out {:.1e} lse {:.1e} dq {:.1e} dk {:.1e} dv {:.1e}",
                    errors[0], errors[1], errors[2], errors[3], errors[4]
                );
                for (name, error) in ["out", "lse", "dq", "dk", "dv"].iter().zip(errors) {
                    assert!(
                        error < TOLERANCE,
                        "case {index} ({case:?}, {isa:?}): {name} off by {error:e}"
                    );
                }
            }
        }
    }

    /// Checks one case against the reference on the detected instruction set, both
    /// backward splits; returns the largest error.
    fn check(case: &Case, seed: u64) -> f64 {
        let p = case.attention();
        let x = inputs(case, seed);
        let reference = reference(&p, &x);
        let (out, lse) = forward(
            &p,
            &x.q,
            &x.k,
            &x.v,
            x.padding.as_deref(),
            x.sinks.as_deref(),
        );
        let ctx = Ctx::new(&p, &x.q, &x.k, &x.v, x.padding.as_deref());
        let delta = backward_deltas(&p, &out, &x.grad);
        let (dq, dk, dv) = backward_with(Isa::detect(), false, &ctx, &delta, &lse, &x.grad);
        let (dq1, dk1, dv1) = backward_with(Isa::detect(), true, &ctx, &delta, &lse, &x.grad);
        assert!(
            dq.iter().zip(&dq1).all(|(a, b)| a.to_bits() == b.to_bits()),
            "{case:?}: dq splits differ"
        );
        assert!(
            dk.iter().zip(&dk1).all(|(a, b)| a.to_bits() == b.to_bits()),
            "{case:?}: dk splits differ"
        );
        assert!(
            dv.iter().zip(&dv1).all(|(a, b)| a.to_bits() == b.to_bits()),
            "{case:?}: dv splits differ"
        );
        errors(&p, &reference, (&out, &lse), (&dq, &dk, &dv))
            .into_iter()
            .fold(0.0, f64::max)
    }

    #[test]
    fn random_shapes_match_the_reference() {
        let mut rng = Rng(2024);
        let mut worst = 0.0f64;
        for seed in 0..40 {
            let mut pick = |n: u64| (rng.next() % n) as usize;
            let kv_heads = 1 + pick(2);
            let case = Case {
                batch: 1 + pick(2),
                heads: kv_heads * (1 + pick(3)),
                kv_heads,
                seq_q: 1 + pick(150),
                seq_k: 1 + pick(150),
                d_qk: 1 + pick(40),
                d_v: 1 + pick(40),
                causal: pick(2) == 0,
                window: (pick(2) == 0).then(|| 1 + pick(60)),
                softcap: (pick(3) == 0).then_some(4.0),
                scale_factor: 1.0 + pick(4) as f32,
                padding: [Padding::None, Padding::Random, Padding::WithEmptyEntry][pick(3)],
                sinks: pick(3) == 0,
                alibi: (pick(3) == 0).then(Alibi::new),
                chunk: (pick(3) == 0).then(|| 1 + pick(80)),
            };
            let error = check(&case, seed);
            worst = worst.max(error);
            assert!(error < TOLERANCE, "{case:?}: off by {error:e}");
        }
        println!("largest relative error: {worst:.1e}");
    }

    #[test]
    fn sinks_take_empty_rows() {
        // More queries than keys, causal: the first rows see nothing and give the
        // sink everything.
        let case = Case {
            heads: 2,
            kv_heads: 1,
            seq_q: 9,
            seq_k: 4,
            d_qk: 16,
            d_v: 16,
            causal: true,
            sinks: true,
            ..BASE
        };
        let p = case.attention();
        let x = inputs(&case, 7);
        let (out, lse) = forward(&p, &x.q, &x.k, &x.v, None, x.sinks.as_deref());
        let sinks = x.sinks.unwrap();
        for h in 0..2 {
            for row in 0..5 {
                assert_eq!(lse[h * 9 + row], sinks[h]);
                assert!(out[(h * 9 + row) * 16..][..16].iter().all(|&x| x == 0.0));
            }
        }
    }

    #[test]
    fn empty_sequences() {
        // No keys: every row is masked (or takes its sink), gradients are zero.
        let case = Case {
            heads: 2,
            seq_q: 3,
            seq_k: 0,
            ..BASE
        };
        let p = case.attention();
        let x = inputs(&case, 3);
        let (out, lse) = forward(&p, &x.q, &x.k, &x.v, None, None);
        assert!(out.iter().all(|&x| x == 0.0) && lse.iter().all(|&l| l == MASKED));
        let (out, lse) = forward(&p, &x.q, &x.k, &x.v, None, Some(&[0.5, -1.0]));
        assert!(out.iter().all(|&x| x == 0.0));
        assert_eq!(lse, [0.5, 0.5, 0.5, -1.0, -1.0, -1.0]);
        let delta = backward_deltas(&p, &out, &x.grad);
        let (dq, dk, dv) = backward(&p, &x.q, &x.k, &x.v, &delta, &lse, &x.grad, None);
        assert!(dq.iter().all(|&x| x == 0.0) && dk.is_empty() && dv.is_empty());
        // No queries.
        let case = Case {
            seq_q: 0,
            seq_k: 5,
            ..BASE
        };
        let p = case.attention();
        let x = inputs(&case, 4);
        let (out, lse) = forward(&p, &x.q, &x.k, &x.v, None, None);
        assert!(out.is_empty() && lse.is_empty());
        let delta = backward_deltas(&p, &out, &x.grad);
        let (dq, dk, dv) = backward(&p, &x.q, &x.k, &x.v, &delta, &lse, &x.grad, None);
        assert!(dq.is_empty() && dk.iter().all(|&x| x == 0.0) && dv.iter().all(|&x| x == 0.0));
    }

    #[test]
    fn backward_is_deterministic() {
        let case = Case {
            batch: 2,
            heads: 4,
            kv_heads: 2,
            seq_q: 300,
            seq_k: 300,
            d_qk: 64,
            d_v: 64,
            causal: true,
            padding: Padding::Random,
            ..BASE
        };
        let p = case.attention();
        let x = inputs(&case, 99);
        let (out, lse) = forward(&p, &x.q, &x.k, &x.v, x.padding.as_deref(), None);
        let delta = backward_deltas(&p, &out, &x.grad);
        let first = backward(
            &p,
            &x.q,
            &x.k,
            &x.v,
            &delta,
            &lse,
            &x.grad,
            x.padding.as_deref(),
        );
        for _ in 0..3 {
            let (out2, lse2) = forward(&p, &x.q, &x.k, &x.v, x.padding.as_deref(), None);
            assert!(
                out.iter()
                    .zip(&out2)
                    .all(|(a, b)| a.to_bits() == b.to_bits())
            );
            assert!(
                lse.iter()
                    .zip(&lse2)
                    .all(|(a, b)| a.to_bits() == b.to_bits())
            );
            let again = backward(
                &p,
                &x.q,
                &x.k,
                &x.v,
                &backward_deltas(&p, &out, &x.grad),
                &lse,
                &x.grad,
                x.padding.as_deref(),
            );
            for (a, b) in [
                (&first.0, &again.0),
                (&first.1, &again.1),
                (&first.2, &again.2),
            ] {
                assert!(a.iter().zip(b).all(|(x, y)| x.to_bits() == y.to_bits()));
            }
        }
    }

    #[test]
    fn exp_and_tanh_are_accurate() {
        fn check<const FMA: bool>() {
            let (mut worst_exp, mut worst_tanh) = (0.0f64, 0.0f64);
            let mut x = -87.0f32;
            while x < 88.0 {
                let exact = (x as f64).exp();
                worst_exp = worst_exp.max(((exp::<FMA>(x) as f64 - exact) / exact).abs());
                let t = x / 8.0;
                let exact = (t as f64).tanh();
                if exact != 0.0 {
                    worst_tanh = worst_tanh.max(((tanh::<FMA>(t) as f64 - exact) / exact).abs());
                }
                x += 0.001_37;
            }
            assert!(worst_exp < 3e-7, "exp: {worst_exp:e}");
            assert!(worst_tanh < 5e-7, "tanh: {worst_tanh:e}");
            assert_eq!(exp::<FMA>(f32::NEG_INFINITY), 0.0);
            assert_eq!(exp::<FMA>(0.0), 1.0);
            assert_eq!(tanh::<FMA>(50.0), 1.0);
            assert_eq!(tanh::<FMA>(-50.0), -1.0);
        }
        check::<false>();
        #[cfg(target_arch = "x86_64")]
        if Isa::detect() != Isa::Baseline {
            #[target_feature(enable = "avx2,fma")]
            fn with_fma() {
                check::<true>()
            }
            // SAFETY: the CPU has AVX2 and FMA.
            unsafe { with_fma() }
        }
    }

    /// One [`gemm`] call's operands but `C` (see [`gemm`] for their meaning).
    struct Product<'a> {
        m: usize,
        n: usize,
        cols: usize,
        a: &'a [f32],
        ars: usize,
        ats: usize,
        b: &'a [f32],
        ldb: usize,
        ldc: usize,
        accumulate: bool,
    }

    impl Product<'_> {
        /// Runs the product into `c` as the build for `isa` compiles it (`isa` must be
        /// available).
        fn run(&self, isa: Isa, c: &mut [f32]) {
            #[inline(always)]
            fn with<const FMA: bool, const WIDE: bool>(p: &Product, c: &mut [f32]) {
                let Product {
                    m,
                    n,
                    cols,
                    a,
                    ars,
                    ats,
                    b,
                    ldb,
                    ldc,
                    accumulate,
                } = *p;
                gemm::<FMA, WIDE>(m, n, cols, a, ars, ats, b, ldb, c, ldc, accumulate)
            }
            #[cfg(target_arch = "x86_64")]
            #[target_feature(enable = "avx2,fma")]
            fn avx2(p: &Product, c: &mut [f32]) {
                with::<true, false>(p, c)
            }
            #[cfg(target_arch = "x86_64")]
            #[target_feature(enable = "avx512f,avx2,fma")]
            fn avx512(p: &Product, c: &mut [f32]) {
                with::<true, true>(p, c)
            }
            match isa {
                Isa::Baseline => with::<false, false>(self, c),
                // SAFETY: the caller checked that the CPU has AVX2 and FMA.
                #[cfg(target_arch = "x86_64")]
                Isa::Avx2Fma => unsafe { avx2(self, c) },
                // SAFETY: the caller checked that the CPU has AVX-512, AVX2 and FMA.
                #[cfg(target_arch = "x86_64")]
                Isa::Avx512 => unsafe { avx512(self, c) },
            }
        }
    }

    #[test]
    fn gemm_matches_naive_products() {
        let isas: &[Isa] = match Isa::detect() {
            Isa::Baseline => &[Isa::Baseline],
            #[cfg(target_arch = "x86_64")]
            Isa::Avx2Fma => &[Isa::Baseline, Isa::Avx2Fma],
            #[cfg(target_arch = "x86_64")]
            Isa::Avx512 => &[Isa::Baseline, Isa::Avx2Fma, Isa::Avx512],
        };
        let mut rng = Rng(5);
        // Shapes that take every strip height (8, 6, 4, 1 rows) and tile width (32,
        // 16, 8 and fewer columns) of every build.
        for (m, n, cols) in [
            (1, 1, 1),
            (3, 5, 7),
            (4, 64, 16),
            (9, 13, 40),
            (64, 64, 64),
            (5, 3, 25),
            (13, 7, 61),
            (17, 9, 96),
            (64, 33, 128),
            (23, 2, 88),
        ] {
            for transposed in [false, true] {
                // A's rows contiguous, or its columns (as `Pᵀ` and `dSᵀ` are read).
                let (ars, ats) = if transposed { (1, m + 2) } else { (n + 2, 1) };
                let a = rng.vec(m.max(n) * (m.max(n) + 2), 1.0);
                let b = rng.vec(n * (cols + 3), 1.0);
                let c0 = rng.vec(m * (cols + 1), 1.0);
                for accumulate in [false, true] {
                    let mut fused: Option<Vec<f32>> = None;
                    for &isa in isas {
                        let mut c = c0.clone();
                        let (ldb, ldc) = (cols + 3, cols + 1);
                        let product = Product {
                            m,
                            n,
                            cols,
                            a: &a,
                            ars,
                            ats,
                            b: &b,
                            ldb,
                            ldc,
                            accumulate,
                        };
                        product.run(isa, &mut c);
                        let case = format!("{isa:?} ({m},{n},{cols}) transposed {transposed}");
                        for r in 0..m {
                            for j in 0..cols + 1 {
                                let got = c[r * ldc + j];
                                if j == cols {
                                    assert_eq!(got, c0[r * ldc + j], "{case}: column past the end");
                                    continue;
                                }
                                let mut expected = if accumulate {
                                    c0[r * ldc + j] as f64
                                } else {
                                    0.0
                                };
                                for t in 0..n {
                                    expected += a[r * ars + t * ats] as f64 * b[t * ldb + j] as f64;
                                }
                                assert!((got as f64 - expected).abs() < 1e-4, "{case} [{r}][{j}]");
                            }
                        }
                        // The FMA builds' register tiles differ in shape, not in
                        // arithmetic: the same bits.
                        if isa != Isa::Baseline {
                            match &fused {
                                None => fused = Some(c),
                                Some(first) => assert!(
                                    first
                                        .iter()
                                        .zip(&c)
                                        .all(|(x, y)| x.to_bits() == y.to_bits()),
                                    "{case}: differs from the AVX2 build"
                                ),
                            }
                        }
                    }
                }
            }
        }
    }
}
