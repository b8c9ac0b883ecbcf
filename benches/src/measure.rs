//! Timing and memory measurement shared by every benchmark.
//!
//! The rules, so that no number flatters an implementation:
//! - warm-up runs first (kernel compilation, allocator pools, a GPU's clocks), then the
//!   median of the timed runs; short runs repeat until both add up to a floor of time
//!   (see [`time_runs`]);
//! - every run gets fresh inputs, made and synced before the clock starts, so no
//!   backend can serve a cached result;
//! - the clock stops only after a scalar of the result was read back to the host and
//!   the device synced, so lazy and asynchronous backends finish their work inside it;
//! - on the CPU backends every core is busy when the clock starts (see
//!   [`busy_cores`]), as in a training loop.

use std::time::Instant;

use burn::tensor::{Device, Tensor};
use burn_transformer::device::backend_name;

/// Warm-up and timed run counts.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Runs {
    /// Untimed runs first.
    pub warmup: usize,
    /// Timed runs; the median is reported.
    pub iters: usize,
}

impl Runs {
    /// `warmup` untimed runs, then `iters` timed ones.
    pub fn new(warmup: usize, iters: usize) -> Self {
        Self { warmup, iters }
    }
}

/// The timed runs of one cell.
#[derive(Clone, Debug, PartialEq)]
pub struct Timing {
    /// Median wall time, milliseconds.
    pub median_ms: f64,
    /// Fastest run, milliseconds.
    pub min_ms: f64,
    /// Every timed run, milliseconds, in order.
    pub samples_ms: Vec<f64>,
}

impl Timing {
    /// Median and minimum of `samples_ms` (the upper median for an even count).
    ///
    /// # Panics
    /// If there are no samples.
    pub fn from_samples(samples_ms: Vec<f64>) -> Self {
        assert!(!samples_ms.is_empty(), "a timing needs at least one run");
        let mut sorted = samples_ms.clone();
        sorted.sort_by(f64::total_cmp);
        Self {
            median_ms: sorted[sorted.len() / 2],
            min_ms: sorted[0],
            samples_ms,
        }
    }

    /// Number of timed runs.
    pub fn runs(&self) -> usize {
        self.samples_ms.len()
    }
}

/// Times `run` on fresh inputs from `setup`: `runs.warmup` untimed runs, then
/// `runs.iters` timed ones (fewer for very long runs: see `TIMED_BUDGET_MS`). Runs
/// shorter than the floors repeat: warm-ups until they add up to `WARMUP_FLOOR_MS`,
/// timed runs until `TIMED_FLOOR_MS`, each at most `SHORT_RUNS_MAX` times. The device
/// is synced after `setup`, outside the clock; `run` must end by reading a result back
/// (see [`finish`]).
///
/// # Errors
/// The first error of `setup`, `run` or the device sync.
pub fn time_runs<I>(
    device: &Device,
    runs: Runs,
    mut setup: impl FnMut() -> Result<I, String>,
    mut run: impl FnMut(I) -> Result<(), String>,
) -> Result<Timing, String> {
    let on_cpu = matches!(backend_name(device), "flex" | "ndarray");
    let mut samples = Vec::with_capacity(runs.iters);
    let (mut warmups, mut warmup_ms) = (0, 0.0);
    let mut warming = runs.warmup > 0;
    loop {
        let inputs = setup()?;
        device
            .sync()
            .map_err(|error| format!("device sync: {error:?}"))?;
        if on_cpu {
            busy_cores();
        }
        let start = Instant::now();
        run(inputs)?;
        let elapsed = start.elapsed().as_secs_f64() * 1e3;
        if warming {
            (warmups, warmup_ms) = (warmups + 1, warmup_ms + elapsed);
            // One warm-up compiles kernels and fills pools; after a long one, more
            // would only cost minutes. Short ones go on until a GPU has left its
            // idle clocks (each cell runs in a process of its own, after seconds of
            // kernel compilation).
            warming = elapsed <= LONG_RUN_MS
                && (warmups < runs.warmup
                    || (warmup_ms < WARMUP_FLOOR_MS && warmups < SHORT_RUNS_MAX));
            continue;
        }
        samples.push(elapsed);
        let timed_ms = samples.iter().sum::<f64>();
        let enough = samples.len() >= runs.iters.max(1)
            && (timed_ms >= TIMED_FLOOR_MS || samples.len() >= SHORT_RUNS_MAX);
        if enough || timed_ms > TIMED_BUDGET_MS {
            break;
        }
    }
    Ok(Timing::from_samples(samples))
}

/// Keeps every thread of the rayon pool that flex and ndarray compute on busy for
/// [`BUSY_CORES_MS`]. Inputs are made on one thread, so the other cores idle before
/// each timed run, and on the 2-core virtual machines these numbers come from an idle
/// core runs the next few milliseconds at about half speed: a tiled CPU flash-attention
/// forward that took 5.8 ms when called back to back took 11.8 ms after 20 ms of idle
/// cores, 11.4 ms after 1 ms of busy cores and 6.2 ms after 10 ms of them. The timed
/// runs measure the cores as a training loop keeps them. The PyTorch peer does the
/// same on the CPU (`benches/attention_torch.py`).
fn busy_cores() {
    rayon::broadcast(|_| {
        let start = Instant::now();
        while start.elapsed().as_secs_f64() * 1e3 < BUSY_CORES_MS {
            std::hint::spin_loop();
        }
    });
}

/// How long [`busy_cores`] keeps the cores busy, ms.
const BUSY_CORES_MS: f64 = 10.0;

/// A run this long (ms) needs no second warm-up.
const LONG_RUN_MS: f64 = 10_000.0;

/// Warm-ups go on until they add up to this much (ms): a sub-millisecond GPU cell's
/// single warm-up left the clocks low (on an H100, the first cell of a batch took
/// 1.3 times the time of the same cell in a later batch).
const WARMUP_FLOOR_MS: f64 = 200.0;
/// Timed runs go on until they add up to this much (ms), so that a short cell's median
/// rests on more than a handful of runs.
const TIMED_FLOOR_MS: f64 = 100.0;
/// Most warm-ups, and most timed runs, that the floors add.
const SHORT_RUNS_MAX: usize = 50;

/// Timed runs stop once they add up to this much (ms), however many were asked for:
/// the long cells of the full grid (seq 8192 on a CPU-emulated GPU) take minutes a run.
/// The record keeps every sample, so the report shows how many runs a median has.
const TIMED_BUDGET_MS: f64 = 60_000.0;

/// Reads one element of `tensor` back to the host and syncs its device: the end of
/// every timed run. Returns the element (callers may check it is finite).
///
/// # Errors
/// When the read or the sync fails.
pub fn finish<const D: usize>(tensor: Tensor<D>) -> Result<f32, String> {
    let device = tensor.device();
    let ranges: [std::ops::Range<usize>; D] = std::array::from_fn(|_| 0..1);
    let value = tensor
        .slice(ranges)
        .into_data()
        .convert::<f32>()
        .try_to_vec::<f32>()
        .map_err(|error| format!("reading a result: {error:?}"))?
        .first()
        .copied()
        .unwrap_or(f32::NAN);
    device
        .sync()
        .map_err(|error| format!("device sync: {error:?}"))?;
    Ok(value)
}

/// A `/proc/self/status` field in bytes (Linux), e.g. `VmHWM` (peak resident set)
/// or `VmRSS`; `None` elsewhere.
pub fn proc_status_bytes(field: &str) -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|line| line.starts_with(field))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024)
}

/// Peak memory of a cell, measured the best way the backend allows.
///
/// On devices with a pooled allocator (wgpu, cuda) the pool's reserved bytes at their
/// high-water mark; elsewhere (flex, ndarray) the growth of the process's peak
/// resident set over the resident set when the tracker was made. Run one cell per
/// process for the second to mean anything.
#[derive(Clone, Debug)]
pub struct PeakMemory {
    device: Device,
    baseline_rss: Option<u64>,
    peak_reserved: u64,
}

impl PeakMemory {
    /// Starts tracking: call before the cell allocates its inputs.
    pub fn start(device: &Device) -> Self {
        Self {
            device: device.clone(),
            baseline_rss: proc_status_bytes("VmRSS"),
            peak_reserved: 0,
        }
    }

    /// Samples the device pool (call after each run).
    pub fn sample(&mut self) {
        if let Some(usage) = self.device.memory_pool_usage() {
            self.peak_reserved = self.peak_reserved.max(usage.bytes_reserved);
        }
    }

    /// The peak in bytes and how it was measured.
    pub fn peak(&mut self) -> (Option<u64>, &'static str) {
        self.sample();
        if self.device.memory_pool_usage().is_some() {
            (
                Some(self.peak_reserved),
                "device pool reserved bytes (high-water)",
            )
        } else {
            match (proc_status_bytes("VmHWM"), self.baseline_rss) {
                (Some(peak), Some(base)) => (
                    Some(peak.saturating_sub(base)),
                    "process peak RSS growth (VmHWM)",
                ),
                _ => (None, "not available on this platform"),
            }
        }
    }
}

/// Least-squares fit of `log y = a + b·log x`: returns the exponent `b`, or `None`
/// with fewer than two usable points (positive x and y).
pub fn log_log_slope(points: &[(f64, f64)]) -> Option<f64> {
    let logs: Vec<(f64, f64)> = points
        .iter()
        .filter(|(x, y)| *x > 0.0 && *y > 0.0 && x.is_finite() && y.is_finite())
        .map(|(x, y)| (x.ln(), y.ln()))
        .collect();
    if logs.len() < 2 {
        return None;
    }
    let n = logs.len() as f64;
    let mean_x = logs.iter().map(|p| p.0).sum::<f64>() / n;
    let mean_y = logs.iter().map(|p| p.1).sum::<f64>() / n;
    let sxx: f64 = logs.iter().map(|p| (p.0 - mean_x).powi(2)).sum();
    let sxy: f64 = logs.iter().map(|p| (p.0 - mean_x) * (p.1 - mean_y)).sum();
    (sxx > 0.0).then(|| sxy / sxx)
}

/// Max |a − b| over two tensors of one shape (infinite where either is not finite).
pub fn max_abs_diff<const D: usize>(a: Tensor<D>, b: Tensor<D>) -> f64 {
    let host = |t: Tensor<D>| {
        t.into_data()
            .convert::<f32>()
            .try_to_vec::<f32>()
            .unwrap_or_default()
    };
    let (a, b) = (host(a), host(b));
    if a.len() != b.len() {
        return f64::INFINITY;
    }
    a.iter()
        .zip(&b)
        .map(|(x, y)| {
            if x.is_finite() && y.is_finite() {
                f64::from((x - y).abs())
            } else {
                f64::INFINITY
            }
        })
        .fold(0.0, f64::max)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn median_and_minimum() {
        let timing = Timing::from_samples(vec![5.0, 1.0, 3.0, 9.0]);
        assert_eq!(
            (timing.median_ms, timing.min_ms, timing.runs()),
            (5.0, 1.0, 4)
        );
        assert_eq!(Timing::from_samples(vec![2.0, 7.0, 4.0]).median_ms, 4.0);
    }

    #[test]
    fn log_log_slope_recovers_power_laws() {
        let quadratic: Vec<(f64, f64)> = [256.0, 512.0, 1024.0, 4096.0]
            .iter()
            .map(|&n: &f64| (n, 3.0 * n * n))
            .collect();
        assert!((log_log_slope(&quadratic).unwrap() - 2.0).abs() < 1e-9);
        assert_eq!(log_log_slope(&[(1.0, 2.0)]), None);
    }

    /// Times `run_ms`-long runs (0: instant) with `runs`: how many calls, and the timing.
    fn time_sleeps(runs: Runs, run_ms: u64) -> (usize, Timing) {
        let mut calls = 0;
        let timing = time_runs(
            &Device::flex(),
            runs,
            || Ok(()),
            |()| {
                calls += 1;
                std::thread::sleep(std::time::Duration::from_millis(run_ms));
                Ok(())
            },
        )
        .unwrap();
        (calls, timing)
    }

    /// Instant runs never reach the floors: the most warm-ups and timed runs they add.
    #[test]
    fn short_runs_repeat_up_to_their_caps() {
        let (calls, timing) = time_sleeps(Runs::new(2, 3), 0);
        assert_eq!((calls, timing.runs()), (2 * SHORT_RUNS_MAX, SHORT_RUNS_MAX));
    }

    /// Runs of at least 30 ms (a sleep takes at least what it asks for): warm-ups past
    /// the one asked for until 200 ms (at most 7), timed runs until 100 ms (at most 4).
    #[test]
    fn short_runs_repeat_until_their_floors() {
        let (calls, timing) = time_sleeps(Runs::new(1, 3), 30);
        let timed: f64 = timing.samples_ms.iter().sum();
        assert!(timed >= TIMED_FLOOR_MS, "{timed} ms");
        assert!((3..=4).contains(&timing.runs()), "{}", timing.runs());
        assert!((2..=7).contains(&(calls - timing.runs())), "{calls}");
    }
}
