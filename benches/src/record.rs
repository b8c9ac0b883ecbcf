//! One measurement as a JSON line, in the format of DESIGN.md plus a few optional
//! fields that some benchmarks need (throughput, cache sizes, why a cell did not run).

use serde::{Deserialize, Serialize};

/// One measured cell: one benchmark, implementation, backend, shape and pass.
///
/// The first twelve fields are DESIGN.md's format and always present; the rest are
/// written only when set.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Record {
    /// Which benchmark: `attention`, `rms_norm`, `rope`, `swiglu`, `moe_dispatch`,
    /// `train_step`, `prefill`, `decode`, `kv_cache`.
    pub bench: String,
    /// Which implementation or variant: `fused`, `reference`, `burn`, `ours`, a model
    /// size, a cache kind.
    #[serde(rename = "impl")]
    pub implementation: String,
    /// `flex`, `ndarray`, `wgpu` or `cuda`.
    pub backend: String,
    /// Batch size.
    pub batch: usize,
    /// Query heads (0 where the benchmark has none).
    pub heads: usize,
    /// Key/value heads (0 where the benchmark has none).
    pub kv_heads: usize,
    /// Sequence length (the context length for decoding).
    pub seq: usize,
    /// Head width, or the feature width of a building block.
    pub head_dim: usize,
    /// Causal masking.
    pub causal: bool,
    /// `fwd` or `fwd_bwd` (a training step counts as `fwd_bwd`).
    pub pass: String,
    /// Median wall time of the timed runs, in milliseconds.
    pub ms_median: Option<f64>,
    /// Fastest timed run, in milliseconds.
    pub ms_min: Option<f64>,
    /// Peak memory of the cell, in bytes (see `peak_method`).
    pub peak_bytes: Option<u64>,
    /// How `peak_bytes` was measured.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub peak_method: Option<String>,
    /// Tokens per second at the median time (training and generation).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tokens_per_s: Option<f64>,
    /// Bytes of KV cache per token, over all layers.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bytes_per_token: Option<u64>,
    /// Model width.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub d_model: Option<usize>,
    /// Number of parameters.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub params: Option<usize>,
    /// Number of timed runs behind the median.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub runs: Option<usize>,
    /// Max |output − peer output| on the first timed inputs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub check_error: Option<f64>,
    /// The peer the output was checked against.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub checked_against: Option<String>,
    /// Element type of the inputs (`f32`, `bf16`, `f16`); a record without one
    /// measured f32.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dtype: Option<String>,
    /// The variant of an implementation that has several: our fused kernel's family on
    /// a CubeCL device (`register`, `staged`, `tensor-cores`, `fragments`), the backend
    /// PyTorch's `scaled_dot_product_attention` ran (`flash`, `efficient`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kernel: Option<String>,
    /// Arithmetic rate at the median time, TFLOP/s, counted as FlashAttention's papers
    /// count it (see `attention::flops`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tflops: Option<f64>,
    /// Why the cell did not run (out of memory, unsupported, skipped, timed out).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub failure: Option<String>,
    /// The machine that measured the cell: its CPU, and the adapter of a GPU backend
    /// (runs on several machines share one results file).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub machine: Option<String>,
    /// Start of the run that measured the cell (UTC, `YYYY-MM-DD HH:MM`): partial runs
    /// keep earlier records, so one report can join several runs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub run: Option<String>,
}

impl Record {
    /// A record of `bench` / `implementation` on `backend` with every number unset.
    pub fn new(bench: &str, implementation: &str, backend: &str) -> Self {
        Self {
            bench: bench.into(),
            implementation: implementation.into(),
            backend: backend.into(),
            pass: "fwd".into(),
            ..Self::default()
        }
    }

    /// Stores the timing's median and minimum.
    pub fn with_timing(mut self, timing: &crate::measure::Timing) -> Self {
        self.ms_median = Some(timing.median_ms);
        self.ms_min = Some(timing.min_ms);
        self.runs = Some(timing.runs());
        self
    }

    /// The same record, marked as not measured for `reason`.
    pub fn failed(mut self, reason: impl Into<String>) -> Self {
        self.failure = Some(reason.into());
        self
    }

    /// Whether `other` measures the same cell: everything but the numbers agrees.
    pub fn same_cell(&self, other: &Record) -> bool {
        self.bench == other.bench
            && self.implementation == other.implementation
            && self.backend == other.backend
            && (self.batch, self.heads, self.kv_heads) == (other.batch, other.heads, other.kv_heads)
            && (self.seq, self.head_dim, self.causal) == (other.seq, other.head_dim, other.causal)
            && self.pass == other.pass
            && self.d_model == other.d_model
            && self.dtype_name() == other.dtype_name()
            && self.kernel == other.kernel
    }

    /// The inputs' element type: `dtype`, or `f32` where the record has none.
    pub fn dtype_name(&self) -> &str {
        self.dtype.as_deref().unwrap_or("f32")
    }

    /// Whether the cell produced a time.
    pub fn measured(&self) -> bool {
        self.failure.is_none() && self.ms_median.is_some()
    }
}

/// The name of an element type in records and kernel lists: `f32`, `bf16`, `f16`.
pub fn dtype_name(dtype: burn::tensor::DType) -> &'static str {
    use burn::tensor::DType;
    match dtype {
        DType::F32 => "f32",
        DType::F16 => "f16",
        DType::BF16 => "bf16",
        _ => "other",
    }
}

/// Reads records from JSON lines, skipping blank lines.
///
/// # Errors
/// The line number and serde's message for a malformed line.
pub fn parse_lines(text: &str) -> Result<Vec<Record>, String> {
    text.lines()
        .enumerate()
        .filter(|(_, line)| !line.trim().is_empty())
        .map(|(index, line)| {
            serde_json::from_str(line).map_err(|error| format!("line {}: {error}", index + 1))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn design_fields_are_always_written_and_extras_only_when_set() {
        let record = Record::new("attention", "fused", "wgpu");
        let line = serde_json::to_string(&record).unwrap();
        for key in [
            "bench",
            "impl",
            "backend",
            "batch",
            "heads",
            "kv_heads",
            "seq",
            "head_dim",
            "causal",
            "pass",
            "ms_median",
            "ms_min",
            "peak_bytes",
        ] {
            assert!(
                line.contains(&format!("\"{key}\":")),
                "{key} missing in {line}"
            );
        }
        assert!(!line.contains("tokens_per_s"), "{line}");
        assert_eq!(parse_lines(&format!("{line}\n\n")).unwrap(), vec![record]);
    }
}
