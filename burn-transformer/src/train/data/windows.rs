//! Batches of random context windows for language modelling, as burn-train data
//! loaders.
//!
//! A training batch is `batch_size` windows of `context + 1` consecutive tokens at
//! random offsets (inputs are the first `context` tokens, targets the last
//! `context`), as nanoGPT's `get_batch`. The offsets of global step `s` depend only
//! on `(seed, s)`, never on a generator that advances, so a run resumed at step `s`
//! sees exactly the batches an uninterrupted run would have seen (see
//! [`steps`](super::steps) for the passes).

use burn::tensor::{Device, Int, Tensor, TensorData};

use super::Tokens;
use super::steps::{Steps, step_loader};

/// Salt of the validation windows' seed, so they differ from any training step's.
const VALIDATION_SALT: u64 = 0x7661_6c69_6461_7465; // "validate"

/// One batch of language-modelling windows.
#[derive(Debug, Clone)]
pub struct LmBatch {
    /// `[batch, context]` token ids.
    pub inputs: Tensor<2, Int>,
    /// `[batch, context]` the next token of each input position.
    pub targets: Tensor<2, Int>,
    /// The global training step this batch is for (0-based); for validation
    /// batches, their index in the fixed validation set.
    pub step: usize,
    /// The fraction of the step's windows this batch holds: 1, or `1/n` on each of
    /// `n` devices sharing the step (their gradients are summed, so each part's loss
    /// counts with this weight).
    pub share: f64,
}

/// SplitMix64 (Steele, Lea and Flood 2014): a tiny generator with good mixing, used
/// so the windows of a step depend on nothing but the seed and the step, with no
/// dependence on a crate's generator algorithm across versions.
#[derive(Debug, Clone)]
pub(crate) struct SplitMix64 {
    state: u64,
}

impl SplitMix64 {
    /// A generator for `(seed, stream)`.
    pub(crate) fn new(seed: u64, stream: u64) -> Self {
        let mut mixer = Self { state: seed };
        let base = mixer.next_u64();
        Self {
            state: base ^ stream.wrapping_mul(0x9E37_79B9_7F4A_7C15),
        }
    }

    /// The next 64 random bits.
    pub(crate) fn next_u64(&mut self) -> u64 {
        self.state = self.state.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.state;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// A number in `0..bound` (Lemire's multiply-shift; the bias is below 2⁻³² for
    /// any corpus that fits in memory).
    pub(crate) fn below(&mut self, bound: usize) -> usize {
        ((self.next_u64() as u128 * bound as u128) >> 64) as usize
    }
}

/// The window offsets of one batch: `batch_size` starts in `0..=len - context - 1`.
fn window_starts(
    len: usize,
    context: usize,
    batch_size: usize,
    seed: u64,
    stream: u64,
) -> Vec<usize> {
    let mut rng = SplitMix64::new(seed, stream);
    let choices = len - context; // starts 0..len-context leave room for the target
    (0..batch_size).map(|_| rng.below(choices)).collect()
}

/// The inputs and targets of the windows at `starts`, as `i64` rows.
fn gather_windows(tokens: &Tokens, starts: &[usize], context: usize) -> (Vec<i64>, Vec<i64>) {
    let mut inputs = Vec::with_capacity(starts.len() * context);
    let mut targets = Vec::with_capacity(starts.len() * context);
    let mut window = Vec::with_capacity(context + 1);
    for &start in starts {
        window.clear();
        tokens.extend_into(start..start + context + 1, &mut window);
        inputs.extend(window[..context].iter().map(|&t| t as i64));
        targets.extend(window[1..].iter().map(|&t| t as i64));
    }
    (inputs, targets)
}

/// A burn-train data loader of [`LmBatch`]es over one split's tokens.
#[derive(Debug, Clone)]
pub struct WindowLoader {
    tokens: Tokens,
    batch_size: usize,
    context: usize,
    seed: u64,
    steps: Steps,
    device: Device,
}

step_loader!(WindowLoader => LmBatch);

impl WindowLoader {
    /// The training loader: `steps_per_epoch` batches per pass, starting at epoch
    /// `start_epoch` (the number of epochs already trained, when resuming).
    ///
    /// # Panics
    /// If the tokens hold no window of `context + 1` (check with
    /// [`TokenSplit::check_context`](super::TokenSplit::check_context) first) or a
    /// size is zero.
    pub fn training(
        tokens: Tokens,
        batch_size: usize,
        context: usize,
        steps_per_epoch: usize,
        seed: u64,
        start_epoch: usize,
        device: &Device,
    ) -> Self {
        let steps = Steps::training(batch_size, steps_per_epoch, start_epoch, "windows");
        Self::new(tokens, batch_size, context, seed, steps, device)
    }

    /// The validation loader: the same `batches` batches at every pass.
    ///
    /// # Panics
    /// As [`WindowLoader::training`].
    pub fn validation(
        tokens: Tokens,
        batch_size: usize,
        context: usize,
        batches: usize,
        seed: u64,
        device: &Device,
    ) -> Self {
        let steps = Steps::validation(batch_size, batches, "windows");
        Self::new(
            tokens,
            batch_size,
            context,
            seed ^ VALIDATION_SALT,
            steps,
            device,
        )
    }

    fn new(
        tokens: Tokens,
        batch_size: usize,
        context: usize,
        seed: u64,
        steps: Steps,
        device: &Device,
    ) -> Self {
        assert!(
            batch_size > 0 && context > 0 && steps.num_items() > 0,
            "WindowLoader: batch_size, context and batches must be positive"
        );
        assert!(
            tokens.len() > context,
            "WindowLoader: {} tokens hold no window of context {context} + 1",
            tokens.len()
        );
        Self {
            tokens,
            batch_size,
            context,
            seed,
            steps,
            device: device.clone(),
        }
    }

    /// Ends the run at `steps` steps: the pass that reaches it is shortened, and
    /// later passes are empty.
    pub fn with_total_steps(mut self, steps: usize) -> Self {
        self.steps = self.steps.with_total_steps(steps);
        self
    }

    /// Starts the first pass at global step `step`: a run that resumes after a pass
    /// shortened by its earlier end (see [`WindowLoader::with_total_steps`]).
    pub fn with_first_step(mut self, step: usize) -> Self {
        self.steps = self.steps.with_first_step(step);
        self
    }

    /// The batch of global step `step` (training) or of index `step` (validation),
    /// without touching the epoch counter.
    pub fn batch(&self, step: usize) -> LmBatch {
        let starts = window_starts(
            self.tokens.len(),
            self.context,
            self.batch_size,
            self.seed,
            step as u64,
        );
        // A device's part of the step: its rows of the windows the step draws.
        let starts = &starts[self.steps.rows()];
        let (inputs, targets) = gather_windows(&self.tokens, starts, self.context);
        let shape = [starts.len(), self.context];
        LmBatch {
            inputs: Tensor::from_data(TensorData::new(inputs, shape), &self.device),
            targets: Tensor::from_data(TensorData::new(targets, shape), &self.device),
            step,
            share: self.steps.share(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use burn::data::dataloader::DataLoader;

    #[test]
    fn windows_are_next_token_pairs_and_depend_only_on_seed_and_step() {
        let tokens = Tokens::from((0..100).collect::<Vec<u32>>());
        let device = Device::flex();
        let loader = WindowLoader::training(tokens.clone(), 4, 8, 3, 7, 0, &device);
        let batch = loader.batch(5);
        let inputs = batch.inputs.try_to_vec_as::<i64>().unwrap();
        let targets = batch.targets.try_to_vec_as::<i64>().unwrap();
        for (i, t) in inputs.iter().zip(&targets) {
            assert_eq!(i + 1, *t, "targets are the inputs shifted by one");
        }
        // A loader resumed at epoch 1 produces step 3 first, as the original does.
        let resumed = WindowLoader::training(tokens, 4, 8, 3, 7, 1, &device);
        let mut original = loader.iter();
        let _ = original.next();
        drop(original);
        let second_pass: Vec<usize> = loader.iter().map(|b| b.unwrap().step).collect();
        let resumed_pass: Vec<usize> = resumed.iter().map(|b| b.unwrap().step).collect();
        assert_eq!(second_pass, vec![3, 4, 5]);
        assert_eq!(resumed_pass, second_pass);
        assert_eq!(
            window_starts(100, 8, 4, 7, 4),
            window_starts(100, 8, 4, 7, 4)
        );
        assert_ne!(
            window_starts(100, 8, 4, 7, 4),
            window_starts(100, 8, 4, 7, 5)
        );
    }

    #[test]
    fn every_start_leaves_room_for_the_target() {
        for stream in 0..200 {
            for start in window_starts(10, 9, 4, 1, stream) {
                assert_eq!(start, 0, "a 10-token split holds one window of 9 + 1");
            }
            assert!(window_starts(20, 9, 8, 1, stream).iter().all(|&s| s <= 10));
        }
    }
}
