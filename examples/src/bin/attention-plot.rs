//! Renders the attention weights of a trained encoder-decoder model for one input:
//! a terminal heatmap and a PNG per layer and head, for the encoder's self-attention
//! and the decoder's self- and cross-attention.
//!
//! ```text
//! cargo run --release -p examples --bin train-seq2seq            # trains runs/train-seq2seq
//! cargo run --release -p examples --bin attention-plot -- --input 31415
//! ```
//!
//! The model reads the input, decodes its answer greedily, then runs once more with
//! the answer as the decoder's input (teacher forcing) to collect the probabilities
//! of every head (`Transformer::forward_with_weights`).

use std::path::PathBuf;
use std::process::ExitCode;

use burn::config::Config;
use burn::tensor::{Int, Tensor, TensorData};
use burn_transformer::generate::{GenerationConfig, Seq2SeqDecoding, generate};
use burn_transformer::model::TransformerConfig;
use burn_transformer::train::digits::{BOS, EOS};
use burn_transformer::train::{DigitTask, load_module};
use clap::Parser;
use examples::device::open_device;
use examples::plot::Heatmap;

#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[derive(Parser, Debug)]
#[command(about = "Render the attention weights of a model trained by train-seq2seq")]
struct Args {
    /// The folder of a `train-seq2seq` run (its model.json and model.bpk).
    #[arg(long, default_value = "runs/train-seq2seq")]
    run: PathBuf,
    /// The input: digits, and `+` for the addition task (`31415`, `123+45`).
    #[arg(long)]
    input: String,
    /// Where the PNGs go. Default: `<run>/attention`.
    #[arg(long)]
    out: Option<PathBuf>,
    /// Backend: flex, ndarray, wgpu or cuda.
    #[arg(long, default_value = "flex")]
    device: String,
    /// Print only the first head of each layer in the terminal (all are written as PNG).
    #[arg(long)]
    first_head_only: bool,
}

fn main() -> ExitCode {
    examples::exit_with(run(Args::parse()))
}

/// How a token is shown on an axis.
fn label(token: u32) -> String {
    DigitTask::render(&[token])
}

fn run(args: Args) -> Result<(), String> {
    let source_tokens = DigitTask::encode(&args.input).map_err(|e| e.to_string())?;
    let device = open_device(&args.device)?;
    let config_path = args.run.join("model.json");
    let weights_path = args.run.join("model.bpk");
    for path in [&config_path, &weights_path] {
        if !path.is_file() {
            return Err(format!(
                "{} not found: train a model first (cargo run --release -p examples --bin \
                 train-seq2seq) or pass --run",
                path.display()
            ));
        }
    }
    let config = TransformerConfig::load(&config_path)
        .map_err(|e| format!("{}: {e}", config_path.display()))?;
    let model = config
        .try_init(&device)
        .map_err(|e| format!("{}: {e}", config_path.display()))?;
    let model = load_module(model, &weights_path).map_err(|e| e.to_string())?;

    let source = Tensor::<2, Int>::from_data(
        TensorData::new(
            source_tokens.iter().map(|&t| t as i64).collect::<Vec<_>>(),
            [1, source_tokens.len()],
        ),
        &device,
    );
    // Greedy answer, at most twice the input's length (the tasks' outputs are shorter).
    let memory = model.encode(source.clone(), None);
    let decoding = Seq2SeqDecoding::new(&model, memory, None);
    let settings =
        GenerationConfig::greedy(2 * source_tokens.len() + 2).with_stop_tokens(vec![EOS]);
    let answer = generate(&decoding, &[vec![BOS]], &settings, |_| {})
        .map_err(|e| e.to_string())?
        .remove(0)
        .tokens;
    let shown: String = answer
        .iter()
        .filter(|&&t| t != EOS)
        .map(|&t| label(t))
        .collect();
    println!("input {}  ->  answer {shown}", args.input);

    // Teacher forcing on the answer: decoder inputs are BOS then the answer's tokens.
    let decoder_tokens: Vec<u32> = std::iter::once(BOS)
        .chain(answer.iter().copied().filter(|&t| t != EOS))
        .collect();
    let target = Tensor::<2, Int>::from_data(
        TensorData::new(
            decoder_tokens.iter().map(|&t| t as i64).collect::<Vec<_>>(),
            [1, decoder_tokens.len()],
        ),
        &device,
    );
    let (_, encoder, decoder) = model.forward_with_weights(source, target, None, None);

    let out = args.out.unwrap_or_else(|| args.run.join("attention"));
    std::fs::create_dir_all(&out).map_err(|e| format!("{}: {e}", out.display()))?;
    let source_labels: Vec<String> = source_tokens.iter().map(|&t| label(t)).collect();
    let target_labels: Vec<String> = decoder_tokens.iter().map(|&t| label(t)).collect();
    let mut maps = Vec::new();
    for (layer, weights) in encoder.iter().enumerate() {
        maps.push((
            "encoder-self",
            layer,
            weights.self_attn.clone(),
            &source_labels,
            &source_labels,
        ));
    }
    for (layer, weights) in decoder.iter().enumerate() {
        maps.push((
            "decoder-self",
            layer,
            weights.self_attn.clone(),
            &target_labels,
            &target_labels,
        ));
        if let Some(cross) = &weights.cross_attn {
            maps.push((
                "decoder-cross",
                layer,
                cross.clone(),
                &target_labels,
                &source_labels,
            ));
        }
    }
    let mut written = 0;
    for (kind, layer, weights, rows, cols) in maps {
        let [_, heads, n_rows, n_cols] = weights.dims(); // [1, heads, queries, keys]
        let values = weights
            .into_data()
            .convert::<f32>()
            .try_into_vec::<f32>()
            .map_err(|e| format!("{kind} weights: {e:?}"))?;
        for head in 0..heads {
            let title = format!("{kind} attention, layer {layer}, head {head}");
            let map = Heatmap {
                values: &values[head * n_rows * n_cols..(head + 1) * n_rows * n_cols],
                row_labels: rows,
                col_labels: cols,
                title: &title,
            };
            if head == 0 || !args.first_head_only {
                println!("{}", map.to_terminal());
            }
            map.write_png(&out.join(format!("{kind}-layer{layer}-head{head}.png")))
                .map_err(|e| e.to_string())?;
            written += 1;
        }
    }
    println!("{written} heatmaps written to {}", out.display());
    Ok(())
}
