//! Learning-rate schedules as burn-train [`LrScheduler`]s.
//!
//! - [`WarmupCosine`]: linear warm-up, then a half cosine down to a floor, then the
//!   floor (nanoGPT's `get_lr`, the schedule of GPT-3 and LLaMA).
//! - The Noam schedule of "Attention Is All You Need" is Burn's own
//!   [`NoamLrSchedulerConfig`](burn::optim::lr_scheduler::noam::NoamLrSchedulerConfig);
//!   [`noam`] builds it with our error type.
//!
//! A scheduler's state is its step count, saved in every checkpoint by burn-train,
//! so a resumed run continues the schedule where it stopped.

use burn::config::Config;
use burn::optim::LearningRate;
use burn::optim::lr_scheduler::module_lr_scheduler::ModuleLrScheduler;
use burn::optim::lr_scheduler::noam::NoamLrSchedulerConfig;
use burn::optim::lr_scheduler::{LrScheduler, LrSchedulerRecord};

use super::TrainError;

/// Record key of the step count.
const STEP_KEY: &str = "step";

/// Configuration of a [`WarmupCosine`] schedule.
#[derive(Config, Debug)]
pub struct WarmupCosineConfig {
    /// Peak learning rate, reached at the end of the warm-up.
    pub peak_lr: f64,
    /// Steps of linear warm-up. Default: 100 (nanoGPT's Shakespeare recipe).
    #[config(default = 100)]
    pub warmup_steps: usize,
    /// Step at which the cosine reaches `min_lr` (usually the last step).
    pub decay_steps: usize,
    /// The floor after the decay. Default: `peak_lr / 10`.
    #[config(default = "None")]
    pub min_lr: Option<f64>,
}

impl WarmupCosineConfig {
    /// Builds the scheduler.
    ///
    /// # Errors
    /// [`TrainError::InvalidSetting`] for a non-positive or non-finite learning rate,
    /// a floor above the peak, or a warm-up that does not end before the decay does.
    pub fn init(&self) -> Result<WarmupCosine, TrainError> {
        let min_lr = self.min_lr.unwrap_or(self.peak_lr / 10.0);
        if !(self.peak_lr.is_finite() && self.peak_lr > 0.0) {
            return Err(TrainError::setting(
                "lr",
                format!("must be positive and finite, got {}", self.peak_lr),
            ));
        }
        if !(min_lr.is_finite() && (0.0..=self.peak_lr).contains(&min_lr)) {
            return Err(TrainError::setting(
                "min-lr",
                format!("must be in [0, lr = {}], got {min_lr}", self.peak_lr),
            ));
        }
        if self.warmup_steps >= self.decay_steps.max(1) && self.decay_steps > 0 {
            return Err(TrainError::setting(
                "warmup",
                format!(
                    "{} warm-up steps do not end before the decay ends at step {}",
                    self.warmup_steps, self.decay_steps
                ),
            ));
        }
        Ok(WarmupCosine {
            peak_lr: self.peak_lr,
            min_lr,
            warmup_steps: self.warmup_steps,
            decay_steps: self.decay_steps,
            step: 0,
        })
    }
}

/// Linear warm-up to `peak_lr`, cosine decay to `min_lr` at `decay_steps`, then
/// constant.
#[derive(Debug, Clone)]
pub struct WarmupCosine {
    peak_lr: f64,
    min_lr: f64,
    warmup_steps: usize,
    decay_steps: usize,
    /// Steps taken so far.
    step: usize,
}

impl WarmupCosine {
    /// The learning rate of step `step` (0-based), without advancing.
    pub fn lr_at(&self, step: usize) -> LearningRate {
        if step < self.warmup_steps {
            // (step + 1) / (warmup + 1): the first step already moves the weights.
            return self.peak_lr * (step + 1) as f64 / (self.warmup_steps + 1) as f64;
        }
        if step >= self.decay_steps {
            return self.min_lr;
        }
        let progress =
            (step - self.warmup_steps) as f64 / (self.decay_steps - self.warmup_steps) as f64;
        let cosine = 0.5 * (1.0 + (std::f64::consts::PI * progress).cos());
        self.min_lr + cosine * (self.peak_lr - self.min_lr)
    }
}

impl LrScheduler for WarmupCosine {
    fn step(&mut self) -> LearningRate {
        let lr = self.lr_at(self.step);
        self.step += 1;
        lr
    }

    fn to_record(&self) -> LrSchedulerRecord {
        LrSchedulerRecord::new().with_scalar(STEP_KEY, self.step as u64)
    }

    fn load_record(&mut self, record: LrSchedulerRecord) {
        if let Some(step) = record.scalar::<u64>(STEP_KEY) {
            self.step = step as usize;
        }
    }
}

/// The Noam schedule, `factor · d_model^-½ · min(step^-½, step · warmup^-3/2)`
/// (Burn's implementation).
///
/// # Errors
/// [`TrainError::InvalidSetting`] for zero warm-up steps or model size.
pub fn noam(
    factor: f64,
    warmup_steps: usize,
    d_model: usize,
) -> Result<ModuleLrScheduler, TrainError> {
    NoamLrSchedulerConfig::new(factor)
        .with_warmup_steps(warmup_steps)
        .with_model_size(d_model)
        .init()
        .map_err(|reason| TrainError::setting("noam", reason))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn warmup_cosine_follows_nanogpt() {
        let mut schedule = WarmupCosineConfig::new(1e-3, 2000)
            .with_warmup_steps(100)
            .with_min_lr(Some(1e-4))
            .init()
            .unwrap();
        let lrs: Vec<f64> = (0..2100).map(|_| schedule.step()).collect();
        assert!((lrs[0] - 1e-3 / 101.0).abs() < 1e-15);
        assert!((lrs[99] - 1e-3 * 100.0 / 101.0).abs() < 1e-15);
        assert!((lrs[100] - 1e-3).abs() < 1e-15);
        assert!(
            (lrs[1050] - 5.5e-4).abs() < 1e-12,
            "half-way: the mean of peak and floor"
        );
        assert!((lrs[2000] - 1e-4).abs() < 1e-15);
        assert!((lrs[2099] - 1e-4).abs() < 1e-15);
    }

    #[test]
    fn warmup_cosine_resumes_from_its_record() {
        let config = WarmupCosineConfig::new(1e-3, 50).with_warmup_steps(5);
        let mut straight = config.init().unwrap();
        let mut first = config.init().unwrap();
        for _ in 0..17 {
            straight.step();
            first.step();
        }
        let mut resumed = config.init().unwrap();
        resumed.load_record(first.to_record());
        for _ in 0..40 {
            assert_eq!(straight.step(), resumed.step());
        }
    }

    #[test]
    fn bad_schedules_are_errors() {
        assert!(WarmupCosineConfig::new(0.0, 10).init().is_err());
        assert!(
            WarmupCosineConfig::new(1e-3, 10)
                .with_warmup_steps(10)
                .init()
                .is_err()
        );
        assert!(
            WarmupCosineConfig::new(1e-3, 10)
                .with_min_lr(Some(1.0))
                .init()
                .is_err()
        );
        assert!(noam(1.0, 0, 64).is_err());
    }
}
