//! What every training program shares: the run folder, resuming from its newest
//! checkpoint, the loss history and burn-train's builder settings.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use burn::data::dataloader::DataLoader;
use burn::tensor::Device;
use burn::train::checkpoint::KeepLastNCheckpoints;
use burn::train::metric::{Adaptor, LearningRateMetric, LossMetric, Metric, Numeric};
use burn::train::{
    InferenceStep, Learner, LearnerModel, LearningResult, SequenceOutput, SupervisedTraining,
    TrainStep,
};

use super::TrainError;
use super::checkpoint::{AtomicFileCheckpointer, latest_checkpoint};
use super::progress::{History, ProgressRenderer, ProgressSettings};

/// Where and how a run writes and reports.
#[derive(Debug, Clone)]
pub struct RunOptions {
    /// The run's folder: `checkpoint/`, `history.json`, burn-train's logs.
    pub directory: PathBuf,
    /// Continue from the newest checkpoint in `directory`.
    pub resume: bool,
    /// Start a new run in a folder that holds one, removing the old run's files first
    /// (without it, a new run there is refused: see [`TrainError::RunExists`]).
    pub overwrite: bool,
    /// Print progress lines.
    pub verbose: bool,
    /// Print a training line every this many steps.
    pub log_every: usize,
    /// Let burn-train install its `experiment.log` application logger (once per
    /// process).
    pub experiment_log: bool,
}

impl RunOptions {
    /// Quiet options for `directory` (tests, benchmarks).
    pub fn quiet(directory: impl Into<PathBuf>) -> Self {
        Self {
            directory: directory.into(),
            resume: false,
            overwrite: false,
            verbose: false,
            log_every: 0,
            experiment_log: false,
        }
    }
}

/// The checkpoints folder of a run.
pub fn checkpoint_dir(directory: &Path) -> PathBuf {
    directory.join("checkpoint")
}

/// The history file of a run.
pub fn history_file(directory: &Path) -> PathBuf {
    directory.join("history.json")
}

/// What training writes in a run folder: the checkpoints, the history and burn-train's
/// metric logs.
const RUN_ENTRIES: [&str; 5] = [
    "checkpoint",
    "history.json",
    "train",
    "valid",
    "experiment.log",
];

/// Whether `directory` holds the checkpoints or history of a run.
pub fn holds_run(directory: &Path) -> bool {
    let has_checkpoints = std::fs::read_dir(checkpoint_dir(directory))
        .is_ok_and(|mut entries| entries.next().is_some());
    has_checkpoints || history_file(directory).is_file()
}

/// Removes a run from `directory`: what training writes there, and the files `outputs`
/// (names in the folder) a program wrote beside them. Anything else stays.
///
/// # Errors
/// [`TrainError::File`] naming an entry that could not be removed.
pub fn clear_run(directory: &Path, outputs: &[&str]) -> Result<(), TrainError> {
    for name in RUN_ENTRIES.iter().chain(outputs) {
        let path = directory.join(name);
        let removed = if path.is_dir() {
            std::fs::remove_dir_all(&path)
        } else {
            std::fs::remove_file(&path)
        };
        match removed {
            Err(error) if error.kind() != std::io::ErrorKind::NotFound => {
                return Err(crate::io::FileError::Write {
                    path,
                    source: error,
                }
                .into());
            }
            _ => {}
        }
    }
    Ok(())
}

/// The schedule of a run in steps.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Schedule {
    pub steps: usize,
    pub eval_interval: usize,
    pub tokens_per_step: usize,
}

impl Schedule {
    /// Train-then-validate rounds (burn-train epochs).
    pub fn rounds(&self) -> usize {
        self.steps.div_ceil(self.eval_interval.max(1))
    }
}

/// A run about to start: where it resumes and what it has done so far.
pub(crate) struct Prepared {
    /// The checkpoint epoch to load, when resuming.
    pub resumed_epoch: Option<usize>,
    /// Steps already taken.
    pub start_step: usize,
    /// The history so far (shared with the renderer).
    pub history: Arc<Mutex<History>>,
}

/// Removes stale temporary files, refuses (or, with `overwrite`, clears) an earlier run
/// when starting a new one, finds the checkpoint to resume from and loads the history
/// up to it.
///
/// # Errors
/// [`TrainError::RunExists`] for a new run in a run's folder without `overwrite`;
/// [`TrainError::Checkpoint`] when resuming without a complete checkpoint, or with
/// an unreadable history.
pub(crate) fn prepare(options: &RunOptions, schedule: Schedule) -> Result<Prepared, TrainError> {
    let checkpoints = checkpoint_dir(&options.directory);
    // A writer killed mid-write leaves its temporary file behind.
    for folder in [&options.directory, &checkpoints] {
        for stale in crate::io::remove_stale_temporaries(folder) {
            log::info!("removed {}, left by a run that stopped", stale.display());
        }
    }
    if !options.resume && holds_run(&options.directory) {
        if !options.overwrite {
            return Err(TrainError::RunExists {
                directory: options.directory.clone(),
            });
        }
        clear_run(&options.directory, &[])?;
    }
    let resumed_epoch = if options.resume {
        let epoch = latest_checkpoint(&checkpoints).ok_or_else(|| TrainError::Checkpoint {
            path: checkpoints.clone(),
            reason: "no complete checkpoint to resume from (the model, optim and scheduler \
                     files of one round)"
                .into(),
        })?;
        Some(epoch.min(schedule.rounds()))
    } else {
        None
    };
    let start_step = resumed_epoch.map_or(0, |epoch| {
        (epoch * schedule.eval_interval).min(schedule.steps)
    });
    let history_path = history_file(&options.directory);
    let mut history = if resumed_epoch.is_some() && history_path.is_file() {
        History::load(&history_path)?
    } else {
        History::default()
    };
    history.truncate(start_step);
    Ok(Prepared {
        resumed_epoch,
        start_step,
        history: Arc::new(Mutex::new(history)),
    })
}

/// Trains `learner` with burn-train: the training loss and learning rate, the
/// validation loss and `validation_metric` are recorded; the settings every run
/// shares are applied (see [`configure`]). The whole run happens on the compute pool
/// of `device` (see `crate::device::on_compute_pool`).
///
/// # Errors
/// [`TrainError::Training`] with burn-train's message.
#[allow(clippy::too_many_arguments)]
pub(crate) fn launch<M, V>(
    learner: Learner<M>,
    train: Arc<dyn DataLoader<<M as TrainStep>::Input>>,
    valid: Arc<dyn DataLoader<<M as InferenceStep>::Input>>,
    validation_metric: V,
    device: &Device,
    options: &RunOptions,
    schedule: Schedule,
    prepared: &Prepared,
) -> Result<(M, History), TrainError>
where
    M: LearnerModel + TrainStep<Output = SequenceOutput> + InferenceStep<Output = SequenceOutput>,
    V: Metric + Numeric + 'static,
    SequenceOutput: Adaptor<V::Input>,
{
    // The builder holds boxed strategies that cannot cross threads: it is made on the
    // pool thread that runs it.
    let result = crate::device::on_compute_pool(device, || {
        let builder = SupervisedTraining::new(&options.directory, train, valid)
            .metric_train_numeric(LossMetric::new())
            .metric_train_numeric(LearningRateMetric::new())
            .metric_valid_numeric(LossMetric::new())
            .metric_valid_numeric(validation_metric);
        configure(builder, options, schedule, prepared).launch(learner)
    });
    finish(result, prepared)
}

/// Applies the settings every run shares to a burn-train builder: the number of
/// rounds, atomic checkpointers keeping the last two rounds, the progress renderer,
/// the application logger and the checkpoint to resume from. Metrics are the
/// caller's.
fn configure<M: LearnerModel>(
    builder: SupervisedTraining<M>,
    options: &RunOptions,
    schedule: Schedule,
    prepared: &Prepared,
) -> SupervisedTraining<M> {
    let checkpoints = checkpoint_dir(&options.directory);
    let renderer = ProgressRenderer::new(
        ProgressSettings {
            start_step: prepared.start_step,
            total_steps: schedule.steps,
            tokens_per_step: schedule.tokens_per_step,
            log_every: options.log_every,
            verbose: options.verbose,
            history_file: Some(history_file(&options.directory)),
        },
        prepared.history.clone(),
    );
    let mut builder = builder
        .num_epochs(schedule.rounds())
        .with_custom_checkpointers(
            AtomicFileCheckpointer::new(&checkpoints, "model"),
            AtomicFileCheckpointer::new(&checkpoints, "optim"),
            AtomicFileCheckpointer::new(&checkpoints, "scheduler"),
        )
        .with_checkpointing_strategy(KeepLastNCheckpoints::new(2))
        .renderer(Box::new(renderer));
    if !options.experiment_log {
        builder = builder.with_application_logger(None);
    }
    if let Some(epoch) = prepared.resumed_epoch {
        builder = builder.checkpoint(epoch);
    }
    builder
}

/// The trained model and the history, or burn-train's error.
///
/// # Errors
/// [`TrainError::Training`] with burn-train's message.
fn finish<M>(result: LearningResult<M>, prepared: &Prepared) -> Result<(M, History), TrainError> {
    if let Some(error) = result.error {
        return Err(TrainError::Training(error.to_string()));
    }
    let history = prepared
        .history
        .lock()
        .map(|history| history.clone())
        .unwrap_or_else(|poisoned| poisoned.into_inner().clone());
    Ok((result.model, history))
}
