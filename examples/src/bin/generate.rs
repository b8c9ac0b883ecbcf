//! `generate`: text generation with a Hugging Face model, streamed as it is decoded.
//!
//! ```text
//! generate --model DIR --prompt TEXT [--tokenizer tokenizer.json] [--max-new-tokens N]
//!          [--temperature T] [--top-k K] [--top-p P] [--repetition-penalty R] [--seed S]
//!          [--num-beams B] [--device flex|ndarray|wgpu|cuda] [--dtype f32|f16|bf16]
//! ```
//!
//! Greedy by default; `--temperature` above 0 samples (with optional top-k / top-p),
//! reproducibly for a given `--seed`. `--num-beams` above 1 runs beam search and prints
//! the best hypothesis at the end. Generation stops at the model's `eos_token_id`s or
//! after `--max-new-tokens`.

use std::io::Write;
use std::path::PathBuf;

use burn_transformer::device::parse_device;
use burn_transformer::generate::{
    BeamSearchConfig, GenerationConfig, SamplingConfig, beam_search, generate,
};
use burn_transformer::hf::{LoadOptions, load_causal_lm_with};
use clap::Parser;
use tokenizers::Tokenizer;

#[global_allocator]
static ALLOCATOR: examples::Allocator = examples::Allocator;

/// Generates text with a Hugging Face model.
#[derive(Parser, Debug)]
#[command(version)]
struct Args {
    /// Model directory: config.json and model.safetensors (or a sharded index).
    #[arg(long)]
    model: PathBuf,
    /// The text to continue.
    #[arg(long)]
    prompt: String,
    /// The tokenizer file. Default: DIR/tokenizer.json.
    #[arg(long)]
    tokenizer: Option<PathBuf>,
    /// At most this many new tokens.
    #[arg(long, default_value_t = 64)]
    max_new_tokens: usize,
    /// Sampling temperature; 0 is greedy decoding.
    #[arg(long, default_value_t = 0.0)]
    temperature: f32,
    /// Sample among the K most likely tokens only.
    #[arg(long)]
    top_k: Option<usize>,
    /// Sample among the most likely tokens that make up probability P.
    #[arg(long)]
    top_p: Option<f32>,
    /// Penalize repeated tokens (1 disables).
    #[arg(long, default_value_t = 1.0)]
    repetition_penalty: f32,
    /// Seed of the sampler.
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Beam search with this many beams (no streaming).
    #[arg(long, default_value_t = 1)]
    num_beams: usize,
    /// Length penalty of beam search.
    #[arg(long, default_value_t = 1.0)]
    length_penalty: f32,
    /// Backend: flex, ndarray, wgpu or cuda[:N].
    #[arg(long, default_value = "flex")]
    device: String,
    /// Float type of the weights: f32, f16 or bf16.
    #[arg(long, default_value = "f32")]
    dtype: String,
}

fn main() {
    let args = Args::parse();
    if let Err(message) = run(&args) {
        eprintln!("generate: {message}");
        std::process::exit(1);
    }
}

fn run(args: &Args) -> Result<(), String> {
    let device = parse_device(&args.device).map_err(|error| error.to_string())?;
    let dtype = examples::parse_dtype(&args.dtype)?;
    let tokenizer_path = args
        .tokenizer
        .clone()
        .unwrap_or_else(|| args.model.join("tokenizer.json"));
    let tokenizer = Tokenizer::from_file(&tokenizer_path)
        .map_err(|error| format!("{}: {error}", tokenizer_path.display()))?;
    let (model, config) = load_causal_lm_with(
        &args.model,
        &device,
        &LoadOptions::default().with_dtype(dtype),
    )
    .map_err(|error| error.to_string())?;

    let encoding = tokenizer
        .encode(args.prompt.as_str(), true)
        .map_err(|error| format!("cannot tokenize the prompt: {error}"))?;
    let prompt: Vec<u32> = encoding.get_ids().to_vec();
    if prompt.is_empty() {
        return Err("the prompt is empty after tokenization".into());
    }
    let pad = config
        .pad_token_id
        .or(config.eos_token_ids.first().copied())
        .unwrap_or(0);

    print!("{}", args.prompt);
    flush();
    if args.num_beams > 1 {
        let beam = BeamSearchConfig::new(args.num_beams, args.max_new_tokens)
            .with_length_penalty(args.length_penalty)
            .with_stop_tokens(config.eos_token_ids.clone())
            .with_pad_token(pad);
        let hypotheses = beam_search(&model, &[prompt], &beam).map_err(|e| e.to_string())?;
        if let Some(best) = hypotheses.first().and_then(|h| h.first()) {
            let text = tokenizer
                .decode(&best.tokens, true)
                .map_err(|error| format!("cannot decode: {error}"))?;
            println!("{text}");
        }
        return Ok(());
    }

    let sampling = if args.temperature > 0.0 {
        SamplingConfig::sample(args.temperature, args.seed)
            .with_top_k(args.top_k)
            .with_top_p(args.top_p)
    } else {
        SamplingConfig::greedy()
    }
    .with_repetition_penalty(args.repetition_penalty);
    let generation = GenerationConfig::greedy(args.max_new_tokens)
        .with_stop_tokens(config.eos_token_ids.clone())
        .with_pad_token(pad)
        .with_sampling(sampling);

    // Decoding the whole continuation each step and printing what is new keeps
    // multi-byte characters split over tokens intact.
    let mut tokens: Vec<u32> = Vec::new();
    let mut printed = String::new();
    let mut decode_error = None;
    generate(&model, &[prompt], &generation, |event| {
        tokens.push(event.token);
        match tokenizer.decode(&tokens, true) {
            Ok(text) if !text.ends_with('\u{FFFD}') => {
                if let Some(new) = text.strip_prefix(printed.as_str()) {
                    print!("{new}");
                    flush();
                }
                printed = text;
            }
            Ok(_) => {}
            Err(error) => decode_error = Some(error.to_string()),
        }
    })
    .map_err(|error| error.to_string())?;
    println!();
    match decode_error {
        Some(error) => Err(format!("cannot decode: {error}")),
        None => Ok(()),
    }
}

fn flush() {
    let _ = std::io::stdout().flush();
}
