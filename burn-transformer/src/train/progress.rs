//! Progress display and the loss history of a run.
//!
//! [`ProgressRenderer`] plugs into burn-train as its metrics renderer (burn-train's
//! own terminal dashboard needs its `tui` feature, which this workspace does not
//! build): every `log_every` steps it prints the training loss, the learning rate
//! and the speed; after each validation, the validation loss and perplexity. It also
//! records every value into a [`History`], which the programs plot and which a
//! resumed run continues.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Instant;

use burn::train::logger::{EvaluationProgressLogger, TrainingProgressLogger};
use burn::train::metric::{MetricDefinition, MetricId, NumericEntry};
use burn::train::renderer::{
    EvaluationName, MetricState, MetricsRenderer, MetricsRendererEvaluation,
    MetricsRendererTraining,
};
use serde::{Deserialize, Serialize};

use super::TrainError;
use super::json_file::{read_json, write_json};

/// The name burn-train's loss metric reports under.
const LOSS: &str = "Loss";
/// The name of burn-train's learning-rate metric.
const LEARNING_RATE: &str = "Learning Rate";
/// The name of burn-train's perplexity metric.
const PERPLEXITY: &str = "Perplexity";
/// The name of burn-train's accuracy metric.
const ACCURACY: &str = "Accuracy";

/// One training step's values.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct TrainPoint {
    /// The step (1-based: the number of optimizer steps taken after it).
    pub step: usize,
    /// The loss that was minimized (with label smoothing and auxiliary losses).
    pub loss: f64,
    /// The learning rate of the step.
    pub lr: f64,
}

/// One validation's values.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct ValidationPoint {
    /// Optimizer steps taken before the validation.
    pub step: usize,
    /// Mean cross entropy over the validation batches (no label smoothing).
    pub loss: f64,
    /// `exp` of the mean token cross entropy, when measured.
    pub perplexity: Option<f64>,
    /// Token accuracy (padding excluded), when measured.
    pub accuracy: Option<f64>,
}

/// The values of a run, in step order.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct History {
    /// Every training step.
    pub train: Vec<TrainPoint>,
    /// Every validation.
    pub validation: Vec<ValidationPoint>,
    /// Wall-clock seconds spent in training steps (validation excluded).
    pub train_seconds: f64,
}

impl History {
    /// Reads a history written by a run (`history.json`).
    ///
    /// # Errors
    /// [`TrainError::File`] if the file cannot be read, [`TrainError::Checkpoint`] if
    /// it is not a history.
    pub fn load(path: &Path) -> Result<Self, TrainError> {
        read_json(path, "a training history")
    }

    /// Writes the history as JSON, atomically.
    ///
    /// # Errors
    /// [`TrainError::File`] naming the file.
    pub fn save(&self, path: &Path) -> Result<(), TrainError> {
        write_json(path, self)
    }

    /// Drops everything after `step` (a run resumed from an earlier checkpoint than
    /// the history reached).
    pub fn truncate(&mut self, step: usize) {
        self.train.retain(|point| point.step <= step);
        self.validation.retain(|point| point.step <= step);
    }

    /// The last validation loss.
    pub fn last_validation_loss(&self) -> Option<f64> {
        self.validation.last().map(|point| point.loss)
    }
}

/// What the renderer needs to know about the run.
#[derive(Debug, Clone)]
pub(crate) struct ProgressSettings {
    /// burn-train items per optimizer step: one per device sharing the step (each
    /// reports its part's loss; the step's loss is their mean).
    pub(crate) items_per_step: usize,
    /// Steps already taken (a resumed run's start).
    pub(crate) start_step: usize,
    /// The last step of the run.
    pub(crate) total_steps: usize,
    /// Tokens per training step (for the tokens/s figure).
    pub(crate) tokens_per_step: usize,
    /// Print a training line every this many steps; 0 prints none.
    pub(crate) log_every: usize,
    /// Print anything at all.
    pub(crate) verbose: bool,
    /// Where to write `history.json` after each validation.
    pub(crate) history_file: Option<PathBuf>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    Train,
    Valid,
    Idle,
}

/// A burn-train metrics renderer that prints progress lines and records a
/// [`History`].
pub(crate) struct ProgressRenderer {
    settings: ProgressSettings,
    history: Arc<Mutex<History>>,
    names: HashMap<MetricId, String>,
    phase: Phase,
    step: usize,
    /// Sums of the values of the current step's items, and how many items were seen.
    pending_train: HashMap<String, f64>,
    items_this_step: usize,
    pending_valid: HashMap<String, f64>,
    split_started: Option<Instant>,
    split_seconds_before: f64,
    last_log: Option<(Instant, usize)>,
}

impl ProgressRenderer {
    /// A renderer that appends to `history` (which may hold a resumed run's past).
    pub(crate) fn new(settings: ProgressSettings, history: Arc<Mutex<History>>) -> Self {
        Self {
            step: settings.start_step,
            settings,
            history,
            names: HashMap::new(),
            phase: Phase::Idle,
            pending_train: HashMap::new(),
            items_this_step: 0,
            pending_valid: HashMap::new(),
            split_started: None,
            split_seconds_before: 0.0,
            last_log: None,
        }
    }

    fn history(&self) -> MutexGuard<'_, History> {
        // A panic elsewhere while holding the lock leaves valid data behind.
        self.history
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    fn record(&mut self, state: MetricState, valid: bool) {
        let MetricState::Numeric(entry, Some(value)) = state else {
            return;
        };
        let Some(name) = self.names.get(&entry.metric_id).cloned() else {
            return;
        };
        match (valid, value) {
            // Per-step values; burn-train's end-of-split summaries are `Final`.
            (false, NumericEntry::Final(_)) => {}
            (false, value) => {
                *self.pending_train.entry(name).or_insert(0.0) += value.current();
            }
            (true, NumericEntry::Final(value)) => {
                self.pending_valid.insert(name, value);
            }
            (true, _) => {}
        }
    }

    /// Counts an item of the current step; the step ends with its last item.
    fn finish_train_item(&mut self) {
        self.items_this_step += 1;
        if self.items_this_step >= self.settings.items_per_step.max(1) {
            self.finish_train_step();
        }
    }

    fn finish_train_step(&mut self) {
        self.step += 1;
        let items = std::mem::take(&mut self.items_this_step).max(1) as f64;
        let mut mean = |name: &str| self.pending_train.remove(name).map(|sum| sum / items);
        let loss = mean(LOSS).unwrap_or(f64::NAN);
        let lr = mean(LEARNING_RATE).unwrap_or(0.0);
        self.pending_train.clear();
        let now = Instant::now();
        let elapsed = self
            .split_started
            .map_or(0.0, |start| now.duration_since(start).as_secs_f64());
        {
            let mut history = self.history();
            history.train.push(TrainPoint {
                step: self.step,
                loss,
                lr,
            });
            history.train_seconds = self.split_seconds_before + elapsed;
        }
        let every = self.settings.log_every;
        if self.settings.verbose && every > 0 && (self.step.is_multiple_of(every) || self.step == 1)
        {
            let speed = match self.last_log {
                Some((time, step)) if self.step > step => {
                    let seconds =
                        now.duration_since(time).as_secs_f64() / (self.step - step) as f64;
                    format!(
                        " | {:6.1} ms/step | {:7.0} tokens/s",
                        seconds * 1e3,
                        self.settings.tokens_per_step as f64 / seconds
                    )
                }
                _ => String::new(),
            };
            println!(
                "step {:>6}/{} | loss {:.4} | lr {:.2e}{speed}",
                self.step, self.settings.total_steps, loss, lr
            );
            self.last_log = Some((now, self.step));
        }
    }

    fn finish_validation(&mut self) {
        let Some(loss) = self.pending_valid.get(LOSS).copied() else {
            return;
        };
        let point = ValidationPoint {
            step: self.step,
            loss,
            perplexity: self.pending_valid.get(PERPLEXITY).copied(),
            accuracy: self.pending_valid.get(ACCURACY).copied(),
        };
        self.pending_valid.clear();
        self.history().validation.push(point);
        if self.settings.verbose {
            let mut line = format!("step {:>6}: validation loss {:.4}", point.step, point.loss);
            if let Some(perplexity) = point.perplexity {
                line += &format!(", perplexity {perplexity:.2}");
            }
            if let Some(accuracy) = point.accuracy {
                line += &format!(", token accuracy {:.1}%", accuracy);
            }
            println!("{line}");
        }
        // Validation time is not training time: restart the clock of the next split.
        self.last_log = None;
    }

    fn save_history(&self) {
        if let Some(path) = &self.settings.history_file {
            let history = self.history().clone();
            if let Err(error) = history.save(path) {
                log::warn!("{error}");
            }
        }
    }
}

impl MetricsRendererTraining for ProgressRenderer {
    fn update_train(&mut self, state: MetricState) {
        self.record(state, false);
    }

    fn update_valid(&mut self, state: MetricState) {
        self.record(state, true);
    }
}

impl TrainingProgressLogger for ProgressRenderer {
    fn start(
        &mut self,
        total_epochs: usize,
        starting_epoch: usize,
        _total_items: Option<usize>,
        _label: Option<&str>,
    ) {
        let before = self.history().train_seconds;
        self.split_seconds_before = before;
        if self.settings.verbose {
            let resumed = if self.settings.start_step > 0 {
                format!(", resuming after step {}", self.settings.start_step)
            } else {
                String::new()
            };
            println!(
                "training {} steps in {total_epochs} rounds of training + validation \
                 (starting with round {starting_epoch}{resumed})",
                self.settings.total_steps
            );
        }
    }

    fn update_epoch(&mut self, _epoch: usize) {
        self.save_history();
    }

    fn start_split(&mut self, split: &str, _total_items: usize) {
        self.phase = if split == "train" {
            self.split_started = Some(Instant::now());
            Phase::Train
        } else {
            Phase::Valid
        };
    }

    fn update_split(&mut self, _items_processed: usize) {
        if self.phase == Phase::Train {
            self.finish_train_item();
        }
    }

    fn end_split(&mut self) {
        match self.phase {
            Phase::Train => {
                if let Some(start) = self.split_started.take() {
                    self.split_seconds_before += start.elapsed().as_secs_f64();
                    self.history().train_seconds = self.split_seconds_before;
                }
            }
            Phase::Valid => self.finish_validation(),
            Phase::Idle => {}
        }
        self.phase = Phase::Idle;
    }

    fn end(&mut self) {
        self.save_history();
    }

    fn log_event_training(&mut self, _event: String) {}
}

impl EvaluationProgressLogger for ProgressRenderer {
    fn start_global_progress(&mut self, _total_tests: usize) {}
    fn start_test(&mut self, _name: &str, _total_items: usize) {}
    fn update_test_progress(&mut self, _items_processed: usize) {}
    fn end_test(&mut self) {}
    fn end_global_progress(&mut self) {}
    fn log_event_evaluation(&mut self, _event: String) {}
}

impl MetricsRendererEvaluation for ProgressRenderer {
    fn update_test(&mut self, _name: EvaluationName, _state: MetricState) {}
}

impl MetricsRenderer for ProgressRenderer {
    fn manual_close(&mut self) {}

    fn register_metric(&mut self, definition: MetricDefinition) {
        self.names
            .insert(definition.metric_id, definition.name.to_string());
    }
}
