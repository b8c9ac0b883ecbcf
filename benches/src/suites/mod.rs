//! The benchmarks, one module per subject. Each suite turns a [`Mode`] and a backend
//! into [`Job`]s; the runner executes every job in a child process of its own (so a
//! crash or an out-of-memory failure costs one job, and peak memory is the job's own)
//! and collects the [`Record`]s it prints.

use serde::{Deserialize, Serialize};

use crate::measure::Runs;
use crate::record::Record;

pub mod attention;
pub mod blocks;
pub mod generation;
pub mod kv_cache;
pub mod train_step;

/// How much to measure.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Mode {
    /// About five minutes on two cores: small grids, few runs.
    Quick,
    /// The whole grid (long sequences, both head sizes, more runs).
    Full,
}

impl Mode {
    /// Warm-up and timed runs per cell.
    pub fn runs(self) -> Runs {
        match self {
            Mode::Quick => Runs::new(1, 3),
            Mode::Full => Runs::new(2, 7),
        }
    }

    /// Warm-up and timed runs of a whole-model cell (a training step, a prefill):
    /// fewer, as each run is long.
    pub fn model_runs(self) -> Runs {
        match self {
            // Three timed runs: the whole-model cells of the emulated GPU take seconds
            // a run, and the quick mode has about five minutes in all; the median of
            // two would be the slower one (on lavapipe, up to 1.6 times the faster).
            Mode::Quick => Runs::new(1, 3),
            Mode::Full => Runs::new(3, 10),
        }
    }

    /// `quick` or `full`.
    pub fn name(self) -> &'static str {
        match self {
            Mode::Quick => "quick",
            Mode::Full => "full",
        }
    }
}

/// The suites, in the order the runner runs and reports them.
pub const SUITES: &[&str] = &[
    "attention",
    "blocks",
    "kv_cache",
    "generation",
    "train_step",
];

/// One unit of work, run in its own process.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(tag = "suite", rename_all = "snake_case")]
pub enum Job {
    /// One attention cell.
    Attention(attention::Cell),
    /// One building block on one backend.
    Blocks(blocks::Case),
    /// One cache kind at one context length.
    KvCache(kv_cache::Case),
    /// One model cache kind at one context length: prefill and decode.
    Generation(generation::Case),
    /// One model size and attention path: a whole training step.
    TrainStep(train_step::Case),
}

impl Job {
    /// Every job of `suite` on `backend`.
    pub fn all(suite: &str, mode: Mode, backend: &str) -> Vec<Job> {
        match suite {
            "attention" => attention::jobs(mode, backend),
            "blocks" => blocks::jobs(mode, backend),
            "kv_cache" => kv_cache::jobs(mode, backend),
            "generation" => generation::jobs(mode, backend),
            "train_step" => train_step::jobs(mode, backend),
            _ => Vec::new(),
        }
    }

    /// Runs the job in this process.
    ///
    /// # Errors
    /// Why the job could not be measured.
    pub fn run(&self) -> Result<Vec<Record>, String> {
        match self {
            Job::Attention(cell) => cell.run().map(|record| vec![record]),
            Job::Blocks(case) => case.run(),
            Job::KvCache(case) => case.run(),
            Job::Generation(case) => case.run(),
            Job::TrainStep(case) => case.run(),
        }
    }

    /// Records with every number unset, marked with `reason`: what the report shows
    /// for a job that failed or was skipped.
    pub fn failed(&self, reason: &str) -> Vec<Record> {
        let records = match self {
            Job::Attention(cell) => vec![cell.record()],
            Job::Blocks(case) => case.records(),
            Job::KvCache(case) => vec![case.record()],
            Job::Generation(case) => case.records(),
            Job::TrainStep(case) => vec![case.record()],
        };
        records
            .into_iter()
            .map(|record| record.failed(reason))
            .collect()
    }

    /// A short description for progress lines.
    pub fn describe(&self) -> String {
        match self {
            Job::Attention(cell) => cell.describe(),
            Job::Blocks(case) => case.describe(),
            Job::KvCache(case) => case.describe(),
            Job::Generation(case) => case.describe(),
            Job::TrainStep(case) => case.describe(),
        }
    }

    /// Whether the quick mode leaves this job out on an adapter that emulates the GPU on
    /// the CPU (lavapipe, llvmpipe): the largest cells of the suites whose runs take
    /// seconds there (forward attention at 2048, generation at context 2048, the medium
    /// training step), which made up half of a quick run on two cores. The smaller cells
    /// of the same suites still run, `--full` runs these, and the report lists them
    /// under "Not measured".
    pub fn left_out_of_quick_on_emulated_gpu(&self) -> bool {
        match self {
            Job::Attention(cell) => !cell.backward && cell.seq >= 2048,
            Job::Generation(case) => case.context >= 2048,
            Job::TrainStep(case) => case.size == train_step::Size::Medium,
            Job::Blocks(_) | Job::KvCache(_) => false,
        }
    }

    /// The backend the job runs on.
    pub fn backend(&self) -> &str {
        match self {
            Job::Attention(cell) => &cell.backend,
            Job::Blocks(case) => &case.backend,
            Job::KvCache(case) => &case.backend,
            Job::Generation(case) => &case.backend,
            Job::TrainStep(case) => &case.backend,
        }
    }

    /// Why the runner should not start this job, if it should not (a naive
    /// attention cell that would need more memory than the budget).
    pub fn skip_reason(&self, memory_budget: u64) -> Option<String> {
        match self {
            Job::Attention(cell) => cell.skip_reason(memory_budget),
            _ => None,
        }
    }
}

/// The device of a backend name (`flex`, `ndarray`, `wgpu`, `cuda`).
///
/// # Errors
/// When this build lacks the backend.
pub fn device_named(name: &str) -> Result<burn::tensor::Device, String> {
    burn_transformer::device::parse_device(name).map_err(|error| error.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quick_mode_on_an_emulated_gpu_keeps_every_suite_and_leaves_out_only_its_largest_cells() {
        for suite in SUITES {
            let jobs = Job::all(suite, Mode::Quick, "wgpu");
            let kept: Vec<&Job> = jobs
                .iter()
                .filter(|job| !job.left_out_of_quick_on_emulated_gpu())
                .collect();
            assert!(!kept.is_empty(), "{suite} would measure nothing");
            for job in jobs
                .iter()
                .filter(|job| job.left_out_of_quick_on_emulated_gpu())
            {
                let line = job.describe();
                assert!(
                    line.contains("seq 2048")
                        || line.contains("context 2048")
                        || line.contains("medium"),
                    "{line}"
                );
            }
        }
        // The runner matches a job to its backend's adapter by this name.
        for suite in SUITES {
            for job in Job::all(suite, Mode::Quick, "ndarray") {
                assert_eq!(job.backend(), "ndarray", "{}", job.describe());
            }
        }
    }
}
