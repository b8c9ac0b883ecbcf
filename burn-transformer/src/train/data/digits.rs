//! Generated digit tasks for sequence-to-sequence training: reversing a digit string
//! (each output digit is read from a position that moves with the output), sorting
//! it, or adding two numbers.
//!
//! Held-out examples are disjoint from training ones by construction: an example is
//! held out when a hash of its source falls in one tenth of the hash space, and the
//! training stream never emits those. Training batches of step `s` depend only on
//! `(seed, s)`, so a resumed run sees the batches an uninterrupted one would.

use burn::config::Config;
use burn::tensor::{Bool, Device, Int, Tensor, TensorData};

use super::steps::{Steps, step_loader};
use super::windows::SplitMix64;
use crate::train::TrainError;

/// Padding (never predicted: left out of the loss).
pub const PAD: u32 = 0;
/// Start of the decoder's input.
pub const BOS: u32 = 1;
/// End of the target.
pub const EOS: u32 = 2;
/// The id of digit 0; digits are `DIGIT0..DIGIT0 + 10`.
pub const DIGIT0: u32 = 3;
/// The `+` of addition problems.
pub const PLUS: u32 = 13;
/// Number of token ids of every digit task.
pub const VOCAB_SIZE: usize = 14;

/// Salt of the validation examples' stream.
const VALIDATION_SALT: u64 = 0x5365_7132_5365_7156;
/// Salt of the test examples' stream.
const TEST_SALT: u64 = 0x5465_7374_5365_7473;
/// One example in this many is held out (by a hash of its source).
const HOLD_OUT_ONE_IN: u64 = 10;

/// A generated sequence-to-sequence task over digit strings.
#[derive(Config, Debug, Copy, PartialEq, Eq)]
pub enum DigitTask {
    /// `3 1 4 1 5` → `5 1 4 1 3`.
    Reverse,
    /// `3 1 4 1 5` → `1 1 3 4 5`.
    Sort,
    /// `1 2 3 + 4 5` → `1 6 8` (operands of up to the length's digits).
    Add,
}

/// One source/target pair, as token ids (no BOS, no EOS).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Example {
    /// The input.
    pub source: Vec<u32>,
    /// The expected output.
    pub target: Vec<u32>,
}

impl DigitTask {
    /// Parses `reverse`, `sort` or `add`.
    ///
    /// # Errors
    /// [`TrainError::InvalidSetting`] listing the tasks.
    pub fn parse(name: &str) -> Result<Self, TrainError> {
        match name.to_ascii_lowercase().as_str() {
            "reverse" => Ok(Self::Reverse),
            "sort" => Ok(Self::Sort),
            "add" | "addition" => Ok(Self::Add),
            other => Err(TrainError::setting(
                "task",
                format!("unknown task `{other}`: expected reverse, sort or add"),
            )),
        }
    }

    /// An example whose digit strings have `min_len..=max_len` digits.
    pub(crate) fn sample(&self, rng: &mut SplitMix64, min_len: usize, max_len: usize) -> Example {
        let digits = |rng: &mut SplitMix64| -> Vec<u32> {
            let len = min_len + rng.below(max_len - min_len + 1);
            (0..len).map(|_| rng.below(10) as u32).collect()
        };
        let as_tokens = |digits: &[u32]| digits.iter().map(|d| DIGIT0 + d).collect::<Vec<_>>();
        match self {
            Self::Reverse => {
                let source = digits(rng);
                let target: Vec<u32> = source.iter().rev().copied().collect();
                Example {
                    source: as_tokens(&source),
                    target: as_tokens(&target),
                }
            }
            Self::Sort => {
                let source = digits(rng);
                let mut target = source.clone();
                target.sort_unstable();
                Example {
                    source: as_tokens(&source),
                    target: as_tokens(&target),
                }
            }
            Self::Add => {
                let a = digits(rng);
                let b = digits(rng);
                let value = |d: &[u32]| d.iter().fold(0u128, |n, &d| n * 10 + d as u128);
                let sum: Vec<u32> = (value(&a) + value(&b))
                    .to_string()
                    .bytes()
                    .map(|b| (b - b'0') as u32)
                    .collect();
                let mut source = as_tokens(&a);
                source.push(PLUS);
                source.extend(as_tokens(&b));
                Example {
                    source,
                    target: as_tokens(&sum),
                }
            }
        }
    }

    /// The longest target of examples with at most `max_len` digits per number.
    pub fn max_target_len(&self, max_len: usize) -> usize {
        match self {
            Self::Reverse | Self::Sort => max_len,
            Self::Add => max_len + 1,
        }
    }

    /// The token ids of a source written as text: digits, and `+` for the addition
    /// task (`31415`, `123+45`; the inverse of [`DigitTask::render`] on sources).
    ///
    /// # Errors
    /// [`TrainError::InvalidSetting`] for empty text or a character outside the
    /// alphabet.
    pub fn encode(text: &str) -> Result<Vec<u32>, TrainError> {
        if text.is_empty() {
            return Err(TrainError::setting(
                "input",
                "is empty: give digits such as 31415",
            ));
        }
        text.chars()
            .map(|c| match c {
                '0'..='9' => Ok(DIGIT0 + c as u32 - '0' as u32),
                '+' => Ok(PLUS),
                other => Err(TrainError::setting(
                    "input",
                    format!("`{other}` is not a digit or `+` (the digit tasks' alphabet)"),
                )),
            })
            .collect()
    }

    /// Renders token ids as text (`31415`, `123+45`).
    pub fn render(tokens: &[u32]) -> String {
        tokens
            .iter()
            .map(|&t| match t {
                PAD => '_',
                BOS => '^',
                EOS => '$',
                PLUS => '+',
                t if (DIGIT0..DIGIT0 + 10).contains(&t) => char::from(b'0' + (t - DIGIT0) as u8),
                _ => '?',
            })
            .collect()
    }
}

/// Whether an example belongs to the held-out part (a hash of its source).
pub(crate) fn is_held_out(example: &Example) -> bool {
    let mut hash = SplitMix64::new(0x6865_6c64, example.source.len() as u64);
    let mut h = hash.next_u64();
    for &token in &example.source {
        h = SplitMix64::new(h, token as u64).next_u64();
    }
    h.is_multiple_of(HOLD_OUT_ONE_IN)
}

/// Draws an example from the training part (`held_out == false`) or the held-out
/// part.
fn draw(
    task: DigitTask,
    rng: &mut SplitMix64,
    min_len: usize,
    max_len: usize,
    held_out: bool,
) -> Example {
    loop {
        let example = task.sample(rng, min_len, max_len);
        if is_held_out(&example) == held_out {
            return example;
        }
    }
}

/// `count` held-out examples for the final evaluation (seeded; same every call).
pub fn test_examples(
    task: DigitTask,
    min_len: usize,
    max_len: usize,
    count: usize,
    seed: u64,
) -> Vec<Example> {
    let mut rng = SplitMix64::new(seed ^ TEST_SALT, 0);
    (0..count)
        .map(|_| draw(task, &mut rng, min_len, max_len, true))
        .collect()
}

/// A padded batch of examples.
#[derive(Debug, Clone)]
pub struct Seq2SeqBatch {
    /// `[batch, seq_src]`, right-padded with [`PAD`].
    pub source: Tensor<2, Int>,
    /// `[batch, seq_src]`, `true` at padding.
    pub source_padding: Tensor<2, Bool>,
    /// `[batch, seq_tgt]`: [`BOS`] then the target (the decoder's input).
    pub target_input: Tensor<2, Int>,
    /// `[batch, seq_tgt]`: the target then [`EOS`] (what is predicted); [`PAD`] after.
    pub target_output: Tensor<2, Int>,
    /// `[batch, seq_tgt]`, `true` at padding.
    pub target_padding: Tensor<2, Bool>,
    /// The global step (training) or batch index (validation).
    pub step: usize,
    /// The fraction of the step's examples this batch holds: 1, or `1/n` on each of
    /// `n` devices sharing the step. Each device's loss is the mean over its own
    /// target tokens, so the summed gradient is the whole batch's when the devices
    /// hold as many target tokens each.
    pub share: f64,
}

/// Pads `rows` on the right to their longest length.
pub(crate) fn pad_rows(rows: &[Vec<u32>], device: &Device) -> (Tensor<2, Int>, Tensor<2, Bool>) {
    let width = rows.iter().map(Vec::len).max().unwrap_or(1).max(1);
    let mut ids = Vec::with_capacity(rows.len() * width);
    let mut padding = Vec::with_capacity(rows.len() * width);
    for row in rows {
        for column in 0..width {
            let token = row.get(column).copied();
            ids.push(token.unwrap_or(PAD) as i64);
            padding.push(token.is_none());
        }
    }
    let shape = [rows.len(), width];
    (
        Tensor::from_data(TensorData::new(ids, shape), device),
        Tensor::from_data(TensorData::new(padding, shape), device),
    )
}

impl Seq2SeqBatch {
    /// A batch of `examples` on `device`.
    pub fn new(examples: &[Example], step: usize, device: &Device) -> Self {
        let sources: Vec<Vec<u32>> = examples.iter().map(|e| e.source.clone()).collect();
        let inputs: Vec<Vec<u32>> = examples
            .iter()
            .map(|e| {
                std::iter::once(BOS)
                    .chain(e.target.iter().copied())
                    .collect()
            })
            .collect();
        let outputs: Vec<Vec<u32>> = examples
            .iter()
            .map(|e| {
                e.target
                    .iter()
                    .copied()
                    .chain(std::iter::once(EOS))
                    .collect()
            })
            .collect();
        let (source, source_padding) = pad_rows(&sources, device);
        let (target_input, target_padding) = pad_rows(&inputs, device);
        let (target_output, _) = pad_rows(&outputs, device);
        Self {
            source,
            source_padding,
            target_input,
            target_output,
            target_padding,
            step,
            share: 1.0,
        }
    }
}

/// A burn-train data loader of generated digit-task batches: training batches of
/// step `s` depend only on `(seed, s)`; validation batches are fixed held-out ones.
#[derive(Debug, Clone)]
pub struct Seq2SeqLoader {
    task: DigitTask,
    min_len: usize,
    max_len: usize,
    batch_size: usize,
    seed: u64,
    held_out: bool,
    steps: Steps,
    device: Device,
}

step_loader!(Seq2SeqLoader => Seq2SeqBatch);

impl Seq2SeqLoader {
    /// Training batches, `steps_per_epoch` per pass, from epoch `start_epoch` until
    /// step `total_steps`.
    #[allow(clippy::too_many_arguments)]
    pub fn training(
        task: DigitTask,
        min_len: usize,
        max_len: usize,
        batch_size: usize,
        steps_per_epoch: usize,
        total_steps: usize,
        seed: u64,
        start_epoch: usize,
        device: &Device,
    ) -> Self {
        let steps = Steps::training(batch_size, steps_per_epoch, start_epoch, "examples")
            .with_total_steps(total_steps);
        Self::new(
            task,
            (min_len, max_len),
            batch_size,
            seed,
            false,
            steps,
            device,
        )
    }

    /// Starts the first pass at global step `step`: a run that resumes after a pass
    /// shortened by its earlier end.
    pub fn with_first_step(mut self, step: usize) -> Self {
        self.steps = self.steps.with_first_step(step);
        self
    }

    /// The same `batches` held-out batches at every pass.
    pub fn validation(
        task: DigitTask,
        min_len: usize,
        max_len: usize,
        batch_size: usize,
        batches: usize,
        seed: u64,
        device: &Device,
    ) -> Self {
        let steps = Steps::validation(batch_size, batches, "examples");
        let seed = seed ^ VALIDATION_SALT;
        Self::new(
            task,
            (min_len, max_len),
            batch_size,
            seed,
            true,
            steps,
            device,
        )
    }

    fn new(
        task: DigitTask,
        (min_len, max_len): (usize, usize),
        batch_size: usize,
        seed: u64,
        held_out: bool,
        steps: Steps,
        device: &Device,
    ) -> Self {
        Self {
            task,
            min_len,
            max_len,
            batch_size,
            seed,
            held_out,
            steps,
            device: device.clone(),
        }
    }

    /// The batch of step (or validation index) `step`.
    pub fn batch(&self, step: usize) -> Seq2SeqBatch {
        let mut rng = SplitMix64::new(self.seed, step as u64);
        let examples: Vec<Example> = (0..self.batch_size)
            .map(|_| {
                draw(
                    self.task,
                    &mut rng,
                    self.min_len,
                    self.max_len,
                    self.held_out,
                )
            })
            .collect();
        // A device's part of the step: its rows of the examples the step draws.
        Seq2SeqBatch {
            share: self.steps.share(),
            ..Seq2SeqBatch::new(&examples[self.steps.rows()], step, &self.device)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn digit_tasks_are_correct_and_held_out_examples_never_train() {
        let mut rng = SplitMix64::new(1, 0);
        for _ in 0..50 {
            let e = DigitTask::Reverse.sample(&mut rng, 2, 6);
            let mut reversed = e.source.clone();
            reversed.reverse();
            assert_eq!(e.target, reversed);
            let e = DigitTask::Add.sample(&mut rng, 1, 4);
            let text = DigitTask::render(&e.source);
            let (a, b) = text.split_once('+').unwrap();
            let sum = a.parse::<u64>().unwrap() + b.parse::<u64>().unwrap();
            assert_eq!(DigitTask::render(&e.target), sum.to_string());
        }
        let loader =
            Seq2SeqLoader::training(DigitTask::Reverse, 3, 8, 32, 2, 10, 5, 0, &Device::flex());
        let test = test_examples(DigitTask::Reverse, 3, 8, 200, 5);
        assert!(test.iter().all(is_held_out));
        for step in 0..10 {
            let batch = loader.batch(step);
            let sources: Vec<i64> = batch.source.try_to_vec_as().unwrap();
            let width = batch.source.dims()[1];
            for row in sources.chunks(width) {
                let source: Vec<u32> = row
                    .iter()
                    .filter(|&&t| t != PAD as i64)
                    .map(|&t| t as u32)
                    .collect();
                let example = Example {
                    target: source.iter().rev().copied().collect(),
                    source,
                };
                assert!(!is_held_out(&example));
            }
        }
    }

    #[test]
    fn sources_read_back_as_they_render() {
        let tokens = DigitTask::encode("123+45").unwrap();
        assert_eq!(tokens, vec![4, 5, 6, PLUS, 7, 8]);
        assert_eq!(DigitTask::render(&tokens), "123+45");
        let error = DigitTask::encode("12a").unwrap_err().to_string();
        assert!(error.contains("`a` is not a digit"), "{error}");
        assert!(DigitTask::encode("").is_err());
    }

    #[test]
    fn batches_pad_both_sides_and_shift_the_target() {
        let examples = vec![
            Example {
                source: vec![3, 4, 5],
                target: vec![5, 4, 3],
            },
            Example {
                source: vec![6],
                target: vec![6],
            },
        ];
        let batch = Seq2SeqBatch::new(&examples, 0, &Device::flex());
        let source: Vec<i64> = batch.source.try_to_vec_as().unwrap();
        let padding: Vec<bool> = batch.source_padding.try_to_vec_as().unwrap();
        let input: Vec<i64> = batch.target_input.try_to_vec_as().unwrap();
        let output: Vec<i64> = batch.target_output.try_to_vec_as().unwrap();
        assert_eq!(source, vec![3, 4, 5, 6, 0, 0]);
        assert_eq!(padding, vec![false, false, false, false, true, true]);
        assert_eq!(input, vec![1, 5, 4, 3, 1, 6, 0, 0]);
        assert_eq!(output, vec![5, 4, 3, 2, 6, 2, 0, 0]);
    }
}
