//! `hf-logits`: logits and a greedy continuation of a Hugging Face model (or a
//! `train-lm` run), for comparison with transformers.
//!
//! ```text
//! hf-logits --model DIR --input INPUT.json --out OUT.safetensors [--device flex|ndarray|wgpu|cuda]
//!           [--dtype f32|f16|bf16]
//! ```
//!
//! `INPUT.json` is `{"tokens": [[...], ...], "max_new_tokens": n}` with rows of equal
//! length. `OUT.safetensors` receives `logits`, f32 `[batch, seq, vocab]`, from one full
//! forward pass, and `greedy`, i64 `[batch, n]`, the greedy continuation decoded
//! through the KV cache (no stop token). The file is written under a temporary name
//! and renamed, so it is either complete or absent. Bad input exits with status 1
//! and a message naming the problem; weights holding NaN or infinite values are named
//! in a warning.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use burn::tensor::{Int, Tensor, TensorData};
use burn_transformer::generate::{GenerationConfig, generate};
use burn_transformer::io::{read_text, write_atomically_with};
use clap::Parser;
use examples::ModelFlags;
use serde::Deserialize;

#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// One forward pass and a greedy continuation of a Hugging Face model (or a train-lm
/// run).
#[derive(Parser, Debug)]
#[command(version)]
struct Args {
    /// JSON input: {"tokens": [[...], ...], "max_new_tokens": n}.
    #[arg(long)]
    input: PathBuf,
    /// Output safetensors file (`logits` f32, `greedy` i64).
    #[arg(long)]
    out: PathBuf,
    #[command(flatten)]
    model: ModelFlags,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Input {
    tokens: Vec<Vec<i64>>,
    max_new_tokens: usize,
}

fn main() -> ExitCode {
    examples::exit_with(run(&Args::parse()))
}

/// Reads and checks the input: a non-empty batch of equal, non-empty rows.
fn read_input(path: &Path) -> Result<Input, String> {
    let text = read_text(path).map_err(|error| error.to_string())?;
    let input: Input = serde_json::from_str(&text)
        .map_err(|error| format!("{}: invalid input: {error}", path.display()))?;
    let Some(first) = input.tokens.first() else {
        return Err(format!("{}: `tokens` has no rows", path.display()));
    };
    if first.is_empty() {
        return Err(format!("{}: `tokens` rows are empty", path.display()));
    }
    if let Some((row, tokens)) = input
        .tokens
        .iter()
        .enumerate()
        .find(|(_, row)| row.len() != first.len())
    {
        return Err(format!(
            "{}: rows of `tokens` must have equal lengths: row 0 has {}, row {row} has {}",
            path.display(),
            first.len(),
            tokens.len()
        ));
    }
    Ok(input)
}

fn run(args: &Args) -> Result<(), String> {
    let folder = args.model.folder()?;
    let input = read_input(&args.input)?;
    let model = args.model.load(&folder)?.model;
    let device = model.device();
    let vocab = model.vocab_size();
    let batch = input.tokens.len();
    let seq = input.tokens[0].len();
    for (row, tokens) in input.tokens.iter().enumerate() {
        if let Some(&token) = tokens.iter().find(|&&t| t < 0 || t as usize >= vocab) {
            return Err(format!(
                "{}: token {token} in row {row} is outside the model's vocabulary (0..{vocab})",
                args.input.display()
            ));
        }
    }

    // A table of learned positions (GPT-2, OPT) ends; greedy decoding then slides its
    // window, but the one forward pass takes the rows whole.
    if let Some(positions) = model.max_positions()
        && seq > positions
    {
        return Err(format!(
            "{}: rows of {seq} tokens exceed the model's {positions} learned positions: \
             give at most {positions} tokens per row",
            args.input.display()
        ));
    }

    let flat: Vec<i64> = input.tokens.iter().flatten().copied().collect();
    let tokens = Tensor::<2, Int>::from_data(TensorData::new(flat, [batch, seq]), &device);
    let logits = model
        .forward(tokens, None)
        .into_data()
        .convert::<f32>()
        .try_into_vec::<f32>()
        .map_err(|error| format!("cannot read the logits: {error:?}"))?;

    let prompts: Vec<Vec<u32>> = input
        .tokens
        .iter()
        .map(|row| row.iter().map(|&t| t as u32).collect())
        .collect();
    let config = GenerationConfig::greedy(input.max_new_tokens);
    let greedy: Vec<i64> = generate(&model, &prompts, &config, |_| {})
        .map_err(|error| error.to_string())?
        .into_iter()
        .flat_map(|generated| generated.tokens.into_iter().map(i64::from))
        .collect();

    let logits_bytes: Vec<u8> = logits.iter().flat_map(|v| v.to_le_bytes()).collect();
    let greedy_bytes: Vec<u8> = greedy.iter().flat_map(|v| v.to_le_bytes()).collect();
    write_tensors(
        &args.out,
        &[
            (
                "logits",
                safetensors::Dtype::F32,
                vec![batch, seq, vocab],
                &logits_bytes,
            ),
            (
                "greedy",
                safetensors::Dtype::I64,
                vec![batch, input.max_new_tokens],
                &greedy_bytes,
            ),
        ],
    )
}

/// Writes the tensors to `path` atomically.
fn write_tensors(
    path: &Path,
    tensors: &[(&str, safetensors::Dtype, Vec<usize>, &[u8])],
) -> Result<(), String> {
    let views = tensors
        .iter()
        .map(|(name, dtype, shape, bytes)| {
            safetensors::tensor::TensorView::new(*dtype, shape.clone(), bytes)
                .map(|view| (name.to_string(), view))
                .map_err(|error| format!("tensor {name}: {error}"))
        })
        .collect::<Result<Vec<_>, _>>()?;
    write_atomically_with(path, |temporary| {
        safetensors::serialize_to_file(views, None, temporary)
    })
    .map_err(|error| error.to_string())
}
