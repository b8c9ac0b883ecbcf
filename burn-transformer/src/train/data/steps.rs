//! What the step-indexed data loaders share: which batches a pass hands out.
//!
//! burn-train calls a loader's `iter` once per epoch; here an epoch is the stretch of
//! steps between two validations. The batch of global step `s` depends only on the
//! run's seed and `s`, so a training loader's pass `e` hands out the batches of steps
//! `e·n .. (e+1)·n` (`n` steps per epoch), and a loader resumed at epoch `e` hands out
//! exactly what an uninterrupted one would. A run extended past its planned end
//! resumes after a last pass that may have been shortened: its passes then count
//! from the step it stopped at ([`Steps::with_first_step`]). A validation loader hands out the same `n`
//! batches at every pass, so validations compare like with like.
//!
//! Several devices share each step (burn-train's multi-device and DDP strategies
//! slice a loader once per device): a slice of a pass's items is the same rows of
//! every batch, so the devices together see each step's whole batch, the step count
//! stays the same, and the gradient they sum is the one-device gradient (each part's
//! loss is weighted by its [`share`](Steps::share) of the batch).

use std::ops::Range;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use burn::data::dataloader::{DataLoaderIterator, Progress};
use burn::data::dataset::DatasetError;

#[derive(Debug, Clone)]
enum Passes {
    /// Fresh batches per pass; `next_epoch` counts the passes handed out (shared by
    /// every copy of the loader, so `to_device` copies agree).
    Training {
        next_epoch: Arc<AtomicUsize>,
        /// The epoch the loader was made at, whose pass starts at `first_step`.
        first_epoch: usize,
        first_step: usize,
    },
    /// The same batches at every pass.
    Validation,
}

/// The batches of each pass of a step-indexed loader.
#[derive(Debug, Clone)]
pub(crate) struct Steps {
    /// Examples (or windows) per batch.
    batch_size: usize,
    /// Batches per pass (per epoch).
    batches: usize,
    /// The rows of every batch this loader hands out (all of them, or one device's
    /// part: see `slice`).
    rows: Range<usize>,
    /// The run's last step: the last pass stops there.
    total_steps: Option<usize>,
    passes: Passes,
    /// What `Progress` counts.
    items: &'static str,
}

impl Steps {
    /// `steps_per_epoch` fresh batches per pass, from epoch `start_epoch` on.
    pub(crate) fn training(
        batch_size: usize,
        steps_per_epoch: usize,
        start_epoch: usize,
        items: &'static str,
    ) -> Self {
        Self::new(
            batch_size,
            steps_per_epoch,
            Passes::Training {
                next_epoch: Arc::new(AtomicUsize::new(start_epoch)),
                first_epoch: start_epoch,
                first_step: start_epoch * steps_per_epoch,
            },
            items,
        )
    }

    /// The same `batches` batches at every pass.
    pub(crate) fn validation(batch_size: usize, batches: usize, items: &'static str) -> Self {
        Self::new(batch_size, batches, Passes::Validation, items)
    }

    fn new(batch_size: usize, batches: usize, passes: Passes, items: &'static str) -> Self {
        Self {
            batch_size,
            batches,
            rows: 0..batch_size,
            total_steps: None,
            passes,
            items,
        }
    }

    /// Ends a training run at `steps` steps: the pass that reaches it is shortened,
    /// and later passes are empty.
    pub(crate) fn with_total_steps(mut self, steps: usize) -> Self {
        self.total_steps = Some(steps);
        self
    }

    /// Starts a training loader's first pass at global step `step` (the step a run
    /// stopped at, when it did not stop at a multiple of the steps per epoch).
    pub(crate) fn with_first_step(mut self, step: usize) -> Self {
        if let Passes::Training { first_step, .. } = &mut self.passes {
            *first_step = step;
        }
        self
    }

    /// The batch indices of the next pass; advances a training loader's pass counter.
    fn next_pass(&self) -> Range<usize> {
        let base = match &self.passes {
            Passes::Training {
                next_epoch,
                first_epoch,
                first_step,
            } => {
                let passes = next_epoch.fetch_add(1, Ordering::SeqCst) - first_epoch;
                first_step + passes * self.batches
            }
            Passes::Validation => 0,
        };
        let start = base;
        let count = match (&self.passes, self.total_steps) {
            (Passes::Training { .. }, Some(total)) => self.batches.min(total.saturating_sub(start)),
            _ => self.batches,
        };
        start..start + count
    }

    /// The next pass, each batch made by `batch` from its index.
    pub(crate) fn iter<'a, B: 'a>(
        &'a self,
        batch: impl Fn(usize) -> B + 'a,
    ) -> Box<dyn DataLoaderIterator<B> + 'a> {
        Box::new(StepIterator {
            indices: self.next_pass(),
            next: 0,
            batch,
            steps: self,
        })
    }

    /// Items of a pass.
    pub(crate) fn num_items(&self) -> usize {
        self.batches * self.rows.len()
    }

    /// The rows of each batch this loader hands out.
    pub(crate) fn rows(&self) -> Range<usize> {
        self.rows.clone()
    }

    /// The fraction of each step's batch this loader hands out (1 unless sliced).
    pub(crate) fn share(&self) -> f64 {
        self.rows.len() as f64 / self.batch_size as f64
    }

    /// Items `start..end` of each pass, of `num_items`: the same fraction of the rows
    /// of every batch. burn-train's `split_dataloader` gives device `i` of `n` the
    /// items `i·N/n .. (i+1)·N/n`, so with a batch size divisible by `n` each device
    /// gets `batch_size / n` rows of every step.
    pub(crate) fn slice(&self, start: usize, end: usize) -> Self {
        let items = self.num_items().max(1);
        let rows = self.rows.len();
        let from = self.rows.start + start * rows / items;
        let to = self.rows.start + (end * rows).div_ceil(items).min(rows);
        // Each device's slice counts its own passes (from where the loader is), so
        // that every device hands out the same steps in each epoch.
        let passes = match &self.passes {
            Passes::Training {
                next_epoch,
                first_epoch,
                first_step,
            } => Passes::Training {
                next_epoch: Arc::new(AtomicUsize::new(next_epoch.load(Ordering::SeqCst))),
                first_epoch: *first_epoch,
                first_step: *first_step,
            },
            Passes::Validation => Passes::Validation,
        };
        Self {
            rows: from..to.max(from + 1).min(self.rows.end),
            passes,
            ..self.clone()
        }
    }
}

struct StepIterator<'a, F> {
    /// Global step (or validation index) of every batch of this pass.
    indices: Range<usize>,
    next: usize,
    batch: F,
    steps: &'a Steps,
}

impl<B, F: Fn(usize) -> B> Iterator for StepIterator<'_, F> {
    type Item = Result<B, DatasetError>;

    fn next(&mut self) -> Option<Self::Item> {
        let index = self.indices.clone().nth(self.next)?;
        self.next += 1;
        Some(Ok((self.batch)(index)))
    }
}

impl<B, F: Fn(usize) -> B> DataLoaderIterator<B> for StepIterator<'_, F> {
    fn progress(&self) -> Progress {
        Progress::new(
            self.next * self.steps.batch_size,
            self.indices.len() * self.steps.batch_size,
            Some(self.steps.items.into()),
        )
    }
}

/// Implements burn-train's `DataLoader` for a loader struct with a `steps: Steps`
/// field, a `device: Device` field and a `batch(&self, index)` method.
macro_rules! step_loader {
    ($loader:ty => $batch:ty) => {
        impl burn::data::dataloader::DataLoader<$batch> for $loader {
            fn iter<'a>(
                &'a self,
            ) -> Box<dyn burn::data::dataloader::DataLoaderIterator<$batch> + 'a> {
                self.steps.iter(move |index| self.batch(index))
            }

            fn num_items(&self) -> usize {
                self.steps.num_items()
            }

            fn to_device(
                &self,
                device: &burn::tensor::Device,
            ) -> std::sync::Arc<dyn burn::data::dataloader::DataLoader<$batch>> {
                std::sync::Arc::new(Self {
                    device: device.clone(),
                    ..self.clone()
                })
            }

            fn slice(
                &self,
                start: usize,
                end: usize,
            ) -> std::sync::Arc<dyn burn::data::dataloader::DataLoader<$batch>> {
                std::sync::Arc::new(Self {
                    steps: self.steps.slice(start, end),
                    ..self.clone()
                })
            }
        }
    };
}
pub(crate) use step_loader;

#[cfg(test)]
mod tests {
    use super::*;

    fn pass(steps: &Steps) -> Vec<usize> {
        steps.iter(|index| index).map(Result::unwrap).collect()
    }

    #[test]
    fn training_passes_continue_where_the_last_ended_and_stop_at_the_total() {
        let steps = Steps::training(4, 3, 0, "items").with_total_steps(7);
        assert_eq!(pass(&steps), vec![0, 1, 2]);
        let copy = steps.clone();
        assert_eq!(pass(&copy), vec![3, 4, 5], "copies share the pass counter");
        assert_eq!(pass(&steps), vec![6]);
        assert_eq!(pass(&steps), Vec::<usize>::new());
        let resumed = Steps::training(4, 3, 1, "items").with_total_steps(7);
        assert_eq!(pass(&resumed), vec![3, 4, 5]);
        // A run of 7 steps extended to 12 resumes after its short last pass.
        let extended = Steps::training(4, 3, 3, "items")
            .with_first_step(7)
            .with_total_steps(12);
        assert_eq!(pass(&extended), vec![7, 8, 9]);
        assert_eq!(pass(&extended), vec![10, 11]);
        assert_eq!(pass(&extended), Vec::<usize>::new());
    }

    #[test]
    fn validation_passes_repeat_and_slices_hold_rows_of_every_batch() {
        let steps = Steps::validation(4, 5, "items");
        assert_eq!(pass(&steps), vec![0, 1, 2, 3, 4]);
        assert_eq!(pass(&steps), vec![0, 1, 2, 3, 4]);
        assert_eq!(steps.num_items(), 20);
        // Two devices: each gets two of the four rows of every batch, at every step.
        let halves = [steps.slice(0, 10), steps.slice(10, 20)];
        assert_eq!((halves[0].rows(), halves[1].rows()), (0..2, 2..4));
        assert_eq!(pass(&halves[1]), vec![0, 1, 2, 3, 4]);
        assert_eq!((halves[0].share(), halves[0].num_items()), (0.5, 10));
        // Training slices hand out the same steps, pass after pass.
        let training = Steps::training(4, 3, 0, "items");
        let devices = [training.slice(0, 6), training.slice(6, 12)];
        for pass_steps in [vec![0, 1, 2], vec![3, 4, 5]] {
            assert_eq!(pass(&devices[0]), pass_steps);
            assert_eq!(pass(&devices[1]), pass_steps);
        }
        assert_eq!(steps.share(), 1.0);
        let mut iter = steps.iter(|index| index);
        let _ = iter.next();
        let progress = iter.progress();
        assert_eq!((progress.items_processed, progress.items_total), (4, 20));
    }
}
