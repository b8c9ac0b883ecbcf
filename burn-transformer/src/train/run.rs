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

use burn::module::Module;

use super::TrainError;
use super::checkpoint::{checkpoint_path, load_module};
use super::checkpointer::AtomicFileCheckpointer;
use super::manifest::{EpochSteps, ManifestWriter, find_resume_point};
use super::progress::{History, ProgressRenderer, ProgressSettings};

/// Where and how a run writes and reports.
#[derive(Debug, Clone)]
pub struct RunOptions {
    /// The run's folder: `checkpoint/`, `history.json`, burn-train's logs.
    pub directory: PathBuf,
    /// Continue from the newest intact checkpoint in `directory`. The run's planned
    /// steps may have grown since it stopped: it then trains on to the new end.
    pub resume: bool,
    /// The run's identity ([`new_run_id`]), written into every checkpoint's manifest;
    /// a resumed run refuses checkpoints of another identity
    /// ([`TrainError::OtherRun`]). `None` checks nothing.
    pub run_id: Option<String>,
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
    /// More devices that share every training step with the run's device, data
    /// parallel: each computes the gradient of its rows of the batch and the
    /// gradients are summed ([`parallel_strategy`]). Empty: the run's device alone.
    pub extra_devices: Vec<Device>,
}

impl RunOptions {
    /// Quiet options for `directory` (tests, benchmarks).
    pub fn quiet(directory: impl Into<PathBuf>) -> Self {
        Self {
            directory: directory.into(),
            resume: false,
            run_id: None,
            overwrite: false,
            verbose: false,
            log_every: 0,
            experiment_log: false,
            extra_devices: Vec::new(),
        }
    }

    /// Every device of the run: `device`, then the extra ones.
    pub fn devices(&self, device: &Device) -> Vec<Device> {
        std::iter::once(device.clone())
            .chain(self.extra_devices.iter().cloned())
            .collect()
    }

    /// Checks that `batch_size` rows split evenly over the run's devices.
    ///
    /// # Errors
    /// [`TrainError::InvalidSetting`] naming `--batch-size`.
    pub(crate) fn check_parallel_batch(&self, batch_size: usize) -> Result<(), TrainError> {
        let devices = 1 + self.extra_devices.len();
        if !batch_size.is_multiple_of(devices) {
            return Err(TrainError::setting(
                "batch-size",
                format!(
                    "{batch_size} rows do not split evenly over {devices} devices: give a \
                     multiple of {devices}"
                ),
            ));
        }
        Ok(())
    }
}

/// How burn-train runs a step on several devices: DDP (gradients all-reduced by
/// collective operations between the devices, as Burn 0.22 offers them on CUDA) when
/// every device is a CUDA device, else the multi-device strategy (each device's
/// gradient is moved to the first, where they are summed and the optimizer steps).
/// Both sum the devices' gradients; each device's loss is weighted by its share of the
/// batch ([`LmBatch::share`](super::LmBatch::share)), so the sum is the one-device
/// gradient.
pub fn parallel_strategy(devices: Vec<Device>) -> burn::train::ExecutionStrategy {
    use burn::tensor::distributed::{DistributedConfig, ReduceOperation};
    use burn::train::{ExecutionStrategy, MultiDeviceOptim};
    let collective = devices
        .iter()
        .all(|device| crate::device::backend_name(device) == "cuda");
    match collective {
        true => ExecutionStrategy::ddp(
            devices,
            DistributedConfig {
                all_reduce_op: ReduceOperation::Sum,
            },
        ),
        false => ExecutionStrategy::multi(devices, MultiDeviceOptim::OptimMainDevice),
    }
}

/// A new run identity: the time and the process, unique for every run started on a
/// machine (`20261123T221530.482915Z-4187`).
pub fn new_run_id() -> String {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default();
    let seconds = now.as_secs();
    let (days, of_day) = (seconds / 86_400, seconds % 86_400);
    let (year, month, day) = civil_date(days);
    format!(
        "{year:04}{month:02}{day:02}T{:02}{:02}{:02}.{:06}Z-{}",
        of_day / 3600,
        of_day / 60 % 60,
        of_day % 60,
        now.subsec_micros(),
        std::process::id()
    )
}

/// The proleptic Gregorian date of `days` since 1970-01-01 (Howard Hinnant's
/// `civil_from_days`).
fn civil_date(days: u64) -> (u64, u64, u64) {
    let z = days + 719_468;
    let era = z / 146_097;
    let day_of_era = z % 146_097;
    let year_of_era =
        (day_of_era - day_of_era / 1460 + day_of_era / 36_524 - day_of_era / 146_096) / 365;
    let day_of_year = day_of_era - (365 * year_of_era + year_of_era / 4 - year_of_era / 100);
    let mp = (5 * day_of_year + 2) / 153;
    let day = day_of_year - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = year_of_era + era * 400 + u64::from(month <= 2);
    (year, month, day)
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

/// The schedule of a run in steps, and how its steps run.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Schedule {
    pub steps: usize,
    pub eval_interval: usize,
    pub tokens_per_step: usize,
    /// burn-train's gradient checkpointing (Burn's balanced strategy on the
    /// training device).
    pub checkpoint_activations: bool,
}

/// A run about to start: where it resumes and what it has done so far.
pub(crate) struct Prepared {
    /// The checkpoint epoch to load, when resuming.
    pub resumed_epoch: Option<usize>,
    /// Steps already taken.
    pub start_step: usize,
    /// burn-train's epochs when the run ends: those done and those to go.
    pub rounds: usize,
    /// Where the manifests of the checkpoints to come are written, and for what run.
    pub manifests: Arc<ManifestWriter>,
    /// The history so far (shared with the renderer).
    pub history: Arc<Mutex<History>>,
}

/// Removes stale temporary files, refuses (or, with `overwrite`, clears) an earlier run
/// when starting a new one, finds the checkpoint to resume from and loads the history
/// up to it.
///
/// # Errors
/// [`TrainError::RunExists`] for a new run in a run's folder without `overwrite`;
/// [`TrainError::Checkpoint`] when resuming without an intact checkpoint, from one
/// past the run's last step, or with an unreadable history; [`TrainError::OtherRun`]
/// for a checkpoint of another run.
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
    let per_round = schedule.eval_interval.max(1);
    let (resumed_epoch, start_step) = if options.resume {
        let point = find_resume_point(&checkpoints, options.run_id.as_deref())?;
        for warning in &point.warnings {
            log::warn!("{warning}");
            if options.verbose {
                eprintln!("warning: {warning}");
            }
        }
        // Checkpoints without a manifest (older versions) were taken at the end of a
        // round: a full one, or the last, shortened to the run's end.
        let step = point
            .step
            .unwrap_or((point.epoch * per_round).min(schedule.steps));
        if step > schedule.steps {
            return Err(TrainError::Checkpoint {
                path: checkpoint_path(&checkpoints, "model", point.epoch),
                reason: format!(
                    "taken after step {step}, past the run's {} steps: resume with at \
                     least --steps {step}",
                    schedule.steps
                ),
            });
        }
        (Some(point.epoch), step)
    } else {
        (None, 0)
    };
    let first_epoch = resumed_epoch.unwrap_or(0);
    let rounds = first_epoch + (schedule.steps - start_step).div_ceil(per_round);
    if resumed_epoch.is_some() && start_step == schedule.steps && options.verbose {
        println!(
            "the run has taken all its {} steps: nothing to train (a larger --steps \
             continues it)",
            schedule.steps
        );
    }
    let history_path = history_file(&options.directory);
    let mut history = if resumed_epoch.is_some() && history_path.is_file() {
        History::load(&history_path)?
    } else {
        History::default()
    };
    history.truncate(start_step);
    let manifests = ManifestWriter::new(
        &checkpoints,
        options.run_id.clone(),
        EpochSteps {
            first_epoch,
            first_step: start_step,
            per_epoch: per_round,
            total: schedule.steps,
        },
    );
    Ok(Prepared {
        resumed_epoch,
        start_step,
        rounds,
        manifests: Arc::new(manifests),
        history: Arc::new(Mutex::new(history)),
    })
}

/// Checks that the checkpoint a run resumes from fits `model` (the settings of the
/// run may have been edited since it was written), so that burn-train, which panics
/// on a record that does not fit, never sees one.
///
/// # Errors
/// [`TrainError::Checkpoint`] naming the file and what does not match.
pub(crate) fn check_resumed_model<M: Module>(
    model: &M,
    options: &RunOptions,
    prepared: &Prepared,
) -> Result<(), TrainError> {
    match prepared.resumed_epoch {
        Some(epoch) => {
            let path = checkpoint_path(&checkpoint_dir(&options.directory), "model", epoch);
            load_module(model.clone(), &path).map(drop)
        }
        None => Ok(()),
    }
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
        configure(builder, device, options, schedule, prepared).launch(learner)
    });
    finish(result, prepared)
}

/// Applies the settings every run shares to a burn-train builder: the number of
/// rounds, atomic checkpointers keeping the last two rounds, the progress renderer,
/// the application logger and the checkpoint to resume from. Metrics are the
/// caller's.
fn configure<M: LearnerModel>(
    builder: SupervisedTraining<M>,
    device: &Device,
    options: &RunOptions,
    schedule: Schedule,
    prepared: &Prepared,
) -> SupervisedTraining<M> {
    let checkpoints = checkpoint_dir(&options.directory);
    let renderer = ProgressRenderer::new(
        ProgressSettings {
            items_per_step: 1 + options.extra_devices.len(),
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
        .num_epochs(prepared.rounds)
        .with_custom_checkpointers(
            AtomicFileCheckpointer::new(&checkpoints, "model", prepared.manifests.clone()),
            AtomicFileCheckpointer::new(&checkpoints, "optim", prepared.manifests.clone()),
            AtomicFileCheckpointer::new(&checkpoints, "scheduler", prepared.manifests.clone()),
        )
        .with_checkpointing_strategy(KeepLastNCheckpoints::new(2))
        .renderer(Box::new(renderer));
    if !options.experiment_log {
        builder = builder.with_application_logger(None);
    }
    if schedule.checkpoint_activations {
        builder = builder.gradient_checkpointing();
    }
    if let Some(epoch) = prepared.resumed_epoch {
        builder = builder.checkpoint(epoch);
    }
    if !options.extra_devices.is_empty() {
        let devices = options.devices(device);
        builder = builder.with_training_strategy(burn::train::TrainingStrategy::Default(
            parallel_strategy(devices),
        ));
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
