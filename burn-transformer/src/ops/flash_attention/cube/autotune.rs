//! Choosing the kernels by timing them: the first call of a shape class on a device
//! runs every candidate (staged tiles of at most 64, 32 and 16 rows and keys, and on
//! CPU runtimes register tiles) on the call's own tensors, keeps the fastest for that
//! class, and later calls of the class run it directly. Forward and backward are tuned
//! apart: their kernels differ and so may their winners.
//!
//! CubeCL's tuner does the timing (on the device's clock where the runtime has one)
//! and the bookkeeping; the cache lives for the process. The shape class keeps every
//! dimension that decides which tiles fit (element type, head dims) exactly and rounds
//! the sizes up to powers of two, so a winner runs on every shape of its class: each
//! candidate falls back to register tiles where its staged tiles do not fit, and no
//! candidate can fail.

use burn::tensor::DType;
use burn_cubecl::CubeTuneId;
use burn_cubecl::tensor::CubeTensor;
use cubecl::AutotuneKey;
use cubecl::tune::{LocalTuner, Tunable, TunableSet, local_tuner};
use serde::{Deserialize, Serialize};

use super::super::{Problem, ScoreOptions};
use super::launch::{BackwardTensors, Family, ForwardTensors, backward_with, forward_with};
use super::tiling::{STAGED_BLOCK_LIMITS, StagedProduct, is_cpu_runtime};

/// The shape class of one call: what its timing depends on.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize, AutotuneKey)]
pub(super) struct ShapeClass {
    dtype: DType,
    d_qk: usize,
    d_v: usize,
    #[autotune(anchor)]
    batch_heads: usize,
    #[autotune(anchor)]
    group: usize,
    #[autotune(anchor)]
    seq_q: usize,
    #[autotune(anchor)]
    seq_k: usize,
    causal: bool,
    windowed: bool,
    chunked: bool,
}

impl ShapeClass {
    fn of(problem: &Problem, dtype: DType) -> Self {
        Self::new(
            dtype,
            problem.d_qk,
            problem.d_v,
            problem.batch * problem.heads,
            problem.group(),
            problem.seq_q,
            problem.seq_k,
            problem.mask.causal,
            problem.mask.window.is_some(),
            problem.mask.chunk.is_some(),
        )
    }
}

/// One candidate of the tuning.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Candidate {
    /// The staged kernels (plain tile products) with tiles of at most this many rows
    /// and keys.
    Staged(usize),
    /// The register-tile kernels.
    RegisterTile,
}

impl Candidate {
    /// Every candidate on a device with `properties`; the first is the default while
    /// a class is being tuned on another thread.
    ///
    /// Register tiles compete on CPU runtimes only. On a GPU each of their units holds
    /// one row (or a lane's share of it) and streams every key from global memory,
    /// where the staged tiles stage a key tile once for the whole cube, so timing them
    /// would only lengthen the first call of each shape class; where no staged tile
    /// fits the device, every staged candidate runs register tiles anyway.
    pub(crate) fn all(properties: &cubecl::ir::DeviceProperties) -> Vec<Self> {
        let register = is_cpu_runtime(properties).then_some(Self::RegisterTile);
        STAGED_BLOCK_LIMITS
            .into_iter()
            .map(Self::Staged)
            .chain(register)
            .collect()
    }

    /// The name the tuner logs.
    pub(super) fn name(self) -> String {
        match self {
            Self::Staged(block) => format!("staged-{block}"),
            Self::RegisterTile => "register".into(),
        }
    }

    /// The kernels this candidate runs `problem` with on a device with `properties`.
    fn family(
        self,
        problem: &Problem,
        dtype: DType,
        properties: &cubecl::ir::DeviceProperties,
    ) -> Family {
        let (product, max_block) = match self {
            Self::Staged(block) => (Some(StagedProduct::Plain), block),
            Self::RegisterTile => (None, 0),
        };
        Family::staged_or_register(problem, dtype, product, max_block, properties)
    }
}

/// Candidate runs per shape class (tests: a class is timed once, then served from the
/// cache; counted per class so that tests running beside each other do not mix).
#[cfg(test)]
static CANDIDATE_RUNS: std::sync::LazyLock<
    std::sync::Mutex<std::collections::HashMap<ShapeClass, usize>>,
> = std::sync::LazyLock::new(Default::default);

/// How many times candidates ran for the shape class of `problem` in `dtype`.
#[cfg(test)]
pub(crate) fn candidate_runs(problem: &Problem, dtype: DType) -> usize {
    let runs = CANDIDATE_RUNS
        .lock()
        .unwrap_or_else(|poison| poison.into_inner());
    runs.get(&ShapeClass::of(problem, dtype))
        .copied()
        .unwrap_or(0)
}

static FORWARD: LocalTuner<ShapeClass, CubeTuneId> = local_tuner!("flash-attention-forward");
static BACKWARD: LocalTuner<ShapeClass, CubeTuneId> = local_tuner!("flash-attention-backward");

/// The forward through the fastest candidate of its shape class.
pub(super) fn forward(problem: Problem, options: ScoreOptions, tensors: ForwardTensors) {
    run_fastest(&FORWARD, problem, options, tensors, forward_with);
}

/// The backward through the fastest candidate of its shape class.
pub(super) fn backward(problem: Problem, options: ScoreOptions, tensors: BackwardTensors) {
    run_fastest(&BACKWARD, problem, options, tensors, backward_with);
}

/// The tensors of one pass: what the candidates read and write.
pub(super) trait PassTensors: Clone + Send + Sync + 'static {
    /// The queries, whose device, client and element type are the call's.
    fn queries(&self) -> &CubeTensor;
}

impl PassTensors for ForwardTensors {
    fn queries(&self) -> &CubeTensor {
        &self.q
    }
}

impl PassTensors for BackwardTensors {
    fn queries(&self) -> &CubeTensor {
        &self.q
    }
}

/// Runs one pass (`launch` with a candidate's kernels) through `tuner`: timing every
/// candidate on the first call of the shape class, the cached winner after.
fn run_fastest<T: PassTensors>(
    tuner: &'static LocalTuner<ShapeClass, CubeTuneId>,
    problem: Problem,
    options: ScoreOptions,
    tensors: T,
    launch: fn(Family, &Problem, &ScoreOptions, &T),
) {
    let client = tensors.queries().client.clone();
    let id = CubeTuneId::new(&client, &tensors.queries().device);
    let device_client = client.clone();
    let set = tuner.init(&id, move || {
        let class = |(tensors, problem, _): &(T, Problem, ScoreOptions)| {
            ShapeClass::of(problem, tensors.queries().dtype)
        };
        // Candidates write the call's own outputs: each writes all of them.
        let mut set = TunableSet::new(
            class,
            |_: &ShapeClass, inputs: &(T, Problem, ScoreOptions)| inputs.clone(),
        );
        for candidate in Candidate::all(device_client.properties()) {
            set = set.with(Tunable::new(
                &candidate.name(),
                move |(tensors, problem, options): (T, Problem, ScoreOptions)| {
                    let queries = tensors.queries();
                    count_run(&problem, queries.dtype);
                    let properties = queries.client.properties();
                    let family = candidate.family(&problem, queries.dtype, properties);
                    launch(family, &problem, &options, &tensors);
                    Ok::<(), String>(())
                },
            ));
        }
        set
    });
    tuner.execute(&id, &client, set, (tensors, problem, options));
}

#[cfg_attr(not(test), allow(unused_variables))]
fn count_run(problem: &Problem, dtype: DType) {
    #[cfg(test)]
    {
        let mut runs = CANDIDATE_RUNS
            .lock()
            .unwrap_or_else(|poison| poison.into_inner());
        *runs.entry(ShapeClass::of(problem, dtype)).or_default() += 1;
    }
}

#[cfg(test)]
mod tests {
    use super::super::variants::tests::gpu;
    use super::*;

    /// GPUs time the staged tiles alone; CPU runtimes (named as Mesa names
    /// lavapipe) time register tiles beside them.
    #[test]
    fn register_tiles_compete_on_cpu_runtimes_only() {
        let gpu = gpu();
        assert_eq!(
            Candidate::all(&gpu),
            STAGED_BLOCK_LIMITS.map(Candidate::Staged).to_vec()
        );
        let mut lavapipe = gpu;
        lavapipe.identity.name = "llvmpipe (LLVM 15.0.6, 256 bits)".to_string();
        let candidates = Candidate::all(&lavapipe);
        assert_eq!(candidates.last(), Some(&Candidate::RegisterTile));
        assert_eq!(candidates.len(), STAGED_BLOCK_LIMITS.len() + 1);
    }
}
