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

use std::path::PathBuf;
use std::process::ExitCode;

use burn_transformer::generate::{
    BeamSearchConfig, GenerationConfig, SamplingConfig, beam_search, generate,
};
use clap::Parser;
use examples::{HfModelFlags, StreamedText};
use tokenizers::Tokenizer;

#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// Generates text with a Hugging Face model.
#[derive(Parser, Debug)]
#[command(version)]
struct Args {
    #[command(flatten)]
    model: HfModelFlags,
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
}

fn main() -> ExitCode {
    examples::exit_with(run(&Args::parse()))
}

fn run(args: &Args) -> Result<(), String> {
    let tokenizer_path = args
        .tokenizer
        .clone()
        .unwrap_or_else(|| args.model.model.join("tokenizer.json"));
    let tokenizer = Tokenizer::from_file(&tokenizer_path)
        .map_err(|error| format!("{}: {error}", tokenizer_path.display()))?;
    let (model, config) = args.model.load()?;

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
    examples::flush();
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

    let mut stream = StreamedText::default();
    let mut decode_error = None;
    generate(&model, &[prompt], &generation, |event| {
        if let Err(error) = stream.push(event.token, |tokens| tokenizer.decode(tokens, true)) {
            decode_error = Some(error.to_string());
        }
    })
    .map_err(|error| error.to_string())?;
    println!();
    match decode_error {
        Some(error) => Err(format!("cannot decode: {error}")),
        None => Ok(()),
    }
}
